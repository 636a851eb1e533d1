"""proxy/engine/window_lanes.py (avg/sum/stddev/stdvar_over_time, deriv, predict_linear,
holt_winters: the range functions whose every step depends on the one before) through the
entry point the evaluator calls, windows.eval_range_function, so that a rework of the shared
window walk keeps these tests.

Expected values follow Prometheus v2.42.0 promql/functions.go: kahanSumInc (Neumaier's
variant), funcAvgOverTime (with its Inf rules), funcSumOverTime, funcStdvarOverTime /
funcStddevOverTime, linearRegression (constY, interceptTime), funcDeriv (intercept at the first
sample), funcPredictLinear (intercept at the eval time), funcHoltWinters (calcTrendValue);
worked out by hand, or by `_reference`, which reads every window alone. The module runs four
windows in lock step, so the counts of windows below (1 to 9 per series, empty windows
between) fill the lanes fully, partly, and leave some idle."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.windows import eval_range_function
from proxy.result import QueryResult

NAN, INF = math.nan, math.inf
LANE_FUNCTIONS = ("avg_over_time", "sum_over_time", "stddev_over_time", "stdvar_over_time", "deriv",
                  "predict_linear", "holt_winters")
PARAMS: dict[str, list[float]] = {"predict_linear": [30.0], "holt_winters": [0.3, 0.6]}


def _series(values: Sequence[float], times: Sequence[int] | None = None) -> QueryResult:
    ts = list(times) if times is not None else [1_000 * (i + 1) for i in range(len(values))]
    return QueryResult.from_series("matrix", [({"__name__": "m"}, ts, list(values))])


def _last(func: str, values: Sequence[float], params: Sequence[float] | None = None,
          times: Sequence[int] | None = None) -> list[float]:
    """The function over one window holding every sample, at the last sample's time."""
    raw = _series(values, times)
    t = int(raw.t_ms[-1])
    out = eval_range_function(func, PARAMS.get(func, []) if params is None else list(params), raw,
                              np.array([t], dtype=np.int64), 600_000)
    return out.value.tolist()


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def _kahan(inc: float, s: float, c: float) -> tuple[float, float]:
    t = s + inc
    c += ((s - t) + inc) if abs(s) >= abs(inc) else ((inc - t) + s)
    return t, c


# -- by hand ---------------------------------------------------------------------------------


def test_sum_over_time_is_compensated() -> None:
    # A plain left-to-right sum gives 0 (1 is lost next to 1e16); Neumaier's compensation keeps it.
    assert ((1e16 + 1.0) - 1e16) == 0.0
    assert _last("sum_over_time", [1e16, 1.0, -1e16]) == [1.0]
    assert _last("sum_over_time", [INF, 1.0]) == [INF]  # an infinite sum is returned without c
    assert _same(_last("sum_over_time", [INF, -INF]), [NAN])


def test_avg_over_time_keeps_an_infinite_mean() -> None:
    assert _last("avg_over_time", [1.0, 2.0, 4.0, 5.0]) == [3.0]
    assert _last("avg_over_time", [INF, 1.0, INF]) == [INF]  # finite and same-sign Inf values skipped
    assert _last("avg_over_time", [-INF, 7.0]) == [-INF]
    assert _same(_last("avg_over_time", [INF, -INF]), [NAN])  # opposite signs: Inf - Inf
    assert _same(_last("avg_over_time", [INF, NAN]), [NAN])  # a NaN is not skipped
    assert _same(_last("avg_over_time", [NAN, 1.0]), [NAN])


def test_stddev_and_stdvar() -> None:
    vals = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]  # mean 5, squared deviations sum 32
    assert _last("stdvar_over_time", vals) == [4.0]
    assert _last("stddev_over_time", vals) == [2.0]
    assert _last("stdvar_over_time", [3.5]) == [0.0]  # one sample: 0, not NaN
    assert _same(_last("stddev_over_time", [1.0, INF]), [NAN])


def test_deriv_and_predict_linear_on_a_line() -> None:
    # y = 2 x + 1 with x in seconds: 3, 5, 7, 9 at 1s..4s.
    line = [3.0, 5.0, 7.0, 9.0]
    assert _last("deriv", line) == [2.0]
    # predict_linear intercepts at the eval time (4s, y = 9) and goes 30s on: 9 + 60.
    assert _last("predict_linear", line, [30.0]) == [69.0]
    assert _last("predict_linear", line, [-2.0]) == [5.0]


