"""The planner's own PromQL AST: small frozen dataclasses, rewritten with `dataclasses.replace`.

`shardplanner.promql.parse(query)` converts promql-parser's AST into these nodes once;
`shardplanner.serialize.to_promql(node)` prints them back. Nothing here imports
promql-parser, so the rest of the planner works on plain, hashable, comparable values.

Node kinds (the `Expr` union)::

    Selector   up{job="x"} offset 5m @ 100          name, matchers, offset_ms, at, or_matchers
    MatrixSel  up{job="x"}[5m] offset 1m            selector (a Selector), range_ms
    Subquery   rate(x[1m])[1h:5m] offset 1m @ end() expr, range_ms, step_ms, offset_ms, at
    Agg        sum by (a) (x), topk(5, x)           op, expr, param, grouping, without
    Binary     a / on(h) group_left(g) b            op, lhs, rhs, return_bool, matching
    Unary      -x                                   expr (always negation: unary plus is
                                                    dropped by the parser, as Prometheus does)
    Paren      (x)                                  expr
    Call       rate(x[5m]), time()                  func, args
    Number     1, -2.5, NaN, -Inf                   value (a float; -1 is Number(-1.0))
    String     "a\\nb"                              value (the unquoted value)

Conventions:
- Durations are integer milliseconds (`_ms`). `offset_ms == 0` means "no offset" (PromQL has
  no `offset 0s`); a negative offset is allowed (`offset -5m`).
- `at` is `None`, an absolute time in integer milliseconds, or `"start"` / `"end"` for
  `@ start()` / `@ end()`. Pinning is `replace(sel, at=request.start_ms)`.
- A MatrixSel keeps offset and `@` on its inner Selector, as PromQL does:
  `x[5m] offset 1m` is `MatrixSel(Selector("x", offset_ms=60_000), 300_000)`.
- A Selector without a metric name keeps `name=None`; `{__name__="up"}` stays a matcher.
  `Selector.metric_name` gives the name either way when it is a plain equality.
- `or_matchers` is promql-parser's `{a="1" or b="2"}` form (Prometheus 3 syntax; 2.42 rejects
  it): when it is non-empty, `matchers` is empty and the selector is the union of the groups.
  `with_matcher` adds to every group, so sharding stays exhaustive and disjoint.
- Equality is structural (dataclass equality); `Number(nan) == Number(nan)` and
  `Number(-0.0) != Number(0.0)`, so "same AST" means "same query".

Rewriting, for the planner:

    from dataclasses import replace
    from shardplanner.ast import Matcher, Selector, Subquery, inject_matcher, transform

    # Shard: Hostname=~"a|b" into every selector (also those inside [5m] and subqueries).
    sharded = inject_matcher(expr, Matcher("Hostname", "=~", "a|b"))

    # Pin @ start()/end() to absolute times.
    def pin(node):
        if isinstance(node, (Selector, Subquery)) and node.at in ("start", "end"):
            return replace(node, at=start_ms if node.at == "start" else end_ms)
        return node
    pinned = transform(expr, pin)

    # avg(x) -> sum(x) and count(x): replace(agg, op="sum"), replace(agg, op="count").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

MatchOp: TypeAlias = Literal["=", "!=", "=~", "!~"]
MATCH_OPS: tuple[MatchOp, ...] = ("=", "!=", "=~", "!~")

# `int` is an absolute time in milliseconds.
At: TypeAlias = int | Literal["start", "end"] | None

AGGREGATION_OPS = frozenset(
    {
        "sum", "avg", "count", "min", "max", "group", "stddev", "stdvar",
        "topk", "bottomk", "count_values", "quantile", "limitk", "limit_ratio",
    }
)
SET_OPS = frozenset({"and", "or", "unless"})
COMPARISON_OPS = frozenset({"==", "!=", "<", "<=", ">", ">="})
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
BINARY_OPS = SET_OPS | COMPARISON_OPS | ARITHMETIC_OPS

# Prometheus's yacc precedence, loosest first; all levels are left-associative except `^`.
PRECEDENCE: dict[str, int] = {
    "or": 1,
    "and": 2, "unless": 2,
    "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
    "+": 4, "-": 4,
    "*": 5, "/": 5, "%": 5, "atan2": 5,
    "^": 6,
}
RIGHT_ASSOCIATIVE = frozenset({"^"})


@dataclass(frozen=True)
class Matcher:
    """`name op "value"`, e.g. `Matcher("Hostname", "=~", "node-1|node-2")`."""

    name: str
    op: MatchOp
    value: str

    def __post_init__(self) -> None:
        if self.op not in MATCH_OPS:
            raise ValueError(f"unknown match operator {self.op!r}")


@dataclass(frozen=True)
class Selector:
    """An instant vector selector: `name{matchers} @ at offset offset_ms`."""

    name: str | None
    matchers: tuple[Matcher, ...] = ()
    offset_ms: int = 0
    at: At = None
    or_matchers: tuple[tuple[Matcher, ...], ...] = ()

    @property
    def metric_name(self) -> str | None:
        """The metric name, from `name` or from a `__name__="..."` matcher; None if the
        selector picks its metric by regex (or not at all)."""
        if self.name is not None:
            return self.name
        for m in self.matchers:
            if m.name == "__name__" and m.op == "=":
                return m.value
        return None


@dataclass(frozen=True)
class MatrixSel:
    """A range vector selector `selector[range]`; offset and `@` live on `selector`."""

    selector: Selector
    range_ms: int


@dataclass(frozen=True)
class Subquery:
    """`expr[range:step] @ at offset offset_ms`; `step_ms=None` is `[range:]` (the
    evaluation interval), which is not the same query as any explicit step."""

    expr: Expr
    range_ms: int
    step_ms: int | None = None
    offset_ms: int = 0
    at: At = None


@dataclass(frozen=True)
class Agg:
    """`op by (grouping) (param, expr)`. `grouping=None`: no clause; `()`: `by ()`.
    `without=True` turns `by` into `without`."""

    op: str
    expr: Expr
    param: Expr | None = None
    grouping: tuple[str, ...] | None = None
    without: bool = False


@dataclass(frozen=True)
class VectorMatching:
    """`on(labels)` (on=True) or `ignoring(labels)` (on=False), optionally followed by
    `group_left(include)` / `group_right(include)`."""

    on: bool
    labels: tuple[str, ...] = ()
    group: Literal["left", "right"] | None = None
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class Binary:
    """`lhs op [bool] [on/ignoring ...] rhs`."""

    op: str
    lhs: Expr
    rhs: Expr
    return_bool: bool = False
    matching: VectorMatching | None = None

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown binary operator {self.op!r}")
        if self.return_bool and self.op not in COMPARISON_OPS:
            raise ValueError(f"bool needs a comparison operator, not {self.op!r}")
        if self.matching is not None and self.matching.group and self.op in SET_OPS:
            raise ValueError(f"no group_left/group_right with {self.op!r}")


@dataclass(frozen=True)
class Unary:
    """Negation, `-expr`."""

    expr: Expr


@dataclass(frozen=True)
class Paren:
    expr: Expr


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...] = ()


@dataclass(frozen=True, eq=False)
class Number:
    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", float(self.value))  # Number(2) is Number(2.0)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Number):
            return NotImplemented
        a, b = self.value, other.value
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        # -0.0 and 0.0 differ in PromQL (1 / -0 is -Inf).
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)

    def __hash__(self) -> int:
        if math.isnan(self.value):
            return hash("NaN")
        return hash((self.value, math.copysign(1.0, self.value)))


@dataclass(frozen=True)
class String:
    value: str


Expr: TypeAlias = (
    Selector | MatrixSel | Subquery | Agg | Binary | Unary | Paren | Call | Number | String
)
NODE_TYPES = (Selector, MatrixSel, Subquery, Agg, Binary, Unary, Paren, Call, Number, String)


def children(node: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions, in print order (an Agg's param comes before its expr)."""
    match node:
        case MatrixSel():
            return (node.selector,)
        case Subquery() | Unary() | Paren():
            return (node.expr,)
        case Agg():
            return (node.expr,) if node.param is None else (node.param, node.expr)
        case Binary():
            return (node.lhs, node.rhs)
        case Call():
            return node.args
        case Selector() | Number() | String():
            return ()
    raise TypeError(f"not a PromQL node: {node!r}")


