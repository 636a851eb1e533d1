"""The planner's own PromQL tree (shardplanner/ast.py): node validation, equality that means
"same query", traversal order, and the rewrites the planner makes (transform, matchers)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shardplanner.ast import (
    Agg,
    Binary,
    Expr,
    Matcher,
    MatrixSel,
    Number,
    Paren,
    Selector,
    Subquery,
    VectorMatching,
    children,
    inject_matcher,
    selectors,
    transform,
    unparen,
    walk,
    with_matcher,
)
from shardplanner.promql import parse
from shardplanner.serialize import to_promql


def test_nodes_refuse_what_promql_cannot_say() -> None:
    with pytest.raises(ValueError):
        Matcher("a", "==", "b")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Binary("**", Number(1), Number(2))
    with pytest.raises(ValueError):  # `bool` only modifies comparisons (parser: "bool modifier can only be used on comparison operators")
        Binary("+", Number(1), Number(2), return_bool=True)
    with pytest.raises(ValueError):  # "no grouping allowed for \"and\" operation" in 2.42's parser
        Binary("and", Selector("a"), Selector("b"), matching=VectorMatching(True, ("x",), "left"))
    assert Binary("==", Number(1), Number(2), return_bool=True).return_bool


def test_number_equality_is_same_query_equality() -> None:
    # NaN == NaN (both print as NaN), but -0 != 0: in Go 1 / -0 is -Inf, 1 / 0 is +Inf.
    assert Number(math.nan) == Number(float("nan")) and hash(Number(math.nan)) == hash(Number(math.nan))
    assert Number(-0.0) != Number(0.0)
    assert Number(2) == Number(2.0) and isinstance(Number(2).value, float)
    assert len({Number(0.0), Number(-0.0), Number(0.0)}) == 2


def test_metric_name_from_name_or_equality_matcher() -> None:
    assert Selector("up").metric_name == "up"
    assert Selector(None, (Matcher("__name__", "=", "up"),)).metric_name == "up"
    assert Selector(None, (Matcher("__name__", "=~", "up"),)).metric_name is None
    assert Selector(None, (Matcher("job", "=", "x"),)).metric_name is None


def test_children_in_print_order_and_walk_is_pre_order() -> None:
    expr = parse("topk(3, rate(x[5m])) / on(h) y")
    assert isinstance(expr, Binary)
    agg = expr.lhs
    assert isinstance(agg, Agg) and children(agg) == (Number(3), agg.expr)  # the param first, as printed
    names = [type(n).__name__ for n in walk(expr)]
    assert names == ["Binary", "Agg", "Number", "Call", "MatrixSel", "Selector", "Selector"]
    assert [s.name for s in selectors(expr)] == ["x", "y"]
    with pytest.raises(TypeError):
        children("x")  # type: ignore[arg-type]


def test_transform_is_bottom_up_and_keeps_unchanged_subtrees() -> None:
    expr = parse("sum(rate(x[5m])) + max_over_time(y[1h:1m])")
    assert transform(expr, lambda n: n) is expr
    seen: list[str] = []
    transform(expr, lambda n: seen.append(type(n).__name__) or n)  # type: ignore[func-returns-value]
    assert seen.index("Selector") < seen.index("MatrixSel") < seen.index("Call") < seen.index("Agg")
    assert seen[-1] == "Binary"
    renamed = transform(expr, lambda n: Selector("z") if n == Selector("y") else n)
    assert isinstance(renamed, Binary) and renamed.lhs is expr.lhs  # type: ignore[union-attr]
    assert to_promql(renamed) == "sum(rate(x[5m])) + max_over_time(z[1h:1m])"
    with pytest.raises(TypeError):  # a matrix selector cannot hold anything but a selector
        transform(parse("x[5m]"), lambda n: Number(1) if isinstance(n, Selector) else n)


def test_with_matcher_ands_into_each_or_group() -> None:
    # {a="1" or b="2"} is the union of its groups: sharding must narrow every group, or the
    # shards would overlap.
    m = Matcher("h", "=", "n1")
    sel = Selector(None, or_matchers=((Matcher("a", "=", "1"),), (Matcher("b", "=", "2"),)))
    got = with_matcher(sel, m)
    assert got.matchers == () and got.or_matchers == ((Matcher("a", "=", "1"), m), (Matcher("b", "=", "2"), m))
    assert with_matcher(Selector("x", (Matcher("a", "=", "1"),)), m).matchers == (Matcher("a", "=", "1"), m)


def test_unparen_and_matrix_keeps_offset_on_its_selector() -> None:
    assert unparen(Paren(Paren(Selector("x")))) == Selector("x")
    assert unparen(Selector("x")) == Selector("x")
    assert parse("x[5m] offset 1m") == MatrixSel(Selector("x", offset_ms=60_000), 300_000)


def test_inject_matcher_reaches_every_selector() -> None:
    tree = parse(
        'sum(rate(x{a="1"}[5m] offset 1m)) / on() group_left count(max_over_time(y[10m:1m]))'
        ' or z{a="b" or c="d"}'
    )
    shard = Matcher("Hostname", "=~", "node-0|node-1")
    out = inject_matcher(tree, shard)
    assert all(shard in s.matchers or all(shard in g for g in s.or_matchers) for s in selectors(out))
    assert to_promql(out) == (
        'sum(rate(x{a="1", Hostname=~"node-0|node-1"}[5m] offset 1m))'
        ' / on() group_left() count(max_over_time(y{Hostname=~"node-0|node-1"}[10m:1m]))'
        ' or z{a="b", Hostname=~"node-0|node-1" or c="d", Hostname=~"node-0|node-1"}'
    )
    assert parse(to_promql(out)) == out


def test_transform_pins_at_start_end() -> None:
    tree = parse("rate(x[5m] @ start()) - max_over_time(y[1h:] @ end() offset 5m)")

    def pin(node: Expr) -> Expr:
        if isinstance(node, (Selector, Subquery)) and node.at in ("start", "end"):
            return replace(node, at=1_000 if node.at == "start" else 2_000)
        return node

    out = transform(tree, pin)
    assert to_promql(out) == "rate(x[5m] @ 1.000) - max_over_time(y[1h:] @ 2.000 offset 5m)"
    assert transform(tree, lambda n: n) is tree  # unchanged trees are not copied


def test_avg_to_sum_and_count() -> None:
    tree = parse("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)")
    assert isinstance(tree, Agg)
    assert to_promql(replace(tree, op="sum")) == "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    assert to_promql(replace(tree, op="count")) == "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
