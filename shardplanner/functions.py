"""Prometheus 2.42's PromQL functions and aggregations, as data (promql/parser/functions.go,
promql/engine.go of v2.42.0): the one list of what the backends of this fleet know.

    FUNCTIONS["rate"]  -> Function("rate", ("matrix",), "vector")
    AGGREGATIONS       -> the aggregation operators of 2.42
    AT_UNSAFE          -> engine.go AtModifierUnsafeFunctions
    unknown_names(expr) -> functions and aggregations `expr` uses that 2.42 does not know

promql-parser 0.12 knows Prometheus 3's functions too (`sort_by_label`, `limitk`, `info`...);
a query using one is not Prometheus 2.42 PromQL, and the backend's own error (400 bad_data,
"unknown function with name ...") is the answer to give, not a routing refusal.

`args`: each argument's type ("vector", "matrix", "scalar", "string"); `optional`: how many
trailing arguments may be left out (`round(v)`, `year()`), -1 for a variadic last argument
(`label_join`). `returns`: the result type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardplanner.ast import Agg, Call, Expr, walk

ValueType = Literal["vector", "matrix", "scalar", "string"]

__all__ = ["AGGREGATIONS", "AT_UNSAFE", "FUNCTIONS", "Function", "unknown_names"]


@dataclass(frozen=True)
class Function:
    name: str
    args: tuple[ValueType, ...]
    returns: ValueType
    optional: int = 0  # trailing arguments that may be left out; -1: the last repeats

    @property
    def is_range(self) -> bool:
        """Reads a range vector (rate, *_over_time, ...)."""
        return "matrix" in self.args


def _table() -> dict[str, Function]:
    V: ValueType = "vector"
    M: ValueType = "matrix"
    S: ValueType = "scalar"
    T: ValueType = "string"
    rows: list[Function] = []
    for name in ("abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "deg", "exp",
                 "floor", "ln", "log10", "log2", "rad", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt", "tan",
                 "tanh", "timestamp", "absent", "histogram_count", "histogram_sum"):
        rows.append(Function(name, (V,), V))
    for name in ("avg_over_time", "changes", "count_over_time", "delta", "deriv", "idelta", "increase", "irate",
                 "last_over_time", "max_over_time", "min_over_time", "present_over_time", "rate", "resets",
                 "stddev_over_time", "stdvar_over_time", "sum_over_time", "absent_over_time"):
        rows.append(Function(name, (M,), V))
    for name in ("days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month", "year"):
        rows.append(Function(name, (V,), V, optional=1))
    rows += [
        Function("clamp", (V, S, S), V),
        Function("clamp_max", (V, S), V),
        Function("clamp_min", (V, S), V),
        Function("histogram_fraction", (S, S, V), V),
        Function("histogram_quantile", (S, V), V),
        Function("holt_winters", (M, S, S), V),
        Function("label_join", (V, T, T, T), V, optional=-1),
        Function("label_replace", (V, T, T, T, T), V),
        Function("pi", (), S),
        Function("predict_linear", (M, S), V),
        Function("quantile_over_time", (S, M), V),
        Function("round", (V, S), V, optional=1),
        Function("scalar", (V,), S),
        Function("time", (), S),
        Function("vector", (S,), V),
    ]
    return {f.name: f for f in rows}


FUNCTIONS: dict[str, Function] = _table()

AGGREGATIONS: frozenset[str] = frozenset({
    "sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk", "count_values", "quantile",
})

# engine.go AtModifierUnsafeFunctions (v2.42): the result depends on the evaluation time even
# when every argument is pinned with `@`, so they are evaluated at every step, never as a
# step-invariant expression evaluated once.
AT_UNSAFE: frozenset[str] = frozenset({
    "days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month", "year",
    "predict_linear", "time", "timestamp",
})


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
