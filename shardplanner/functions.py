"""PromQL's functions and aggregation operators as data: the one table the planner derives
every per-function decision from. Prometheus 2.42 is what this fleet's backends run; its rows
are read from v2.42.0's promql/parser/functions.go (`Functions`: argument and return types,
`Variadic`), promql/functions.go (`FunctionCalls`, `AtModifierUnsafeFunctions`, which
functions call `enh.DropMetricName`) and promql/engine.go (`rangeEval` of a range function).

    FUNCTIONS["rate"]    -> Function("rate", ("matrix",), "vector", ...)   the 2.42 rows
    ALL_FUNCTIONS        -> plus rows for names newer releases (and promql-parser) know
    AGGREGATIONS         -> the aggregation operators of 2.42 (ALL_AGGREGATIONS: plus newer)
    AT_UNSAFE            -> 2.42's AtModifierUnsafeFunctions, from the rows' `at_safe`
    unknown_names(expr)  -> functions and aggregations `expr` uses that 2.42 does not know

Columns of a function row (one row per function, in `_ROWS`):

    args, returns   each argument's type and the result's ("vector", "matrix", "scalar",
                    "string"); `optional` is parser.Functions' `Variadic`: 0 exactly `args`;
                    otherwise the last may be left out (`round(v)`, `year()`) and, for n > 0,
                    repeated up to n arguments in all, for -1 without bound (`label_join`)
    shard, why      the node-sharding rule and its reason (shardplanner/rules.py reads them):
                    per_series / label_write / constant / unshardable
    keeps_name      the output keeps `__name__` (2.42 drops it everywhere else)
    at_safe         not in AtModifierUnsafeFunctions: a call whose arguments are all pinned
                    with `@` is step-invariant (engine.go preprocessExprHelper)
    answer          answer-size class: "one" (one series or a scalar whatever the input),
                    "series" (at most one output series per input series, its labels from
                    that series), "group" (one per group of input series)
    sorts           the order of the answer is the point (sort, sort_desc)
    native_only     reads native histograms only: float samples give no output
    time_splittable False when the value depends on the query's own start/end/step
    since           "2.42" for what 2.42 knows (older releases are not this fleet's concern);
                    otherwise the first release whose parser knows the name ("2.49", "3.5"),
                    "" for a promql-parser extension no release has. A row not from 2.42 is
                    in ALL_FUNCTIONS, not FUNCTIONS, and `unknown_names` reports it: a query
                    using one is answered with the backend's own 400 bad_data ("unknown
                    function with name ..."), not a routing refusal. Their other columns are
                    read from Prometheus's main branch and serve the shard rules only.

An aggregation row (`_AGGREGATION_ROWS`) has `shard`/`why`, `param` (the type of topk's k,
count_values' label) and `answer` ("groups": one series per group, "k": up to k per group,
"series": as many as its input).

Who derives what: rules.RULES (shard, why, time_splittable); names.PER_SERIES_CALLS (which
calls a per-name union may cross); analysis.ABSENT_LIKE, NOT_PER_SERIES, SCALAR_FUNCS,
CLOCK_FUNCS, SORTING_FUNCS; answer_size.ONE_SERIES, BY_K, AS_WIDE_AS_INPUT; AT_UNSAFE here.
tests/shardplanner/test_functions_table.py checks every name promql-parser knows is a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardplanner.ast import Agg, Call, Expr, walk

ValueType = Literal["vector", "matrix", "scalar", "string"]
# The shard kinds of rules.py; merge and group_local are aggregations' only.
ShardKind = Literal["merge", "group_local", "per_series", "label_write", "constant", "unshardable"]
AnswerSize = Literal["one", "series", "group"]
AggAnswer = Literal["groups", "k", "series"]

__all__ = [
    "AGGREGATIONS",
    "ALL_AGGREGATIONS",
    "AggAnswer",
    "ALL_FUNCTIONS",
    "AT_UNSAFE",
    "FUNCTIONS",
    "PROMETHEUS",
    "Aggregation",
    "AnswerSize",
    "Function",
    "ShardKind",
    "ValueType",
    "unknown_names",
]

PROMETHEUS = "2.42"  # the release the backends run: `since` of the rows FUNCTIONS keeps


@dataclass(frozen=True)
class Function:
    name: str
    args: tuple[ValueType, ...]
    returns: ValueType
    optional: int = 0  # parser.Functions' Variadic (see the module docstring)
    shard: ShardKind = "per_series"
    why: str = ""
    keeps_name: bool = False
    at_safe: bool = True
    answer: AnswerSize = "series"
    sorts: bool = False
    native_only: bool = False
    time_splittable: bool = True
    since: str = PROMETHEUS

    @property
    def is_range(self) -> bool:
        """Reads a range vector (rate, *_over_time, ...)."""
        return "matrix" in self.args

    @property
    def min_args(self) -> int:
        """The fewest arguments a call may have (`hour()`: 0, `label_join(v, "d", ",")`: 3)."""
        return len(self.args) - (1 if self.optional else 0)


@dataclass(frozen=True)
class Aggregation:
    name: str
    shard: ShardKind
    why: str
    param: ValueType | None = None  # topk's k, quantile's q: scalar; count_values' label: string
    answer: AggAnswer = "groups"  # one series per group; "k": up to k per group; "series": as input
    since: str = PROMETHEUS


_TYPES: dict[str, ValueType] = {"v": "vector", "m": "matrix", "s": "scalar", "t": "string"}


def _f(name: str, args: str, returns: str, shard: ShardKind, why: str, *, optional: int = 0,
       keeps_name: bool = False, at_safe: bool = True, answer: AnswerSize = "series", sorts: bool = False,
       native_only: bool = False, time_splittable: bool = True, since: str = PROMETHEUS) -> Function:
    """One row; `args`/`returns` spelled one letter a type: v vector, m matrix, s scalar,
    t string (`"vss"`: a vector and two scalars)."""
    return Function(name, tuple(_TYPES[a] for a in args), _TYPES[returns], optional, shard, why, keeps_name,
                    at_safe, answer, sorts, native_only, time_splittable, since)


_PER: ShardKind = "per_series"
_ONE = "one series' samples in, one value out"
_ELEM = "element-wise on each series"
_DATE = "element-wise on each series' sample value (no argument: vector(time()), not shardable)"
_NATIVE = "native histograms: one series in, one value out"
_ORDER = "the order of the answer is the point"
_LABEL = "per series, unless it writes the shard label"

_ROWS: tuple[Function, ...] = (
    # --- range vectors (engine.go rangeEval drops __name__ for all but last_over_time) -------
    _f("rate", "m", "v", _PER, _ONE),
    _f("irate", "m", "v", _PER, _ONE),
    _f("increase", "m", "v", _PER, _ONE),
    _f("delta", "m", "v", _PER, _ONE),
    _f("idelta", "m", "v", _PER, _ONE),
    _f("deriv", "m", "v", _PER, _ONE),
    _f("predict_linear", "ms", "v", _PER, _ONE, at_safe=False),
    _f("changes", "m", "v", _PER, _ONE),
    _f("resets", "m", "v", _PER, _ONE),
    _f("holt_winters", "mss", "v", _PER, _ONE),
    _f("avg_over_time", "m", "v", _PER, _ONE),
    _f("min_over_time", "m", "v", _PER, _ONE),
    _f("max_over_time", "m", "v", _PER, _ONE),
    _f("sum_over_time", "m", "v", _PER, _ONE),
    _f("count_over_time", "m", "v", _PER, _ONE),
    _f("quantile_over_time", "sm", "v", _PER, _ONE),
    _f("stddev_over_time", "m", "v", _PER, _ONE),
    _f("stdvar_over_time", "m", "v", _PER, _ONE),
    _f("last_over_time", "m", "v", _PER, _ONE, keeps_name=True),  # "acts like offset"
    _f("present_over_time", "m", "v", _PER, _ONE),
    # funcAbsentOverTime + engine.go: one series, labelled from the selector, when nothing matched
    _f("absent_over_time", "m", "v", "unshardable", "creates a series when a shard has no samples", answer="one"),
    # --- element-wise (simpleFunc and friends: enh.DropMetricName) ---------------------------
    _f("abs", "v", "v", _PER, _ELEM),
    _f("ceil", "v", "v", _PER, _ELEM),
    _f("floor", "v", "v", _PER, _ELEM),
    _f("round", "vs", "v", _PER, _ELEM, optional=1),
    _f("exp", "v", "v", _PER, _ELEM),
    _f("ln", "v", "v", _PER, _ELEM),
    _f("log2", "v", "v", _PER, _ELEM),
    _f("log10", "v", "v", _PER, _ELEM),
    _f("sqrt", "v", "v", _PER, _ELEM),
    _f("sgn", "v", "v", _PER, _ELEM),
    _f("clamp", "vss", "v", _PER, _ELEM),
    _f("clamp_min", "vs", "v", _PER, _ELEM),
    _f("clamp_max", "vs", "v", _PER, _ELEM),
    _f("timestamp", "v", "v", _PER, _ELEM, at_safe=False),  # reads its argument's sample times
    _f("acos", "v", "v", _PER, _ELEM),
    _f("acosh", "v", "v", _PER, _ELEM),
    _f("asin", "v", "v", _PER, _ELEM),
    _f("asinh", "v", "v", _PER, _ELEM),
    _f("atan", "v", "v", _PER, _ELEM),
    _f("atanh", "v", "v", _PER, _ELEM),
    _f("cos", "v", "v", _PER, _ELEM),
    _f("cosh", "v", "v", _PER, _ELEM),
    _f("sin", "v", "v", _PER, _ELEM),
    _f("sinh", "v", "v", _PER, _ELEM),
    _f("tan", "v", "v", _PER, _ELEM),
    _f("tanh", "v", "v", _PER, _ELEM),
    _f("deg", "v", "v", _PER, _ELEM),
    _f("rad", "v", "v", _PER, _ELEM),
    # dateWrapper: without an argument, the date of vector(time()); all in AtModifierUnsafeFunctions
    _f("day_of_month", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("day_of_week", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("day_of_year", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("days_in_month", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("hour", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("minute", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("month", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    _f("year", "v", "v", _PER, _DATE, optional=1, at_safe=False),
    # --- histograms ---------------------------------------------------------------------------
    # funcHistogramQuantile: classic buckets grouped by every label but `le`, one output per group
    _f("histogram_quantile", "sv", "v", _PER,
       "classic buckets are grouped by every label but le: the shard label stays", answer="group"),
    # funcHistogramFraction/Count/Sum skip every sample whose H is nil
    _f("histogram_fraction", "ssv", "v", _PER, _NATIVE, native_only=True),
    _f("histogram_count", "v", "v", _PER, _NATIVE, native_only=True),
    _f("histogram_sum", "v", "v", _PER, _NATIVE, native_only=True),
    # --- labels (funcLabelReplace/funcLabelJoin: the input's labels, __name__ included) -------
    _f("label_replace", "vtttt", "v", "label_write", _LABEL, keeps_name=True),
    _f("label_join", "vttt", "v", "label_write", _LABEL, keeps_name=True, optional=-1),
    # --- no series ------------------------------------------------------------------------
    _f("time", "", "s", "constant", "the evaluation time: the same in every shard", at_safe=False, answer="one"),
    _f("pi", "", "s", "constant", "a constant", answer="one"),
    # --- never sharded ----------------------------------------------------------------------
    # funcAbsent: one series from the selector's equality matchers (never __name__)
    _f("absent", "v", "v", "unshardable", "creates a series when a shard has none", answer="one"),
    _f("scalar", "v", "s", "unshardable", "needs the single series of the whole vector", answer="one"),
    _f("vector", "s", "v", "unshardable", "creates a series from nothing in every shard", answer="one"),
    # funcSort/funcSortDesc return their input reordered: labels untouched
    _f("sort", "v", "v", "unshardable", _ORDER, keeps_name=True, sorts=True),
    _f("sort_desc", "v", "v", "unshardable", _ORDER, keeps_name=True, sorts=True),
    # --- not in 2.42: Prometheus 2.47+ and 3 (promql/parser/functions.go on main) -----------
    _f("double_exponential_smoothing", "mss", "v", _PER, _ONE + " (holt_winters in 2.42)", since="3.0"),
    _f("first_over_time", "m", "v", _PER, _ONE, keeps_name=True, since="3.7"),
    _f("mad_over_time", "m", "v", _PER, _ONE, since="2.49"),
    _f("ts_of_max_over_time", "m", "v", _PER, _ONE, since="3.5"),
    _f("ts_of_min_over_time", "m", "v", _PER, _ONE, since="3.5"),
    _f("ts_of_last_over_time", "m", "v", _PER, _ONE, since="3.5"),
    _f("ts_of_first_over_time", "m", "v", _PER, _ONE, since="3.7"),
    _f("histogram_avg", "v", "v", _PER, _NATIVE, native_only=True, since="2.51"),
    _f("histogram_stddev", "v", "v", _PER, _NATIVE, native_only=True, since="2.47"),
    _f("histogram_stdvar", "v", "v", _PER, _NATIVE, native_only=True, since="2.47"),
    _f("histogram_quantiles", "vtss", "v", "unshardable", "promql-parser extension: adds a label, not in 2.42",
       optional=9, answer="group", since="3.11"),
    _f("sort_by_label", "vt", "v", "unshardable", _ORDER, optional=-1, keeps_name=True, sorts=True, since="2.49"),
    _f("sort_by_label_desc", "vt", "v", "unshardable", _ORDER, optional=-1, keeps_name=True, sorts=True,
       since="2.49"),
    _f("info", "vv", "v", "unshardable", "joins info series that may live in another shard", optional=1,
       keeps_name=True, since="2.55"),
    _f("start_timestamp", "v", "v", "unshardable", "promql-parser extension, not in Prometheus 2.42",
       since="3.14"),
    _f("max_of", "ss", "s", "constant", "scalar of scalars: constant when its arguments are", answer="one",
       since="3.13"),
    _f("min_of", "ss", "s", "constant", "scalar of scalars: constant when its arguments are", answer="one",
       since="3.13"),
    # The query's own parameters: no time split (every piece would see its own start/end).
    _f("start", "", "s", "unshardable", "query start: differs per time piece", at_safe=False, answer="one",
       time_splittable=False, since="3.12"),
    _f("end", "", "s", "unshardable", "query end: differs per time piece", at_safe=False, answer="one",
       time_splittable=False, since="3.12"),
    _f("range", "", "s", "unshardable", "query range: differs per time piece", at_safe=False, answer="one",
       time_splittable=False, since="3.12"),
    _f("step", "", "s", "unshardable", "query step", at_safe=False, answer="one", time_splittable=False,
       since="3.12"),
    # promql-parser 0.12 parses integral(matrix[, scalar]) (its own errors say so); no
    # Prometheus release has it.
    _f("integral", "ms", "v", "unshardable", "newer than Prometheus 2.42 and promql-parser 0.12", optional=1,
       since=""),
)

_NEEDS_ALL = "needs every series of a group at once"
_AGGREGATION_ROWS: tuple[Aggregation, ...] = (
    # engine.go aggregation(): sum/min/max/count/group/avg re-aggregate from per-shard partials
    Aggregation("sum", "merge", "sum of per-shard sums"),
    Aggregation("min", "merge", "min of per-shard mins"),
    Aggregation("max", "merge", "max of per-shard maxes"),
    Aggregation("count", "merge", "sum of per-shard counts"),
    Aggregation("group", "merge", "1 wherever any shard has the group"),
    Aggregation("avg", "merge", "sum of per-shard sums / sum of per-shard counts"),
    Aggregation("topk", "merge", "global topk per step over the per-shard topk winners", "scalar", "k"),
    Aggregation("bottomk", "merge", "global bottomk per step over the per-shard bottomk winners", "scalar", "k"),
    Aggregation("quantile", "group_local", _NEEDS_ALL, "scalar"),
    Aggregation("stddev", "group_local", _NEEDS_ALL),
    Aggregation("stdvar", "group_local", _NEEDS_ALL),
    Aggregation("count_values", "group_local", _NEEDS_ALL, "string", "series"),  # one per value: as input
    # parser/lex.go on main: experimental since 2.54
    Aggregation("limitk", "unshardable", "experimental, not in Prometheus 2.42", "scalar", "k", since="2.54"),
    Aggregation("limit_ratio", "unshardable", "experimental, not in Prometheus 2.42", "scalar", "k",
                since="2.54"),
)

ALL_FUNCTIONS: dict[str, Function] = {f.name: f for f in _ROWS}
FUNCTIONS: dict[str, Function] = {f.name: f for f in _ROWS if f.since == PROMETHEUS}
ALL_AGGREGATIONS: dict[str, Aggregation] = {a.name: a for a in _AGGREGATION_ROWS}
AGGREGATIONS: frozenset[str] = frozenset(a.name for a in _AGGREGATION_ROWS if a.since == PROMETHEUS)

# functions.go AtModifierUnsafeFunctions (v2.42): the result depends on the evaluation time even
# when every argument is pinned with `@`, so they are evaluated at every step, never as a
# step-invariant expression evaluated once.
AT_UNSAFE: frozenset[str] = frozenset(n for n, f in FUNCTIONS.items() if not f.at_safe)


def unknown_names(expr: Expr) -> list[str]:
    """The functions and aggregation operators of `expr` that Prometheus 2.42 does not know,
    in order of appearance."""
    out: dict[str, None] = {}
    for n in walk(expr):
        if isinstance(n, Call) and n.func not in FUNCTIONS:
            out[n.func] = None
        elif isinstance(n, Agg) and n.op not in AGGREGATIONS:
            out[n.op] = None
    return list(out)
