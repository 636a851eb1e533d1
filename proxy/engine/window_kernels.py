"""Compiled per-window loops of PromQL's range functions, transcribed from Prometheus v2.42.0
promql/functions.go (and the window walk of promql/engine.go), operation for operation, so
that results are bit-equal to Prometheus's wherever Go's arithmetic is deterministic.

    run(code, offsets, t, v, eval_ms, range_ms, offset_ms, range_s, p0, p1)
        -> (state int8[n_series * n_steps], value float64[n_series * n_steps])
    window_bounds(offsets, t, eval_ms, range_ms, offset_ms)
        -> (win_lo, win_hi int64[n_series * n_steps])

Cell (series s, step k) is at s * n_steps + k. `_window` is the one window walk of the
engine: `run` walks with it as it goes, and `window_bounds` gives its [lo, hi) of every cell
to the kernels of window_lanes.py and quantile.py. The window of step k is
[eval_ms[k] - offset_ms - range_ms, eval_ms[k] - offset_ms], closed on both ends (2.42;
Prometheus 3 made it left-open). State 0: no sample in the window (Prometheus does not call
the function), 1: called, no output point (e.g. rate over one sample), 2: output point
`value`.

Floating point: every function here is compiled without fast-math (LLVM then neither
reassociates nor contracts a*b+c into an FMA, as Go does not on amd64), and with numpy's
error model (x/0 is Inf or NaN, as in Go, instead of Python's ZeroDivisionError).

The functions whose every step depends on the one before (avg, sum, stddev, stdvar, deriv,
predict_linear, holt_winters) are in window_lanes.py: Go's loops, four windows interleaved.

Exact shortcuts (same result as Go's loop, less work): counter resets inside a rate window
are found through a next-reset index (their values are still added in window order);
changes()/resets() count through prefix sums of integer flags. quantile_over_time is in
quantile.py, beside the one quantile() the aggregation uses too.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from proxy.engine.window_codes import (
    CHANGES,
    COUNT_OVER_TIME,
    DELTA,
    IDELTA,
    INCREASE,
    IRATE,
    LAST_OVER_TIME,
    MAX_OVER_TIME,
    MIN_OVER_TIME,
    PRESENT_OVER_TIME,
    RATE,
    RESETS,
)

__all__ = ["run", "window_bounds"]


_jit = njit(cache=True, nogil=True, error_model="numpy")
_jit_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")


@_jit
def _extrapolated(t, v, lo, hi, ts, range_ms, offset_ms, range_s, counter, is_rate, nxt):  # type: ignore[no-untyped-def]
    """extrapolatedRate (floats): rate, increase, delta."""
    n = hi - lo
    result = v[hi - 1] - v[lo]
    if counter:
        r = nxt[lo + 1]
        while r < hi:  # the resets in window order: resultValue += prevValue
            result += v[r - 1]
            r = nxt[r + 1]
    range_start = ts - (range_ms + offset_ms)
    range_end = ts - offset_ms
    to_start = float(t[lo] - range_start) / 1000
    to_end = float(range_end - t[hi - 1]) / 1000
    sampled = float(t[hi - 1] - t[lo]) / 1000
    avg_dur = sampled / float(n - 1)
    if counter and result > 0 and v[lo] >= 0:
        to_zero = sampled * (v[lo] / result)
        if to_zero < to_start:
            to_start = to_zero
    threshold = avg_dur * 1.1
    interval = sampled
    if to_start < threshold:
        interval += to_start
    else:
        interval += avg_dur / 2
    if to_end < threshold:
        interval += to_end
    else:
        interval += avg_dur / 2
    factor = interval / sampled
    if is_rate:
        factor /= range_s
    return result * factor


@_jit
def _instant(t, v, lo, hi, is_rate):  # type: ignore[no-untyped-def]
    """instantValue: irate, idelta. NaN: no output."""
    last = v[hi - 1]
    prev = v[hi - 2]
    if is_rate and last < prev:
        result = last
    else:
        result = last - prev
    dt = t[hi - 1] - t[hi - 2]
    if dt == 0:
        return math.nan, False
    if is_rate:
        result /= float(dt) / 1000
    return result, True


@_jit
def _min_max(v, lo, hi, is_min):  # type: ignore[no-untyped-def]
    m = v[lo]
    for j in range(lo, hi):
        x = v[j]
        if (x < m if is_min else x > m) or math.isnan(m):
            m = x
    return m


@_jit
def _series_aux(code, offsets, v):  # type: ignore[no-untyped-def]
    """Per sample: `nxt[j]` the first counter reset at or after j (its series' end if none;
    a reset at r: v[r] < v[r-1]); `pre[j]` the number of changes()/resets() flags at the
    samples after its series' first up to j."""
    nxt = np.empty(len(v) + 1 if code <= INCREASE else 0, dtype=np.int64)
    pre = np.zeros(len(v) if code == CHANGES or code == RESETS else 0, dtype=np.int64)
    for s in range(len(offsets) - 1):
        a, b = offsets[s], offsets[s + 1]
        if code <= INCREASE:
            nxt[b] = b
            following = b
            for j in range(b - 1, a, -1):
                if v[j] < v[j - 1]:
                    following = j
                nxt[j] = following
            if b > a:
                nxt[a] = following
        elif code == CHANGES or code == RESETS:
            acc = 0
            for j in range(a + 1, b):
                cur, prev = v[j], v[j - 1]
                if code == CHANGES:
                    if cur != prev and not (math.isnan(cur) and math.isnan(prev)):
                        acc += 1
                elif cur < prev:
                    acc += 1
                pre[j] = acc
    return nxt, pre