def test_regression_of_a_constant_series() -> None:
    # constY: slope 0, intercept the value; Inf: both NaN. NaN is never constant (NaN != NaN).
    assert _last("deriv", [5.0, 5.0, 5.0]) == [0.0]
    assert _last("predict_linear", [5.0, 5.0], [100.0]) == [5.0]
    assert _same(_last("predict_linear", [5.0, 5.0], [INF]), [NAN])  # 0 * Inf + 5
    assert _same(_last("deriv", [INF, INF]), [NAN])
    assert _same(_last("deriv", [NAN, NAN]), [NAN])


def test_holt_winters_by_hand() -> None:
    # s1 = 1, b = 3 - 1 = 2. i=1: x = 1.5, b stays 2 (calcTrendValue(0) = b), y = 0.5 * 3,
    # s1 = 3. i=2: x = 2, b = 0.5 * (3 - 1) + 0.5 * 2 = 2, y = 0.5 * (3 + 2), s1 = 4.5.
    assert _last("holt_winters", [1.0, 3.0, 4.0], [0.5, 0.5]) == [4.5]
    assert _last("holt_winters", [1.0, 3.0], [0.5, 0.5]) == [0.5 * 3.0 + 0.5 * (1.0 + 2.0)]


def test_two_samples_needed_for_a_regression_or_smoothing() -> None:
    for func in ("deriv", "predict_linear", "holt_winters"):
        assert _last(func, [7.0]) == [], func
    for func in ("avg_over_time", "sum_over_time", "stddev_over_time", "stdvar_over_time"):
        assert _last(func, [7.0]) != [], func


def test_deriv_intercepts_at_the_first_sample_not_at_zero() -> None:
    # Samples near 1.7e12 ms: an intercept at time 0 would lose the slope to rounding
    # (prometheus issue 2674); at the first sample x stays small and the slope is exact.
    t0 = 1_700_000_000_000
    out = _last("deriv", [1.0, 2.0, 3.0], times=[t0, t0 + 1_000, t0 + 2_000])
    assert out == [1.0]


# -- lanes against a from-scratch reference ----------------------------------------------------


def _reference(func: str, p: Sequence[float], pts: list[tuple[int, float]], ts: int) -> float | None:
    vs = [v for _, v in pts]
    n = len(vs)
    if func == "sum_over_time":
        s = c = 0.0
        for v in vs:
            s, c = _kahan(v, s, c)
        return s if math.isinf(s) else s + c
    if func == "avg_over_time":
        mean = c = count = 0.0
        for v in vs:
            count += 1
            if math.isinf(mean) and ((math.isinf(v) and (mean > 0) == (v > 0))
                                     or (not math.isinf(v) and not math.isnan(v))):
                continue
            mean, c = _kahan(v / count - mean / count, mean, c)
        return mean if math.isinf(mean) else mean + c
    if func in ("stddev_over_time", "stdvar_over_time"):
        count = mean = cm = aux = ca = 0.0
        for v in vs:
            count += 1
            d = v - (mean + cm)
            mean, cm = _kahan(d / count, mean, cm)
            aux, ca = _kahan(d * (v - (mean + cm)), aux, ca)
        var = (aux + ca) / count
        return math.sqrt(var) if func == "stddev_over_time" else var
    if n < 2:
        return None
    if func in ("deriv", "predict_linear"):
        at = pts[0][0] if func == "deriv" else ts
        const = all(v == vs[0] for v in vs[1:])
        if const:
            slope, icpt = (NAN, NAN) if math.isinf(vs[0]) else (0.0, vs[0])
        else:
            k = sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
            for t, y in pts:
                k += 1.0
                x = float(t - at) / 1e3
                sx, cx = _kahan(x, sx, cx)
                sy, cy = _kahan(y, sy, cy)
                sxy, cxy = _kahan(x * y, sxy, cxy)
                sx2, cx2 = _kahan(x * x, sx2, cx2)
            sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
            slope = (sxy - sx * sy / k) / (sx2 - sx * sx / k)
            icpt = sy / k - slope * sx / k
        return slope if func == "deriv" else slope * p[0] + icpt
    sf, tf = p
    s0, s1, b = 0.0, vs[0], vs[1] - vs[0]
    for i in range(1, n):
        x = sf * vs[i]
        if i - 1 != 0:
            b = tf * (s1 - s0) + (1 - tf) * b
        s0, s1 = s1, x + (1 - sf) * (s1 + b)
    return s1


