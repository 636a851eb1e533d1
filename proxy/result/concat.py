"""Concatenation of pieces: the union of their series, samples in time order.

    concat(results)              one QueryResult with every sample
    concat(results, lazy=True)   a large matrix as a `Concatenation`: the same answer, its
                                 samples gathered from the pieces when they are read

concat maps each piece's series to the union by canonical label JSON (one dict operation
per series; a piece with the same key list as the previous one, as time pieces have, is
mapped once), orders the union once with a compiled bytewise sort key (`order_by_labels`),
and gathers the samples in one compiled pass. The merged result keeps the pieces' keys, so
its labels are not formatted again for encoding.

A `Concatenation` (the Merge stage's time pieces of a large answer) holds its pieces and
where each piece's segments go, not a merged copy: the JSON encoder streams it a few
hundred thousand samples at a time (`QueryResult.sample_windows`), so a 24 h answer of
3 M samples is never held twice (pieces + merged, ~50 MB a copy). Reading its `t_ms` or
`value` gathers every sample once, as `concat` would have, and lets the pieces go.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
from numba import njit

from proxy.errors import PromError
from proxy.result.query_result import LazySamples, QueryResult, ResultType

__all__ = ["Concatenation", "MergeConflict", "concat"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

# concat(lazy=True) leaves matrices of more samples than this ungathered (a Concatenation),
# which an encoder gathers a window at a time (json_encode._WINDOW_SAMPLES).
LAZY_ABOVE_SAMPLES = 262_144
WINDOW_SAMPLES = 262_144
# Sort keys are made this many label sets at a time (`order_by_labels`).
SORT_KEY_CHUNK = 2048


class MergeConflict(PromError):
    """Two pieces disagree in a way a correct plan never produces (a planner bug)."""

    def __init__(self, message: str) -> None:
        super().__init__("internal", message)


def merged_notes(results: Sequence[QueryResult]) -> tuple[list[str], list[str]]:
    warnings = list(dict.fromkeys(w for r in results for w in r.warnings))
    infos = list(dict.fromkeys(w for r in results for w in r.infos))
    return warnings, infos


def merged_result_type(results: Sequence[QueryResult]) -> str:
    types = {r.result_type for r in results}
    if len(types) != 1:
        raise MergeConflict(f"pieces of different result types: {sorted(types)}")
    (rtype,) = types
    return rtype


@njit(cache=True, nogil=True)
def _copy_segments(src_start, seg_len, dest, t_src, v_src, t_out, v_out):  # type: ignore[no-untyped-def]
    """Copy one piece's segments to their places in the merged arrays."""
    for j in range(len(src_start)):
        a = src_start[j]
        o = dest[j]
        for x in range(seg_len[j]):
            t_out[o + x] = t_src[a + x]
            v_out[o + x] = v_src[a + x]


@njit(cache=True, nogil=True)
def increasing_within(t, offsets):  # type: ignore[no-untyped-def]
    """True if every series' timestamps are strictly increasing."""
    for s in range(len(offsets) - 1):
        for i in range(offsets[s] + 1, offsets[s + 1]):
            if t[i] <= t[i - 1]:
                return False
    return True


@njit(cache=True, nogil=True)
def _sort_key_block(raw, starts, ends, out, out_s, out_e):  # type: ignore[no-untyped-def]
    """Label JSON without backslashes -> `n1 NUL v1 NUL n2 NUL v2 NUL` per key (the
    strings' contents, each closing quote a NUL, the rest dropped). Returns the length."""
    o = 0
    for s in range(len(starts)):
        out_s[s] = o
        inside = False
        for j in range(starts[s], ends[s]):
            c = raw[j]
            if c == 34:
                if inside:
                    out[o] = 0
                    o += 1
                inside = not inside
            elif inside:
                out[o] = c
                o += 1
        out_e[s] = o
    return o


