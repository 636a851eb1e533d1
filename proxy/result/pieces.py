"""Cutting a range answer back into time pieces, exact on the step grid.

Fetch granularity is not cache granularity: the executor fetches several contiguous time
pieces in one backend call (or a whole split interval when only part of it was asked for)
and stores one entry per piece. A range query is evaluated independently at every grid
point, so the answer for a sub-range `[a, b]` of a fetched range is exactly the fetched
samples with `a <= t <= b` -- and a series without a sample there is not in it, as
Prometheus omits such series. An empty piece is a valid answer (an empty matrix).

    split_time(answer, [(a0, b0), (a1, b1), ...]) -> [answer cut to [a0, b0], ...]
    slice_time(answer, a, b)                       -> answer cut to [a, b]
    slice_time(cell, a, b, lazy=True)              -> the same, its samples copied when read

A lazy cut (`TimeCut`) is for the warm read path: a window's edge cells are cut for one
answer, and that answer is spliced from the cells' encoded samples (codec/json_splice.py),
so the cut's own samples are never read; it holds its cell (kept by the cache reader
anyway) until then.

Compiled: a binary search per series and bound, then one copy per piece; no temporary
array per sample. Samples out of time order within a series take the vectorised path.
Series order, label sets (and their formatted keys), warnings and infos are kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
from numba import njit

from .query_result import F64, LazySamples, QueryResult

__all__ = ["TimeCut", "iter_split_time", "slice_time", "split_time", "subsample"]

I64 = npt.NDArray[np.int64]


def slice_time(result: QueryResult, start_ms: int, end_ms: int, *, lazy: bool = False) -> QueryResult:
    """`result` (a matrix) restricted to samples with `start_ms <= t <= end_ms`. `lazy`: a
    `TimeCut`, whose samples are copied from `result` only when read (it holds `result`)."""
    if result.result_type != "matrix":
        raise ValueError(f"only a matrix can be cut by time, not a {result.result_type}")
    bounds = result.series_bounds()
    if bounds is not None:
        counts = result.counts > 0
        whole = not counts.any() or (int(bounds[0][counts].min()) >= start_ms
                                     and int(bounds[1][counts].max()) <= end_ms)
    else:
        t = result.t_ms
        whole = len(t) == 0 or (int(t.min()) >= start_ms and int(t.max()) <= end_ms)
    if whole:
        return result
    if lazy:
        cut = TimeCut.of(result, start_ms, end_ms)
        if cut is not None:
            return cut
    (piece,) = iter_split_time(result, [(start_ms, end_ms)], origin=True)
    return piece


class TimeCut(LazySamples):
    """`source` cut to a time range, series by series: the sample ranges [lo, hi) of the
    series it keeps; the samples are copied from `source` the first time they are read,
    then `source` is let go. Each series' first and last timestamp are known at once
    (`series_bounds`), and `origin` points at `source`, as an eager cut's does."""

    def __init__(self, source: QueryResult, kept: list[int], lo: I64, hi: I64, ckeys: list[bytes]) -> None:
        offsets = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=offsets[1:])
        super().__init__(source.result_type, source.labels_of(kept), offsets, list(source.warnings),
                         list(source.infos), [ckeys[s] for s in kept])
        self._source: QueryResult | None = source
        self._lo = lo
        self._hi = hi
        t = source.t_ms
        self._bounds = (t[lo], t[hi - 1]) if len(kept) else (lo, lo)
        self.origin = (weakref.ref(source), lo)

    @classmethod
    def of(cls, source: QueryResult, start_ms: int, end_ms: int) -> TimeCut | None:
        """The cut, or None when a series' timestamps do not increase (cut eagerly then)."""
        t = np.ascontiguousarray(source.t_ms, dtype=np.int64)
        offsets = np.ascontiguousarray(source.offsets, dtype=np.int64)
        lo = np.empty((1, source.n_series), dtype=np.int64)
        hi = np.empty((1, source.n_series), dtype=np.int64)
        if source.series_bounds() is not None:
            # In time order, checked when it was decoded: the binary searches alone (a day cell
            # answering a day's hour pieces is cut 23 times; checking its 184 k samples each
            # time was most of the cut).
            _cut_points_in_order(offsets, t, start_ms, end_ms, lo[0], hi[0])
        elif not _cut_points(offsets, t, np.array([start_ms]), np.array([end_ms]), lo, hi):
            return None
        keep = np.flatnonzero(hi[0] > lo[0])
        ckeys = source.canonical_keys() if source.n_series else []
        return cls(source, keep.tolist(), lo[0][keep], hi[0][keep], ckeys)

    def series_bounds(self) -> tuple[I64, I64] | None:
        return self._bounds

    def _load(self) -> tuple[I64, F64]:
        source = self._source
        assert source is not None
        t = np.empty(self.n_samples, dtype=np.int64)
        v = np.empty(self.n_samples, dtype=np.float64)
        _copy_ranges(self._lo, self._hi, self.offsets, np.ascontiguousarray(source.t_ms, dtype=np.int64),
                     np.ascontiguousarray(source.value, dtype=np.float64), t, v)
        self._source = None  # the origin still points at it, weakly
        return t, v


