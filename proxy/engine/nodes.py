"""The engine's evaluation tree: one frozen dataclass per node type, as Prometheus's evaluator
has one case per parser node type (promql/engine.go evaluator.eval). CrossStore
(proxy/pipeline/crossstore.py) builds the tree -- it decides what runs where -- and
`evaluate` (evaluator.py) walks it.

Leaves are what the pipeline supplies before the walk:

    Leaf            a subtree one backend (an overlap, a time split) answers: its decoded
                    answer on `req`'s steps (the pipeline's `Sub` adds the plan and route)
    RawWindow       the raw samples of one matrix selector over [lo, hi], read from each
                    store for the stretch it holds (`reads`)

Inner nodes, each over `req` (its steps; an `@`-pinned subtree has its own instant `req`):

    Literal         a number or string literal (`2`, `"x"`)
    BinaryNode      lhs <op> rhs                       engine.go VectorBinop & co
    AggregateNode   sum/topk/quantile/... (param)      engine.go aggregation()
    CallNode        an instant-vector function         functions.go, by name
    AbsentNode      absent/absent_over_time/scalar of merged series
    PinnedNode      `x @ T`: the subtree at T, restamped at every step (StepInvariantExpr)
    SegmentsNode    stretches of steps, each answered on its own, joined
    UnionNode       one selector's metrics held by different stores, unioned
    WindowNode      a range function over a RawWindow  (rate(x[6h]) straddling two stores)
    SubqueryNode    a range function over a subquery's inner expression on its own grid

`node` on each is the parser's AST node it evaluates (shardplanner.ast), kept for the
kernels (matching, grouping, function name) and for explain's text. Nodes compare by
identity (`eq=False`): the pipeline keys leaves' answers by the leaf itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from shardplanner.analysis import pinned_at
from shardplanner.ast import Number, String
from shardplanner.plan import QueryRequest
from shardplanner.serialize import to_promql

__all__ = [
    "AbsentNode", "AggregateNode", "BinaryNode", "CallNode", "Inner", "Leaf", "Literal", "Node", "PinnedNode",
    "RawWindow", "SegmentsNode", "SubqueryNode", "UnionNode", "WindowNode", "children", "leaves",
]


@dataclass(frozen=True, eq=False)
class Leaf:
    """A subtree one backend answers; the pipeline supplies its answer."""

    req: QueryRequest


@dataclass(frozen=True, eq=False)
class RawWindow:
    """The raw samples of `selector` over [lo, hi] (ms, both ends in), read from each store
    for its stretch: `reads` = (backend, from, to)."""

    selector: Any  # shardplanner.ast.Selector
    reads: tuple[tuple[str, int, int], ...]
    lo: int
    hi: int

    def uncovered(self) -> list[tuple[int, int]]:
        """The stretches of the window no store holds (read by nobody: no data there, as in
        a Prometheus with that retention)."""
        out: list[tuple[int, int]] = []
        at = self.lo
        for _, a, b in sorted(self.reads, key=lambda r: r[1]):
            if a > at:
                out.append((at, a - 1))
            at = max(at, b + 1)
        if at <= self.hi:
            out.append((at, self.hi))
        return out


@dataclass(frozen=True, eq=False)
class Literal:
    value: float | str


@dataclass(frozen=True, eq=False)
class Inner:
    """An operator promaccel evaluates; `KIND` is its name in explain's output."""

    KIND: ClassVar[str] = ""
    node: Any
    req: QueryRequest

    def text(self) -> str:
        """What is evaluated here, in PromQL words (explain)."""
        return to_promql(self.node)


@dataclass(frozen=True, eq=False)
class BinaryNode(Inner):
    KIND: ClassVar[str] = "binary"
    lhs: Node
    rhs: Node

    def text(self) -> str:
        node = self.node
        text = str(node.op) + (" bool" if node.return_bool else "")
        m = node.matching
        if m is not None:
            text += f" {'on' if m.on else 'ignoring'} ({', '.join(m.labels)})"
            if m.group is not None:
                text += f" group_{m.group} ({', '.join(m.include)})"
        return text


