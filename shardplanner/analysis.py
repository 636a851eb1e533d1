"""What the proxy needs to know about a query beyond its plan, from its tree. Pure.

    pinned_at(expr)        T when every selector is `@ T` (the value at any step is the value at T)
    absent_like(expr)      uses absent/absent_over_time/scalar/vector (not per series)
    probe_as_range(expr)   an instant answer that may be read off a range answer at t
    edge_ms(expr, lb)      the longest span one evaluation reads back
    is_scalar_expr(expr)   PromQL types it as a scalar
"""

from __future__ import annotations

from shardplanner.ast import (
    Binary,
    Call,
    Expr,
    MatrixSel,
    Number,
    Paren,
    Selector,
    String,
    Subquery,
    Unary,
    children,
    unparen,
    walk,
)
from shardplanner.functions import FUNCTIONS

# From the function table (2.42's rows, shardplanner/functions.py):
# Functions callable without arguments whose value then depends on the evaluation time
# (time(), hour(), ...: @-unsafe and no argument required).
CLOCK_FUNCS = frozenset(n for n, f in FUNCTIONS.items() if not f.at_safe and f.min_args == 0)
# Functions whose answer is not per series: over merged backends they are applied above the
# merge (proxy/pipeline/crossstore.py). ABSENT_LIKE: those reading series (absent,
# absent_over_time, scalar); NOT_PER_SERIES adds those of a scalar argument (vector).
ABSENT_LIKE = frozenset(
    n for n, f in FUNCTIONS.items() if f.answer == "one" and ("vector" in f.args or "matrix" in f.args)
)
NOT_PER_SERIES = frozenset(n for n, f in FUNCTIONS.items() if f.answer == "one" and f.args)
# Functions PromQL types as scalars.
SCALAR_FUNCS = frozenset(n for n, f in FUNCTIONS.items() if f.returns == "scalar")
# Functions whose answer's order is the point (sort, sort_desc).
SORTING_FUNCS = frozenset(n for n, f in FUNCTIONS.items() if f.sorts)


def pinned_at(expr: Expr) -> int | None:
    """T when every selector of `expr` is pinned `@ T` (one T, no subquery, no function of the
    evaluation time): then its value at any step is its value at T."""
    ats: set[object] = set()
    for n in walk(expr):
        if isinstance(n, Subquery) or (isinstance(n, Call) and n.func in CLOCK_FUNCS and not n.args):
            return None
        if isinstance(n, Selector):
            ats.add(n.at)
    if len(ats) != 1:
        return None
    (at,) = ats
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def absent_like(expr: Expr) -> bool:
    """Does `expr` use a function whose answer is not per series (absent, scalar, vector)?"""
    return any(isinstance(n, Call) and n.func in NOT_PER_SERIES for n in walk(expr))


def is_scalar_expr(node: Expr) -> bool:
    """Whether PromQL types `node` as a scalar (so its range answer is a per-step scalar)."""
    match node:
        case Number():
            return True
        case Paren() | Unary():
            return is_scalar_expr(node.expr)
        case Binary():
            return is_scalar_expr(node.lhs) and is_scalar_expr(node.rhs)
        case Call():
            return node.func in SCALAR_FUNCS
    return False


def probe_as_range(expr: Expr) -> bool:
    """Can this instant query's answer be read off a range answer at its time (an instant
    vector whose order is not meaningful: not a range/string/scalar expression, not
    sort()/sort_desc())?"""
    node = unparen(expr)
    if isinstance(node, MatrixSel | Subquery | String) or is_scalar_expr(node):
        return False
    return not (isinstance(node, Call) and node.func in SORTING_FUNCS)


def edge_ms(expr: Expr | None, lookback_ms: int) -> int:
    """The longest time span one evaluation reads back: a selector's lookback or range, plus
    the ranges of the subqueries around it (`max_over_time(rate(x[5m])[30m:1m])` reads
    35 m). Unknown (an unparsed query): the lookback plus one hour."""
    if expr is None:
        return lookback_ms + 3_600_000

    def span(node: Expr) -> int:
        if isinstance(node, Selector):
            return lookback_ms
        if isinstance(node, MatrixSel):
            return node.range_ms
        if isinstance(node, Subquery):
            return node.range_ms + span(node.expr)
        return max((span(c) for c in children(node)), default=0)

    return max(span(expr), lookback_ms)


__all__ = ["ABSENT_LIKE", "CLOCK_FUNCS", "NOT_PER_SERIES", "SCALAR_FUNCS", "SORTING_FUNCS", "absent_like", "edge_ms",
           "is_scalar_expr", "pinned_at", "probe_as_range"]
