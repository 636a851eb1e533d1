"""proxy/engine/histogram.py: histogram_quantile over classic `le` buckets, as Prometheus
v2.42.0 evaluates it: promql/functions.go funcHistogramQuantile (le parsed with
strconv.ParseFloat, else the series is skipped; groups keyed by every label but le; output
without le and __name__) and promql/quantile.go bucketQuantile (q checks first; sort.Sort by
upper bound; highest bound not +Inf -> NaN; coalesceBuckets; ensureMonotonic; fewer than two
buckets or no observations -> NaN; sort.Search over all but the last bucket; a rank in the +Inf
bucket -> the last finite bound; a first bucket with bound <= 0 -> that bound; else linear
interpolation, from 0 in the first bucket). Expected values are worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.errors import DuplicateLabelset
from proxy.engine.functions import evaluate_call
from proxy.engine.histogram import histogram_quantile
from proxy.engine.stepwise import Samples
from proxy.result import QueryResult
from shardplanner.ast import Call
from shardplanner.promql import parse

NAN, INF = math.nan, math.inf
T0 = 1_700_000_000_000


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def _hq(q: float, buckets: Sequence[tuple[str, float]], **labels: str) -> list[float]:
    """histogram_quantile(q, ...) of one histogram at one instant; buckets in series order."""
    vec = QueryResult.from_series("vector", [({"__name__": "h_bucket", "le": le, **labels}, [T0], [v])
                                             for le, v in buckets])
    grid = np.array([T0], dtype=np.int64)
    _, _, _, values = histogram_quantile(np.array([q]), Samples.of(vec, grid, False), 1)
    return values.tolist()


STD = [("0.1", 2.0), ("0.5", 6.0), ("1", 10.0), ("+Inf", 12.0)]


@pytest.mark.parametrize(("q", "want"), [
    (0.0, 0.0),  # rank 0: the first bucket (bound 0.1 > 0), interpolated from 0
    (0.1, 0.1 * ((0.1 * 12.0) / 2.0)),  # rank 0.1 * 12 in (0, 0.1] holding 2
    (0.5, 0.1 + (0.5 - 0.1) * ((6.0 - 2.0) / 4.0)),  # rank 6 is the top of (0.1, 0.5]
    (0.75, 0.5 + (1.0 - 0.5) * ((9.0 - 6.0) / 4.0)),
    (0.9, 1.0),  # rank 10.8 is past the last finite bucket: its bound
    (1.0, 1.0),
    (-0.1, -INF), (1.1, INF), (NAN, NAN),
])
def test_bucket_quantile(q: float, want: float) -> None:
    assert _same(_hq(q, STD), [want])


def test_series_order_does_not_matter_for_distinct_bounds() -> None:
    shuffled = [STD[2], STD[3], STD[0], STD[1]]
    for q in (0.1, 0.5, 0.75, 0.95):
        assert _hq(q, shuffled) == _hq(q, STD)


def test_the_q_checks_come_before_the_bucket_checks() -> None:
    no_inf = [("1", 5.0), ("2", 10.0)]
    assert _same(_hq(0.5, no_inf), [NAN])  # highest bound not +Inf
    assert _hq(-1.0, no_inf) == [-INF] and _hq(2.0, no_inf) == [INF]
    assert _hq(-1.0, [("+Inf", 0.0)]) == [-INF]


@pytest.mark.parametrize("buckets", [
    [("+Inf", 10.0)],  # one bucket
    [("+Inf", 4.0), ("inf", 6.0)],  # two series, one bound after coalescing
    [("1", 0.0), ("+Inf", 0.0)],  # no observations
])
def test_nan_cases(buckets: list[tuple[str, float]]) -> None:
    assert _same(_hq(0.5, buckets), [NAN])


def test_non_positive_first_bound() -> None:
    assert _hq(0.2, [("-1", 5.0), ("0", 10.0), ("+Inf", 20.0)]) == [-1.0]  # rank 4 in the first bucket
    assert _hq(0.3, [("0", 10.0), ("+Inf", 20.0)]) == [0.0]
    # Past the first bucket interpolation starts from the previous bound, negative or not.
    assert _hq(0.375, [("-1", 5.0), ("0", 10.0), ("+Inf", 20.0)]) == [-1.0 + 1.0 * (2.5 / 5.0)]


def test_rank_on_a_bucket_boundary_takes_the_lower_bucket() -> None:
    # sort.Search finds the first count >= rank: rank 10 is the top of (0, 1].
    assert _hq(0.5, [("1", 10.0), ("2", 20.0), ("+Inf", 20.0)]) == [1.0]


def test_equal_bounds_are_coalesced() -> None:
    # "1", "1.0" and "1e0" are one bound: counts 3 + 4 + 3 = 10.
    b = [("1", 3.0), ("2", 20.0), ("1.0", 4.0), ("+Inf", 20.0), ("1e0", 3.0)]
    assert _hq(0.25, b) == [1.0 * (5.0 / 10.0)]
    assert _hq(0.75, b) == [1.0 + 1.0 * (5.0 / 10.0)]


def test_non_monotonic_counts_are_made_monotonic() -> None:
    # ensureMonotonic: 10, 7, 15 -> 10, 10, 15 (the 2 bucket is empty after the fix).
    b = [("1", 10.0), ("2", 7.0), ("3", 15.0), ("+Inf", 15.0)]
    assert _hq(0.5, b) == [1.0 * (7.5 / 10.0)]
    assert _hq(0.8, b) == [2.0 + 1.0 * (2.0 / 5.0)]  # rank 12: past 10, 10 -> bucket (2, 3]
    # A NaN count is neither above nor below the running maximum: it stays NaN, and
    # sort.Search's bisection (h = 1 first) skips past it.
    nan = [("1", 10.0), ("2", NAN), ("+Inf", 20.0)]
    # rank 5: Search(2, ...) tries h=1 only (NaN >= 5 is false) -> 2 == len-1: the second bound,
    # although the first bucket holds the rank.
    assert _hq(0.25, nan) == [2.0]
    nan5 = [("1", 4.0), ("2", NAN), ("3", 10.0), ("4", 10.0), ("+Inf", 10.0)]
    # rank 3: h=2 (10 >= 3) -> hi=2; h=1 (NaN) -> lo=2: bucket (2, 3], count 10 - NaN.
    assert _same(_hq(0.3, nan5), [NAN])
    # rank 2 is never reached by the bisection's h=0 either: h=2, then h=1 (NaN) -> lo=2.
    assert _same(_hq(0.2, nan5), [NAN])


def test_a_nan_bound_stays_where_go_insertion_sort_leaves_it() -> None:
    # buckets.Less is `a < b`: nothing is less than NaN and NaN is less than nothing, so Go's
    # insertion sort (<= 12 buckets) never moves a NaN bound or moves anything past it:
    # 1, NaN, 0.5, +Inf stay in that order; counts 5, 7, 3, 10 -> monotonic 5, 7, 7, 10.
    b = [("1", 5.0), ("NaN", 7.0), ("0.5", 3.0), ("+Inf", 10.0)]
    assert _hq(0.3, b) == [1.0 * (3.0 / 5.0)]  # rank 3 in the first bucket
    assert _same(_hq(0.6, b), [NAN])  # rank 6 in the NaN bucket


def test_unparsable_or_missing_le_is_skipped() -> None:
    b = [("1", 10.0), ("one", 1_000.0), ("0x1p1", 20.0), ("+Inf", 20.0), ("1_0", 15.0)]
    # Go's ParseFloat reads 0x1p1 (2) and 1_0 (10); "one" is skipped.
    assert _hq(0.5, b) == [1.0]
    assert _hq(0.6, b) == [1.0 + 1.0 * (2.0 / 10.0)]
    assert _hq(0.9, [("1", 10.0), (" 2", 99.0), ("+Inf", 20.0)]) == [1.0]  # " 2" skipped: rank in +Inf


def test_groups_labels_order_and_steps() -> None:
    grid = [T0, T0 + 60_000]
    series = []
    for job, scale in (("b", 1.0), ("a", 2.0)):
        for le, c in (("1", 10.0), ("2", 20.0), ("+Inf", 20.0)):
            series.append(({"__name__": "h_bucket", "job": job, "le": le}, grid, [c * scale, c * scale]))
    # A second metric with the same other labels is a group of its own (the name is part of the key).
    series.append(({"__name__": "g_bucket", "job": "a", "le": "+Inf"}, grid[1:], [1.0]))
    series.append(({"__name__": "g_bucket", "job": "a", "le": "4"}, grid[1:], [1.0]))
    raw = QueryResult.from_series("matrix", series)
    interner, ids, steps, values = histogram_quantile(np.array([0.25, 0.75]), Samples.of(raw, np.array(grid), True), 2)
    got = sorted((tuple(sorted(interner.labels[i].items())), int(s), v)
                 for i, s, v in zip(ids.tolist(), steps.tolist(), values.tolist()))
    # g_bucket at step 1: rank 0.75 of 1 in (0, 4] -> 4 * 0.75.
    assert got == [
        ((("job", "a"),), 0, 0.5), ((("job", "a"),), 1, 1.5), ((("job", "a"),), 1, 3.0),
        ((("job", "b"),), 0, 0.5), ((("job", "b"),), 1, 1.5),
    ]
    # Output labels of h_bucket and g_bucket are both {job="a"}: Prometheus's same-labelset error.
    node = parse("histogram_quantile(0.5, x)")
    assert isinstance(node, Call)
    with pytest.raises(DuplicateLabelset):
        evaluate_call(node, [0.5, raw], grid, True)


def test_instant_groups_in_order_of_appearance_and_empty_input() -> None:
    vec = QueryResult.from_series("vector", [
        ({"__name__": "h_bucket", "job": "z", "le": "+Inf"}, [T0], [4.0]),
        ({"__name__": "h_bucket", "job": "a", "le": "+Inf"}, [T0], [4.0]),
        ({"__name__": "h_bucket", "job": "z", "le": "1"}, [T0], [2.0]),
        ({"__name__": "h_bucket", "job": "a", "le": "1"}, [T0], [4.0]),
    ])
    node = parse("histogram_quantile(0.5, x)")
    assert isinstance(node, Call)
    out = evaluate_call(node, [0.5, vec], [T0], False)
    assert out.labels == [{"job": "z"}, {"job": "a"}] and out.value.tolist() == [1.0, 0.5]
    none = evaluate_call(node, [0.5, QueryResult.empty("vector")], [T0], False)
    assert none.result_type == "vector" and none.n_series == 0
