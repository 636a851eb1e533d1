"""Gzip of answers (issue 28), with ISA-L's deflate when it is installed, and from deflate
fragments kept for the runs of samples a warm answer reads every time.

Grafana asks for gzip on every request, so every answer is compressed; ISA-L (`isal`) writes
the same gzip format several times faster than zlib at level 1, and smaller (figures in
docs/ARCHITECTURE.md, "The hot path"). Still, compressing was half of a warm 24 h dashboard
refresh (~27 MB of JSON: ~60 of ~125 ms). Most of those bytes are the same every refresh: a
sliding window's interior pieces are whole hour cells (or the same hour cuts of a day cell),
and only the two edge pieces change. So a spliced answer (codec/json_splice.py) is gzipped
from parts:

- each run of samples the answer copied from a kept cell's bytes, of a piece whose runs were
  seen before and are likely read again (a whole cell, or a piece between the answer's first
  and last: `Source.steady`), is deflated once, on its own (it refers to nothing before it
  and ends on a byte boundary: a full flush), and the fragment is kept (`FRAGMENT_SHARE` of
  cache.json_memo_bytes, least recently used first out);
- the bytes between those runs: a stretch under STORED_BELOW bytes (a series' labels and
  brackets) is a stored block, a longer one (the edge pieces' runs) is deflated now, ending
  with a full flush too;
- one gzip member: header, the parts in order, an empty final block, the CRC-32 of the
  spliced body and its length (RFC 1951, 1952). A deflate stream is a sequence of blocks; blocks that start on a byte boundary
  and whose back-references stay inside their own run can be concatenated (as pigz does).

A piece seen once is not compressed ahead, nor a window's edge pieces: a sliding window cuts
them anew each time, and a window asked exactly twice (the bench's large panels: each window
once cold, once warm) paid for deflating its edges' runs one by one (~3 ms for 512 runs, a
full flush each) and never used them.
"""

from __future__ import annotations

import struct
import threading
import weakref
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .json_splice import MEMO_MAX_BYTES, SampleJSON, Spliced, copy_runs

try:
    from isal import isal_zlib as _deflate  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover -- a platform without an isal wheel: zlib's output is the same format
    _deflate = zlib  # type: ignore[assignment,misc]

__all__ = ["FRAGMENT_SHARE", "LEVEL", "WBITS_GZIP", "compressor", "fragment_bytes", "gzip_bytes", "gzip_spliced",
           "keep_fragments_at_most"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

# ISA-L's levels are 0-3; its level 1 beats zlib's level 1 on both speed and size.
LEVEL = 1
WBITS_GZIP = 16 + zlib.MAX_WBITS
RAW = -zlib.MAX_WBITS
# A gzip member's header: deflate, no name, no time, unknown OS (RFC 1952).
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"

# Bodies of this many bytes or more are compressed in two halves at once (a 3 MB answer:
# ~6 ms of one core at LEVEL on the bench machine).
PARALLEL_ABOVE = 1 << 20
_HALVES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promaccel-gzip")

# The kept fragments' share of cache.json_memo_bytes (the JSON they compress is kept there):
# a 24 h dashboard refresh's ~25 MB of interior runs deflate to ~5 MB.
FRAGMENT_SHARE = 4
# Fragments are used when they cover at least this share of an answer's bytes; and a piece's
# runs are compressed ahead only when they are this many bytes or more together.
MIN_COVERED = 0.5
MIN_PIECE_BYTES = 4096
# Stretches between fragments shorter than this are stored, not deflated (see _assemble).
STORED_BELOW = 256
_STORED_HEAD = 5
# The stream's last block: final, stored, empty.
_LAST_BLOCK = b"\x01\x00\x00\xff\xff"


def gzip_bytes(data: bytes | memoryview) -> bytes:
    """`data` as one gzip member, at LEVEL. A large body is deflated in two halves at once,
    like pigz: the first ends with a full flush (byte-aligned, and the second refers to
    nothing before it), the second is the last block; one member, one CRC-32, so every gzip
    reader reads it."""
    n = len(data)
    if n < PARALLEL_ABOVE:
        out: bytes = _deflate.compress(data, LEVEL, WBITS_GZIP)
        return out
    view = memoryview(data).cast("B")
    mid = n // 2
    second = _HALVES.submit(_raw_deflate, view[mid:], True)
    first = _raw_deflate(view[:mid], False)
    return b"".join((GZIP_HEADER, first, second.result(), _trailer(view)))


def _raw_deflate(data: memoryview, last: bool) -> bytes:
    c = _deflate.compressobj(LEVEL, _deflate.DEFLATED, RAW)
    out: bytes = c.compress(data) + c.flush(_deflate.Z_FINISH if last else _deflate.Z_FULL_FLUSH)
    return out


def _trailer(data: memoryview | U8) -> bytes:
    return struct.pack("<II", _deflate.crc32(data), len(data) & 0xFFFFFFFF)


def compressor() -> Any:
    """A streaming gzip compressor (the object `zlib.compressobj` returns, or ISA-L's)."""
    return _deflate.compressobj(LEVEL, _deflate.DEFLATED, WBITS_GZIP)


@dataclass(frozen=True, slots=True)
class _Batch:
    """One piece's runs deflated, each on its own: run j is buf[at[j]:at[j + 1]]."""

    buf: U8
    at: I64

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes + self.at.nbytes)


