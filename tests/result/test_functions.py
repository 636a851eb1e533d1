"""proxy.engine.functions / aggregate / histogram / gosort in-process: edge cases (NaN, Inf,
-0, empty inputs, duplicate label sets, bad parameters) against Prometheus 2.42's code paths.
Expected values come from Go's definitions (cited per test); the real-Prometheus comparison is
tests/e2e/test_functions_equivalence.py."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from proxy.engine.aggregate import AGGREGATIONS, evaluate_aggregation
from proxy.engine.errors import EvalError
from proxy.engine.functions import INSTANT_FUNCTIONS, evaluate_call
from proxy.engine.histogram import go_parse_float
from proxy.result import QueryResult
from proxy.result.golang import go_format_f, go_format_v, go_max, go_min
from proxy.result.gomath import go_log, go_sin
from proxy.result.gosort import go_search, go_sort, heap_pop, heap_push
from shardplanner.ast import Agg, Call
from shardplanner.promql import parse

T0 = 1_700_000_000_000
GRID = [T0, T0 + 60_000, T0 + 120_000]
NAN, INF = math.nan, math.inf


def vec(*series: tuple[dict[str, str], float]) -> QueryResult:
    return QueryResult.from_series("vector", [(d, [T0], [v]) for d, v in series])


def mat(*series: tuple[dict[str, str], list[int], list[float]]) -> QueryResult:
    return QueryResult.from_series("matrix", list(series))


def call(expr: str, args: list[object], *, grid: list[int] | None = None) -> QueryResult:
    node = parse(expr)
    assert isinstance(node, Call)
    is_range = grid is not None
    return evaluate_call(node, args, grid or [T0], is_range)  # type: ignore[arg-type]


def agg(expr: str, inner: QueryResult, param: object = None, *, grid: list[int] | None = None) -> QueryResult:
    node = parse(expr)
    assert isinstance(node, Agg)
    return evaluate_aggregation(node, inner, param, grid or [T0], grid is not None)  # type: ignore[arg-type]


def rows(r: QueryResult) -> list[tuple[dict[str, str], list[float]]]:
    return [(d, v) for d, _, v in r.to_pylist()]


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x)
                                    == math.copysign(1, y)) for x, y in zip(a, b))


A = {"__name__": "m", "host": "a"}
B = {"__name__": "m", "host": "b"}


# --- functions ----------------------------------------------------------------------------


def test_simple_functions_drop_the_name_and_keep_order() -> None:
    out = call("abs(x)", [vec((B, -2.0), (A, NAN))])
    assert out.result_type == "vector"
    assert [d for d, _ in rows(out)] == [{"host": "b"}, {"host": "a"}]  # evaluation order kept
    assert same([v[0] for _, v in rows(out)], [2.0, NAN])


def test_sgn_keeps_nan_and_signed_zero() -> None:
    out = call("sgn(x)", [vec((A, -0.0), (B, NAN))])
    assert same([v[0] for _, v in rows(out)], [-0.0, NAN])


def test_empty_input_is_an_empty_answer_of_the_right_type() -> None:
    assert call("ceil(x)", [QueryResult.empty("vector")]).result_type == "vector"
    out = call("ceil(x)", [QueryResult.empty("matrix")], grid=GRID)
    assert out.result_type == "matrix" and out.n_series == 0


def test_name_dropping_collision_is_prometheus_error() -> None:
    x = vec(({"__name__": "a", "h": "1"}, 1.0), ({"__name__": "b", "h": "1"}, 2.0))
    with pytest.raises(EvalError, match="^vector cannot contain metrics with the same labelset$"):
        call("floor(x)", [x])
    # ...but not when the two never share a step
    m = mat(({"__name__": "a", "h": "1"}, [GRID[0]], [1.0]), ({"__name__": "b", "h": "1"}, [GRID[1]], [2.0]))
    assert rows(call("floor(x)", [m], grid=GRID)) == [({"h": "1"}, [1.0, 2.0])]


def test_range_answer_is_sorted_by_labels() -> None:
    m = mat((B, GRID, [1.0, 2.0, 3.0]), (A, GRID[1:], [4.0, 5.0]))
    out = call("exp(x)", [m], grid=GRID)
    assert [d for d, _ in rows(out)] == [{"host": "a"}, {"host": "b"}]


def test_clamp_uses_go_min_max_and_inverted_bounds_give_nothing() -> None:
    out = call("clamp(x, 0, 10)", [vec((A, NAN), (B, 20.0)), 0.0, 10.0])
    assert same([v[0] for _, v in rows(out)], [NAN, 10.0])
    assert call("clamp(x, 10, 0)", [vec((A, 1.0)), 10.0, 0.0]).n_series == 0
    # math.Max(+Inf, NaN) is +Inf in Go (numpy says NaN)
    assert rows(call("clamp_min(x, +Inf)", [vec((A, NAN)), INF]))[0][1] == [INF]
    assert same(list(go_max(np.array([0.0, -0.0]), np.array([-0.0, 0.0]))), [0.0, 0.0])
    assert same(list(go_min(np.array([0.0, -0.0]), np.array([-0.0, 0.0]))), [-0.0, -0.0])


def test_round_ties_up_and_to_nearest_per_step() -> None:
    out = call("round(x)", [vec((A, -2.5), (B, 2.5))])
    assert [v[0] for _, v in rows(out)] == [-2.0, 3.0]
    per_step = mat(({}, GRID, [1.0, 0.5, 10.0]))
    out = call("round(x, scalar(y))", [mat((A, GRID, [1.26, 1.26, 1.26])), per_step], grid=GRID)
    assert rows(out) == [({"host": "a"}, [1.0, 1.5, 0.0])]


def test_scalar_time_pi_vector() -> None:
    assert call("scalar(x)", [vec((A, 3.0))]).value[0] == 3.0
    assert math.isnan(call("scalar(x)", [vec((A, 3.0), (B, 4.0))]).value[0])
    assert math.isnan(call("scalar(x)", [QueryResult.empty("vector")]).value[0])
    r = call("scalar(x)", [mat((A, GRID[:1], [7.0]))], grid=GRID)
    assert same(r.value.tolist(), [7.0, NAN, NAN]) and r.labels == [{}]
    assert call("time()", []).value[0] == T0 / 1000
    assert call("pi()", [], grid=GRID).value.tolist() == [math.pi] * 3
    v = call("vector(2)", [2.0])
    assert v.result_type == "vector" and v.labels == [{}]


def test_timestamp_of_a_computed_vector_is_the_step_time() -> None:
    out = call("timestamp(x * 1)", [mat((A, GRID[1:], [1.0, 2.0]))], grid=GRID)
    assert rows(out) == [({"host": "a"}, [GRID[1] / 1000, GRID[2] / 1000])]
    with pytest.raises(ValueError, match="raw samples"):
        call("timestamp(x)", [vec((A, 1.0))])


def test_date_functions_follow_go_for_nan_and_negative() -> None:
    # year(vector(NaN)) on Prometheus 2.42: int64(NaN) is MinInt64 -> year 292277026596
    assert call("year(x)", [vec((A, NAN))]).value[0] == 292277026596
    assert call("month(x)", [vec((A, -1e18))]).value[0] == 3
    assert call("day_of_month(x)", [vec((A, -1e18))]).value[0] == 10
    assert call("day_of_year(x)", [vec((A, NAN))]).value[0] == 339
    assert call("days_in_month(x)", [vec((A, 951782400.0))]).value[0] == 29  # Feb 2000
    assert call("day_of_week()", [], grid=[0]).value[0] == 4  # 1970-01-01 was a Thursday
    assert call("hour()", [], grid=[3_600_000 * 5 + 59_999]).value[0] == 5


def test_label_replace_expands_like_go() -> None:
    x = vec(({"host": "gpu-12"}, 1.0))
    out = call('label_replace(x, "d", "$1-${2}x$$ $name $9 $", "host", "(gpu)-(\\\\d+)")', [x, "d",
               "$1-${2}x$$ $name $9 $", "host", "(gpu)-(\\d+)"])
    assert out.labels[0]["d"] == "gpu-12x$   $"
    # No match: the series is unchanged (name kept); empty result deletes the label.
    same_x = call('label_replace(x, "host", "", "nosuch", "z")', [x, "host", "", "nosuch", "z"])
    assert same_x.labels == [{"host": "gpu-12"}]
    gone = call('label_replace(x, "host", "", "host", ".*")', [x, "host", "", "host", ".*"])
    assert gone.labels == [{}]


def test_label_replace_and_join_errors_even_on_empty_input() -> None:
    empty = QueryResult.empty("vector")
    with pytest.raises(EvalError, match=r"^invalid regular expression in label_replace\(\): \($"):
        call('label_replace(x, "a", "b", "c", "(")', [empty, "a", "b", "c", "("])
    with pytest.raises(EvalError, match=r"^invalid destination label name in label_replace\(\): 1a$"):
        call('label_replace(x, "1a", "b", "c", "d")', [empty, "1a", "b", "c", "d"])
    with pytest.raises(EvalError, match=r"^invalid source label name in label_join\(\): a-b$"):
        call('label_join(x, "a", ",", "a-b")', [empty, "a", ",", "a-b"])
    x = vec(({"h": "1", "g": "0"}, 1.0), ({"h": "1", "g": "1"}, 2.0))
    with pytest.raises(EvalError, match="same labelset"):
        call('label_replace(x, "g", "", "g", ".*")', [x, "g", "", "g", ".*"])


def test_label_join_keeps_name() -> None:
    out = call('label_join(x, "j", "/", "host", "nosuch", "host")', [vec((A, 1.0)), "j", "/", "host", "nosuch",
                                                                      "host"])
    assert out.labels == [{"__name__": "m", "host": "a", "j": "a//a"}]


def test_sort_puts_nan_last_and_range_by_labels() -> None:
    x = vec(({"i": "1"}, 3.0), ({"i": "2"}, NAN), ({"i": "3"}, 1.0), ({"i": "4"}, 2.0))
    assert [d["i"] for d in call("sort(x)", [x]).labels] == ["3", "4", "1", "2"]
    assert [d["i"] for d in call("sort_desc(x)", [x]).labels] == ["1", "4", "3", "2"]
    m = mat((B, GRID, [1.0, 1.0, 1.0]), (A, GRID, [2.0, 2.0, 2.0]))
    assert call("sort(x)", [m], grid=GRID).labels[0]["host"] == "b"  # already the answer's order


def test_histogram_quantile_rules() -> None:
    def h(*buckets: tuple[str, float], q: float = 0.5, name: str = "x_bucket") -> list[float]:
        series = [({"__name__": name, "le": le, "j": "a"}, v) for le, v in buckets]
        return call("histogram_quantile(0.5, x)", [q, vec(*series)]).value.tolist()

    assert h(("1", 10.0), ("2", 20.0), ("+Inf", 20.0)) == [1.0]
    assert h(("1", 10.0), ("2", 20.0), ("+Inf", 20.0), q=0.75) == [1.5]
    assert same(h(("1", 10.0), ("2", 20.0)), [NAN])  # no +Inf bucket
    assert same(h(("+Inf", 20.0)), [NAN])  # fewer than two buckets
    assert same(h(("1", 0.0), ("+Inf", 0.0)), [NAN])  # no observations
    assert h(("1", 10.0), ("+Inf", 20.0), q=0.9) == [1.0]  # rank in +Inf: the last finite bound
    assert h(("-1", 10.0), ("+Inf", 20.0), q=0.1) == [-1.0]  # first bound <= 0
    assert h(("1", 10.0), ("+Inf", 20.0), q=-1) == [-INF]
    assert h(("1", 10.0), ("+Inf", 20.0), q=2) == [INF]
    assert h(("1", 30.0), ("2", 20.0), ("+Inf", 40.0), q=0.5) == [1 * (20 / 30)]  # made monotonic
    assert h(("1", 10.0), ("1.0", 10.0), ("+Inf", 40.0), q=0.25) == [0.5]  # coalesced
    assert h(("1", 10.0), ("x", 99.0), ("+Inf", 20.0), q=0.75) != []  # unparsable le skipped
    out = call("histogram_quantile(0.5, x)", [0.5, vec(({"__name__": "x", "j": "a"}, 1.0))])
    assert out.n_series == 0  # no le: skipped
    two = vec(*[({"__name__": n, "le": le}, 1.0) for n in ("a", "b") for le in ("1", "+Inf")])
    with pytest.raises(EvalError, match="same labelset"):
        call("histogram_quantile(0.5, x)", [0.5, two])


def test_go_parse_float() -> None:
    assert go_parse_float("+Inf") == INF and go_parse_float("-infinity") == -INF
    assert go_parse_float("0x1p-2") == 0.25 and go_parse_float(".5") == 0.5
    # Go's digit separators (real Prometheus 2.42 reads time=1_000 as 1000: tests/api/test_fuzz_endpoints.py)
    assert go_parse_float("1_0") == 10.0 and go_parse_float("0x_1p4") == 16.0
    for bad in ("_1", "1_", "1__0", " 1", "1e400", "+nan", "", "abc", "0x1", "\u0661"):
        assert go_parse_float(bad) is None, bad
    assert math.isnan(go_parse_float("NaN") or 0.0)


def test_native_histogram_functions_are_empty_on_floats() -> None:
    assert call("histogram_count(x)", [vec((A, 1.0))]).n_series == 0
    assert call("histogram_fraction(0, 1, x)", [0.0, 1.0, vec((A, 1.0))]).n_series == 0


def test_every_function_is_callable() -> None:
    assert "absent" not in INSTANT_FUNCTIONS and "rate" not in INSTANT_FUNCTIONS
    # promql/parser/functions.go of v2.42 has 70 functions: 21 take a range vector, plus absent
    # (evaluated by the executor itself).
    assert len(INSTANT_FUNCTIONS) == 48


# --- aggregations -------------------------------------------------------------------------

H = [{"__name__": "m", "g": str(i % 2), "i": str(i)} for i in range(6)]


def test_sum_avg_in_go_order_and_first_value() -> None:
    x = vec((H[0], 1e16), (H[1], 1.0), (H[2], -1e16), (H[3], 1.0))
    assert agg("sum(x)", x).value.tolist() == [((1e16 + 1.0) - 1e16) + 1.0]
    assert same(agg("sum(x)", vec((H[0], -0.0))).value.tolist(), [-0.0])
    # avg: mean += v/n - mean/n, and an infinite mean is kept
    assert agg("avg(x)", vec((H[0], INF), (H[1], 1.0))).value.tolist() == [INF]
    assert same(agg("avg(x)", vec((H[0], INF), (H[1], -INF))).value.tolist(), [NAN])
    vals = [0.1, 0.7, 0.3]
    mean = vals[0]
    for n, v in enumerate(vals[1:], start=2):
        mean += v / n - mean / n
    assert agg("avg(x)", vec(*[(H[i], v) for i, v in enumerate(vals)])).value.tolist() == [mean]


def test_min_max_nan_rules() -> None:
    x = vec((H[0], NAN), (H[1], 2.0), (H[2], 1.0))
    assert agg("min(x)", x).value.tolist() == [1.0]
    assert agg("max(x)", x).value.tolist() == [2.0]
    assert same(agg("max(x)", vec((H[0], NAN))).value.tolist(), [NAN])


def test_stddev_stdvar_welford() -> None:
    vals = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    x = vec(*[({"i": str(i)}, v) for i, v in enumerate(vals)])
    assert agg("stdvar(x)", x).value.tolist() == [4.0]
    assert agg("stddev(x)", x).value.tolist() == [2.0]
    assert agg("stddev(x)", vec((H[0], 5.0))).value.tolist() == [0.0]


def test_grouping_labels_and_group_order() -> None:
    x = vec((H[1], 1.0), (H[0], 2.0), (H[3], 3.0))
    out = agg("sum by (g) (x)", x)
    assert out.labels == [{"g": "1"}, {"g": "0"}]  # order of appearance
    out = agg("count without (i) (x)", x)
    assert out.labels == [{"g": "1"}, {"g": "0"}] and out.value.tolist() == [2.0, 1.0]
    assert agg("group by (nosuch) (x)", x).labels == [{}]
    m = mat((H[1], GRID, [1.0] * 3), (H[0], GRID, [2.0] * 3))
    assert agg("max by (g) (x)", m, grid=GRID).labels == [{"g": "0"}, {"g": "1"}]


def test_topk_bottomk() -> None:
    x = vec((H[0], 1.0), (H[1], 3.0), (H[2], NAN), (H[3], 3.0), (H[4], 2.0))
    out = agg("topk(2, x)", x, 2.0)
    assert out.labels == [H[1], H[3]] and out.value.tolist() == [3.0, 3.0]  # full labels kept
    out = agg("bottomk(2, x)", x, 2.0)
    assert out.value.tolist() == [1.0, 2.0]
    assert agg("topk(0, x)", x, 0.0).n_series == 0
    assert agg("topk(2.9, x)", x, 2.9).n_series == 2
    with pytest.raises(EvalError, match="overflows int64"):  # engine.go: above 9223372036854774784
        agg("topk(9.3e18, x)", x, 2.0**63)
    with pytest.raises(EvalError, match=r"^Scalar value 1e\+19 overflows int64$"):
        agg("topk(1e19, x)", QueryResult.empty("vector"), 1e19)
    with pytest.raises(EvalError, match=r"^Scalar value NaN overflows int64$"):
        agg("topk(NaN, x)", x, NAN)
    nan_only = vec((H[0], NAN), (H[1], NAN))
    assert agg("topk(1, x)", nan_only, 1.0).n_series == 1


def test_topk_per_step_k_in_a_range() -> None:
    m = mat((H[0], GRID, [1.0, 1.0, 1.0]), (H[1], GRID, [2.0, 2.0, 2.0]))
    k = mat(({}, GRID, [1.0, 2.0, 0.0]))
    out = agg("topk(scalar(k), x)", m, k, grid=GRID)
    assert rows(out) == [(H[0], [1.0]), (H[1], [2.0, 2.0])]  # k = 1, 2, 0
    assert [t for _, t, _ in out.to_pylist()] == [[GRID[1]], GRID[:2]]


def test_quantile() -> None:
    x = vec(*[({"i": str(i)}, float(v)) for i, v in enumerate([4, 1, 3, 2])])
    assert agg("quantile(0.5, x)", x, 0.5).value.tolist() == [2.5]
    assert agg("quantile(0, x)", x, 0.0).value.tolist() == [1.0]
    assert agg("quantile(2, x)", x, 2.0).value.tolist() == [INF]
    assert same(agg("quantile(NaN, x)", x, NAN).value.tolist(), [NAN])


def test_count_values() -> None:
    x = vec((H[0], 1.0), (H[1], 1.0), (H[2], -0.0), (H[3], NAN), (H[4], 1e21), (H[5], 0.1))
    out = agg('count_values("v", x)', x, "v")
    assert out.labels == [{"v": "1"}, {"v": "-0"}, {"v": "NaN"}, {"v": "1000000000000000000000"}, {"v": "0.1"}]
    assert out.value.tolist() == [2.0, 1.0, 1.0, 1.0, 1.0]
    out = agg('count_values by (g) ("v", x)', x, "v")
    assert out.labels[0] == {"g": "0", "v": "1"}
    with pytest.raises(EvalError, match='^invalid label name "a-b"$'):
        agg('count_values("a-b", x)', QueryResult.empty("vector"), "a-b")


def test_every_aggregation_name() -> None:
    assert AGGREGATIONS == {"sum", "min", "max", "avg", "count", "group", "topk", "bottomk", "quantile", "stddev",
                            "stdvar", "count_values"}


def test_bad_arguments_are_programming_errors() -> None:
    with pytest.raises(ValueError):
        agg("sum(x)", mat((A, [1], [1.0])))  # a matrix for an instant query
    with pytest.raises(ValueError):
        call("abs(x)", [mat((A, [T0 + 1], [1.0]))], grid=GRID)  # off the grid


# --- Go helpers -------------------------------------------------------------------------


def test_go_sort_sorts_and_is_deterministic() -> None:
    rng = random.Random(7)
    for n in (0, 1, 5, 13, 60, 300):
        items = [rng.choice([1.0, 2.0, 3.0, 4.0]) for _ in range(n)]
        idx = list(range(n))
        go_sort(idx, lambda a, b, items=items: items[a] < items[b])  # type: ignore[misc]
        assert [items[i] for i in idx] == sorted(items)
        again = list(range(n))
        go_sort(again, lambda a, b, items=items: items[a] < items[b])  # type: ignore[misc]
        assert again == idx
    # Go's insertion sort (n <= 12) is stable: equal values keep their order
    idx = list(range(6))
    go_sort(idx, lambda a, b: [1, 0, 1, 0, 1, 0][a] < [1, 0, 1, 0, 1, 0][b])
    assert idx == [1, 3, 5, 0, 2, 4]


def test_heap_and_search() -> None:
    h: list[float] = []
    for v in [5.0, 1.0, 4.0, 2.0]:
        heap_push(h, v, lambda a, b: a < b)
    assert [heap_pop(h, lambda a, b: a < b) for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert go_search(10, lambda i: i >= 7) == 7 and go_search(3, lambda i: False) == 3


def test_go_formatting() -> None:
    assert [go_format_v(v) for v in (1e19, 123456.0, 1234567.0, 1e-5, NAN, -INF)] == [
        "1e+19", "123456", "1.234567e+06", "1e-05", "NaN", "-Inf"]
    assert [go_format_f(v) for v in (2.0, 1.5e-7, -0.0, INF)] == ["2", "0.00000015", "-0", "+Inf"]


def test_go_math_special_values() -> None:
    assert same(go_log(np.array([0.0, -1.0, INF, 1.0, NAN])).tolist(), [-INF, NAN, INF, 0.0, NAN])
    assert same(go_sin(np.array([-0.0, INF, NAN, 1e300])).tolist(), [-0.0, NAN, NAN, math.sin(1e300)])