def split_time(result: QueryResult, bounds: Sequence[tuple[int, int]]) -> list[QueryResult]:
    """`result` (a matrix) cut into one answer per `(start_ms, end_ms)` of `bounds`.

    `bounds` must be sorted and disjoint; samples outside every bound are dropped."""
    return list(iter_split_time(result, bounds))


def iter_split_time(result: QueryResult, bounds: Sequence[tuple[int, int]], *,
                    origin: bool = False) -> Iterator[QueryResult]:
    """`split_time`, one piece at a time (each copied when it is asked for: a caller that
    packs each piece before the next holds one unpacked piece, not all of them).
    `origin`: each piece remembers (weakly) `result` and where its series start in it
    (`QueryResult.origin`), so that an encoder splices `result`'s encoded samples."""
    if result.result_type != "matrix":
        raise ValueError(f"only a matrix can be cut by time, not a {result.result_type}")
    n = len(bounds)
    if n == 0:
        return
    starts = np.fromiter((b[0] for b in bounds), dtype=np.int64, count=n)
    ends = np.fromiter((b[1] for b in bounds), dtype=np.int64, count=n)
    if np.any(ends < starts) or np.any(starts[1:] <= ends[:-1]):
        raise ValueError("bounds must be sorted, disjoint and non-empty")
    t = np.ascontiguousarray(result.t_ms, dtype=np.int64)
    offsets = np.ascontiguousarray(result.offsets, dtype=np.int64)
    lo = np.empty((n, result.n_series), dtype=np.int64)
    hi = np.empty((n, result.n_series), dtype=np.int64)
    if not _cut_points(offsets, t, starts, ends, lo, hi):
        yield from _split_unsorted(result, starts, ends)
        return
    ckeys = result.canonical_keys() if result.n_series else []
    v = np.ascontiguousarray(result.value, dtype=np.float64)
    for j in range(n):
        counts = hi[j] - lo[j]
        keep = np.flatnonzero(counts)
        new_offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(counts[keep], out=new_offsets[1:])
        tj = np.empty(int(new_offsets[-1]), dtype=np.int64)
        vj = np.empty(len(tj), dtype=np.float64)
        _copy_ranges(lo[j][keep], hi[j][keep], new_offsets, t, v, tj, vj)
        piece = _with_series(result, keep.tolist(), new_offsets, tj, vj, ckeys)
        if origin:
            # Weakly: a piece must not keep a whole fetched answer alive (issue 15).
            piece.origin = (weakref.ref(result), lo[j][keep])
        yield piece
        del tj, vj


