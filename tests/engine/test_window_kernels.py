"""proxy/engine/window_kernels.py (rate, increase, delta, irate, idelta, min/max/count/last/
present_over_time, changes, resets) through the entry point the evaluator calls,
windows.eval_range_function, so that a rework of the shared window walk keeps these tests.

Expected values come from Prometheus v2.42.0's source: promql/engine.go matrixIterSlice (the
window of eval time t is [t - offset - range, t - offset], closed on both ends: it keeps
`t >= mint` and reads up to maxt; Prometheus 3 made it left-open), promql/functions.go
extrapolatedRate, instantValue, funcChanges, funcResets and aggrOverTime's min/max/count/last/
present. They are worked out by hand below, or by `_reference`, a plain transcription that
selects every window from scratch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.windows import eval_range_function
from proxy.result import QueryResult

NAN, INF = math.nan, math.inf
KERNEL_FUNCTIONS = ("rate", "increase", "delta", "irate", "idelta", "min_over_time", "max_over_time",
                    "count_over_time", "last_over_time", "present_over_time", "changes", "resets")


def _series(values: Sequence[float], times: Sequence[int], **labels: str) -> QueryResult:
    return QueryResult.from_series("matrix", [({"__name__": "m", **labels}, list(times), list(values))])


def _at(func: str, raw: QueryResult, t: int, range_ms: int, offset_ms: int = 0) -> list[float]:
    """The function's values at one eval time (all series), [] when no point."""
    out = eval_range_function(func, [], raw, np.array([t], dtype=np.int64), range_ms, offset_ms=offset_ms)
    return out.value.tolist()


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


# -- the window ----------------------------------------------------------------------------


def test_the_window_is_closed_on_both_ends() -> None:
    raw = _series([1.0, 2.0, 3.0], [10_000, 20_000, 30_000])
    # [30s - 20s, 30s] holds the samples at 10s (on the left edge) and 30s (on the right edge).
    assert _at("count_over_time", raw, 30_000, 20_000) == [3.0]
    assert _at("min_over_time", raw, 30_000, 20_000) == [1.0]
    assert _at("last_over_time", raw, 30_000, 20_000) == [3.0]
    # One ms later the left edge passes 10s; one ms earlier the right edge misses 30s.
    assert _at("count_over_time", raw, 30_001, 20_000) == [2.0]
    assert _at("last_over_time", raw, 29_999, 20_000) == [2.0]
    # offset moves both edges back: at 50s, offset 20s, range 20s -> [10s, 30s] again.
    assert _at("count_over_time", raw, 50_000, 20_000, 20_000) == [3.0]
    assert _at("min_over_time", raw, 50_001, 20_000, 20_000) == [2.0]
    # No sample in the window: Prometheus does not call the function, no point at all.
    assert _at("present_over_time", raw, 60_000, 20_000, 5_000) == []


def test_windows_of_one_series_do_not_see_the_next() -> None:
    raw = QueryResult.from_series("matrix", [
        ({"s": "a"}, [0, 10_000], [1.0, 2.0]),
        ({"s": "b"}, [], []),
        ({"s": "c"}, [30_000, 40_000], [5.0, 7.0]),
    ])
    out = eval_range_function("count_over_time", [], raw, np.array([10_000, 20_000, 40_000]), 10_000)
    assert out.to_pylist() == [({"s": "a"}, [10_000, 20_000], [2.0, 1.0]), ({"s": "c"}, [40_000], [2.0])]


# -- rate, increase, delta (extrapolatedRate) -----------------------------------------------


