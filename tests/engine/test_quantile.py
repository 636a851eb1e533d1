"""proxy/engine/quantile.py: Prometheus v2.42.0 promql/quantile.go quantile(), for the
`quantile` aggregation and quantile_over_time. quantile_over_time is tested through the entry
point the evaluator calls (windows.eval_range_function), the aggregation through
evaluate_aggregation, so that a rework of the window walk keeps these tests.

quantile.go quantile(q, values): NaN for no values or q NaN (checked first), -Inf for q < 0,
+Inf for q > 1; else sort.Sort(vectorByValueHeap) (its Less puts NaN before everything), rank
= q * (n - 1), and `values[lower] * (1 - weight) + values[upper] * weight` -- so an Inf next to
the rank gives NaN even at weight 0 (Inf * 0)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.aggregate import evaluate_aggregation
from proxy.engine.quantile import quantile, quantiles
from proxy.engine.windows import eval_range_function
from proxy.result import QueryResult
from shardplanner.ast import Agg
from shardplanner.promql import parse

NAN, INF = math.nan, math.inf
T0 = 1_700_000_000_000


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def _go(q: float, ordered: Sequence[float]) -> float:
    """quantile() over values already in Go's sorted order (NaNs first)."""
    if not ordered or math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    n = float(len(ordered))
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight


def _go_order(values: Sequence[float]) -> list[float]:
    nans = [v for v in values if math.isnan(v)]
    return nans + sorted(v for v in values if not math.isnan(v))


# -- quantile() ----------------------------------------------------------------------------


@pytest.mark.parametrize(("q", "nans", "values", "want"), [
    (0.5, 0, [1.0, 2.0, 3.0, 4.0], 2.5),  # rank 1.5: halfway between 2 and 3
    (0.0, 0, [1.0, 2.0, 3.0, 4.0], 1.0),
    (1.0, 0, [1.0, 2.0, 3.0, 4.0], 4.0),  # upper index capped at n - 1
    (0.75, 0, [10.0], 10.0),
    (-0.0, 0, [1.0, 2.0], 1.0),  # -0 is not below 0
    (-1e-300, 0, [1.0, 2.0], -INF),
    (1.0000000000000002, 0, [1.0, 2.0], INF),
    (NAN, 0, [1.0, 2.0], NAN),
    (-1.0, 0, [], NAN),  # no values: NaN before the q checks
    (2.0, 0, [], NAN),
    (0.5, 1, [1.0, 2.0], 1.0),  # NaN, 1, 2: rank 1 is the 1, weight 0
    (0.25, 1, [1.0, 2.0], NAN),  # rank 0.5: between the NaN and 1
    (1.0, 2, [5.0], 5.0),
    (0.0, 0, [1.0, INF], NAN),  # weight 0, but Inf * 0 is NaN
    (1.0, 0, [-INF, 1.0], 1.0),  # lower == upper == 1: 1 * 1 + 1 * 0
    (0.5, 0, [-INF, INF], NAN),
    (0.5, 0, [-INF, -INF, 3.0], -INF),
])
def test_quantile(q: float, nans: int, values: list[float], want: float) -> None:
    got = quantile(q, nans, np.asarray(values, dtype=np.float64))
    assert _same([got], [want])
    assert _same([got], [_go(q, [NAN] * nans + values)])


def test_quantiles_sorts_each_run_and_takes_its_own_q() -> None:
    v = np.array([4.0, 1.0, 3.0, 2.0, 9.0, -1.0, 7.0], dtype=np.float64)
    starts = np.array([0, 4, 4, 7], dtype=np.int64)  # runs [4,1,3,2], [], [9,-1,7]
    q = np.array([0.5, 0.5, 1.0 / 3.0], dtype=np.float64)
    got = quantiles(q, v, starts).tolist()
    assert _same(got, [2.5, NAN, _go(1.0 / 3.0, [-1.0, 7.0, 9.0])])
    assert v.tolist() == [4.0, 1.0, 3.0, 2.0, 9.0, -1.0, 7.0]  # the input is not sorted in place


# -- the aggregation -------------------------------------------------------------------------


def _agg(expr: str, values: list[float], q: float) -> list[float]:
    node = parse(expr)
    assert isinstance(node, Agg)
    group = QueryResult.from_series("vector", [({"i": str(i)}, [T0], [v]) for i, v in enumerate(values)])
    return evaluate_aggregation(node, group, q, [T0], False).value.tolist()


def test_the_aggregation_puts_nan_first_as_go_sort_does() -> None:
    # Go's insertion sort (12 or fewer values) with Less(NaN, x) = true moves every NaN to the
    # front: NaN, 1, 3 -> the median is 1 (a NaN-last sort would give 3).
    assert _agg("quantile(0.5, x)", [3.0, NAN, 1.0], 0.5) == [1.0]
    assert _same(_agg("quantile(0, x)", [3.0, NAN, 1.0], 0.0), [NAN])
    assert _agg("quantile(1, x)", [NAN, NAN, 2.0, -2.0], 1.0) == [2.0]


