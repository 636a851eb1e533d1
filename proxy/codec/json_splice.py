"""A matrix answer made of cached cells, written from their encoded samples (issue 28).

A warm dashboard panel is the same cells every refresh (a sliding window cuts the two at its
edges differently each time). Writing its JSON from the samples costs ~8 ns a byte (the
value digits, the timestamps); copying bytes already written costs well under 1. So the
first time a cell's samples are written, they are kept as bytes, each sample as
`,[t,"v"]` (`json_encode.encode_samples`), with where each starts, and the answer is
assembled from runs of those bytes:

    {"metric":<labels>,"values":[ <run> <run> ... ]}, ...

A series' samples in one piece are a contiguous run, in the cell's bytes too; the first run
of a series drops its leading comma, the others keep theirs. A piece cut by time from a
cell (`pieces.slice_time`, the window's edge cells) carries its `origin`: the cell (weakly)
and where each of its series starts in it, so it is spliced from the cell's bytes as well.
A `Concatenation` (time pieces) says where each piece's runs go (`Concatenation.parts`).

The bytes are kept only for the cells the cache reader keeps decoded (`keeps_json`: a cold
answer's fetched cells are written for it alone), within MEMO_MAX_BYTES (least recently used
first out), and live no longer than their cell. Only answers written whole take this path (up to SPLICE_MAX_SAMPLES); a heavy
streamed answer's cells are never kept as bytes (scenario (e)'s memory bound).
A cell whose samples are still packed in its cache payload is read through a cursor for
this, and stays packed.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from proxy.result import QueryResult
from proxy.result.concat import Concatenation

from .json_encode import encode_samples, head_tail

__all__ = ["MEMO_MAX_BYTES", "SPLICE_MAX_SAMPLES", "SampleJSON", "Source", "Spliced", "keep_at_most", "memo_bytes",
           "splice_prometheus_json", "spliceable", "spliced_runs"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

# All cells' encoded samples together, until start-up sets cache.json_memo_bytes (`keep_at_most`;
# this is its default): a dashboard's large panels are a few MB of JSON each (a 256-series
# 1 h panel: 2-3 MB; a 24 h dashboard refresh ~27 MB). Only warm answers' cells are kept:
# cold ones (scenario (e)) keep nothing here.
MEMO_MAX_BYTES = 64 << 20
# Answers up to this many samples are written whole from their cells' bytes; larger ones
# are streamed by the encoder (responses.STREAM_ABOVE_SAMPLES, the same bound).
SPLICE_MAX_SAMPLES = 200_000

# A piece's origin is written whole when it is at most this many times the piece (or small).
ORIGIN_MAX_RATIO = 8
ORIGIN_SMALL = 1 << 16

_W_METRIC = np.frombuffer(b'{"metric":', dtype=np.uint8)
_W_VALUES = np.frombuffer(b',"values":[', dtype=np.uint8)
_HEAD = len(_W_METRIC) + len(_W_VALUES)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class SampleJSON:
    """A result's samples as encoded bytes: sample k is buf[at[k]:at[k + 1]], `,[t,"v"]`."""

    buf: U8
    at: npt.NDArray[np.integer]

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes + self.at.nbytes)


@dataclass(frozen=True, slots=True)
class Source:
    """The runs an answer copied from one source's bytes: memo.buf[a[j]:a[j] + n[j]] went to
    the answer's bytes at dest[j]. `steady`: the same runs are likely read again -- the memo
    lives on (a cell's, not made for this answer alone), and the piece is a whole cell or
    lies between the answer's first and last pieces (a sliding window cuts its edges anew
    each time)."""

    memo: SampleJSON
    steady: bool
    a: I64
    n: I64
    dest: I64


@dataclass(frozen=True, slots=True)
class Spliced:
    """A spliced answer's bytes (`body`, valid inside `spliced_runs` only) and where its
    sample runs came from (codec/deflate.py keeps the steady runs deflated)."""

    body: U8
    sources: list[Source]