def order_by_labels(ckeys: list[bytes]) -> list[int]:
    """Series indexes in Prometheus's labels.Compare order. `n1 NUL v1 NUL n2 NUL v2 NUL`
    (UTF-8) compares bytewise exactly like labels.Compare (a string that is a prefix of
    another sorts first) as long as no name or value holds a NUL, and is much cheaper than
    tuples. It is made in one compiled pass from the label JSON; the few label sets whose
    JSON has escapes (a value with a quote or a backslash) are made from their parsed JSON.
    Keys that arrive in order (as they do from Prometheus, and in the union of time pieces
    of the same series) are checked a chunk at a time and not kept; otherwise they are all
    made and sorted (Timsort)."""
    n = len(ckeys)
    escaped = [i for i, k in enumerate(ckeys) if b"\\" in k]
    of_json = [_sort_key_of(orjson.loads(ckeys[i])) for i in escaped]
    if any(k is None for k in of_json):  # a NUL in a name or value: tuples
        tkeys = [tuple(sorted(orjson.loads(k).items())) for k in ckeys]
        return sorted(range(n), key=tkeys.__getitem__)
    fixed = (escaped, cast(list[bytes], of_json))
    last = b""
    for c0 in range(0, n, SORT_KEY_CHUNK):
        keys = _sort_keys(ckeys, c0, fixed)
        if (c0 and keys[0] < last) or any(a > b for a, b in pairwise(keys)):
            break
        last = keys[-1]
    else:
        return list(range(n))
    # Out of order at chunk c0: the chunks before it are made again, the rest once.
    skeys: list[bytes] = []
    for c in range(0, n, SORT_KEY_CHUNK):
        skeys += keys if c == c0 else _sort_keys(ckeys, c, fixed)
    return sorted(range(n), key=skeys.__getitem__)


def _sort_keys(ckeys: list[bytes], c0: int, fixed: tuple[list[int], list[bytes]]) -> list[bytes]:
    """The sort keys of ckeys[c0:c0 + SORT_KEY_CHUNK], `fixed` giving those of the label
    sets with escapes (their indexes, ascending, and keys). A chunk at a time, since a 24 h
    panel's ~18,000 label sets are ~13 MB of JSON, and their joined copy, its sort-key block
    and the keys cut from it were ~40 MB at once."""
    chunk = ckeys[c0:c0 + SORT_KEY_CHUNK]
    raw = b"".join(chunk)
    lens = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
    ends = np.cumsum(lens)
    out = np.empty(len(raw), dtype=np.uint8)
    out_s = np.empty(len(chunk), dtype=np.int64)
    out_e = np.empty(len(chunk), dtype=np.int64)
    m = _sort_key_block(np.frombuffer(raw, dtype=np.uint8), ends - lens, ends, out, out_s, out_e)
    block = out[:m].tobytes()
    keys = [block[a:b] for a, b in zip(out_s.tolist(), out_e.tolist())]
    at, of_json = fixed
    for j in range(bisect_left(at, c0), bisect_left(at, c0 + len(chunk))):
        keys[at[j] - c0] = of_json[j]
    return keys


def _sort_key_of(labels: dict[str, str]) -> bytes | None:
    """`n1 NUL v1 NUL ...` of one label set (by name), UTF-8; None if a name or value holds
    a NUL (the key would not compare as labels.Compare)."""
    parts = []
    for name, value in sorted(labels.items()):
        if "\0" in name or "\0" in value:
            return None
        parts.append(name)
        parts.append(value)
    parts.append("")
    return "\0".join(parts).encode()


