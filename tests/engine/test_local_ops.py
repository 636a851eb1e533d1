"""proxy/engine/local_ops.py: an `@`-pinned answer restamped at every step (engine.go's
StepInvariantExpr: the value at the pinned time, at every step), absent()/scalar() of merged
series (Prometheus v2.42.0 functions.go funcAbsent + createLabelsForAbsentFunction, funcScalar:
NaN unless exactly one series), a range function's answer as an instant answer, step
stretches joined, and a union's same-labelset check (rangeEval's error). Expected values are
worked out by hand from that code."""

from __future__ import annotations

import math

import pytest

from proxy.engine.errors import DuplicateLabelset
from proxy.engine.local_ops import absent_or_scalar, as_answer, check_distinct, grid_of, joined, restamp
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest
from shardplanner.promql import parse

T0 = 1_700_000_000_000
STEP = 60_000
RANGE = QueryRequest.range("q", T0, T0 + 3 * STEP, STEP)
INSTANT = QueryRequest.instant("q", T0)
GRID = [T0 + k * STEP for k in range(4)]


def _mat(*series: tuple[dict[str, str], list[int], list[float]]) -> QueryResult:
    return QueryResult.from_series("matrix", list(series))


def test_grid_of() -> None:
    assert grid_of(RANGE).tolist() == GRID
    assert grid_of(QueryRequest.range("q", T0, T0 + 150_000, STEP)).tolist() == GRID[:3]  # end off the grid
    assert grid_of(INSTANT).tolist() == [T0]


# -- restamp -------------------------------------------------------------------------------


def test_restamp_a_scalar() -> None:
    pinned = QueryResult.scalar(T0 - 999_000, 2.5)
    out = restamp(pinned, RANGE)
    assert out.to_pylist() == [({}, GRID, [2.5] * 4)]
    now = restamp(pinned, INSTANT)
    assert now.result_type == "scalar" and now.t_ms.tolist() == [T0] and now.value.tolist() == [2.5]


def test_restamp_an_empty_scalar_is_nan() -> None:
    out = restamp(QueryResult.empty("scalar"), INSTANT)
    assert out.result_type == "scalar" and math.isnan(float(out.value[0]))


def test_restamp_a_vector() -> None:
    pinned = QueryResult.from_series("vector", [({"k": "b"}, [T0 - 5_000], [1.0]), ({"k": "a"}, [T0 - 5_000], [2.0])])
    out = restamp(pinned, RANGE)
    # A range answer is sorted by labels; every step carries the pinned value.
    assert out.result_type == "matrix"
    assert out.to_pylist() == [({"k": "a"}, GRID, [2.0] * 4), ({"k": "b"}, GRID, [1.0] * 4)]
    now = restamp(pinned, INSTANT)  # an instant answer keeps the evaluation order
    assert now.result_type == "vector" and now.to_pylist() == [({"k": "b"}, [T0], [1.0]), ({"k": "a"}, [T0], [2.0])]
    assert restamp(QueryResult.empty("vector"), RANGE).n_series == 0


def test_restamp_keeps_notes() -> None:
    pinned = QueryResult.from_series("vector", [({"k": "a"}, [T0], [1.0])], warnings=["w"])
    assert restamp(pinned, RANGE).warnings == ["w"]


# -- scalar() and absent() -------------------------------------------------------------------


def test_scalar_is_nan_unless_exactly_one_series() -> None:
    inner = _mat(({"i": "1"}, GRID[:3], [1.0, 2.0, 3.0]), ({"i": "2"}, GRID[1:2], [20.0]))
    out = absent_or_scalar(parse("scalar(x)"), inner, RANGE)
    assert out.labels == [{}] and out.t_ms.tolist() == GRID
    got = out.value.tolist()
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == 3.0 and math.isnan(got[3])  # 1, 2, 1, 0 series
    one = absent_or_scalar(parse("scalar(x)"), QueryResult.from_series("matrix", [({}, [T0], [-4.0])]), INSTANT)
    assert one.result_type == "scalar" and one.value.tolist() == [-4.0]
    none = absent_or_scalar(parse("scalar(x)"), QueryResult.empty("matrix"), INSTANT)
    assert math.isnan(float(none.value[0]))