@pytest.mark.parametrize("func", LANE_FUNCTIONS)
def test_every_lane_count_against_the_reference(func: str) -> None:
    """Series with 1..9 evaluated windows (a run of steps, then a gap of empty windows, then
    more), irregular spacing, and values with a wide range of magnitudes."""
    rnd = np.random.default_rng(71)
    series = []
    for i in range(1, 10):
        first = [40_000 + k * 7_000 + int(rnd.integers(0, 3_000)) for k in range(i + 3)]
        later = [400_000 + k * 5_000 for k in range(i % 4 + 1)]
        t = first + later
        v = (rnd.normal(size=len(t)) * 10.0 ** rnd.integers(-3, 9, size=len(t))).tolist()
        series.append(({"__name__": "m", "n": str(i)}, t, v))
    raw = QueryResult.from_series("matrix", series)
    times = list(range(45_000, 460_000, 9_000))
    p = PARAMS.get(func, [])
    got = eval_range_function(func, p, raw, np.array(times), 20_000).to_pylist()
    want = []
    for labels, ts_list, vals in raw.to_pylist():
        pts = list(zip(ts_list, vals))
        wt, wv = [], []
        for ts in times:
            window = [(t, v) for t, v in pts if ts - 20_000 <= t <= ts]
            value = _reference(func, p, window, ts) if window else None
            if value is not None:
                wt.append(ts)
                wv.append(value)
        if wt:
            want.append(({k: v for k, v in labels.items() if k != "__name__"}, wt, wv))
    assert [(d, t) for d, t, _ in got] == [(d, t) for d, t, _ in want]
    for (d, _, gv), (_, _, wv) in zip(got, want):
        assert _same(gv, wv), (func, d, [(a, b) for a, b in zip(gv, wv) if not _same([a], [b])][:3])


def test_per_step_factors_reach_their_own_lane() -> None:
    # Each step's window is one pair of samples; the factors differ per step, so a lane mixing
    # another step's factors would give another value.
    t = [k * 10_000 for k in range(12)]
    v = [float((k * 7) % 5) for k in range(12)]
    raw = _series(v, t)
    times = np.array(t[1:], dtype=np.int64)
    sf = np.linspace(0.1, 0.9, len(times))
    tf = np.linspace(0.8, 0.2, len(times))
    got = eval_range_function("holt_winters", [sf, tf], raw, times, 10_000).value.tolist()
    want = [_reference("holt_winters", [sf[k], tf[k]], [(t[k], v[k]), (t[k + 1], v[k + 1])], t[k + 1])
            for k in range(len(times))]
    assert got == want
    dur = np.arange(len(times), dtype=np.float64) * 100.0
    got = eval_range_function("predict_linear", [dur], raw, times, 10_000).value.tolist()
    want = [_reference("predict_linear", [dur[k]], [(t[k], v[k]), (t[k + 1], v[k + 1])], t[k + 1])
            for k in range(len(times))]
    assert _same(got, [w for w in want if w is not None])


@pytest.mark.parametrize("func", ["sum_over_time", "deriv"])
def test_windows_across_a_burst_and_a_gap(func: str) -> None:
    """Samples 100 ms apart, a 10 minute gap, then 30 s apart: a window edge moves by hundreds
    of samples from one step to the next, then by none, then by one."""
    t = [k * 100 for k in range(1_200)] + [720_000 + k * 30_000 for k in range(20)]
    v = [float((k * 37) % 11) for k in range(len(t))]
    raw = _series(v, t)
    times = list(range(15_000, 1_350_000, 15_000))
    got = eval_range_function(func, [], raw, np.array(times), 60_000).to_pylist()
    pts = list(zip(t, v))
    want = []
    for ts in times:
        window = [(a, b) for a, b in pts if ts - 60_000 <= a <= ts]
        value = _reference(func, [], window, ts) if window else None
        if value is not None:
            want.append((ts, value))
    assert [(tt, vv) for _, ts_, vs in got for tt, vv in zip(ts_, vs)] == want