def test_extrapolation_by_half_an_interval_and_to_the_counter_zero() -> None:
    # 2 then 12 at 20s and 30s, window [0, 60s]: sampled 10s, average 10s, threshold 11s.
    # Start: 20s away (>= 11s) -> half an interval, 5s; end: 30s away -> 5s.
    # delta: 10 * (10 + 5 + 5) / 10 = 20.
    # increase: the counter reaches zero 10 * (2 / 10) = 2s before its first sample, under
    # the 20s to the window start, so 2s is taken (< 11s: extrapolate by it): 10 * 17 / 10.
    raw = _series([2.0, 12.0], [20_000, 30_000])
    assert _at("delta", raw, 60_000, 60_000) == [20.0]
    assert _at("increase", raw, 60_000, 60_000) == [17.0]
    assert _at("rate", raw, 60_000, 60_000) == [17.0 / 60.0]  # factor /= range in seconds


def test_extrapolation_to_the_edges_when_close() -> None:
    # 10, 20, 30, 40 at 5s..35s, window [0, 40s]: 5s to each edge (< 11s), interval 40s.
    # increase: to zero 30 * (10 / 30) = 10s, not under 5s. Both 30 * 40 / 30.
    raw = _series([10.0, 20.0, 30.0, 40.0], [5_000, 15_000, 25_000, 35_000])
    want = 30.0 * ((30.0 + 5.0 + 5.0) / 30.0)
    assert _at("delta", raw, 40_000, 40_000) == [want]
    assert _at("increase", raw, 40_000, 40_000) == [want]
    assert _at("rate", raw, 40_000, 40_000) == [want / 40.0]


def test_resets_count_only_inside_the_window() -> None:
    raw = _series([10.0, 2.0, 4.0, 6.0], [0, 10_000, 20_000, 30_000])
    # [10s, 30s]: 2, 4, 6, no reset (the drop from 10 is before the window); edges on samples.
    assert _at("increase", raw, 30_000, 20_000) == [4.0]
    assert _at("resets", raw, 30_000, 20_000) == [0.0]
    # [0, 30s]: the reset adds the value before it: 6 - 10 + 10.
    assert _at("increase", raw, 30_000, 30_000) == [6.0]
    assert _at("resets", raw, 30_000, 30_000) == [1.0]
    # delta knows no resets: 6 - 10.
    assert _at("delta", raw, 30_000, 30_000) == [-4.0]


def test_a_counter_starting_below_zero_or_falling_is_not_cut_at_zero() -> None:
    # The zero-point rule needs resultValue > 0 and a first value >= 0.
    falling = _series([5.0, 3.0], [20_000, 30_000])  # a reset: 3 - 5 + 5 = 3 > 0, first 5
    # to zero: 10 * (5 / 3) = 16.7s < 20s to the start -> 16.7s, over the 11s threshold: +5s.
    assert _at("increase", falling, 60_000, 60_000) == [3.0 * 2.0]
    negative = _series([-4.0, 6.0], [20_000, 30_000])  # first value < 0: no zero point
    assert _at("increase", negative, 60_000, 60_000) == [10.0 * 2.0]


def test_fewer_than_two_samples_give_no_point() -> None:
    raw = _series([1.0], [10_000])
    for func in ("rate", "increase", "delta", "irate", "idelta"):
        assert _at(func, raw, 10_000, 60_000) == [], func


# -- irate, idelta (instantValue) ----------------------------------------------------------


def test_irate_and_idelta_read_the_last_two_samples() -> None:
    raw = _series([1.0, 50.0, 60.0, 20.0], [0, 10_000, 20_000, 25_000])
    assert _at("idelta", raw, 20_000, 60_000) == [10.0]
    assert _at("irate", raw, 20_000, 60_000) == [10.0 / 10.0]
    # A drop is a reset for irate (the last value over the interval), not for idelta.
    assert _at("irate", raw, 25_000, 60_000) == [20.0 / 5.0]
    assert _at("idelta", raw, 25_000, 60_000) == [-40.0]


def test_two_samples_at_one_time_give_no_point() -> None:
    # instantValue: sampledInterval == 0 -> no output, instead of a division by zero.
    raw = _series([1.0, 3.0], [10_000, 10_000])
    assert _at("irate", raw, 10_000, 60_000) == []
    assert _at("idelta", raw, 10_000, 60_000) == []