@_jit_inline
def _window(t, b, lo, hi, dlo, dhi, maxt, range_ms):  # type: ignore[no-untyped-def]
    """The window walk: the samples [lo, hi) of the window ending at `maxt` (eval time -
    offset), from the previous step's [lo, hi) of a series whose samples end at b, and how
    far each end moved. Prometheus v2.42 promql/engine.go matrixIterSlice keeps the previous
    window's points at or after mint (it drops `out[drop].T < mint`) and appends the points
    up to maxt: the window is [maxt - range, maxt], closed on both ends. Both ends only move
    forward (the eval times ascend), so a series' walk is linear in its samples.

    Each end first tries to jump by as far as it moved the step before (`dlo`, `dhi`): the
    samples jumped over are then known to be out of the window (or in it) from the last one
    alone, the times being increasing; with regular samples the jump lands exactly and the
    walk costs a few comparisons a step instead of one per sample, none mispredicted."""
    lo0, hi0, mint = lo, hi, maxt - range_ms
    if dlo > 0 and lo + dlo <= b and t[lo + dlo - 1] < mint:
        lo += dlo
    while lo < b and t[lo] < mint:
        lo += 1
    hi = max(hi, lo)
    if dhi > 0 and hi + dhi <= b and t[hi + dhi - 1] <= maxt:
        hi += dhi
    while hi < b and t[hi] <= maxt:
        hi += 1
    return lo, hi, lo - lo0, hi - hi0


@_jit
def window_bounds(offsets, t, eval_ms, range_ms, offset_ms):  # type: ignore[no-untyped-def]
    """The samples [win_lo[cell], win_hi[cell]) of every cell's window, for the kernels of the
    other files (window_lanes.run_serial, quantile.run_quantile_over_time): a compiled call
    into this file from theirs would keep a stale numba cache when this file changes."""
    n_steps = len(eval_ms)
    win_lo = np.empty((len(offsets) - 1) * n_steps, dtype=np.int64)
    win_hi = np.empty((len(offsets) - 1) * n_steps, dtype=np.int64)
    for s in range(len(offsets) - 1):
        lo, hi, dlo, dhi = offsets[s], offsets[s], 0, 0
        for k in range(n_steps):
            lo, hi, dlo, dhi = _window(t, offsets[s + 1], lo, hi, dlo, dhi, eval_ms[k] - offset_ms, range_ms)
            win_lo[s * n_steps + k] = lo
            win_hi[s * n_steps + k] = hi
    return win_lo, win_hi


@_jit
def run(code, offsets, t, v, eval_ms, range_ms, offset_ms, range_s, p0, p1):  # type: ignore[no-untyped-def]
    """Every code but window_codes.SERIAL (window_lanes.run_serial) and QUANTILE_OVER_TIME
    (quantile.run_quantile_over_time). The walk is done here, with the function's work (the
    two overlap in the CPU: rate's arithmetic waits on its divisions, the walk on loads)."""
    n_series = len(offsets) - 1
    n_steps = len(eval_ms)
    state = np.zeros(n_series * n_steps, dtype=np.int8)
    out = np.zeros(n_series * n_steps, dtype=np.float64)
    nxt, pre = _series_aux(code, offsets, v)
    for s in range(n_series):
        lo, hi, dlo, dhi = offsets[s], offsets[s], 0, 0
        for k in range(n_steps):
            lo, hi, dlo, dhi = _window(t, offsets[s + 1], lo, hi, dlo, dhi, eval_ms[k] - offset_ms, range_ms)
            if hi == lo:
                continue
            cell = s * n_steps + k
            state[cell] = 1
            n = hi - lo
            if n < 2 and code <= IDELTA:
                continue  # rate and friends: two samples
            ts = eval_ms[k]
            ok = True
            if code <= DELTA:
                val = _extrapolated(t, v, lo, hi, ts, range_ms, offset_ms, range_s, code <= INCREASE, code == RATE, nxt)
            elif code <= IDELTA:
                val, ok = _instant(t, v, lo, hi, code == IRATE)
            elif code == MIN_OVER_TIME or code == MAX_OVER_TIME:
                val = _min_max(v, lo, hi, code == MIN_OVER_TIME)
            elif code == COUNT_OVER_TIME:
                val = float(n)
            elif code == LAST_OVER_TIME:
                val = v[hi - 1]
            elif code == PRESENT_OVER_TIME:
                val = 1.0
            else:  # changes, resets: the flags of samples lo+1 .. hi-1
                val = float(pre[hi - 1] - pre[lo])
            if ok:
                state[cell] = 2
                out[cell] = val
    return state, out
