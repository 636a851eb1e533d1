"""The evaluator's walk over hand-built trees (proxy/engine/evaluator.py): leaves supplied by
the caller, one dispatch per node type, the budget charged per node."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from proxy.engine.errors import EvalLimit
from proxy.engine.evaluator import evaluate, evaluate_off_loop
from proxy.engine.nodes import (
    AbsentNode,
    AggregateNode,
    BinaryNode,
    CallNode,
    Inner,
    Leaf,
    Literal,
    PinnedNode,
    RawWindow,
    SegmentsNode,
    SubqueryNode,
    UnionNode,
    WindowNode,
    children,
    leaves,
)
from proxy.engine.work import WorkBudget
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest
from shardplanner.promql import parse

T0 = 1_700_000_000_000
REQ = QueryRequest.instant("q", T0)
RANGE = QueryRequest.range("q", T0, T0 + 120_000, 60_000)


def _vec(*pairs: tuple[dict[str, str], float]) -> QueryResult:
    return QueryResult.from_series("vector", [(d, [T0], [v]) for d, v in pairs])


def test_a_tree_of_operators_over_leaves() -> None:
    a, b = Leaf(REQ), Leaf(REQ)
    answers = {a: _vec(({"__name__": "x", "k": "1"}, 2.0), ({"__name__": "x", "k": "2"}, 3.0)),
               b: _vec(({"__name__": "y", "k": "1"}, 10.0), ({"__name__": "y", "k": "2"}, 20.0))}
    ratio = BinaryNode(parse("x / on (k) y"), REQ, a, b)
    tree = AggregateNode(parse("sum(x / on (k) y)"), REQ, CallNode(parse("abs(x)"), REQ, (ratio,)))
    out = evaluate(tree, answers, {}, WorkBudget())
    assert isinstance(out, QueryResult) and out.value.tolist() == [2.0 / 10.0 + 3.0 / 20.0]
    assert leaves(tree) == ([a, b], [])
    assert children(ratio) == (a, b)


def test_a_literal_parameter_and_a_union() -> None:
    a, b = Leaf(REQ), Leaf(REQ)
    answers = {a: _vec(({"m": "a"}, 1.0)), b: _vec(({"m": "b"}, 5.0))}
    tree = AggregateNode(parse("topk(1, x)"), REQ, UnionNode(parse("x"), REQ, (a, b)), Literal(1.0))
    out = evaluate(tree, answers, {}, WorkBudget())
    assert isinstance(out, QueryResult) and out.labels == [{"m": "b"}]


def test_a_window_node_reads_its_raw_window() -> None:
    node = parse("sum_over_time(x[2m])")
    sel = parse("x")
    window = RawWindow(sel, (("amp", T0 - 120_000, T0 + 120_000),), T0 - 120_000, T0 + 120_000)
    raw = QueryResult.from_series("matrix", [({"__name__": "x"}, [T0 - 60_000, T0, T0 + 60_000], [1.0, 2.0, 4.0])])
    out = evaluate(WindowNode(node, RANGE, window), {}, {window: raw}, WorkBudget())
    assert isinstance(out, QueryResult)
    assert out.labels == [{}] and out.value.tolist() == [3.0, 7.0, 6.0]
    assert leaves(WindowNode(node, RANGE, window)) == ([], [window])


def test_leaves_must_be_supplied_and_limits_hold() -> None:
    a = Leaf(REQ)
    tree = CallNode(parse("abs(x)"), REQ, (a,))
    with pytest.raises(ValueError, match="no answer supplied"):
        evaluate(tree, {}, {}, WorkBudget())
    big = QueryResult.from_series("vector", [({"i": str(i)}, [T0], [1.0]) for i in range(50)])
    with pytest.raises(EvalLimit, match="limits.max_eval_work"):
        evaluate(tree, {a: big}, {}, WorkBudget(max_work=10))
    with pytest.raises(EvalLimit, match="limits.max_eval_series"):
        evaluate(tree, {a: big}, {}, WorkBudget(max_series=10))


def test_a_subquery_over_its_bound_is_refused_before_evaluating() -> None:
    inner = Leaf(QueryRequest.range("x", T0 - 300_000, T0, 60_000))
    samples = QueryResult.from_series("matrix", [({"i": "1"}, list(range(T0 - 300_000, T0 + 1, 60_000)),
                                                  [float(i) for i in range(6)])])
    tree = SubqueryNode(parse("max_over_time(x[5m:1m])"), REQ, inner)
    out = evaluate(tree, {inner: samples}, {}, WorkBudget())
    assert isinstance(out, QueryResult) and out.value.tolist() == [5.0]
    with pytest.raises(EvalLimit, match="limits.max_window_samples"):
        evaluate(tree, {inner: samples}, {}, WorkBudget(), max_subquery_samples=5)


def test_off_loop_runs_in_the_pool_and_gives_the_same_answer() -> None:
    a = Leaf(REQ)
    big = QueryResult.from_series("vector", [({"i": str(i)}, [T0], [float(i)]) for i in range(30_000)])
    tree = AggregateNode(parse("sum(x)"), REQ, a)
    got = asyncio.run(evaluate_off_loop(tree, {a: big}, {}, WorkBudget()))
    assert isinstance(got, QueryResult) and got.value.tolist() == [float(np.arange(30_000).sum())]


def test_pinned_segments_and_absent_nodes() -> None:
    at = Leaf(QueryRequest.instant("x", T0 - 60_000))
    pinned = PinnedNode(parse("x @ 1699999940"), RANGE, at)
    out = evaluate(pinned, {at: _vec(({"k": "1"}, 4.0))}, {}, WorkBudget())
    assert isinstance(out, QueryResult) and out.t_ms.tolist() == [T0, T0 + 60_000, T0 + 120_000]
    assert out.value.tolist() == [4.0, 4.0, 4.0]

    first, second = Leaf(QueryRequest.range("x", T0, T0 + 60_000, 60_000)), Leaf(
        QueryRequest.range("x", T0 + 120_000, T0 + 120_000, 60_000))
    stretch = SegmentsNode(parse("x"), RANGE, (first, second))
    answers = {first: QueryResult.from_series("matrix", [({"k": "1"}, [T0, T0 + 60_000], [1.0, 2.0])]),
               second: QueryResult.from_series("matrix", [({"k": "1"}, [T0 + 120_000], [3.0])])}
    joined = evaluate(stretch, answers, {}, WorkBudget())
    assert isinstance(joined, QueryResult) and joined.value.tolist() == [1.0, 2.0, 3.0]

    arg = Leaf(RANGE)
    absent = AbsentNode(parse('absent(x{job="a"})'), RANGE, arg)
    some = QueryResult.from_series("matrix", [({"job": "a"}, [T0 + 60_000], [1.0])])
    gaps = evaluate(absent, {arg: some}, {}, WorkBudget())
    assert isinstance(gaps, QueryResult) and gaps.labels == [{"job": "a"}]
    assert gaps.t_ms.tolist() == [T0, T0 + 120_000]


def test_every_node_type_has_a_kind_and_a_case() -> None:
    """A new node type must be named for explain and have its case in the walk."""
    kinds = {cls: cls.KIND for cls in Inner.__subclasses__()}
    assert len(set(kinds.values())) == len(kinds) and all(kinds.values())
    assert {c.__name__ for c in kinds} == {"BinaryNode", "AggregateNode", "CallNode", "AbsentNode", "PinnedNode",
                                           "SegmentsNode", "UnionNode", "WindowNode", "SubqueryNode"}
