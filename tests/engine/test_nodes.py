"""proxy/engine/nodes.py: the engine's evaluation tree -- what a raw window leaves uncovered,
each node's text for explain, its children in argument order, the leaves of a tree left to
right, and identity comparison (the pipeline keys leaves' answers by the leaf itself).
tests/engine/test_evaluator.py evaluates such trees; this file checks the tree alone."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.engine.nodes import (
    AbsentNode,
    AggregateNode,
    BinaryNode,
    CallNode,
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
from shardplanner.plan import QueryRequest
from shardplanner.promql import parse

T0 = 1_700_000_000_000
REQ = QueryRequest.instant("q", T0)


def _window(reads: tuple[tuple[str, int, int], ...], lo: int = 0, hi: int = 100) -> RawWindow:
    return RawWindow(parse("x"), reads, lo, hi)


@pytest.mark.parametrize(("reads", "want"), [
    ((("amp", 0, 100),), []),
    ((), [(0, 100)]),  # nobody holds it
    ((("amp", 0, 40), ("local", 41, 100)), []),  # adjacent, both ends in: no gap
    ((("amp", 0, 40), ("local", 42, 100)), [(41, 41)]),
    ((("local", 60, 100), ("amp", 0, 20)), [(21, 59)]),  # reads in any order
    ((("amp", 10, 50), ("local", 30, 60)), [(0, 9), (61, 100)]),  # overlapping reads
    ((("amp", 0, 80), ("local", 10, 20)), [(81, 100)]),  # a read inside another
    ((("amp", -50, 150),), []),  # reads beyond the window
    ((("amp", 100, 100),), [(0, 99)]),
])
def test_uncovered_stretches(reads: tuple[tuple[str, int, int], ...], want: list[tuple[int, int]]) -> None:
    assert _window(reads).uncovered() == want


def test_texts_for_explain() -> None:
    a, b = Leaf(REQ), Leaf(REQ)
    assert BinaryNode(parse("x / y"), REQ, a, b).text() == "/"
    assert BinaryNode(parse("x > bool y"), REQ, a, b).text() == "> bool"
    assert BinaryNode(parse("x * on (k, j) group_left (t) y"), REQ, a, b).text() == "* on (k, j) group_left (t)"
    assert BinaryNode(parse("x - ignoring (i) y"), REQ, a, b).text() == "- ignoring (i)"
    assert AggregateNode(parse("sum by (job) (x)"), REQ, a).text() == "sum by (job)"
    assert AggregateNode(parse("max without (i) (x)"), REQ, a).text() == "max without (i)"
    assert AggregateNode(parse("topk(5, x)"), REQ, a, Literal(5.0)).text() == "topk (param 5)"
    assert AggregateNode(parse("quantile(0.25, x)"), REQ, a).text() == "quantile (param 0.25)"
    assert AggregateNode(parse('count_values("v", x)'), REQ, a).text() == "count_values (param 'v')"
    assert AggregateNode(parse("topk(scalar(k), x)"), REQ, a, b).text() == "topk"  # a computed parameter
    assert CallNode(parse("abs(x)"), REQ, (a,)).text() == "abs"
    assert AbsentNode(parse("absent(x)"), REQ, a).text() == "absent"
    assert PinnedNode(parse("x @ 1700000000"), REQ, a).text() == "@ 1.7e+09"
    assert PinnedNode(parse("x @ 1700000000.5"), REQ, a).text() == "@ 1.7e+09"  # %g: six digits
    assert "joined" in SegmentsNode(parse("x"), REQ, (a, b)).text()
    assert "union" in UnionNode(parse("x"), REQ, (a, b)).text()
    window = WindowNode(parse("rate(x[5m])"), REQ, _window((("amp", 0, 100),)))
    assert window.text() == "rate(x[5m])"  # the generic text: the node's PromQL
    assert SubqueryNode(parse("max_over_time(x[5m:1m])"), REQ, a).text() == "max_over_time(x[5m:1m])"


def test_pinned_text_needs_one_pinned_time() -> None:
    with pytest.raises(AssertionError):
        PinnedNode(parse("x @ 1 + y @ 2"), REQ, Leaf(REQ)).text()


def test_children_in_argument_order() -> None:
    a, b, c = Leaf(REQ), Leaf(REQ), Leaf(REQ)
    k = Literal(3.0)
    assert children(BinaryNode(parse("x + y"), REQ, a, b)) == (a, b)
    assert children(AggregateNode(parse("sum(x)"), REQ, a)) == (a,)
    assert children(AggregateNode(parse("topk(3, x)"), REQ, a, k)) == (a, k)  # expression first, then param
    assert children(CallNode(parse("clamp(x, 1, 2)"), REQ, (a, b, c))) == (a, b, c)
    assert children(AbsentNode(parse("absent(x)"), REQ, a)) == (a,)
    assert children(PinnedNode(parse("x @ 1"), REQ, a)) == (a,)
    assert children(SegmentsNode(parse("x"), REQ, (a, b, c))) == (a, b, c)
    assert children(UnionNode(parse("x"), REQ, (c, a))) == (c, a)
    window = _window((("amp", 0, 100),))
    assert children(WindowNode(parse("rate(x[5m])"), REQ, window)) == ()  # the raw window is not a node
    assert children(WindowNode(parse("quantile_over_time(0.5, x[5m])"), REQ, window, (k,))) == (k,)
    assert children(SubqueryNode(parse("predict_linear(x[5m:1m], 60)"), REQ, a, (k,))) == (a, k)
    assert children(a) == () and children(k) == ()


def test_leaves_left_to_right() -> None:
    a, b, c, d = Leaf(REQ), Leaf(REQ), Leaf(REQ), Leaf(REQ)
    w1, w2 = _window((("amp", 0, 50),)), _window((("local", 0, 50),))
    tree = BinaryNode(
        parse("x + y"), REQ,
        AggregateNode(parse("topk(1, x)"), REQ, UnionNode(parse("x"), REQ, (a, WindowNode(parse("rate(x[1m])"), REQ, w1))), b),
        SubqueryNode(parse("max_over_time(x[5m:1m])"), REQ,
                     SegmentsNode(parse("x"), REQ, (c, WindowNode(parse("rate(x[1m])"), REQ, w2))), (d,)),
    )
    got_answers, got_windows = leaves(tree)
    assert got_answers == [a, b, c, d]
    assert got_windows == [w1, w2]
    assert leaves(Literal(1.0)) == ([], [])
    assert leaves(a) == ([a], [])


def test_nodes_compare_by_identity_and_are_frozen() -> None:
    a, b = Leaf(REQ), Leaf(REQ)
    assert a != b and a == a and len({a, b}) == 2  # equal fields, two leaves: two answers
    assert Literal(1.0) != Literal(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.req = REQ  # type: ignore[misc]