def concat(results: Sequence[QueryResult], *, keep_first: bool = False, lazy: bool = False) -> QueryResult:
    """Union of series by label set, samples in time order. The same (series, timestamp)
    in two pieces raises MergeConflict, or keeps the earliest piece's sample when
    `keep_first` (two backends holding the same series). `lazy`: a matrix of more than
    LAZY_ABOVE_SAMPLES samples whose pieces do not overlap in time comes back as a
    `Concatenation` (the same answer, gathered when read)."""
    if not results:
        raise MergeConflict("nothing to merge")
    rtype = merged_result_type(results)
    warnings, infos = merged_notes(results)
    if rtype in ("scalar", "string"):
        if len(results) != 1:
            raise MergeConflict(f"cannot concatenate {len(results)} {rtype} results")
        return results[0]

    gid_of: dict[bytes, int] = {}
    # The pieces' parsed label sets, if all of them have theirs (else the answer's are
    # parsed from its keys when read: a merge of raw series never reads them).
    labels: list[dict[str, str]] | None = []
    seg_gid, seg_start, seg_len, seg_first, seg_last, seg_piece = [], [], [], [], [], []
    prev_keys: list[bytes] | None = None
    gids = np.zeros(0, dtype=np.int64)
    increasing = True
    for p, r in enumerate(results):
        keys = r.canonical_keys()
        if prev_keys is None or keys is not prev_keys and keys != prev_keys:
            # One dict operation per series: a new key gets the next id.
            n0 = len(gid_of)
            setdefault = gid_of.setdefault
            gl = [setdefault(ck, len(gid_of)) for ck in keys]
            rl = r.parsed_labels()
            if rl is None:
                labels = None
            elif len(gid_of) > n0 and labels is not None:  # new ids: n0, n0+1, ... in order of first use
                nxt = n0
                for s, g in enumerate(gl):
                    if g == nxt:
                        labels.append(rl[s])
                        nxt += 1
            gids = np.array(gl, dtype=np.int64)
            prev_keys = keys
        # else: the same series in the same order as the previous piece (time pieces)
        counts = r.counts
        nz = counts > 0
        starts = r.offsets[:-1][nz]
        seg_gid.append(gids[nz])
        seg_start.append(starts)
        seg_len.append(counts[nz])
        bounds = r.series_bounds()
        if bounds is not None:  # known in time order (a packed cell, a lazy cut of a cell)
            seg_first.append(bounds[0][nz])
            seg_last.append(bounds[1][nz])
        else:
            seg_first.append(r.t_ms[starts])
            seg_last.append(r.t_ms[starts + counts[nz] - 1])
            increasing = increasing and bool(increasing_within(r.t_ms, r.offsets))
        seg_piece.append(np.full(len(starts), p, dtype=np.int64))

    ckeys = list(gid_of)
    order = order_by_labels(ckeys)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    g_all = np.concatenate(seg_gid)
    s_rank = rank[g_all]
    s_start = np.concatenate(seg_start)
    s_len = np.concatenate(seg_len)
    s_first = np.concatenate(seg_first)
    s_last = np.concatenate(seg_last)
    s_piece = np.concatenate(seg_piece)
    seg_order = np.lexsort((s_piece, s_first, s_rank))
    s_rank, s_start, s_len, s_piece, s_first, s_last = (
        s_rank[seg_order],
        s_start[seg_order],
        s_len[seg_order],
        s_piece[seg_order],
        s_first[seg_order],
        s_last[seg_order],
    )
    # Where each segment goes in the merged arrays: samples are copied from each piece
    # straight to their place (no concatenated copy of the pieces: the largest answers are
    # tens of megabytes per copy).
    total = int(s_len.sum())
    dest = np.zeros(len(s_len), dtype=np.int64)
    np.cumsum(s_len[:-1], out=dest[1:])

    n_keys = len(order)
    counts_by_rank = np.bincount(s_rank, weights=s_len, minlength=n_keys).astype(np.int64)
    offsets = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(counts_by_rank, out=offsets[1:])
    # Within a series the concatenated segments must be strictly increasing in time: each
    # piece's series are, so the merged ones are when each segment starts after the one
    # before it in the same series ends.
    if increasing and len(s_rank) > 1:
        same = s_rank[1:] == s_rank[:-1]
        increasing = not bool((same & (s_first[1:] <= s_last[:-1])).any())
    t: I64 | None = None
    v: F64 | None = None
    if not increasing:
        t, v = _gather(results, s_start, s_len, s_piece, dest, 0, total, _cursors(results))
        t, v, offsets = _resolve_overlaps(t, v, offsets, np.repeat(s_piece, s_len), keep_first)
        counts_by_rank = np.diff(offsets)

    keep = counts_by_rank > 0
    kept = [g for g, k in zip(order, keep.tolist()) if k]
    if not keep.all():
        offsets = np.concatenate([[0], offsets[1:][keep]]).astype(np.int64)
    out_labels = None if labels is None else [labels[g] for g in kept]
    out_keys = [ckeys[g] for g in kept]
    if t is None or v is None:
        # Several cells the cache reader keeps stay in them too: their encoded samples are
        # spliced (codec/json_splice.py). A cold answer's are gathered as before.
        if lazy and rtype == "matrix" and (total > LAZY_ABOVE_SAMPLES or (len(results) > 1 and all(map(_kept, results)))):
            return Concatenation(rtype, out_labels, offsets, warnings, infos, out_keys,  # type: ignore[arg-type]
                                 (list(results), s_start, s_len, s_piece, dest))
        t, v = _gather(results, s_start, s_len, s_piece, dest, 0, total, _cursors(results))
    return QueryResult(rtype, out_labels, offsets, t, v, warnings, infos, keys=out_keys)  # type: ignore[arg-type]


def _kept(r: QueryResult) -> bool:
    """Whether r is a cell the cache reader keeps, or was cut from one (`QueryResult.keeps_json`)."""
    if r.keeps_json:
        return True
    cell = r.origin[0]() if r.origin is not None else None
    return cell is not None and cell.keeps_json