@njit(cache=True, nogil=True)
def _cut_points(offsets, t, starts, ends, lo, hi):  # type: ignore[no-untyped-def]
    """Per bound j and series s, the sample range [lo, hi) of s inside bound j, by binary
    search in each series (timestamps increase within a series). False, and nothing
    meaningful written, if some series' timestamps do not increase."""
    for s in range(len(offsets) - 1):
        for i in range(offsets[s] + 1, offsets[s + 1]):
            if t[i] <= t[i - 1]:
                return False
    for j in range(len(starts)):
        _cut_points_in_order(offsets, t, starts[j], ends[j], lo[j], hi[j])
    return True


@njit(cache=True, nogil=True)
def _cut_points_in_order(offsets, t, start, end, lo, hi):  # type: ignore[no-untyped-def]
    """`_cut_points` for one bound of samples known to be in time order within each series."""
    for s in range(len(offsets) - 1):
        a = offsets[s]
        seg = t[a:offsets[s + 1]]
        lo[s] = a + np.searchsorted(seg, start, side="left")
        hi[s] = a + np.searchsorted(seg, end, side="right")


@njit(cache=True, nogil=True)
def _copy_ranges(lo, hi, offsets, t, v, t_out, v_out):  # type: ignore[no-untyped-def]
    for k in range(len(lo)):
        o = offsets[k]
        for i in range(lo[k], hi[k]):
            t_out[o] = t[i]
            v_out[o] = v[i]
            o += 1


def _split_unsorted(result: QueryResult, starts: I64, ends: I64) -> list[QueryResult]:
    """split_time for samples not in time order within a series: per sample, vectorised
    (one stable sort of the sample indices by piece)."""
    n = len(starts)
    t = result.t_ms
    piece = np.searchsorted(starts, t, side="right") - 1
    inside = piece >= 0
    inside[inside] &= t[inside] <= ends[piece[inside]]
    idx = np.flatnonzero(inside)
    piece_of = piece[idx]
    # Stable: within a piece, samples stay in series order, then time order.
    order = np.argsort(piece_of, kind="stable")
    idx = idx[order]
    piece_of = piece_of[order]
    cuts = np.searchsorted(piece_of, np.arange(n + 1), side="left")
    series_of = result.series[idx] if len(idx) else np.zeros(0, dtype=np.int32)
    ckeys = result.canonical_keys() if result.n_series else []
    out: list[QueryResult] = []
    for j in range(n):
        a, b = int(cuts[j]), int(cuts[j + 1])
        out.append(_take(result, idx[a:b], series_of[a:b], ckeys))
    return out


def subsample(result: QueryResult, start_ms: int, end_ms: int, step_ms: int) -> QueryResult:
    """`result` (a matrix on a finer grid that holds every point of this one) restricted to
    the grid `start_ms + k * step_ms` within `[start_ms, end_ms]`: a range query is
    evaluated independently at each grid point, so this is exactly the coarser query's
    answer (series left without a sample are dropped, as Prometheus omits them)."""
    if result.result_type != "matrix":
        raise ValueError(f"only a matrix can be subsampled, not a {result.result_type}")
    t = result.t_ms
    idx = np.flatnonzero((t >= start_ms) & (t <= end_ms) & ((t - start_ms) % step_ms == 0))
    series_of = result.series[idx] if len(idx) else np.zeros(0, dtype=np.int32)
    return _take(result, idx, series_of, result.canonical_keys() if result.n_series else [])


def _take(result: QueryResult, idx: I64, series_of: npt.NDArray[np.int32], ckeys: list[bytes]) -> QueryResult:
    counts = np.bincount(series_of, minlength=result.n_series).astype(np.int64)
    keep = np.flatnonzero(counts)
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    return _with_series(result, keep.tolist(), offsets, result.t_ms[idx], result.value[idx], ckeys)


def _with_series(result: QueryResult, kept: list[int], offsets: I64, t: I64, v: npt.NDArray[np.float64],
                 ckeys: list[bytes]) -> QueryResult:
    """A result of `result`'s series `kept` (in order) with these samples."""
    return QueryResult(result.result_type, result.labels_of(kept), offsets, t, v, list(result.warnings),
                       list(result.infos), keys=[ckeys[s] for s in kept])
