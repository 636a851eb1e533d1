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

``time_splittable=False`` marks what depends on the query's own start/end/step (the
promql-parser extensions ``start()``, ``end()``, ``range()``, ``step()``): such a query is not
cut in time either. Everything else evaluates each step independently.

=====================================  ============  =========================================
name                                   kind          why
=====================================  ============  =========================================
sum min max count group                merge         sum/min/max of partials; count -> sum
avg                                    merge         sum pieces / count pieces
topk bottomk                           merge         per-shard winners, then global per step
quantile stddev stdvar count_values    group_local   need every series of a group at once
limitk limit_ratio                     unshardable   experimental (Prometheus 3); not in 2.42
rate irate increase delta idelta       per_series    one series' samples in, one value out
deriv predict_linear changes resets    per_series
double_exponential_smoothing           per_series    (holt_winters in 2.42)
*_over_time (not absent_over_time)     per_series
ts_of_*_over_time, first_over_time     per_series
abs ceil floor round exp ln log2 ...   per_series    element-wise math, trigonometry
clamp clamp_min clamp_max sgn          per_series
timestamp, day_of_* hour minute ...    per_series    with an argument; without one they
                                                     return vector(time()) -> not shardable
histogram_quantile histogram_fraction  per_series    classic buckets are grouped by every
                                                     label but ``le``: the shard label stays
histogram_count/_sum/_avg/_stddev/...  per_series    native histograms, one series each
label_replace label_join               label_write   unshardable onto the shard label
time pi max_of min_of                  constant      no series involved
absent absent_over_time                unshardable   creates a series when a shard is empty
scalar vector                          unshardable   global value / series from nothing
sort sort_desc sort_by_label[_desc]    unshardable   order of the answer
info histogram_quantiles               unshardable   joins other series / new label output
start_timestamp                        unshardable   semantics not in 2.42
start end range step                   unshardable   query-parameter functions, no time split
integral (anything unknown)            unshardable   not known to 2.42
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

RuleKind = Literal["merge", "group_local", "per_series", "label_write", "constant", "unshardable"]


@dataclass(frozen=True)
class Rule:
    node: Literal["aggregation", "function"]
    kind: RuleKind
    reason: str
    time_splittable: bool = True


def _agg(kind: RuleKind, reason: str) -> Rule:
    return Rule("aggregation", kind, reason)


def _fn(kind: RuleKind, reason: str, time_splittable: bool = True) -> Rule:
    return Rule("function", kind, reason, time_splittable)


_ONE_SERIES = "one series' samples in, one value out"
_ELEMENTWISE = "element-wise on each series"
_DATE = "element-wise on each series' sample value (no argument: vector(time()), not shardable)"
_NATIVE = "native histograms: one series in, one value out"