def _gather(results: Sequence[QueryResult], s_start: I64, s_len: I64, s_piece: I64, dest: I64,
            a: int, b: int, cursors: dict[int, Any] | None = None) -> tuple[I64, F64]:
    """Samples a..b-1 of the merged arrays (whole segments), copied from the pieces (from
    `cursors[p]` for a piece whose samples are packed: `_cursors`)."""
    lo = int(np.searchsorted(dest, a, side="left"))
    hi = int(np.searchsorted(dest, b, side="left"))
    t = np.empty(b - a, dtype=np.int64)
    v = np.empty(b - a, dtype=np.float64)
    piece = s_piece[lo:hi]
    by_piece = np.argsort(piece, kind="stable") + lo
    bounds = np.searchsorted(piece[by_piece - lo], np.arange(len(results) + 1), side="left").tolist()
    for p, r in enumerate(results):
        mine = by_piece[bounds[p]:bounds[p + 1]]
        if not len(mine):
            continue
        cursor = cursors.get(p) if cursors else None
        if cursor is None:
            _copy_segments(s_start[mine], s_len[mine], dest[mine] - a, r.t_ms, r.value, t, v)
            continue
        starts = s_start[mine]
        t_src, v_src, base = cursor.rows(int(starts.min()), int((starts + s_len[mine]).max()))
        _copy_segments(starts - base, s_len[mine], dest[mine] - a, t_src, v_src, t, v)
    return t, v


def _cursors(results: Sequence[QueryResult]) -> dict[int, Any]:
    """A cursor per piece whose samples are packed: read forward, a few batches at a time,
    as the merged series are gathered in order (the pieces' series are in that order)."""
    out = {}
    for p, r in enumerate(results):
        packed = r.packed_samples()
        if packed is not None:
            out[p] = packed.cursor()
    return out


_Parts = tuple[list[QueryResult], I64, I64, I64, I64]


class Concatenation(LazySamples):
    """`concat`'s answer with its samples still in its pieces (see the module docstring).
    Everything but `t_ms` and `value` is there at once; those two gather every sample the
    first time either is read."""

    def __init__(self, result_type: ResultType, labels: list[dict[str, str]] | None, offsets: I64,
                 warnings: list[str], infos: list[str], keys: list[bytes], parts: _Parts) -> None:
        super().__init__(result_type, labels, offsets, warnings, infos, keys)
        self._parts: _Parts | None = parts

    @property
    def parts(self) -> _Parts | None:
        """(pieces, start, length, piece, destination) of each run of samples, in answer
        order; None once gathered."""
        return self._parts

    @property
    def gathered(self) -> bool:
        """Whether its samples were gathered (and its pieces let go)."""
        return self.loaded

    def _load(self) -> tuple[I64, F64]:
        assert self._parts is not None
        pieces, s_start, s_len, s_piece, dest = self._parts
        samples = _gather(pieces, s_start, s_len, s_piece, dest, 0, self.n_samples, _cursors(pieces))
        self._parts = None
        return samples

    def sample_windows(self, max_samples: int) -> Iterator[tuple[int, int, I64, F64]]:
        """Gathered `max_samples` samples (whole series) at a time, unless already gathered."""
        parts = self._parts
        if parts is None:
            yield from super().sample_windows(max_samples)
            return
        pieces, s_start, s_len, s_piece, dest = parts
        offsets = self.offsets
        cursors = _cursors(pieces)
        for s0, s1 in self.window_bounds(max_samples):
            a, b = int(offsets[s0]), int(offsets[s1])
            t, v = _gather(pieces, s_start, s_len, s_piece, dest, a, b, cursors)
            yield s0, s1, t, v


def _resolve_overlaps(
    t: I64, v: npt.NDArray[np.float64], offsets: I64, piece: I64, keep_first: bool
) -> tuple[I64, npt.NDArray[np.float64], I64]:
    series = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((piece, t, series))
    t, v, series = t[order], v[order], series[order]
    dup = np.zeros(len(t), dtype=bool)
    dup[1:] = (np.diff(t) == 0) & (np.diff(series) == 0)
    if dup.any():
        if not keep_first:
            i = int(np.flatnonzero(dup)[0])
            raise MergeConflict(
                f"two pieces hold the same sample (series #{int(series[i])}, t_ms={int(t[i])})"
            )
        t, v, series = t[~dup], v[~dup], series[~dup]
    counts = np.bincount(series, minlength=len(offsets) - 1)
    new_offsets = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    return t, v, new_offsets