# -- min/max/count/last/present, changes, resets (aggrOverTime & co) -------------------------


@pytest.mark.parametrize(("values", "lo", "hi"), [
    ([NAN, INF, -INF, 3.0], -INF, INF),  # NaN first is replaced by whatever comes next
    ([3.0, NAN], 3.0, 3.0),  # a later NaN never wins
    ([NAN, NAN, 2.0], 2.0, 2.0),
    ([NAN], NAN, NAN),
    ([-0.0, 0.0], -0.0, -0.0),  # 0 < -0 is false: the first zero stays (max, too)
])
def test_min_and_max_over_time(values: list[float], lo: float, hi: float) -> None:
    raw = _series(values, [1_000 * (i + 1) for i in range(len(values))])
    t = 1_000 * len(values)
    mn, mx = _at("min_over_time", raw, t, 60_000), _at("max_over_time", raw, t, 60_000)
    assert _same(mn, [lo]) and _same(mx, [hi])
    if lo == 0:
        assert math.copysign(1, mn[0]) == math.copysign(1, mx[0]) == -1


def test_changes_and_resets_with_nan() -> None:
    # changes: a != b and not both NaN -> 1->NaN, NaN->1, 1->0, 0->2 = 4.
    # resets: b < a -> only 1->0 (comparisons with NaN are false) = 1.
    values = [1.0, NAN, NAN, 1.0, 0.0, 0.0, 2.0]
    raw = _series(values, [1_000 * (i + 1) for i in range(len(values))])
    assert _at("changes", raw, 7_000, 60_000) == [4.0]
    assert _at("resets", raw, 7_000, 60_000) == [1.0]


def test_changes_ignore_the_step_into_the_window() -> None:
    # [10s, 30s] holds 5, 5, 5: the change 0 -> 5 belongs to a pair that straddles the edge.
    raw = _series([0.0, 5.0, 5.0, 5.0], [0, 10_000, 20_000, 30_000])
    assert _at("changes", raw, 30_000, 20_000) == [0.0]
    assert _at("changes", raw, 30_000, 30_000) == [1.0]


def test_last_over_time_keeps_a_nan_and_count_counts_it() -> None:
    raw = _series([1.0, NAN], [1_000, 2_000])
    assert _same(_at("last_over_time", raw, 2_000, 5_000), [NAN])
    assert _at("count_over_time", raw, 2_000, 5_000) == [2.0]
    assert _at("present_over_time", raw, 2_000, 5_000) == [1.0]


# -- many steps against a from-scratch reference --------------------------------------------


def _reference(func: str, pts: list[tuple[int, float]], ts: int, range_ms: int, offset_ms: int) -> float | None:
    """functions.go of v2.42 for one window (already selected), None where Go adds no point."""
    vs = [v for _, v in pts]
    n = len(vs)
    if func in ("rate", "increase", "delta"):
        if n < 2:
            return None
        counter = func != "delta"
        result = vs[-1] - vs[0]
        if counter:
            for prev, cur in zip(vs, vs[1:]):
                if cur < prev:
                    result += prev
        to_start = float(pts[0][0] - (ts - (range_ms + offset_ms))) / 1000
        to_end = float((ts - offset_ms) - pts[-1][0]) / 1000
        sampled = float(pts[-1][0] - pts[0][0]) / 1000
        avg = sampled / float(n - 1)
        if counter and result > 0 and vs[0] >= 0:
            to_start = min(to_start, sampled * (vs[0] / result))
        interval = sampled + (to_start if to_start < avg * 1.1 else avg / 2)
        interval += to_end if to_end < avg * 1.1 else avg / 2
        factor = interval / sampled
        if func == "rate":
            factor /= range_ms / 1000  # whole seconds here: Duration.Seconds() is exact
        return result * factor
    if func in ("irate", "idelta"):
        if n < 2 or pts[-1][0] == pts[-2][0]:
            return None
        if func == "idelta":
            return vs[-1] - vs[-2]
        r = vs[-1] if vs[-1] < vs[-2] else vs[-1] - vs[-2]
        return r / (float(pts[-1][0] - pts[-2][0]) / 1000)
    if func in ("min_over_time", "max_over_time"):
        m = vs[0]
        for v in vs:
            if (v < m if func == "min_over_time" else v > m) or math.isnan(m):
                m = v
        return m
    if func == "count_over_time":
        return float(n)
    if func == "last_over_time":
        return vs[-1]
    if func == "present_over_time":
        return 1.0
    if func == "changes":
        return float(sum(1 for a, b in zip(vs, vs[1:]) if b != a and not (math.isnan(a) and math.isnan(b))))
    assert func == "resets"
    return float(sum(1 for a, b in zip(vs, vs[1:]) if b < a))