@dataclass(frozen=True, eq=False)
class AggregateNode(Inner):
    KIND: ClassVar[str] = "aggregate"
    expr: Node
    param: Node | None = None  # any expression: a scalar per step (engine.go aggregation())

    def text(self) -> str:
        node = self.node
        text = str(node.op)
        if node.grouping is not None:
            text += f" {'without' if node.without else 'by'} ({', '.join(node.grouping)})"
        if isinstance(node.param, Number):
            text += f" (param {node.param.value:g})"
        elif isinstance(node.param, String):
            text += f" (param {node.param.value!r})"
        return text


@dataclass(frozen=True, eq=False)
class CallNode(Inner):
    KIND: ClassVar[str] = "function"
    args: tuple[Node, ...]

    def text(self) -> str:
        return str(self.node.func)


@dataclass(frozen=True, eq=False)
class AbsentNode(Inner):
    """absent(v), absent_over_time(m) (`arg` = count_over_time(m)), scalar(v) of series merged
    from several backends: the merge cannot see that an "absent" from a backend in an outage
    is wrong, so the argument is merged first and the function applied on the merged series."""

    KIND: ClassVar[str] = "absent"
    arg: Node

    def text(self) -> str:
        return str(self.node.func)


@dataclass(frozen=True, eq=False)
class PinnedNode(Inner):
    """`inner` (evaluated at the pinned time, an instant `inner.req`) restamped at every step."""

    KIND: ClassVar[str] = "pinned"
    inner: Node

    def text(self) -> str:
        at = pinned_at(self.node)
        assert at is not None
        return f"@ {at / 1000:g}"


@dataclass(frozen=True, eq=False)
class SegmentsNode(Inner):
    KIND: ClassVar[str] = "segments"
    parts: tuple[Node, ...]

    def text(self) -> str:
        return "the steps no single backend answers, joined to the steps routed as usual"


@dataclass(frozen=True, eq=False)
class UnionNode(Inner):
    KIND: ClassVar[str] = "union"
    parts: tuple[Node, ...]

    def text(self) -> str:
        return "the union of metrics held by different stores"


@dataclass(frozen=True, eq=False)
class WindowNode(Inner):
    """`node.func(sel[r])` over the raw samples of `window`; `params`: its scalar arguments."""

    KIND: ClassVar[str] = "window"
    window: RawWindow
    params: tuple[Node, ...] = ()


@dataclass(frozen=True, eq=False)
class SubqueryNode(Inner):
    """`node.func(expr[r:s])`: `inner` is `expr` on the subquery's own step grid."""

    KIND: ClassVar[str] = "subquery"
    inner: Node
    params: tuple[Node, ...] = ()


Node = Leaf | Literal | Inner


def children(node: Node) -> tuple[Node, ...]:
    """A node's argument nodes, left to right (explain shows them in this order)."""
    if isinstance(node, BinaryNode):
        return (node.lhs, node.rhs)
    if isinstance(node, AggregateNode):
        return (node.expr,) if node.param is None else (node.expr, node.param)
    if isinstance(node, CallNode):
        return node.args
    if isinstance(node, (AbsentNode,)):
        return (node.arg,)
    if isinstance(node, PinnedNode):
        return (node.inner,)
    if isinstance(node, (SegmentsNode, UnionNode)):
        return node.parts
    if isinstance(node, WindowNode):
        return node.params
    if isinstance(node, SubqueryNode):
        return (node.inner, *node.params)
    return ()


def leaves(node: Node) -> tuple[list[Leaf], list[RawWindow]]:
    """The leaves of a tree, left to right: answers and raw windows the pipeline supplies."""
    answers: list[Leaf] = []
    windows: list[RawWindow] = []
    stack: list[Node] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Leaf):
            answers.append(n)
        if isinstance(n, WindowNode):
            windows.append(n.window)
        stack.extend(reversed(children(n)))
    return answers, windows