RULES: dict[str, Rule] = {
    # --- aggregation operators ----------------------------------------------------------
    "sum": _agg("merge", "sum of per-shard sums"),
    "min": _agg("merge", "min of per-shard mins"),
    "max": _agg("merge", "max of per-shard maxes"),
    "count": _agg("merge", "sum of per-shard counts"),
    "group": _agg("merge", "1 wherever any shard has the group"),
    "avg": _agg("merge", "sum of per-shard sums / sum of per-shard counts"),
    "topk": _agg("merge", "global topk per step over the per-shard topk winners"),
    "bottomk": _agg("merge", "global bottomk per step over the per-shard bottomk winners"),
    "quantile": _agg("group_local", "needs every series of a group at once"),
    "stddev": _agg("group_local", "needs every series of a group at once"),
    "stdvar": _agg("group_local", "needs every series of a group at once"),
    "count_values": _agg("group_local", "needs every series of a group at once"),
    "limitk": _agg("unshardable", "experimental, not in Prometheus 2.42"),
    "limit_ratio": _agg("unshardable", "experimental, not in Prometheus 2.42"),
    # --- range-vector functions ---------------------------------------------------------
    "rate": _fn("per_series", _ONE_SERIES),
    "irate": _fn("per_series", _ONE_SERIES),
    "increase": _fn("per_series", _ONE_SERIES),
    "delta": _fn("per_series", _ONE_SERIES),
    "idelta": _fn("per_series", _ONE_SERIES),
    "deriv": _fn("per_series", _ONE_SERIES),
    "predict_linear": _fn("per_series", _ONE_SERIES),
    "changes": _fn("per_series", _ONE_SERIES),
    "resets": _fn("per_series", _ONE_SERIES),
    "double_exponential_smoothing": _fn("per_series", _ONE_SERIES + " (holt_winters in 2.42)"),
    "holt_winters": _fn("per_series", _ONE_SERIES),
    "avg_over_time": _fn("per_series", _ONE_SERIES),
    "min_over_time": _fn("per_series", _ONE_SERIES),
    "max_over_time": _fn("per_series", _ONE_SERIES),
    "sum_over_time": _fn("per_series", _ONE_SERIES),
    "count_over_time": _fn("per_series", _ONE_SERIES),
    "quantile_over_time": _fn("per_series", _ONE_SERIES),
    "stddev_over_time": _fn("per_series", _ONE_SERIES),
    "stdvar_over_time": _fn("per_series", _ONE_SERIES),
    "last_over_time": _fn("per_series", _ONE_SERIES),
    "first_over_time": _fn("per_series", _ONE_SERIES),
    "present_over_time": _fn("per_series", _ONE_SERIES),
    "mad_over_time": _fn("per_series", _ONE_SERIES),
    "ts_of_max_over_time": _fn("per_series", _ONE_SERIES),
    "ts_of_min_over_time": _fn("per_series", _ONE_SERIES),
    "ts_of_last_over_time": _fn("per_series", _ONE_SERIES),
    "ts_of_first_over_time": _fn("per_series", _ONE_SERIES),
    "absent_over_time": _fn("unshardable", "creates a series when a shard has no samples"),
    # --- element-wise ---------------------------------------------------------------------
    **{
        name: _fn("per_series", _ELEMENTWISE)
        for name in (
            "abs",
            "ceil",
            "floor",
            "round",
            "exp",
            "ln",
            "log2",
            "log10",
            "sqrt",
            "sgn",
            "clamp",
            "clamp_min",
            "clamp_max",
            "timestamp",
            "acos",
            "acosh",
            "asin",
            "asinh",
            "atan",
            "atanh",
            "cos",
            "cosh",
            "sin",
            "sinh",
            "tan",
            "tanh",
            "deg",
            "rad",
        )
    },
    **{
        name: _fn("per_series", _DATE)
        for name in (
            "day_of_month",
            "day_of_week",
            "day_of_year",
            "days_in_month",
            "hour",
            "minute",
            "month",
            "year",
        )
    },
    # --- histograms -----------------------------------------------------------------------
    "histogram_quantile": _fn(
        "per_series", "classic buckets are grouped by every label but le: the shard label stays"
    ),
    "histogram_fraction": _fn("per_series", _NATIVE),
    "histogram_count": _fn("per_series", _NATIVE),
    "histogram_sum": _fn("per_series", _NATIVE),
    "histogram_avg": _fn("per_series", _NATIVE),
    "histogram_stddev": _fn("per_series", _NATIVE),
    "histogram_stdvar": _fn("per_series", _NATIVE),
    "histogram_quantiles": _fn("unshardable", "promql-parser extension: adds a label, not in 2.42"),
    # --- labels -----------------------------------------------------------------------------
    "label_replace": _fn("label_write", "per series, unless it writes the shard label"),
    "label_join": _fn("label_write", "per series, unless it writes the shard label"),
    # --- constants --------------------------------------------------------------------------
    "time": _fn("constant", "the evaluation time: the same in every shard"),
    "pi": _fn("constant", "a constant"),
    "max_of": _fn("constant", "scalar of scalars: constant when its arguments are"),
    "min_of": _fn("constant", "scalar of scalars: constant when its arguments are"),
    # --- never sharded --------------------------------------------------------------------------
    "absent": _fn("unshardable", "creates a series when a shard has none"),
    "scalar": _fn("unshardable", "needs the single series of the whole vector"),
    "vector": _fn("unshardable", "creates a series from nothing in every shard"),
    "sort": _fn("unshardable", "the order of the answer is the point"),
    "sort_desc": _fn("unshardable", "the order of the answer is the point"),
    "sort_by_label": _fn("unshardable", "the order of the answer is the point"),
    "sort_by_label_desc": _fn("unshardable", "the order of the answer is the point"),
    "info": _fn("unshardable", "joins info series that may live in another shard"),
    "start_timestamp": _fn("unshardable", "promql-parser extension, not in Prometheus 2.42"),
    "start": _fn("unshardable", "query start: differs per time piece", time_splittable=False),
    "end": _fn("unshardable", "query end: differs per time piece", time_splittable=False),
    "range": _fn("unshardable", "query range: differs per time piece", time_splittable=False),
    "step": _fn("unshardable", "query step", time_splittable=False),
    "integral": _fn("unshardable", "newer than Prometheus 2.42 and promql-parser 0.12"),
}

MERGEABLE_AGGREGATIONS = frozenset(n for n, r in RULES.items() if r.kind == "merge")

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
            if node.op == "count_values" and node.param == String(label):
                return False  # writes the shard label
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
