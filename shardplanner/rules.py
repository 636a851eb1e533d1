"""Which PromQL can be split across node shards, and how the pieces recombine.

One table, :data:`RULES`, classifies every aggregation operator and every function that
promql-parser 0.12 knows (a superset of Prometheus 2.42's); anything not in it is treated as
``unshardable``. The predicates below read only this table and the AST.

Kinds
-----
``merge``        aggregation whose per-shard partials re-aggregate exactly:
                 ``sum(x)`` -> ``sum`` of per-shard ``sum(x{H=~"..."})``; also ``group_local``.
``group_local``  aggregation that is exact per shard only when its grouping keeps the shard
                 label (``quantile by (Hostname) (...)``): each output group then lives in
                 one shard and the shards' answers are concatenated.
``per_series``   function whose every output series is computed from one input series of its
                 single series argument (other arguments constant), keeping the shard label.
``label_write``  ``per_series`` unless the destination label (2nd argument) is the shard
                 label, which would move series between shards' label values.
``constant``     scalar that does not depend on any series (``time()``, ``pi()``): the same
                 value in every shard, so ``x > time()`` keeps ``x`` per-series.
``unshardable``  never split by node: the result needs all series at once, or a series can
                 appear from nothing inside a shard (``absent``, ``vector``), or the order
                 of the answer is the point (``sort``).

Splitting one instant query's long range window in time (``planner._instant_window``,
``planner.split_instant_windows``) has its own, shorter table: ``max_over_time`` (max of
maxes), ``min_over_time`` (min of mins), ``sum_over_time`` (sum of sums), ``count_over_time``
(sum of counts), bare or under the one aggregation that recombines them (``max by``,
``min by``, ``sum by``/``without``). sum/count need disjoint sub-windows: on Prometheus 2.42's
closed windows each one after the oldest starts 1 ms after its neighbour ends. Never split
that way: ``rate``, ``increase``, ``delta`` (and ``irate``/``idelta``/``deriv``/...) -- they
extrapolate from the first and last sample to the window's edges, which no combination of
sub-window answers reproduces; ``avg_over_time``, ``quantile_over_time``, ``stddev_over_time``,
``last_over_time``, ``changes``, ``resets`` and the rest; ``count(count_over_time(..))`` and
other wrappers that are not the recombining aggregation.

``time_splittable=False`` marks what depends on the query's own start/end/step (Prometheus
3.12's experimental ``start()``, ``end()``, ``range()``, ``step()``): such a query is not
cut in time either. Everything else evaluates each step independently.

The rule of each name is a column of the function table (``shardplanner/functions.py``:
``shard`` and ``why`` of a function or aggregation row, ``time_splittable``); :data:`RULES`
is derived from it, so a function is classified where it is declared. In short:

=====================================  ============  =========================================
name                                   kind          why
=====================================  ============  =========================================
sum min max count group avg            merge         re-aggregate the per-shard partials
topk bottomk                           merge         per-shard winners, then global per step
quantile stddev stdvar count_values    group_local   need every series of a group at once
rate, *_over_time, abs, clamp, ...     per_series    one series in, one series out
label_replace label_join               label_write   unshardable onto the shard label
time pi max_of min_of                  constant      no series involved
absent scalar vector sort limitk ...   unshardable   a series from nothing, order, all at once
start end range step                   unshardable   query-parameter functions, no time split
=====================================  ============  =========================================
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from shardplanner.ast import (
    Agg,
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
    unparen,
    walk,
)
from shardplanner.functions import ALL_AGGREGATIONS, ALL_FUNCTIONS, ShardKind

__all__ = [
    "MERGEABLE_AGGREGATIONS",
    "RULES",
    "Rule",
    "RuleKind",
    "is_constant",
    "is_shard_local",
    "keeps_label",
    "rule_for",
    "time_splittable",
    "unshardable_reasons",
]

RuleKind = ShardKind


@dataclass(frozen=True)
class Rule:
    node: Literal["aggregation", "function"]
    kind: RuleKind
    reason: str
    time_splittable: bool = True


# Every aggregation row, then every function row of the table (Prometheus 2.42's and the
# newer names promql-parser knows, so a newer name is still classified, not "unknown").
RULES: dict[str, Rule] = {
    **{a.name: Rule("aggregation", a.shard, a.why) for a in ALL_AGGREGATIONS.values()},
    **{f.name: Rule("function", f.shard, f.why, f.time_splittable) for f in ALL_FUNCTIONS.values()},
}

MERGEABLE_AGGREGATIONS = frozenset(n for n, r in RULES.items() if r.kind == "merge")

# Aggregations whose string parameter names a label they write (count_values).
_WRITES_PARAM_LABEL = {a.name: a.param == "string" for a in ALL_AGGREGATIONS.values()}

_UNKNOWN = Rule("function", "unshardable", "unknown to the planner", time_splittable=True)


def rule_for(name: str) -> Rule:
    """The rule for an aggregation operator or function; unknown names are unshardable."""
    return RULES.get(name, _UNKNOWN)


def is_constant(node: Expr) -> bool:
    """True if ``node`` is a scalar or string that involves no series (same in every shard):
    ``5``, ``-(2 * 3)``, ``time()``, ``"Hostname"``."""
    match node:
        case Number() | String():
            return True
        case Paren() | Unary():
            return is_constant(node.expr)
        case Binary():
            return is_constant(node.lhs) and is_constant(node.rhs)
        case Call():
            return rule_for(node.func).kind == "constant" and all(is_constant(a) for a in node.args)
    return False


def keeps_label(grouping: tuple[str, ...] | None, without: bool, label: str) -> bool:
    """Whether an aggregation's output keeps ``label``: ``by (.., label, ..)`` or
    ``without (...)`` not naming it. No clause at all means ``by ()``."""
    if without:
        return label not in (grouping or ())
    return label in (grouping or ())


def is_shard_local(node: Expr, label: str) -> bool:
    """True if evaluating ``node`` once per shard and concatenating gives exactly the
    unsharded answer: every output series comes from series of one shard and keeps their
    ``label`` value, so the shards' outputs are disjoint.

    ``rate(x[5m]) > 0``, ``avg by (Hostname) (x)``, ``x / on(Hostname, gpu) y`` are local
    for ``Hostname``; ``sum(x)``, ``x or vector(0)``, ``x / on() y`` are not.
    """
    match node:
        case Selector() | MatrixSel():
            return True
        case Subquery() | Paren() | Unary():
            return is_shard_local(node.expr, label)
        case Call():
            return _call_is_local(node, label)
        case Agg():
            rule = rule_for(node.op)
            if rule.kind not in ("merge", "group_local"):
                return False
            if not keeps_label(node.grouping, node.without, label):
                return False
            if node.param is not None and not is_constant(node.param):
                return False
            if _WRITES_PARAM_LABEL.get(node.op) and node.param == String(label):
                return False  # count_values writes the label its parameter names: the shard label
            return is_shard_local(node.expr, label)
        case Binary():
            return _binary_is_local(node, label)
    return False


def _call_is_local(node: Call, label: str) -> bool:
    rule = rule_for(node.func)
    if rule.kind not in ("per_series", "label_write"):
        return False
    if rule.kind == "label_write":
        if len(node.args) < 2 or not isinstance(node.args[1], String):
            return False
        if node.args[1].value == label:
            return False
    if node.func == "histogram_quantile" and label == "le":
        return False  # it groups buckets by every label but le
    series_args = [a for a in node.args if not is_constant(a)]
    return len(series_args) == 1 and is_shard_local(series_args[0], label)


def _binary_is_local(node: Binary, label: str) -> bool:
    lhs_const, rhs_const = is_constant(node.lhs), is_constant(node.rhs)
    if lhs_const and rhs_const:
        return False  # a scalar: nothing per shard
    if lhs_const:
        return is_shard_local(node.rhs, label)
    if rhs_const:
        return is_shard_local(node.lhs, label)
    # vector <op> vector: matched pairs must lie in one shard, i.e. matching compares label.
    m = node.matching
    if m is not None:
        if m.on and label not in m.labels:
            return False
        if not m.on and label in m.labels:
            return False
    return is_shard_local(node.lhs, label) and is_shard_local(node.rhs, label)


def time_splittable(node: Expr) -> bool:
    """False if any function in ``node`` depends on the query's own start, end or step."""
    return all(rule_for(n.func).time_splittable for n in walk(node) if isinstance(n, Call))


def unshardable_reasons(node: Expr, label: str | None = None) -> Iterator[str]:
    """Human-readable reasons found in ``node`` (for plan notes), e.g.
    ``"quantile: needs every series of a group at once"``,
    ``"label_replace: writes the shard label Hostname"``."""
    seen: set[str] = set()
    for n in walk(unparen(node)):
        name = n.func if isinstance(n, Call) else n.op if isinstance(n, Agg) else None
        if name is None or name in seen:
            continue
        rule = rule_for(name)
        if rule.kind in ("unshardable", "group_local"):
            seen.add(name)
            yield f"{name}: {rule.reason}"
        elif (
            rule.kind == "label_write"
            and isinstance(n, Call)
            and len(n.args) > 1
            and n.args[1] == String(label or "")
        ):
            seen.add(name)
            yield f"{name}: writes the shard label {label}"
