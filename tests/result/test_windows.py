"""proxy.engine.windows in-process: edge cases worked out from Prometheus 2.42's rules, and
the compiled kernels against `_reference`, a plain-Python transcription of
promql/functions.go that reads every window from scratch (no reset index, prefix sums or
sliding sorted buffer, no shared window walk). Python floats are IEEE doubles operated on in
the same order, so the two must agree bit for bit. tests/e2e/test_windows_equivalence.py
checks both against the real Prometheus."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.windows import RANGE_FUNCTIONS, eval_range_function, go_duration_seconds, subquery_times
from proxy.errors import PromError
from proxy.result import QueryResult

# -- the reference: Go's functions, one window at a time ------------------------------------


def _kahan(inc: float, s: float, c: float) -> tuple[float, float]:
    t = s + inc
    c += ((s - t) + inc) if abs(s) >= abs(inc) else ((inc - t) + s)
    return t, c


def _regression(pts: list[tuple[int, float]], at: int) -> tuple[float, float]:
    n = sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    init = pts[0][1]
    const = True
    for i, (t, y) in enumerate(pts):
        if const and i > 0 and y != init:
            const = False
        n += 1.0
        x = float(t - at) / 1e3
        sx, cx = _kahan(x, sx, cx)
        sy, cy = _kahan(y, sy, cy)
        sxy, cxy = _kahan(x * y, sxy, cxy)
        sx2, cx2 = _kahan(x * x, sx2, cx2)
    if const:
        return (math.nan, math.nan) if math.isinf(init) else (0.0, init)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    slope = _div(sxy - sx * sy / n, sx2 - sx * sx / n)
    return slope, sy / n - slope * sx / n


def _div(a: float, b: float) -> float:
    if b != 0:
        return a / b
    return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)


def _reference(func: str, p: Sequence[float], pts: list[tuple[int, float]], ts: int, rng: int, off: int) -> float | None:
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
        to_start = float(pts[0][0] - (ts - (rng + off))) / 1000
        to_end = float((ts - off) - pts[-1][0]) / 1000
        sampled = float(pts[-1][0] - pts[0][0]) / 1000
        avg = sampled / float(n - 1)
        if counter and result > 0 and vs[0] >= 0:
            to_zero = sampled * (vs[0] / result)
            if to_zero < to_start:
                to_start = to_zero
        interval = sampled + (to_start if to_start < avg * 1.1 else avg / 2)
        interval += to_end if to_end < avg * 1.1 else avg / 2
        factor = interval / sampled
        if func == "rate":
            factor /= go_duration_seconds(rng)
        return result * factor
    if func in ("irate", "idelta"):
        if n < 2 or pts[-1][0] == pts[-2][0]:
            return None
        r = vs[-1] if func == "irate" and vs[-1] < vs[-2] else vs[-1] - vs[-2]
        return r / (float(pts[-1][0] - pts[-2][0]) / 1000) if func == "irate" else r
    if func == "avg_over_time":
        mean = count = c = 0.0
        for v in vs:
            count += 1
            if math.isinf(mean) and ((math.isinf(v) and (mean > 0) == (v > 0)) or (not math.isinf(v) and not math.isnan(v))):
                continue
            mean, c = _kahan(v / count - mean / count, mean, c)
        return mean if math.isinf(mean) else mean + c
    if func in ("min_over_time", "max_over_time"):
        m = vs[0]
        for v in vs:
            if (v < m if func == "min_over_time" else v > m) or math.isnan(m):
                m = v
        return m
    if func == "sum_over_time":
        s = c = 0.0
        for v in vs:
            s, c = _kahan(v, s, c)
        return s if math.isinf(s) else s + c
    if func == "count_over_time":
        return float(n)
    if func == "quantile_over_time":
        q = p[0]
        if math.isnan(q):
            return math.nan
        if q < 0 or q > 1:
            return math.copysign(math.inf, q)
        srt = [v for v in vs if math.isnan(v)] + sorted(v for v in vs if not math.isnan(v))
        rank = q * (n - 1)
        lo = max(0.0, math.floor(rank))
        hi = min(n - 1.0, lo + 1)
        w = rank - math.floor(rank)
        return srt[int(lo)] * (1 - w) + srt[int(hi)] * w
    if func in ("stddev_over_time", "stdvar_over_time"):
        count = mean = cm = aux = ca = 0.0
        for v in vs:
            count += 1
            d = v - (mean + cm)
            mean, cm = _kahan(d / count, mean, cm)
            aux, ca = _kahan(d * (v - (mean + cm)), aux, ca)
        var = (aux + ca) / count
        return (math.sqrt(var) if var >= 0 else math.nan) if func == "stddev_over_time" else var
    if func == "last_over_time":
        return vs[-1]
    if func == "present_over_time":
        return 1.0
    if func == "changes":
        return float(sum(1 for a, b in zip(vs, vs[1:]) if b != a and not (math.isnan(a) and math.isnan(b))))
    if func == "resets":
        return float(sum(1 for a, b in zip(vs, vs[1:]) if b < a))
    if func in ("deriv", "predict_linear"):
        if n < 2:
            return None
        if func == "deriv":
            return _regression(pts, pts[0][0])[0]
        slope, intercept = _regression(pts, ts)
        return slope * p[0] + intercept
    if func == "holt_winters":
        if n < 2:
            return None
        sf, tf = p
        s0, s1, b = 0.0, vs[0], vs[1] - vs[0]
        for i in range(1, n):
            x = sf * vs[i]
            if i - 1 != 0:
                b = tf * (s1 - s0) + (1 - tf) * b
            s0, s1 = s1, x + (1 - sf) * (s1 + b)
        return s1
    raise AssertionError(func)


def _expected(func: str, p: Sequence[float], raw: QueryResult, times: Sequence[int], rng: int, off: int
              ) -> list[tuple[dict[str, str], list[int], list[float]]]:
    out = []
    for labels, ts_list, vals in raw.to_pylist():
        pts = list(zip(ts_list, vals))
        got_t, got_v = [], []
        for ts in times:
            window = [(t, v) for t, v in pts if ts - off - rng <= t <= ts - off]
            value = _reference(func, p, window, ts, rng, off) if window else None
            if value is not None:
                got_t.append(ts)
                got_v.append(value)
        if got_t:
            keep = labels if func == "last_over_time" else {k: v for k, v in labels.items() if k != "__name__"}
            out.append((keep, got_t, got_v))
    return sorted(out, key=lambda s: sorted(s[0].items()))


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(x == y and math.copysign(1, x) == math.copysign(1, y) or (math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b))


PARAMS = {"quantile_over_time": [0.3], "predict_linear": [450.0], "holt_winters": [0.4, 0.7]}


def _one(values: Sequence[float], times: Sequence[int], name: str = "m", **labels: str) -> QueryResult:
    return QueryResult.from_series("matrix", [({"__name__": name, **labels}, list(times), list(values))])


def _values(func: str, raw: QueryResult, times: Sequence[int], rng: int, off: int = 0,
            params: Sequence[float] | None = None) -> list[tuple[dict[str, str], list[int], list[float]]]:
    return eval_range_function(func, PARAMS.get(func, []) if params is None else params, raw,
                               np.asarray(times, dtype=np.int64), rng, offset_ms=off).to_pylist()


# -- kernels against the reference --------------------------------------------------------


def _random_fleet(seed: int) -> QueryResult:
    """Series with irregular spacing (mostly 10 s, some 1 ms apart, gaps), counters with
    resets, gauges with repeats, NaN and +-Inf, and one empty series."""
    rnd = np.random.default_rng(seed)
    series = []
    for i in range(6):
        gaps = rnd.choice([10_000, 10_000, 10_000, 7_000, 1, 65_000], size=rnd.integers(5, 120))
        t = (1_000_000 + np.cumsum(gaps)).tolist()
        if i % 2 == 0:  # counter with resets
            v = np.cumsum(rnd.integers(0, 50, size=len(t))).astype(float)
            for r in rnd.integers(1, len(t), size=3):
                v[r:] -= v[r]
        else:
            v = rnd.choice([1.5, 2.0, -3.25, 7.0, 1e300, -0.5], size=len(t))
            specials = rnd.integers(0, len(t), size=4)
            v[specials] = rnd.choice([math.nan, math.inf, -math.inf, 0.0], size=4)
        series.append(({"__name__": f"m{i % 3}", "i": str(i)}, t, v.tolist()))
    series.append(({"__name__": "m0", "i": "empty"}, [], []))
    return QueryResult.from_series("matrix", series)


@pytest.mark.parametrize("func", sorted(RANGE_FUNCTIONS))
@pytest.mark.parametrize(("rng", "step", "off"), [(30_000, 10_000, 0), (95_000, 47_000, 20_000),
                                                  (20_000, 60_000, 0), (300_000, 1_000, 5_000)])
def test_kernels_agree_with_the_reference(func: str, rng: int, step: int, off: int) -> None:
    for seed in range(3):
        raw = _random_fleet(seed)
        times = list(range(990_000, 1_000_000 + 1_400_000, step))
        got = _values(func, raw, times, rng, off)
        want = _expected(func, PARAMS.get(func, []), raw, times, rng, off)
        assert [(d, t) for d, t, _ in got] == [(d, t) for d, t, _ in want], (func, seed)
        for (d, _, gv), (_, _, wv) in zip(got, want):
            assert _same(gv, wv), (func, seed, d, [(a, b) for a, b in zip(gv, wv) if not _same([a], [b])][:3])


# -- windows and points -------------------------------------------------------------------


def test_window_is_closed_on_both_ends() -> None:
    raw = _one([1, 2, 3, 4], [10_000, 20_000, 30_000, 40_000])
    # At t=40s with a 30s range the window [10s, 40s] holds all four samples.
    assert _values("count_over_time", raw, [40_000], 30_000) == [({}, [40_000], [4.0])]
    # One millisecond later the sample at 10s falls out; one millisecond shorter, too.
    assert _values("count_over_time", raw, [40_001], 30_000) == [({}, [40_001], [3.0])]
    assert _values("count_over_time", raw, [40_000], 29_999) == [({}, [40_000], [3.0])]
    # With an offset, the window moves back: [t - 15s - 20s, t - 15s].
    assert _values("count_over_time", raw, [45_000], 20_000, off=15_000) == [({}, [45_000], [3.0])]
    assert _values("last_over_time", raw, [45_000], 20_000, off=15_000)[0][2] == [3.0]


def test_empty_windows_give_no_point_and_no_series() -> None:
    raw = QueryResult.from_series("matrix", [({"__name__": "m", "a": "1"}, [100_000], [5.0]),
                                             ({"__name__": "m", "a": "2"}, [900_000], [6.0])])
    for func in RANGE_FUNCTIONS:
        out = eval_range_function(func, PARAMS.get(func, []), raw, np.array([50_000, 100_000, 200_000]), 60_000)
        assert all(d.get("a") == "1" for d, _, _ in out.to_pylist()), func
        assert set(out.t_ms.tolist()) <= {100_000, 200_000}
    empty = eval_range_function("rate", [], QueryResult.empty("matrix"), np.array([1_000]), 60_000)
    assert empty.result_type == "matrix" and empty.n_series == 0


def test_one_sample() -> None:
    raw = _one([7.5], [100_000])
    for func in ("rate", "increase", "delta", "irate", "idelta", "deriv", "predict_linear", "holt_winters"):
        assert _values(func, raw, [100_000], 60_000) == [], func
    one = {f: _values(f, raw, [100_000], 60_000)[0][2][0] for f in RANGE_FUNCTIONS
           if f not in ("rate", "increase", "delta", "irate", "idelta", "deriv", "predict_linear", "holt_winters")}
    assert one == {"avg_over_time": 7.5, "min_over_time": 7.5, "max_over_time": 7.5, "sum_over_time": 7.5,
                   "count_over_time": 1.0, "quantile_over_time": 7.5, "stddev_over_time": 0.0,
                   "stdvar_over_time": 0.0, "last_over_time": 7.5, "present_over_time": 1.0,
                   "changes": 0.0, "resets": 0.0}


def test_counter_reset_and_extrapolation() -> None:
    # Samples fill the window [0, 40s] edge to edge: no extrapolation, the reset adds 20.
    raw = _one([0, 10, 20, 5, 15], [0, 10_000, 20_000, 30_000, 40_000])
    assert _values("increase", raw, [40_000], 40_000)[0][2] == [35.0]
    assert _values("rate", raw, [40_000], 40_000)[0][2] == [35.0 / 40]
    assert _values("delta", raw, [40_000], 40_000)[0][2] == [15.0]
    assert _values("resets", raw, [40_000], 40_000)[0][2] == [1.0]
    assert _values("irate", raw, [40_000], 40_000)[0][2] == [1.0]  # 15 - 5 over 10 s
    assert _values("irate", raw, [30_000], 40_000)[0][2] == [0.5]  # a reset: 5 over 10 s
    assert _values("idelta", raw, [30_000], 40_000)[0][2] == [-15.0]


def test_counter_zero_point_limits_extrapolation() -> None:
    # 1, 11, 21 at 20s, 30s, 40s in [0, 40s]: 20s to the window start (more than 1.1 x 10 s),
    # so half an interval (5 s) would be added; the counter reaches zero 1 s before its first
    # sample, so increase() extrapolates by 1 s only; delta() has no such limit.
    raw = _one([1, 11, 21], [20_000, 30_000, 40_000])
    assert _values("increase", raw, [40_000], 40_000)[0][2] == [21.0]
    assert _values("delta", raw, [40_000], 40_000)[0][2] == [25.0]


def test_nan_and_inf() -> None:
    def at(func: str, values: list[float], params: list[float] | None = None) -> float:
        raw = _one(values, [1_000 * (i + 1) for i in range(len(values))])
        return _values(func, raw, [len(values) * 1_000], 60_000, params=params)[0][2][0]

    assert at("avg_over_time", [math.inf, 1.0]) == math.inf
    assert math.isnan(at("avg_over_time", [math.inf, -math.inf]))
    assert math.isnan(at("avg_over_time", [1.0, math.nan]))
    assert at("sum_over_time", [math.inf, 1.0]) == math.inf
    assert math.isnan(at("sum_over_time", [math.inf, -math.inf]))
    assert at("min_over_time", [math.nan, 2.0, 1.0]) == 1.0
    assert at("max_over_time", [2.0, math.nan]) == 2.0
    assert math.isnan(at("max_over_time", [math.nan, math.nan]))
    assert at("changes", [math.nan, math.nan, 1.0, 1.0]) == 1.0
    assert math.isnan(at("quantile_over_time", [3.0, math.nan, 1.0], [0.0]))  # NaN sorts first
    assert at("quantile_over_time", [3.0, math.nan, 1.0], [1.0]) == 3.0
    assert math.isnan(at("deriv", [math.inf, math.inf]))  # constant Inf: Go's NaN
    assert at("deriv", [5.0, 5.0, 5.0]) == 0.0


def test_quantile_and_holt_winters_parameters() -> None:
    raw = _one([1.0, 2.0, 4.0], [1_000, 2_000, 3_000])
    assert _values("quantile_over_time", raw, [3_000], 10_000, params=[-0.5])[0][2] == [-math.inf]
    assert _values("quantile_over_time", raw, [3_000], 10_000, params=[1.5])[0][2] == [math.inf]
    assert math.isnan(_values("quantile_over_time", raw, [3_000], 10_000, params=[math.nan])[0][2][0])
    assert _values("quantile_over_time", raw, [3_000], 10_000, params=[0.75])[0][2] == [3.0]
    with pytest.raises(PromError) as bad_sf:
        _values("holt_winters", raw, [3_000], 10_000, params=[1.5, 0.5])
    assert (bad_sf.value.kind, bad_sf.value.message) == (
        "execution", "invalid smoothing factor. Expected: 0 < sf < 1, got: 1.500000")
    with pytest.raises(PromError) as bad_tf:
        _values("holt_winters", raw, [3_000], 10_000, params=[0.5, 0.0])
    assert bad_tf.value.message == "invalid trend factor. Expected: 0 < tf < 1, got: 0.000000"
    with pytest.raises(PromError, match="smoothing factor.*got: -Inf"):
        _values("holt_winters", raw, [3_000], 10_000, params=[-math.inf, 2.0])
    # Go checks a factor only when it calls the function: never over empty windows, and a
    # NaN factor fails neither comparison.
    assert _values("holt_winters", raw, [60_000], 10_000, params=[1.5, 0.5]) == []
    assert math.isnan(_values("holt_winters", raw, [3_000], 10_000, params=[math.nan, 0.5])[0][2][0])
    # A factor per step: the first step whose window holds a sample decides.
    with pytest.raises(PromError, match="got: 3.000000"):
        eval_range_function("holt_winters", [np.array([2.0, 3.0, 0.5]), 0.5], raw,
                            np.array([500, 2_000, 3_000]), 10_000)


def test_per_step_parameters() -> None:
    raw = _one([1.0, 2.0, 3.0, 4.0], [1_000, 2_000, 3_000, 4_000])
    q = np.array([0.0, 1.0])
    assert _values("quantile_over_time", raw, [3_000, 4_000], 10_000, params=[q])[0][2] == [1.0, 4.0]
    # y = x seconds: at 4 s the line is at 4, predicted 0 s on; at 5 s it is at 5, 10 s on: 15.
    assert _values("predict_linear", raw, [4_000, 5_000], 10_000, params=[np.array([0.0, 10.0])])[0][2] == [4.0, 15.0]


def test_names_dropped_except_last_over_time_and_sorted() -> None:
    raw = QueryResult.from_series("matrix", [
        ({"__name__": "b", "x": "2"}, [1_000], [1.0]),
        ({"__name__": "a", "x": "3"}, [1_000], [2.0]),
        ({"__name__": "a", "x": "1"}, [1_000], [3.0]),
    ])
    assert [d for d, _, _ in _values("sum_over_time", raw, [1_000], 5_000)] == [{"x": "1"}, {"x": "2"}, {"x": "3"}]
    kept = [d for d, _, _ in _values("last_over_time", raw, [1_000], 5_000)]
    assert kept == [{"__name__": "a", "x": "1"}, {"__name__": "a", "x": "3"}, {"__name__": "b", "x": "2"}]
    assert raw.labels[0] == {"__name__": "b", "x": "2"}  # the input's label sets are not touched


def test_same_labelset_after_dropping_the_name() -> None:
    raw = QueryResult.from_series("matrix", [({"__name__": "a", "x": "1"}, [1_000], [1.0]),
                                             ({"__name__": "b", "x": "1"}, [50_000], [2.0])])
    with pytest.raises(PromError) as err:
        _values("max_over_time", raw, [1_000, 50_000], 5_000)  # even at different steps
    assert (err.value.kind, err.value.message) == ("execution", "vector cannot contain metrics with the same labelset")
    assert len(_values("last_over_time", raw, [1_000, 50_000], 5_000)) == 2
    assert len(_values("max_over_time", raw, [1_000], 5_000)) == 1  # one of them without points


def test_misuse_is_a_value_error() -> None:
    raw = _one([1.0], [1_000])
    with pytest.raises(ValueError):
        eval_range_function("absent_over_time", [], raw, np.array([1_000]), 5_000)
    with pytest.raises(ValueError):
        eval_range_function("quantile_over_time", [], raw, np.array([1_000]), 5_000)
    with pytest.raises(ValueError):
        eval_range_function("rate", [], raw, np.array([2_000, 1_000]), 5_000)
    with pytest.raises(ValueError):
        eval_range_function("rate", [], raw, np.array([1_000]), 0)
    with pytest.raises(ValueError):
        eval_range_function("rate", [], QueryResult.scalar(1_000, 1.0), np.array([1_000]), 5_000)


# -- helpers ------------------------------------------------------------------------------


def test_go_duration_seconds() -> None:
    assert go_duration_seconds(95_000) == 95.0
    assert go_duration_seconds(1_500) == 1.5
    # Go: float64(1) + float64(234000000)/1e9, which need not be the double nearest 1.234.
    assert go_duration_seconds(1_234) == 1.0 + 234_000_000 / 1e9


@pytest.mark.parametrize(("times", "rng", "step", "off"), [
    ([1_700_000_017_000], 1_800_000, 60_000, 0),
    ([1_700_000_000_000], 1_800_000, 60_000, 0),  # on the grid: the first step is included
    (list(range(1_700_000_017_000, 1_700_003_600_000, 47_000)), 600_000, 45_000, 420_000),
    ([1_700_000_017_123], 95_000, 7_000, 3_600_007),
])
def test_subquery_times(times: list[int], rng: int, step: int, off: int) -> None:
    grid = subquery_times(np.array(times), rng, step, off).tolist()
    low, high = times[0] - off - rng, times[-1] - off
    assert grid and all(t % step == 0 for t in grid)
    assert grid == list(range(grid[0], grid[-1] + 1, step))
    assert grid[0] >= low > grid[0] - step
    assert grid[-1] <= high < grid[-1] + step
    assert subquery_times(times[0], rng, step, off)[0] == grid[0]


# --- the work budget: chunks, deadline, bound (issue 26) ---------------------------------------


def _wide(n_series: int = 12, per: int = 2880) -> QueryResult:
    rng = np.random.default_rng(7)
    t = np.tile(np.arange(per, dtype=np.int64) * 30_000, n_series)
    v = rng.random(n_series * per) * 100
    offsets = np.arange(n_series + 1, dtype=np.int64) * per
    return QueryResult("matrix", [{"__name__": "x", "i": f"{i:02d}"} for i in range(n_series)], offsets, t, v, [], [])


@pytest.mark.parametrize("func,params", [("max_over_time", []), ("rate", []), ("holt_winters", [0.3, 0.6]),
                                         ("quantile_over_time", [0.9]), ("changes", [])])
def test_chunked_evaluation_is_the_same_answer(func: str, params: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.engine import windows
    from proxy.engine.work import WorkBudget

    raw = _wide()
    times = np.arange(3_600_000, 86_400_000, 60_000, dtype=np.int64)
    whole = eval_range_function(func, params, raw, times, 3_600_000)
    monkeypatch.setattr(windows, "CHUNK_WORK", 100_000)  # a chunk of one or two series
    assert len(windows._chunks(windows.window_work(raw.offsets, times, 3_600_000))) >= 6
    chunked = eval_range_function(func, params, raw, times, 3_600_000, budget=WorkBudget())
    assert chunked.labels == whole.labels
    assert np.array_equal(chunked.offsets, whole.offsets) and np.array_equal(chunked.t_ms, whole.t_ms)
    assert np.array_equal(chunked.value, whole.value, equal_nan=True)


def test_the_budget_stops_between_chunks_and_refuses_over_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from proxy.engine import windows
    from proxy.engine.work import EvalCancelled, WorkBudget
    from proxy.errors import PromError

    raw = _wide()
    times = np.arange(3_600_000, 86_400_000, 1_000, dtype=np.int64)
    monkeypatch.setattr(windows, "CHUNK_WORK", 1_000_000)
    checks = []
    budget = WorkBudget(deadline=time.monotonic() + 60)
    original = budget.check

    def counting() -> None:
        checks.append(1)
        if len(checks) == 3:
            budget.cancel()  # a client gone, or the deadline, after two chunks
        original()

    budget.check = counting  # type: ignore[method-assign]
    with pytest.raises(EvalCancelled):
        eval_range_function("max_over_time", [], raw, times, 3_600_000, budget=budget)
    assert len(checks) == 3  # stopped at the third chunk, not after the last
    with pytest.raises(EvalCancelled):
        eval_range_function("max_over_time", [], raw, times, 3_600_000, budget=WorkBudget(deadline=time.monotonic() - 1))
    bound = WorkBudget(max_work=10_000_000)
    with pytest.raises(PromError) as refused:
        eval_range_function("max_over_time", [], raw, times, 3_600_000, budget=bound)
    assert refused.value.status == 422 and "limits.max_eval_work" in refused.value.message
    with pytest.raises(PromError, match="limits.max_eval_series"):
        WorkBudget(max_series=10).series(11, "count_values")


def test_topk_k_bound_is_engine_go_convertible_to_int64() -> None:
    from proxy.engine.aggregate import k_per_step
    from proxy.engine.errors import EvalError

    assert k_per_step(np.array([9223372036854774784.0])).tolist() == [9223372036854774784]
    with pytest.raises(EvalError, match="overflows int64"):
        k_per_step(np.array([9223372036854775807.0]))  # float64(2**63 - 1) == 2**63
    assert k_per_step(np.array([-9223372036854775808.0])).tolist() == [-9223372036854775808]
