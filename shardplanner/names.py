"""Selectors without a fixed metric name, resolved against the names the stores have. Pure.

In a hybrid fleet only a `"*"` holding can answer `{__name__=~"DCGM_FI_DEV_(GPU|MEM_COPY)_UTIL"}`
as written: its series may be in any store. Given every store's metric names
(`/api/v1/label/__name__/values`), the selector is the same query as one that lists the names
it matches, `{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL"}`, and routing reads a
literal list as those metrics (`shardplanner.read_windows.listed_names`): each goes to the stores
that hold it, and names held by different stores are a union of their answers.

    resolve_names(parse('{__name__=~"a.*", job="x"}'), {"ab", "ac", "b"})
      -> {__name__=~"ab|ac", job="x"}

A selector that matches no name anywhere reads nothing: it becomes `NO_METRIC`, a name no
store has (so routing can send it anywhere and the answer is the empty one Prometheus gives).
A fixed name that no store lists is left alone (`missing_names` reports it). A selector that
matches more than `max_names` names is left unresolved (its query would grow without bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import replace

from shardplanner.ast import (
    SET_OPS,
    Binary,
    Call,
    Expr,
    Matcher,
    MatrixSel,
    Number,
    Paren,
    Selector,
    String,
    Subquery,
    Unary,
    selectors,
    transform,
)
from shardplanner.functions import FUNCTIONS
from shardplanner.regex import RegexError, fullmatch

__all__ = ["NO_METRIC", "PER_SERIES_CALLS", "fixed_names", "missing_names", "name_matchers", "needs_names",
           "per_series_selector", "resolve_names", "with_names"]

# A metric name no store has: what a selector matching no name at all becomes.
NO_METRIC = "promaccel_no_such_metric"
MAX_NAMES = 256


def name_matchers(sel: Selector) -> tuple[Matcher, ...] | None:
    """The `__name__` matchers of a nameless selector; None for a selector with a fixed name
    or in the `{a="1" or b="2"}` form (not resolved)."""
    if sel.metric_name is not None or sel.or_matchers:
        return None
    return tuple(m for m in sel.matchers if m.name == "__name__")


def _matches(ms: Iterable[Matcher], name: str) -> bool:
    for m in ms:
        try:
            hit = {"=": name == m.value, "!=": name != m.value}.get(m.op)
            if hit is None:
                hit = fullmatch(m.value, name) == (m.op == "=~")
        except RegexError:
            return False
        if not hit:
            return False
    return True


def needs_names(expr: Expr) -> bool:
    """Does `expr` have a selector without a fixed metric name?"""
    return any(name_matchers(s) is not None for s in selectors(expr))


def fixed_names(expr: Expr) -> set[str]:
    return {n for s in selectors(expr) if (n := s.metric_name) is not None}


def missing_names(expr: Expr, known: Set[str]) -> set[str]:
    """Fixed metric names of `expr` that no store lists."""
    return {n for n in fixed_names(expr) if n not in known and n != NO_METRIC}


def resolve_names(expr: Expr, known: Set[str], max_names: int = MAX_NAMES) -> Expr:
    """`expr` with each nameless selector's `__name__` matchers replaced by the literal list
    of the `known` names they match (see the module docstring)."""

    def fix(node: Expr) -> Expr:
        if not isinstance(node, Selector):
            return node
        ms = name_matchers(node)
        if ms is None:
            return node
        names = sorted(n for n in known if _matches(ms, n))
        if len(names) > max_names:
            return node
        rest = tuple(m for m in node.matchers if m.name != "__name__")
        if not names:
            return replace(node, name=NO_METRIC, matchers=rest)
        if len(names) == 1:
            return replace(node, name=names[0], matchers=rest)
        return replace(node, matchers=(Matcher("__name__", "=~", "|".join(names)), *rest))

    return transform(expr, fix)


# Functions that map each series to (at most) one series on their own: a union of metrics
# held by different stores can be taken above them (Prometheus's duplicate-labelset error
# is checked on the union). From the function table: 2.42's rows whose shard rule is
# per_series or label_write (not sort: its order is the point) and whose answer is "series"
# (not histogram_quantile: one per group of buckets), except native_only ones: promaccel
# decodes no native histograms, so no equivalence test covers a per-name union of theirs.
PER_SERIES_CALLS = frozenset(
    f.name
    for f in FUNCTIONS.values()
    if f.shard in ("per_series", "label_write") and f.answer == "series" and not f.native_only
)


def per_series_selector(node: Expr) -> Selector | None:
    """The one selector `node` reads when `node` maps each of its series to one series of its
    own (selectors, range selectors, subqueries, per-series functions, arithmetic with
    literals); None otherwise."""
    match node:
        case Selector():
            return node
        case MatrixSel():
            return node.selector
        case Paren() | Unary():
            return per_series_selector(node.expr)
        case Subquery():
            return per_series_selector(node.expr)
        case Call() if node.func in PER_SERIES_CALLS:
            inner = [a for a in node.args if not isinstance(a, (Number, String))]
            return per_series_selector(inner[0]) if len(inner) == 1 else None
        case Binary() if node.op not in SET_OPS:
            if isinstance(node.lhs, Number):
                return per_series_selector(node.rhs)
            if isinstance(node.rhs, Number):
                return per_series_selector(node.lhs)
    return None


def with_names(node: Expr, sel: Selector, names: tuple[str, ...]) -> Expr:
    """`node` with `sel` (a selector of it) reading exactly the metrics `names`."""
    rest = tuple(m for m in sel.matchers if m.name != "__name__")
    if len(names) == 1:
        new = replace(sel, name=names[0], matchers=rest)
    else:
        new = replace(sel, name=None, matchers=(Matcher("__name__", "=~", "|".join(names)), *rest))
    return transform(node, lambda n: new if n is sel else n)