class _Memos:
    """The cells' encoded samples, kept on the cells (`QueryResult.sample_json`) within a
    byte bound: the least recently used are dropped first, and a cell that goes takes its
    bytes with it (a weak reference's callback gives its share of the bound back)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lru: OrderedDict[int, tuple[weakref.ref[QueryResult], int]] = OrderedDict()
        # Reentrant: a collection inside a locked block may run `gone` on this thread.
        self._lock = threading.RLock()

    def of(self, r: QueryResult) -> SampleJSON:
        memo: SampleJSON | None = r.sample_json
        if memo is not None:
            with self._lock:
                if id(r) in self._lru:
                    self._lru.move_to_end(id(r))
            return memo
        memo = SampleJSON(*encode_samples(*_samples_of(r)))
        if r.keeps_json:  # else made for this answer alone (a cold answer's fetched cells)
            self._keep(r, memo)
        return memo

    def _keep(self, r: QueryResult, memo: SampleJSON) -> None:
        size = memo.nbytes
        if size > self.max_bytes // 4:
            return  # used for this answer only
        key = id(r)

        def gone(ref: weakref.ref[QueryResult], key: int = key) -> None:
            with self._lock:
                entry = self._lru.get(key)
                if entry is not None and entry[0] is ref:
                    del self._lru[key]
                    self.used -= entry[1]

        with self._lock:
            old_entry = self._lru.pop(key, None)  # two threads wrote the same cell at once
            if old_entry is not None:
                self.used -= old_entry[1]
            r.sample_json = memo
            self._lru[key] = (weakref.ref(r, gone), size)
            self.used += size
            self._evict()

    def keep_at_most(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def _evict(self) -> None:
        while self.used > self.max_bytes and self._lru:
            _, (ref, n) = self._lru.popitem(last=False)
            self.used -= n
            old = ref()
            if old is not None:
                old.sample_json = None

    def clear(self) -> None:
        with self._lock:
            for ref, _ in self._lru.values():
                old = ref()
                if old is not None:
                    old.sample_json = None
            self._lru.clear()
            self.used = 0


_MEMOS = _Memos(MEMO_MAX_BYTES)


def memo_bytes() -> int:
    """Bytes of encoded samples kept now (tests, metrics)."""
    return _MEMOS.used


def keep_at_most(max_bytes: int) -> None:
    """Keep at most `max_bytes` of cells' encoded samples from now on (cache.json_memo_bytes,
    set at start-up; the least recently used go first). 0: keep none."""
    _MEMOS.keep_at_most(max_bytes)


@njit(cache=True, nogil=True)
def _skeleton(out, series_at, lab_buf, lab_s, lab_e, payload, w_metric, w_values):  # type: ignore[no-untyped-def]
    """Each series' `{"metric":<labels>,"values":[`, its closing `]}` after its payload
    bytes (left for the runs), and the comma before every series but the first."""
    for s in range(len(series_at)):
        o = series_at[s]
        if s > 0:
            out[o - 1] = 44
        for j in range(len(w_metric)):
            out[o + j] = w_metric[j]
        o += len(w_metric)
        for j in range(lab_s[s], lab_e[s]):
            out[o] = lab_buf[j]
            o += 1
        for j in range(len(w_values)):
            out[o + j] = w_values[j]
        o += len(w_values) + payload[s]
        out[o] = 93
        out[o + 1] = 125


@njit(cache=True, nogil=True)
def _copy_runs(out, dest, src, a, n):  # type: ignore[no-untyped-def]
    for j in range(len(dest)):
        out[dest[j]:dest[j] + n[j]] = src[a[j]:a[j] + n[j]]


def _libc_memcpy() -> object | None:
    try:
        fn = ctypes.CDLL(None).memcpy
    except (OSError, AttributeError):  # pragma: no cover -- no C library to load symbols from
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_void_p
    return fn


_MEMCPY = _libc_memcpy()


if _MEMCPY is not None:
    # Not cached (the C function's address is the process's own), so compiled here, at
    # import, for the one signature the splice uses: compiled lazily, the first warm answer
    # paid ~0.3-0.5 s for it.
    @njit("void(uint8[::1], int64[::1], uint8[::1], int64[::1], int64[::1])", nogil=True)
    def _memcpy_runs(out, dest, src, a, n):  # type: ignore[no-untyped-def]
        po = out.ctypes.data
        ps = src.ctypes.data
        for j in range(len(dest)):
            _MEMCPY(po + dest[j], ps + a[j], n[j])
else:  # pragma: no cover
    _memcpy_runs = _copy_runs


def copy_runs(out: U8, dest: I64, src: U8, a: I64, n: I64) -> None:
    """out[dest[j]:dest[j] + n[j]] = src[a[j]:a[j] + n[j]] for every run j. With the C
    library's memcpy: numba's slice assignment copied a 2 MB answer's 512 runs at ~3 GB/s
    (0.8 ms), memcpy at ~35 GB/s (0.06 ms). Every run is checked to lie inside both buffers
    first (memcpy checks nothing); the buffers never overlap (an answer's own buffer, a
    cell's kept bytes)."""
    if not len(dest):
        return
    if not (out.flags.c_contiguous and src.flags.c_contiguous and out.dtype == src.dtype == np.uint8):
        raise ValueError("copy_runs: contiguous byte buffers only")
    if int(n.min()) < 0 or int(dest.min()) < 0 or int(a.min()) < 0 \
            or int((dest + n).max()) > len(out) or int((a + n).max()) > len(src):
        raise ValueError("copy_runs: a run outside its buffer")
    if src.flags.writeable and out.flags.writeable:
        _memcpy_runs(out, dest, src, a, n)
    else:  # not the signature compiled above (kept bytes are always writable arrays)
        _copy_runs(out, dest, src, a, n)


def spliceable(result: QueryResult) -> bool:
    """Whether `splice_prometheus_json` writes this result (else it answers None): a matrix of
    cells the cache reader keeps (or cut from them), whose bytes are kept or will be. A cold
    answer's fetched cells are not: the encoder writes it as before (written once, nothing
    to keep; their bytes and the whole answer at once cost scenario (e) ~40 MiB more)."""
    if result.result_type != "matrix" or result.n_series == 0 or result.n_samples > SPLICE_MAX_SAMPLES:
        return False
    runs = _runs(result)
    return runs is not None and all(map(_warm, runs[0]))


def _warm(r: QueryResult) -> bool:
    """Whether r's encoded samples are kept (or will be): r, or the cell it was cut from."""
    if r.sample_json is not None or r.keeps_json:
        return True
    cell = r.origin[0]() if r.origin is not None else None
    return cell is not None and (cell.sample_json is not None or cell.keeps_json)


def _runs(result: QueryResult) -> tuple[list[QueryResult], I64, I64, I64, I64] | None:
    """(pieces, start, length, piece, series) of every run of samples, in answer order."""
    if isinstance(result, Concatenation):
        parts = result.parts
        if parts is None:
            return None
        pieces, s_start, s_len, s_piece, dest = parts
        series = np.searchsorted(result.offsets, dest, side="right") - 1
        return pieces, s_start, s_len, s_piece, series
    if not _warm(result):
        return None  # made for this answer alone: nothing to reuse
    counts = result.counts
    series = np.flatnonzero(counts)
    return [result], result.offsets[:-1][series], counts[series], np.zeros(len(series), dtype=np.int64), series


def _samples_of(r: QueryResult) -> tuple[I64, npt.NDArray[np.float64]]:
    """r's timestamps and values; a packed cell's read from its payload and not kept on it
    (codec/arrow.py's `PackedPiece` keeps them once `t_ms` is read)."""
    packed = r.packed_samples()
    if packed is None:
        return r.t_ms, r.value
    n = r.n_samples
    t, v, _ = packed.cursor().rows(0, n)  # from row 0: the arrays start at row 0
    return t[:n], v[:n]


def _sources(pieces: list[QueryResult]) -> list[tuple[SampleJSON, I64]]:
    """`_source` of each piece, knowing how much of each cell the answer reads: a day cell
    answering a day's hour pieces is cut 23 times, an hour each (1/24 of it), and read
    almost whole."""
    read: dict[int, int] = {}
    for r in pieces:
        cell = r.origin[0]() if r.origin is not None else None
        if cell is not None:
            read[id(cell)] = read.get(id(cell), 0) + r.n_samples
    return [_source(r, read) for r in pieces]


def _source(r: QueryResult, read: dict[int, int]) -> tuple[SampleJSON, I64]:
    """The encoded samples that hold r's, and where each of r's series starts in them.
    `read`: the samples this answer reads of each cell, by id."""
    if r.origin is not None:
        cell = r.origin[0]()
        # The cell whole is written once for later answers, unless it is much larger than
        # what this answer reads of it and not written yet (a whole backend answer cut for
        # a cold query).
        if cell is not None and (cell.sample_json is not None or (
                cell.keeps_json and cell.n_samples <= ORIGIN_MAX_RATIO * read[id(cell)] + ORIGIN_SMALL)):
            return _MEMOS.of(cell), r.origin[1]
    return _MEMOS.of(r), r.offsets[:-1]


def splice_prometheus_json(result: QueryResult) -> bytes | None:
    """The answer as `json_encode.encode_prometheus_json` writes it, spliced from its cells'
    encoded samples; None when it is not a matrix of such cells (encode it then)."""
    out = _splice(result, _fresh)
    return None if out is None else out.body.tobytes()


@contextmanager
def spliced_runs(result: QueryResult) -> Iterator[Spliced | None]:
    """The spliced answer and its runs, its bytes in a buffer kept between answers (valid
    inside the `with` only: copy or compress them there). Every buffer of a megabyte or more
    that the process allocates is mapped fresh (memory.tune_malloc's fixed mmap threshold) and
    first written page by page: a fresh 3 MB answer cost ~1.5 ms in page faults alone."""
    buf = _BUFFERS.take()
    box: list[U8 | None] = [buf]

    def alloc(size: int) -> U8:
        got = box[0]
        if got is None or len(got) < size:
            got = box[0] = np.empty(max(size, 1 << 20), dtype=np.uint8)
        return got

    try:
        yield _splice(result, alloc)
    finally:
        _BUFFERS.give(box[0])


def _fresh(size: int) -> U8:
    return np.empty(size, dtype=np.uint8)


class _Buffers:
    """A few output buffers kept for the next answers (at most KEPT of at most KEEP_MAX bytes)."""

    KEPT = 1
    KEEP_MAX = 8 << 20

    def __init__(self) -> None:
        self._free: list[U8] = []
        self._lock = threading.Lock()

    def take(self) -> U8 | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def give(self, buf: U8 | None) -> None:
        if buf is None or len(buf) > self.KEEP_MAX:
            return
        with self._lock:
            if len(self._free) < self.KEPT:
                self._free.append(buf)


_BUFFERS = _Buffers()


def _splice(result: QueryResult, alloc: Callable[[int], U8]) -> Spliced | None:
    if not spliceable(result):
        return None
    runs = _runs(result)
    assert runs is not None
    pieces, s_start, s_len, s_piece, series = runs
    sources = _sources(pieces)
    m = len(s_start)
    a = np.empty(m, dtype=np.int64)
    b = np.empty(m, dtype=np.int64)
    by_piece = np.argsort(s_piece, kind="stable")
    bounds = np.searchsorted(s_piece[by_piece], np.arange(len(pieces) + 1), side="left").tolist()
    for p, (r, src) in enumerate(zip(pieces, sources)):
        mine = by_piece[bounds[p]:bounds[p + 1]]
        if not len(mine):
            continue
        memo, base = src
        st = s_start[mine]
        k = np.searchsorted(r.offsets, st, side="right") - 1
        i = base[k] + (st - r.offsets[k])
        a[mine] = memo.at[i]  # int32 or int64 positions, widened
        b[mine] = memo.at[i + s_len[mine]]
    first = np.ones(m, dtype=bool)
    first[1:] = series[1:] != series[:-1]
    a += first  # a series' first run drops its leading comma
    nb = b - a
    n = result.n_series
    payload = np.bincount(series, weights=nb, minlength=n).astype(np.int64)
    raw, lab_s, lab_e = result.label_block_of(0, n)
    size = _HEAD + (lab_e - lab_s) + payload + 2  # ... `]}`
    head, tail = head_tail(result)
    series_at = np.empty(n, dtype=np.int64)
    series_at[0] = len(head)
    np.cumsum(size[:-1] + 1, out=series_at[1:])  # + the comma between series
    series_at[1:] += len(head)
    total = int(series_at[-1] + size[-1]) + len(tail)
    # Each run's place: its series' payload start plus the runs of that series before it.
    csum = np.zeros(m, dtype=np.int64)
    np.cumsum(nb[:-1], out=csum[1:])
    first_of = np.flatnonzero(first)
    within = csum - np.repeat(csum[first_of], np.diff(np.append(first_of, m)))
    dest = series_at[series] + _HEAD + (lab_e - lab_s)[series] + within
    out = alloc(total)[:total]
    out[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    out[total - len(tail):] = np.frombuffer(tail, dtype=np.uint8)
    _skeleton(out, series_at, np.frombuffer(raw, dtype=np.uint8), lab_s, lab_e, payload, _W_METRIC, _W_VALUES)
    used = []
    for p, (r, src) in enumerate(zip(pieces, sources)):
        mine = by_piece[bounds[p]:bounds[p + 1]]
        if len(mine):
            memo = src[0]
            copy_runs(out, dest[mine], memo.buf, a[mine], nb[mine])
            cell = r.origin[0]() if r.origin is not None else None
            whole = memo is r.sample_json
            inside = 0 < p < len(pieces) - 1 and cell is not None and memo is cell.sample_json
            used.append(Source(memo, whole or inside, a[mine], nb[mine], dest[mine]))
    return Spliced(out, used)
