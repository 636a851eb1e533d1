"""proxy/engine/aggregate.py: PromQL's aggregation operators as Prometheus v2.42.0 evaluates
them, promql/engine.go evaluator.aggregation(): groups in order of appearance
(orderedResult), sum from the first value in input order, avg's incremental mean
`mean += v/n - mean/n` with its Inf rules, stddev/stdvar's running update from value 0,
min/max replacing a NaN, topk/bottomk through container/heap (vectorByValueHeap's Less puts
NaN first; `k == 1` replaces in place) and, for an instant answer,
sort.Sort(sort.Reverse(heap)); count_values with strconv.FormatFloat(v, 'f', -1, 64).
Expected values are worked out by hand from that code (tests/engine/test_quantile.py has the
`quantile` aggregation)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from proxy.engine.aggregate import evaluate_aggregation, k_per_step
from proxy.engine.errors import EvalError
from proxy.result import QueryResult
from shardplanner.ast import Agg
from shardplanner.promql import parse

NAN, INF = math.nan, math.inf
T0 = 1_700_000_000_000
GRID = [T0, T0 + 60_000, T0 + 120_000]


def _vec(*series: tuple[dict[str, str], float]) -> QueryResult:
    return QueryResult.from_series("vector", [(d, [T0], [v]) for d, v in series])


def _named(values: Sequence[float]) -> QueryResult:
    """Series s0, s1, ... of metric m in that (evaluation) order."""
    return _vec(*[({"__name__": "m", "s": f"s{i}"}, v) for i, v in enumerate(values)])


def _agg(expr: str, inner: QueryResult, param: object = None, grid: list[int] | None = None) -> QueryResult:
    node = parse(expr)
    assert isinstance(node, Agg)
    return evaluate_aggregation(node, inner, param, grid or [T0], grid is not None)  # type: ignore[arg-type]


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or
                                    (x == y and math.copysign(1, x) == math.copysign(1, y)) for x, y in zip(a, b))


# -- the arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "values", "want"), [
    ("sum", [1.0, NAN, 2.0], NAN),
    ("sum", [INF, -INF], NAN),
    ("sum", [0.1, 0.2, 0.3], (0.1 + 0.2) + 0.3),  # input order, no compensation
    ("avg", [1e308, 1e308], 1e308),  # v/n - mean/n: no overflow to Inf
    ("avg", [-INF, 5.0, -INF], -INF),
    ("avg", [5.0, INF], INF),  # 5 + (Inf/2 - 5/2)
    ("avg", [INF, NAN], NAN),
    ("min", [NAN, 3.0, 1.0], 1.0), ("min", [2.0, NAN], 2.0), ("min", [NAN, NAN], NAN),
    ("max", [NAN, -INF], -INF), ("max", [-0.0, 0.0], -0.0),  # -0 < 0 is false: the first zero stays
    ("count", [NAN, NAN], 2.0),
    ("group", [NAN, 7.0], 1.0),
    ("stdvar", [1.0, 3.0], 1.0),  # mean 1 -> 2, value 0 + 2 * (3 - 2) = 2, / 2
    ("stddev", [1.0, 1.0, 1.0], 0.0),
    ("stdvar", [1.0, INF], NAN),
])
def test_arithmetic(op: str, values: list[float], want: float) -> None:
    assert _same(_agg(f"{op}(x)", _named(values)).value.tolist(), [want])


def test_avg_is_the_incremental_mean() -> None:
    vals = [0.1, 0.7, 0.3, 1e-9, 12.5]
    mean = vals[0]
    for n, v in enumerate(vals[1:], start=2):
        mean += v / n - mean / n
    assert _agg("avg(x)", _named(vals)).value.tolist() == [mean]


def test_stddev_is_welford_from_zero() -> None:
    vals = [4.0, 7.0, 13.0, 16.0]
    mean, value = vals[0], 0.0
    for n, v in enumerate(vals[1:], start=2):
        delta = v - mean
        mean += delta / n
        value += delta * (v - mean)
    assert _agg("stddev(x)", _named(vals)).value.tolist() == [math.sqrt(value / 4)]
    assert _agg("stdvar(x)", _named(vals)).value.tolist() == [value / 4]


# -- groups and labels ---------------------------------------------------------------------


def test_grouping_labels() -> None:
    x = _vec(({"__name__": "m", "job": "a", "i": "1"}, 1.0), ({"__name__": "m", "job": "b", "i": "2"}, 2.0),
             ({"__name__": "m", "job": "a", "i": "3"}, 4.0), ({"__name__": "m", "i": "4"}, 8.0))
    out = _agg("sum by (job) (x)", x)
    assert out.labels == [{"job": "a"}, {"job": "b"}, {}] and out.value.tolist() == [5.0, 2.0, 8.0]
    out = _agg("sum without (i) (x)", x)  # without drops the metric name too
    assert out.labels == [{"job": "a"}, {"job": "b"}, {}]
    out = _agg("sum by (__name__) (x)", x)  # by keeps it when asked
    assert out.labels == [{"__name__": "m"}] and out.value.tolist() == [15.0]
    assert _agg("sum(x)", x).labels == [{}]


def test_range_answers_are_sorted_by_labels_with_gaps() -> None:
    inner = QueryResult.from_series("matrix", [
        ({"job": "b"}, GRID, [1.0, 2.0, 3.0]),
        ({"job": "a"}, GRID[1:], [10.0, 20.0]),
        ({"job": "b", "i": "2"}, GRID[:1], [100.0]),
    ])
    out = _agg("sum by (job) (x)", inner, grid=GRID)
    assert out.to_pylist() == [({"job": "a"}, GRID[1:], [10.0, 20.0]), ({"job": "b"}, GRID, [101.0, 2.0, 3.0])]


def test_empty_input_and_notes() -> None:
    empty = QueryResult.empty("vector", warnings=["w"], infos=["i"])
    out = _agg("sum(x)", empty)
    assert out.result_type == "vector" and out.n_series == 0 and out.warnings == ["w"] and out.infos == ["i"]
    assert _agg("count(x)", QueryResult.empty("matrix"), grid=GRID).result_type == "matrix"


# -- topk / bottomk --------------------------------------------------------------------------


def test_topk_ties_follow_the_heap() -> None:
    # topk(2) over a=3, b=3, c=3, d=5, e=3 (engine.go, heap of 2, Less = `<`):
    # [a] -> push b: [a b] -> c: root a < 3? no -> d: pop a, push d: [b d] -> e: b < 3? no.
    # The answer: sort.Reverse of [b d] -> d, b. (Not a, the first 3, nor a "stable" pick.)
    x = _vec(*[({"s": s}, v) for s, v in zip("abcde", [3.0, 3.0, 3.0, 5.0, 3.0])])
    out = _agg("topk(2, x)", x, 2.0)
    assert out.labels == [{"s": "d"}, {"s": "b"}] and out.value.tolist() == [5.0, 3.0]
    # bottomk(2), Less = `>`: [a] -> push b -> c, d, e: a > v? never: a, b.
    out = _agg("bottomk(2, x)", x, 2.0)
    assert out.labels == [{"s": "a"}, {"s": "b"}]
    # k = 1 replaces the root in place: the first strictly greater value wins.
    assert _agg("topk(1, x)", x, 1.0).labels == [{"s": "d"}]


def test_topk_nan_is_replaced_first_and_listed_last() -> None:
    # a=NaN, b=1, c=NaN, k=2: [a] -> push b: [a b] (1 < NaN false) -> c: the root is NaN: pop a,
    # push c: up (NaN is Less) -> [c b]. Reverse sort: Less(c, b) -> swap -> b, c.
    x = _vec(({"s": "a"}, NAN), ({"s": "b"}, 1.0), ({"s": "c"}, NAN))
    out = _agg("topk(2, x)", x, 2.0)
    assert out.labels == [{"s": "b"}, {"s": "c"}] and _same(out.value.tolist(), [1.0, NAN])
    out = _agg("bottomk(2, x)", x, 2.0)
    assert out.labels == [{"s": "b"}, {"s": "c"}]


def test_topk_keeps_whole_series_per_group_and_k_rules() -> None:
    x = _vec(({"__name__": "m", "g": "1", "s": "a"}, 1.0), ({"__name__": "m", "g": "2", "s": "b"}, 2.0),
             ({"__name__": "m", "g": "1", "s": "c"}, 3.0))
    out = _agg("topk by (g) (1, x)", x, 1.0)
    assert out.labels == [{"__name__": "m", "g": "1", "s": "c"}, {"__name__": "m", "g": "2", "s": "b"}]
    assert _agg("topk(10, x)", x, 10.0).n_series == 3  # k above the input's size: everything
    assert _agg("topk(2.99, x)", x, 2.99).n_series == 2  # int64(f) truncates
    assert _agg("topk(-0.5, x)", x, -0.5).n_series == 0  # int64(-0.5) = 0 < 1: nothing
    assert k_per_step(np.array([2.99, -2.99, 0.0])).tolist() == [2, -2, 0]


def test_topk_in_a_range_query_picks_per_step() -> None:
    inner = QueryResult.from_series("matrix", [
        ({"s": "a"}, GRID, [1.0, 5.0, 1.0]),
        ({"s": "b"}, GRID, [2.0, 4.0, NAN]),
    ])
    out = _agg("topk(1, x)", inner, 1.0, grid=GRID)
    assert out.to_pylist() == [({"s": "a"}, GRID[1:], [5.0, 1.0]), ({"s": "b"}, GRID[:1], [2.0])]


# -- count_values ----------------------------------------------------------------------------


def test_count_values_formats_with_go_f_minus_one() -> None:
    x = _named([1e-7, 100.0, 1e21, 0.1 + 0.2, -INF, 100.0])
    out = _agg('count_values("v", x)', x, "v")
    # 'f' with the shortest digits: never an exponent; 0.1 + 0.2 keeps all 17 digits.
    assert out.labels == [{"v": "0.0000001"}, {"v": "100"}, {"v": "1000000000000000000000"},
                          {"v": "0.30000000000000004"}, {"v": "-Inf"}]
    assert out.value.tolist() == [1.0, 2.0, 1.0, 1.0, 1.0]


def test_count_values_overwrites_a_label_and_works_with_without() -> None:
    x = _vec(({"__name__": "m", "job": "a", "i": "1"}, 2.0), ({"__name__": "m", "job": "b", "i": "2"}, 2.0),
             ({"__name__": "m", "job": "a", "i": "3"}, 3.0))
    # The value label replaces the series' own label of that name before grouping.
    out = _agg('count_values("job", x)', x, "job")
    assert out.labels == [{"job": "2"}, {"job": "3"}] and out.value.tolist() == [2.0, 1.0]
    out = _agg('count_values without (i) ("v", x)', x, "v")
    assert out.labels == [{"job": "a", "v": "2"}, {"job": "b", "v": "2"}, {"job": "a", "v": "3"}]
    with pytest.raises(EvalError, match='^invalid label name "1v"$'):
        _agg('count_values("1v", x)', x, "1v")


def test_count_values_in_a_range_query() -> None:
    inner = QueryResult.from_series("matrix", [({"i": "1"}, GRID, [1.0, 1.0, 2.0]), ({"i": "2"}, GRID, [1.0, 2.0, 2.0])])
    out = _agg('count_values("v", x)', inner, "v", grid=GRID)
    assert out.to_pylist() == [({"v": "1"}, GRID[:2], [2.0, 1.0]), ({"v": "2"}, GRID[1:], [1.0, 2.0])]


def test_misuse_is_a_programming_error() -> None:
    x = _named([1.0])
    with pytest.raises(TypeError):
        _agg("topk(1, x)", x, "1")
    with pytest.raises(TypeError):
        _agg('count_values("v", x)', x, 1.0)
    with pytest.raises(ValueError, match="one evaluation time"):
        evaluate_aggregation(parse("sum(x)"), x, None, GRID, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an aggregation"):
        evaluate_aggregation(Agg("rate", parse("x")), x, None, [T0], False)