@pytest.mark.parametrize("q", [-0.5, 1.5, NAN])
def test_the_aggregation_out_of_range_phi(q: float) -> None:
    assert _same(_agg("quantile(0.5, x)", [1.0, 2.0], q), [_go(q, [1.0, 2.0])])


def test_the_aggregation_per_step_phi_in_a_range_query() -> None:
    grid = [T0, T0 + 60_000, T0 + 120_000]
    inner = QueryResult.from_series("matrix", [({"i": str(i)}, grid, [float(i)] * 3) for i in range(5)])
    phi = QueryResult.from_series("matrix", [({}, grid, [0.25, 2.0, NAN])])
    node = parse("quantile(scalar(p), x)")
    assert isinstance(node, Agg)
    out = evaluate_aggregation(node, inner, phi, grid, True)
    assert out.labels == [{}] and _same(out.value.tolist(), [1.0, INF, NAN])


# -- quantile_over_time --------------------------------------------------------------------


def test_quantile_over_time_by_hand() -> None:
    raw = QueryResult.from_series("matrix", [({"__name__": "m"}, [1_000, 2_000, 3_000, 4_000], [4.0, NAN, 1.0, 1.0])])
    at = np.array([4_000], dtype=np.int64)

    def qot(q: float) -> list[float]:
        return eval_range_function("quantile_over_time", [q], raw, at, 10_000).value.tolist()

    assert _same(qot(0.0), [NAN])  # NaN, 1, 1, 4
    assert qot(2.0 / 3.0) == [1.0]  # rank 2
    assert qot(1.0) == [4.0]
    assert qot(-1.0) == [-INF] and qot(3.0) == [INF]
    assert _same(qot(NAN), [NAN])


def test_quantile_over_time_sliding_windows_against_the_reference() -> None:
    """Steps that move the window by a sample or two (values inserted and removed one by one,
    duplicates and NaN among them) and steps that jump far (the window read anew), with a
    different phi at every step (inside [0, 1], outside, NaN)."""
    rnd = np.random.default_rng(5)
    series = []
    for i in range(3):
        t = np.cumsum(rnd.choice([1_000, 1_000, 2_000, 90_000], size=300)).tolist()
        v = rnd.choice([0.0, 1.0, 1.0, 2.5, -3.0, NAN, INF, 7.0], size=300).tolist()
        series.append(({"__name__": "m", "i": str(i)}, t, v))
    raw = QueryResult.from_series("matrix", series)
    # 1.5 s steps slide by a sample or two; 25 s steps replace more than 32 samples of a 40 s
    # window that still overlaps the last one; 70 s steps share nothing with the last window.
    for step in (1_500, 25_000, 70_000):
        times = np.arange(0, 3_000_000, step, dtype=np.int64)
        phi = rnd.choice([0.0, 0.1, 0.5, 0.9, 1.0, -0.2, 1.2, NAN], size=len(times))
        got = eval_range_function("quantile_over_time", [phi], raw, times, 40_000).to_pylist()
        want = []
        for labels, ts_list, vals in raw.to_pylist():
            wt, wv = [], []
            for k, ts in enumerate(times.tolist()):
                window = [v for t, v in zip(ts_list, vals) if ts - 40_000 <= t <= ts]
                if window:
                    wt.append(ts)
                    wv.append(_go(float(phi[k]), _go_order(window)))
            if wt:
                want.append(({k: v for k, v in labels.items() if k != "__name__"}, wt, wv))
        assert [(d, t) for d, t, _ in got] == [(d, t) for d, t, _ in want], step
        for (_, _, gv), (_, _, wv) in zip(got, want):
            assert _same(gv, wv), step


def test_quantile_over_time_across_a_burst_and_a_gap() -> None:
    """Samples 100 ms apart, a 10 minute gap, then 30 s apart: from one step to the next the
    window gains and loses hundreds of samples, then none, then one."""
    t = [k * 100 for k in range(1_200)] + [720_000 + k * 30_000 for k in range(20)]
    v = [NAN if k % 13 == 0 else float((k * 37) % 11) for k in range(len(t))]
    raw = QueryResult.from_series("matrix", [({"__name__": "m"}, t, v)])
    times = list(range(15_000, 1_350_000, 15_000))
    got = eval_range_function("quantile_over_time", [0.3], raw, np.array(times), 60_000).to_pylist()
    want = []
    for ts in times:
        window = [b for a, b in zip(t, v) if ts - 60_000 <= a <= ts]
        if window:
            want.append((ts, _go(0.3, _go_order(window))))
    pairs = [(tt, vv) for _, ts_, vs in got for tt, vv in zip(ts_, vs)]
    assert [p[0] for p in pairs] == [w[0] for w in want]
    assert _same([p[1] for p in pairs], [w[1] for w in want])
