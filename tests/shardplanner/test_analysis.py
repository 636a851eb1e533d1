"""What the proxy reads off a query's tree beyond its plan (shardplanner/analysis.py)."""

from __future__ import annotations

import pytest

from shardplanner.analysis import absent_like, edge_ms, is_scalar_expr, pinned_at, probe_as_range
from shardplanner.promql import parse

M = 60_000


# With every selector `@ T` the expression's value is the same at every step (2.42
# promql/engine.go: an `@` selector is evaluated at T whatever the step), unless something
# reads the evaluation time itself: a subquery's grid, or time()/hour()/... called without an
# argument (those that take the step's time: parser.AtModifierUnsafeFunctions).
@pytest.mark.parametrize(("query", "at"), [
    ("x @ 100", 100_000),
    ("rate(x[5m] @ 100) + y @ 100", 100_000),
    ("hour(x @ 100)", 100_000),  # hour of the sample's value: pinned
    ("x @ 100 + y @ 200", None),  # two times
    ("x @ 100 + y", None),  # y follows the step
    ("x @ 100 + time()", None),
    ("x @ 100 * hour()", None),
    ("max_over_time(x[5m:1m] @ 100)", None),  # subquery: not analysed, not pinned
    ("x @ start()", None),  # unpinned: no absolute time
    ("vector(1)", None),  # no selector
])
def test_pinned_at(query: str, at: int | None) -> None:
    assert pinned_at(parse(query)) == at


@pytest.mark.parametrize(("query", "want"), [
    ("absent(up)", True),
    ("absent_over_time(up[5m])", True),
    ("scalar(up) * 2", True),
    ("up + vector(1)", True),
    ("rate(up[5m])", False),
    ("sum(up)", False),
])
def test_absent_like(query: str, want: bool) -> None:
    assert absent_like(parse(query)) is want


@pytest.mark.parametrize(("query", "want"), [
    ("1", True),
    ("-(1 + 2) ^ 3", True),
    ("time()", True),
    ("scalar(up)", True),
    ("pi() * 2", True),
    ("up + 1", False),
    ("sum(up)", False),
    ('"text"', False),
    ("vector(1)", False),
])
def test_is_scalar_expr(query: str, want: bool) -> None:
    # PromQL's types (2.42 promql/parser/ast.go, Expr.Type; parser/functions.go ReturnType).
    assert is_scalar_expr(parse(query)) is want


@pytest.mark.parametrize(("query", "want"), [
    ("up", True),
    ("sum by (a) (rate(up[5m]))", True),
    ("up[5m]", False),  # a matrix answer
    ("rate(up[1m])[5m:1m]", False),
    ("1 + 1", False),  # a scalar
    ('"s"', False),
    ("sort(up)", False),  # the order is the answer
    ("(sort_desc(up))", False),
])
def test_probe_as_range(query: str, want: bool) -> None:
    assert probe_as_range(parse(query)) is want


@pytest.mark.parametrize(("query", "edge"), [
    ("x", 5 * M),  # the lookback delta
    ("rate(x[1m])", 5 * M),  # never less than the lookback
    ("rate(x[10m])", 10 * M),
    ("x + rate(y[20m])", 20 * M),
    ("max_over_time(x[30m:1m])", 35 * M),  # the subquery's range, then x's lookback from its first step
    ("max_over_time(rate(x[5m])[30m:1m])", 35 * M),
    ("max_over_time(max_over_time(x[10m])[1h:5m])[2h:10m]", 190 * M),
])
def test_edge_ms(query: str, edge: int) -> None:
    # What one evaluation at t reads: [t - range, t] for x[range], (t - lookback, t] for x; a
    # subquery evaluates its inner expression on steps within [t - range, t] (2.42
    # promql/engine.go getTimeRangesForSelector adds the subquery ranges on the path).
    assert edge_ms(parse(query), 5 * M) == edge


def test_edge_of_an_unparsed_query_is_generous() -> None:
    assert edge_ms(None, 5 * M) == 65 * M