class _Fragments:
    """Deflated runs by (kept bytes, runs), least recently used first out within a byte
    bound. A piece's runs seen for the first time are only noted (their key's size counts);
    seen again, they are compressed and kept. An entry names its memo weakly: a memo that went
    (its cell dropped or its bytes evicted) is never matched by another that took its id."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lru: OrderedDict[tuple[int, bytes], tuple[weakref.ref[SampleJSON], _Batch | None, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, memo: SampleJSON, a: I64, n: I64) -> _Batch | None:
        key = (id(memo), a.tobytes() + n.tobytes())
        with self._lock:
            entry = self._lru.get(key)
            if entry is None or entry[0]() is not memo:  # first seen (or another memo's id)
                if self.max_bytes > 0:
                    self._put(key, (weakref.ref(memo), None, len(key[1])))
                return None
            self._lru.move_to_end(key)
            if entry[1] is not None:
                return entry[1]
        batch = _deflate_runs(memo.buf, a, n)  # seen before: compress, outside the lock
        with self._lock:
            self._put(key, (weakref.ref(memo), batch, batch.nbytes + len(key[1])))
        return batch

    def _put(self, key: tuple[int, bytes], entry: tuple[weakref.ref[SampleJSON], _Batch | None, int]) -> None:
        old = self._lru.pop(key, None)
        if old is not None:
            self.used -= old[2]
        if entry[2] > self.max_bytes // 4:
            return
        self._lru[key] = entry
        self.used += entry[2]
        while self.used > self.max_bytes and self._lru:
            _, (_, _, size) = self._lru.popitem(last=False)
            self.used -= size

    def keep_at_most(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            while self.used > self.max_bytes and self._lru:
                _, (_, _, size) = self._lru.popitem(last=False)
                self.used -= size


_FRAGMENTS = _Fragments(MEMO_MAX_BYTES // FRAGMENT_SHARE)


def keep_fragments_at_most(max_bytes: int) -> None:
    """Keep at most `max_bytes` of deflated runs (start-up: cache.json_memo_bytes / FRAGMENT_SHARE)."""
    _FRAGMENTS.keep_at_most(max_bytes)


def fragment_bytes() -> int:
    """Bytes of deflated runs (and noted keys) kept now (tests, metrics)."""
    return _FRAGMENTS.used


def _deflate_runs(buf: U8, a: I64, n: I64) -> _Batch:
    c = _deflate.compressobj(LEVEL, _deflate.DEFLATED, RAW)
    view = memoryview(buf)  # type: ignore[arg-type]
    full = _deflate.Z_FULL_FLUSH
    parts = [c.compress(view[s:s + k]) + c.flush(full) for s, k in zip(a.tolist(), n.tolist())]
    at = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=at[1:])
    return _Batch(np.frombuffer(bytearray(b"".join(parts)), dtype=np.uint8), at)


def gzip_spliced(sp: Spliced) -> bytes:
    """The spliced answer as one gzip member, from kept fragments where its runs have them
    (see above), else as `gzip_bytes` writes it."""
    body = sp.body
    total = len(body)
    steady = []
    for src in sp.sources:
        piece_bytes = int(src.n.sum()) if src.steady else 0
        if piece_bytes >= MIN_PIECE_BYTES:
            steady.append((src, piece_bytes))
    if sum(b for _, b in steady) < MIN_COVERED * total:  # never worth its fragments: none noted or made
        return gzip_bytes(memoryview(body))  # type: ignore[arg-type]
    batches: list[tuple[_Batch, I64, I64]] = []
    covered = 0
    for src, piece_bytes in steady:
        batch = _FRAGMENTS.get(src.memo, src.a, src.n)
        if batch is not None:
            batches.append((batch, src.dest, src.n))
            covered += piece_bytes
    if not batches or covered < MIN_COVERED * total:
        return gzip_bytes(memoryview(body))  # type: ignore[arg-type]
    return _assemble(body, batches)


def _assemble(body: U8, batches: list[tuple[_Batch, I64, I64]]) -> bytes:
    """Header, the stretches between fragments interleaved with the fragments (in the body's
    order), an empty final block, trailer. A stretch under STORED_BELOW bytes (a series'
    labels and brackets) is a stored block: deflating it costs a call and a flush (~4 us)
    and saves nothing; a longer one (an edge piece's runs) is deflated now."""
    total = len(body)
    dest = np.concatenate([d for _, d, _ in batches])
    n = np.concatenate([k for _, _, k in batches])
    frag_len = np.concatenate([np.diff(b.at) for b, _, _ in batches])
    order = np.argsort(dest, kind="stable")
    d_sorted = dest[order]
    seg_s = np.concatenate(([0], d_sorted + n[order]))  # stretch k comes before fragment k
    seg_e = np.concatenate((d_sorted, [total]))
    seg_n = seg_e - seg_s
    stored = (seg_n > 0) & (seg_n < STORED_BELOW)
    squeezed = np.flatnonzero(seg_n >= STORED_BELOW)
    live_len = np.where(stored, seg_n + _STORED_HEAD, 0)
    now = _deflate_runs(body, seg_s[squeezed], seg_n[squeezed]) if len(squeezed) else None
    if now is not None:
        live_len[squeezed] = np.diff(now.at)
    # Sizes in stream order: stretch 0, fragment 0, stretch 1, ..., stretch m.
    m = len(d_sorted)
    sizes = np.empty(2 * m + 1, dtype=np.int64)
    sizes[0::2] = live_len
    sizes[1::2] = frag_len[order]
    pos = np.empty(2 * m + 1, dtype=np.int64)
    pos[0] = len(GZIP_HEADER)
    np.cumsum(sizes[:-1], out=pos[1:])
    pos[1:] += len(GZIP_HEADER)
    size = int(pos[-1] + sizes[-1])
    out = np.empty(size + len(_LAST_BLOCK) + 8, dtype=np.uint8)
    out[:len(GZIP_HEADER)] = np.frombuffer(GZIP_HEADER, dtype=np.uint8)
    seg_pos = pos[0::2]
    # Stored blocks: BFINAL 0, BTYPE 00 (byte-aligned after a full flush: one zero byte),
    # LEN and its complement, little-endian, then the bytes (RFC 1951, 3.2.4).
    at, length = seg_pos[stored], seg_n[stored]
    out[at] = 0
    out[at + 1], out[at + 2] = length & 0xFF, length >> 8
    out[at + 3], out[at + 4] = ~length & 0xFF, (~length >> 8) & 0xFF
    copy_runs(out, at + _STORED_HEAD, body, seg_s[stored], length)
    if now is not None:
        copy_runs(out, seg_pos[squeezed], now.buf, now.at[:-1], live_len[squeezed])
    frag_pos = np.empty(m, dtype=np.int64)
    frag_pos[order] = pos[1::2]  # back in the batches' order
    first = 0
    for batch, d, _ in batches:
        k = len(d)
        copy_runs(out, frag_pos[first:first + k], batch.buf, batch.at[:-1], frag_len[first:first + k])
        first += k
    out[size:size + len(_LAST_BLOCK)] = np.frombuffer(_LAST_BLOCK, dtype=np.uint8)
    out[size + len(_LAST_BLOCK):] = np.frombuffer(_trailer(body), dtype=np.uint8)
    return out.tobytes()
