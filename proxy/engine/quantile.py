"""The one quantile of the engine: Prometheus 2.42's promql/quantile.go `quantile()`, used by
the `quantile` aggregation (aggregate.py) and by `quantile_over_time` (its kernel is here
too, `run_quantile_over_time`, over window_kernels.window_bounds's windows, so that the
compiled calls stay in this file: numba's disk cache is keyed on the caller's file alone).

    quantile(q, nans, values)    quantile() over `nans` NaNs followed by `values`
    quantiles(q, v, starts)      the aggregation: one quantile per run of v, sorted here

quantile() sorts its input with sort.Sort(vectorByValueHeap), whose Less puts NaN before
everything; where a NaN lands is then up to Go's pdqsort. The callers keep that order:
quantile_over_time keeps its window's NaNs first (what the insertion sort Go uses on small
windows gives), the aggregation re-sorts a group holding a NaN with the pdqsort port
(aggregate.py). This function indexes the ranks of that order: the first `nans` are NaN,
the rest are `values`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["quantile", "quantiles", "run_quantile_over_time"]

_jit = njit(cache=True, nogil=True, error_model="numpy")


@_jit
def quantile(q, nans, values):  # type: ignore[no-untyped-def]
    """quantile.go quantile(q, values) over `nans` NaNs, then `values` (already in the order
    Go's sort leaves them)."""
    n = float(nans + len(values))
    if n == 0 or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    li, ui = int(lower), int(upper)
    a = math.nan if li < nans else values[li - nans]
    b = math.nan if ui < nans else values[ui - nans]
    return a * (1 - weight) + b * weight


@_jit
def quantiles(q, v, starts):  # type: ignore[no-untyped-def]
    """The `quantile` aggregation of each run [starts[r], starts[r+1]) of `v` at q[r], the run
    sorted ascending (exact for runs without NaN; the caller redoes the others)."""
    out = np.empty(len(starts) - 1)
    for r in range(len(starts) - 1):
        out[r] = quantile(q[r], 0, np.sort(v[starts[r]:starts[r + 1]]))
    return out


@_jit
def _insert(buf, m, x):  # type: ignore[no-untyped-def]
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi) >> 1
        if buf[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    for i in range(m, lo, -1):
        buf[i] = buf[i - 1]
    buf[lo] = x


@_jit
def _remove(buf, m, x):  # type: ignore[no-untyped-def]
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi) >> 1
        if buf[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    for i in range(lo, m - 1):
        buf[i] = buf[i + 1]


@_jit
def run_quantile_over_time(offsets, v, win_lo, win_hi, eval_ms, p0):  # type: ignore[no-untyped-def]
    """funcQuantileOverTime at every (series, step) over the windows [win_lo, win_hi) of
    window_kernels.window_bounds, with window_kernels.run's contract (state 0: empty window,
    2: a value). The window's non-NaN values stay sorted in a buffer that slides with the
    window (Go sorts each window; only the multiset reaches quantile())."""
    n_series = len(offsets) - 1
    n_steps = len(eval_ms)
    state = np.zeros(n_series * n_steps, dtype=np.int8)
    out = np.zeros(n_series * n_steps, dtype=np.float64)
    longest = 0
    for s in range(n_series):
        longest = max(longest, offsets[s + 1] - offsets[s])
    buf = np.empty(longest + 1, dtype=np.float64)
    for s in range(n_series):
        blo = bhi = offsets[s]  # buf[:m] holds the sorted non-NaN values of v[blo:bhi]
        m = 0
        for k in range(n_steps):
            cell = s * n_steps + k
            lo, hi = win_lo[cell], win_hi[cell]
            if hi == lo:
                continue
            if lo >= bhi or (lo - blo) + (hi - bhi) > 32:
                m = 0
                for j in range(lo, hi):
                    if not math.isnan(v[j]):
                        buf[m] = v[j]
                        m += 1
                buf[:m].sort()
            else:
                for j in range(blo, lo):
                    if not math.isnan(v[j]):
                        _remove(buf, m, v[j])
                        m -= 1
                for j in range(bhi, hi):
                    if not math.isnan(v[j]):
                        _insert(buf, m, v[j])
                        m += 1
            blo, bhi = lo, hi
            out[cell] = quantile(p0[k], hi - lo - m, buf[:m])
            state[cell] = 2
    return state, out