def walk(node: Expr) -> Iterator[Expr]:
    """Every node, pre-order, `node` first."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def selectors(node: Expr) -> Iterator[Selector]:
    """Every Selector, including those inside matrix selectors and subqueries."""
    for n in walk(node):
        if isinstance(n, Selector):
            yield n


def transform(node: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rebuild `node` bottom-up: children first, then `fn(rebuilt)`. `fn` returns its argument
    to keep a node. Unchanged subtrees keep their identity."""

    def rec(n: Expr) -> Expr:
        match n:
            case MatrixSel():
                sel = rec(n.selector)
                if not isinstance(sel, Selector):
                    raise TypeError(f"a matrix selector needs a Selector, got {sel!r}")
                n = n if sel is n.selector else replace(n, selector=sel)
            case Subquery() | Unary() | Paren():
                e = rec(n.expr)
                n = n if e is n.expr else replace(n, expr=e)
            case Agg():
                e = rec(n.expr)
                p = None if n.param is None else rec(n.param)
                if e is not n.expr or p is not n.param:
                    n = replace(n, expr=e, param=p)
            case Binary():
                lhs, rhs = rec(n.lhs), rec(n.rhs)
                if lhs is not n.lhs or rhs is not n.rhs:
                    n = replace(n, lhs=lhs, rhs=rhs)
            case Call():
                args = tuple(rec(a) for a in n.args)
                if any(a is not b for a, b in zip(args, n.args)):
                    n = replace(n, args=args)
        return fn(n)

    return rec(node)


def with_matcher(sel: Selector, matcher: Matcher) -> Selector:
    """`sel` with `matcher` ANDed in (into every `or` group when there are any)."""
    if sel.or_matchers:
        return replace(sel, or_matchers=tuple(g + (matcher,) for g in sel.or_matchers))
    return replace(sel, matchers=sel.matchers + (matcher,))


def inject_matcher(node: Expr, matcher: Matcher) -> Expr:
    """AND `matcher` into every selector of `node`:
    `sum(rate(x[5m])) / count(y)` -> `sum(rate(x{H=~"a|b"}[5m])) / count(y{H=~"a|b"})`."""
    return transform(node, lambda n: with_matcher(n, matcher) if isinstance(n, Selector) else n)


def unparen(node: Expr) -> Expr:
    """`node` without any enclosing parentheses: `((x))` -> `x`."""
    while isinstance(node, Paren):
        node = node.expr
    return node


__all__ = [
    "AGGREGATION_OPS", "ARITHMETIC_OPS", "At", "Agg", "BINARY_OPS", "Binary", "COMPARISON_OPS",
    "Call", "Expr", "MATCH_OPS", "MatchOp", "Matcher", "MatrixSel", "NODE_TYPES", "Number",
    "PRECEDENCE", "Paren", "RIGHT_ASSOCIATIVE", "SET_OPS", "Selector", "String", "Subquery",
    "Unary", "VectorMatching", "children", "inject_matcher", "selectors", "transform", "unparen",
    "walk", "with_matcher",
]