def test_absent_at_the_steps_without_a_series() -> None:
    inner = _mat(({"job": "a", "i": "1"}, [GRID[1]], [5.0]), ({"job": "a", "i": "2"}, [GRID[1], GRID[2]], [5.0, 6.0]))
    out = absent_or_scalar(parse('absent(up{job="a"})'), inner, RANGE)
    assert out.to_pylist() == [({"job": "a"}, [GRID[0], GRID[3]], [1.0, 1.0])]
    every = _mat(({"job": "a"}, GRID, [1.0] * 4))
    assert absent_or_scalar(parse('absent(up{job="a"})'), every, RANGE).n_series == 0
    now = absent_or_scalar(parse("absent(up)"), QueryResult.empty("matrix"), INSTANT)
    assert now.result_type == "vector" and now.to_pylist() == [({}, [T0], [1.0])]


@pytest.mark.parametrize(("expr", "labels"), [
    ('absent(up{job="a", env="p"})', {"job": "a", "env": "p"}),
    ('absent({__name__="up", job="a"})', {"job": "a"}),  # the name is never a label of the answer
    ('absent(up{job="a", job="b", x="1"})', {"x": "1"}),  # given twice: left out
    ('absent(up{job="a", job="a"})', {}),  # even with one value (the "arguably wrong" historic rule)
    ('absent(up{job="a", job!="b"})', {}),  # Set, then Del
    ('absent(up{job=~"a|b", env!="d", tier!~"x"})', {}),  # only equality matchers give labels
    ('absent(up{job=""})', {}),  # an empty value is no label
    ("absent(sum(up))", {}),  # not a selector
    ('absent_over_time(up{job="a"}[5m])', {"job": "a"}),  # a matrix selector's matchers
])
def test_absent_labels(expr: str, labels: dict[str, str]) -> None:
    out = absent_or_scalar(parse(expr), QueryResult.empty("matrix"), INSTANT)
    assert out.labels == [labels]


@pytest.mark.parametrize(("expr", "labels"), [
    # Go: job=~"a.*" -> Del(job) (nothing to delete, `has` stays false); job="a" -> Set(job, a).
    ('absent(up{job=~"a.*", job="a"})', {"job": "a"}),
    ('absent(up{env!="d", job="a", env="p"})', {"job": "a", "env": "p"}),
    ('absent(up{job="a", job=~"a.*", job="a"})', {}),  # Set, Del, then Del (job is in `has`)
    ('absent(up{job="", job="a"})', {}),  # Set(job, "") deletes yet marks job as seen
])
def test_absent_labels_follow_matcher_order(expr: str, labels: dict[str, str]) -> None:
    out = absent_or_scalar(parse(expr), QueryResult.empty("matrix"), INSTANT)
    assert out.labels == [labels]


# -- as_answer, joined, check_distinct -------------------------------------------------------


def test_as_answer() -> None:
    m = QueryResult.from_series("matrix", [({"k": "a"}, [T0], [1.0])], warnings=["w"])
    v = as_answer(m, INSTANT)
    assert v.result_type == "vector" and v.to_pylist() == m.to_pylist() and v.warnings == ["w"]
    assert as_answer(m, RANGE) is m
    s = QueryResult.scalar(T0, 1.0)
    assert as_answer(s, INSTANT) is s


def test_joined_stretches() -> None:
    first = _mat(({"k": "a"}, GRID[:2], [1.0, 2.0]))
    second = _mat(({"k": "b"}, GRID[3:], [9.0]), ({"k": "a"}, GRID[2:], [3.0, 4.0]))
    out = joined([first, QueryResult.empty("matrix"), second], RANGE)
    assert out.to_pylist() == [({"k": "a"}, GRID, [1.0, 2.0, 3.0, 4.0]), ({"k": "b"}, GRID[3:], [9.0])]
    assert joined([QueryResult.empty("matrix")], RANGE).result_type == "matrix"
    assert joined([], INSTANT).result_type == "vector"


def test_check_distinct() -> None:
    a = QueryResult.from_series("vector", [({"k": "a"}, [T0], [1.0])])
    b = QueryResult.from_series("vector", [({"k": "b"}, [T0], [1.0])])
    check_distinct([a, b, QueryResult.empty("vector")])
    same_keys = QueryResult.from_series("vector", [({"k": "b"}, [T0], [7.0]), ({"k": "c"}, [T0], [1.0])])
    with pytest.raises(DuplicateLabelset):
        check_distinct([a, b, same_keys])
    with pytest.raises(DuplicateLabelset):  # at different steps, too: one label set, two stores
        check_distinct([_mat(({"k": "a"}, GRID[:1], [1.0])), _mat(({"k": "a"}, GRID[3:], [1.0]))])