@pytest.mark.parametrize("func", KERNEL_FUNCTIONS)
def test_sliding_windows_with_samples_on_the_edges(func: str) -> None:
    """Samples every 10s (some missing, a counter with resets, NaN and +-Inf), steps every 10s
    with a 30s range: most windows have a sample exactly on each edge."""
    rnd = np.random.default_rng(29)
    series = []
    for i in range(4):
        t = [k * 10_000 for k in range(60) if rnd.random() > 0.2]
        if i % 2 == 0:
            v = np.cumsum(rnd.integers(0, 9, size=len(t))).astype(float)
            v[len(v) // 2:] -= v[len(v) // 2]  # a reset to zero half way
        else:
            v = rnd.choice([1.0, 2.0, 2.0, NAN, INF, -INF, -1.5], size=len(t))
        series.append(({"__name__": "m", "i": str(i)}, t, v.tolist()))
    raw = QueryResult.from_series("matrix", series)
    times = list(range(0, 620_000, 10_000))
    for off in (0, 15_000):
        got = eval_range_function(func, [], raw, np.array(times), 30_000, offset_ms=off).to_pylist()
        want = []
        for labels, ts_list, vals in raw.to_pylist():
            pts = list(zip(ts_list, vals))
            wt, wv = [], []
            for ts in times:
                window = [(t, v) for t, v in pts if ts - off - 30_000 <= t <= ts - off]
                value = _reference(func, window, ts, 30_000, off) if window else None
                if value is not None:
                    wt.append(ts)
                    wv.append(value)
            if wt:
                keep = labels if func == "last_over_time" else {k: v for k, v in labels.items() if k != "__name__"}
                want.append((keep, wt, wv))
        assert [(d, t) for d, t, _ in got] == [(d, t) for d, t, _ in want], (func, off)
        for (d, _, gv), (_, _, wv) in zip(got, want):
            assert _same(gv, wv), (func, off, d)


@pytest.mark.parametrize("func", ["count_over_time", "last_over_time", "rate", "changes"])
def test_windows_across_a_burst_and_a_gap(func: str) -> None:
    """Samples 100 ms apart, a 10 minute gap, then 30 s apart: from one step to the next a
    window edge moves by hundreds of samples, then by none, then by one -- however the walk
    steps its edges, each window must hold exactly the samples in [t - range, t]."""
    burst = [k * 100 for k in range(1_200)]
    sparse = [720_000 + k * 30_000 for k in range(20)]
    t = burst + sparse
    v = [float((k * 37) % 11) for k in range(len(t))]
    raw = _series(v, t)
    times = list(range(15_000, 1_350_000, 15_000))
    got = eval_range_function(func, [], raw, np.array(times), 60_000).to_pylist()
    pts = list(zip(t, v))
    wt, wv = [], []
    for ts in times:
        window = [(a, b) for a, b in pts if ts - 60_000 <= a <= ts]
        value = _reference(func, window, ts, 60_000, 0) if window else None
        if value is not None:
            wt.append(ts)
            wv.append(value)
    assert [(tt, vv) for _, ts_, vs in got for tt, vv in zip(ts_, vs)] == list(zip(wt, wv))
