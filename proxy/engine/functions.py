"""PromQL's instant-vector functions on decoded answers, as Prometheus 2.42 evaluates them.

    INSTANT_FUNCTIONS                          the names evaluate_call knows
    evaluate_call(node, args, grid, is_range)  -> QueryResult

`node` is the `shardplanner.ast.Call`; `args` its evaluated arguments, one per `node.args`:
a QueryResult for a vector (instant: "vector"; range: "matrix" on the step grid), a float or a
QueryResult ("scalar" / one-series "matrix") for a scalar, a str for a string literal. `grid`
holds the step times (ms; one for an instant query). The answer is a "matrix" for a range
query (series sorted by labels, as Prometheus sorts range answers) and a "vector" or "scalar"
for an instant query (a vector in evaluation order, as Prometheus leaves it).

Each function is promql/functions.go of v2.42 run the way rangeEval runs it, step by step:
- `__name__` is dropped by every function except label_replace, label_join, sort, sort_desc
  (and those returning new series: vector, scalar, time, pi, argless date functions);
- a step whose output holds one label set twice fails with "vector cannot contain metrics with
  the same labelset" (e.g. `abs({__name__=~"a|b"})`, or label_replace making two equal);
- label_replace compiles `^(?:regex)$` with RE2 (Go's syntax) and expands `$1`, `${name}`,
  `$$` as Go's Regexp.ExpandString; errors carry Prometheus's texts and are raised even when
  the argument is empty (the function runs at every step);
- sort/sort_desc order an instant vector with Go's (unstable) pdqsort and Prometheus's NaN
  rule (gosort.py), so equal values keep Prometheus's order; a range answer is sorted by
  labels like any other;
- histogram_quantile groups classic `le` buckets by their other labels (name included) and
  runs bucketQuantile (sort, coalesce, ensureMonotonic, rank search) per group and step;
- clamp/clamp_min/clamp_max use Go's math.Max/Min (+Inf beats NaN); sin, cos, tan, atan, asin,
  acos, ln, log2, log10 are Go's, bit for bit (gomath.py, golang.py); exp, sinh, cosh, tanh,
  asinh, acosh, atanh are the C library's (Go's Exp is amd64 assembly and Log1p pure Go, not
  ported: they may differ from Prometheus's in the last bit);
- timestamp() of a computed vector is the step time; timestamp of a plain selector needs the
  raw samples' times, which a decoded answer does not have (ValueError: do not call it so);
- the date functions convert with int64(v) as amd64 does (NaN -> MinInt64) and Go's calendar
  arithmetic, so even `year(vector(NaN))` matches;
- histogram_count/sum/fraction read native histograms only; decoded answers hold floats, so
  their answer is empty, as Prometheus's is for float samples.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import EvalError
from proxy.engine.stepwise import (
    Interner,
    Samples,
    as_grid,
    build,
    check_unique,
    notes,
    per_step_answer,
    scalar_steps,
    without_name,
)
from proxy.result import golang as go
from proxy.result import gomath
from proxy.result.gosort import go_sort
from proxy.result.query_result import QueryResult
from shardplanner.ast import Call, Selector, unparen
from shardplanner.functions import FUNCTIONS

__all__ = ["INSTANT_FUNCTIONS", "KERNELS", "CallArgs", "InstantKernel", "evaluate_call", "kernel"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Arg = QueryResult | float | str


@dataclass(frozen=True)
class CallArgs:
    """One call's evaluated arguments on the step grid, as every kernel receives them."""

    node: Call
    args: Sequence[Arg]
    grid: I64
    is_range: bool
    warnings: list[str]
    infos: list[str]

    @property
    def rtype(self) -> Literal["vector", "matrix"]:
        return "matrix" if self.is_range else "vector"

    def vector(self) -> Samples:
        """The vector argument's samples (the row's first "vector" argument)."""
        pos = FUNCTIONS[self.node.func].args.index("vector")
        return Samples.of(_vector_arg(self.args[pos]), self.grid, self.is_range)

    def scalar(self, i: int) -> F64:
        """Argument `i` (a scalar) at every step."""
        return scalar_steps(_scalar_arg(self.args[i]), self.grid)

    def per_step(self, rtype_scalar: bool, values: F64) -> QueryResult:
        return per_step_answer(rtype_scalar, self.is_range, self.grid, values, self.warnings, self.infos)


InstantKernel = Callable[[CallArgs], QueryResult]
# Function name -> its kernel (functions.go FunctionCalls); kernels.py joins it with the rows
# of shardplanner/functions.py.
KERNELS: dict[str, InstantKernel] = {}


def kernel(*names: str) -> Callable[[InstantKernel], InstantKernel]:
    """Register the decorated function as the kernel of `names`."""
    def register(fn: InstantKernel) -> InstantKernel:
        for name in names:
            if name in KERNELS:
                raise ValueError(f"{name}() has two kernels")
            KERNELS[name] = fn
        return fn
    return register


def evaluate_call(node: Call, args: Sequence[Arg], grid: Sequence[int] | I64, is_range: bool) -> QueryResult:
    """`node.func(*args)` as Prometheus 2.42 evaluates it over `grid`."""
    fn = KERNELS.get(node.func)
    if fn is None:
        raise ValueError(f"{node.func}() is not an instant-vector function evaluate_call knows")
    if len(args) != len(node.args):
        raise ValueError(f"{node.func}() got {len(args)} evaluated arguments for {len(node.args)} in the query")
    g = as_grid(grid)
    if not is_range and len(g) != 1:
        raise ValueError("an instant query has one evaluation time")
    warnings, infos = notes(args)
    return fn(CallArgs(node, args, g, is_range, warnings, infos))


# --------------------------------------------------------------------------------------
# Element-wise functions: one output sample per input sample, `__name__` dropped
# --------------------------------------------------------------------------------------


def _elementwise(c: CallArgs, s: Samples, out: F64, keep: npt.NDArray[np.bool_] | None = None) -> QueryResult:
    dropped = [without_name(d) for d in s.result.labels]
    if keep is not None:
        s, out = Samples(s.result, s.ser[keep], s.step[keep], s.value[keep]), out[keep]
    return _per_series(c.rtype, c.grid, dropped, s, np.asarray(out, dtype=np.float64), c.warnings, c.infos)


def _math(fn: Callable[[F64], F64]) -> InstantKernel:
    def run(c: CallArgs) -> QueryResult:
        s = c.vector()
        with np.errstate(all="ignore"):
            return _elementwise(c, s, fn(s.value))
    return run


def _rad(v: F64) -> F64:
    return v * math.pi / 180


def _deg(v: F64) -> F64:
    return v * 180 / math.pi


def _sgn(v: F64) -> F64:
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


_MATH: dict[str, Callable[[F64], F64]] = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "sqrt": np.sqrt, "ln": gomath.go_log,
    "log2": gomath.go_log2, "log10": gomath.go_log10, "sin": gomath.go_sin, "cos": gomath.go_cos,
    "tan": gomath.go_tan,
    "asin": go.go_asin, "acos": go.go_acos, "atan": go.go_atan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "rad": _rad,
    "deg": _deg, "sgn": _sgn,
}
for _name, _fn in _MATH.items():
    kernel(_name)(_math(_fn))


@kernel("round")
def _round(c: CallArgs) -> QueryResult:
    s = c.vector()
    v = s.value
    to_nearest = c.scalar(1)[s.step] if len(c.args) > 1 else np.ones(len(v))
    with np.errstate(all="ignore"):
        inv = 1.0 / to_nearest
        return _elementwise(c, s, np.floor(v * inv + 0.5) / inv)


@kernel("clamp")
def _clamp(c: CallArgs) -> QueryResult:
    s = c.vector()
    lo, hi = c.scalar(1)[s.step], c.scalar(2)[s.step]
    with np.errstate(all="ignore"):
        return _elementwise(c, s, go.go_max(lo, go.go_min(hi, s.value)), ~(hi < lo))


@kernel("clamp_max")
def _clamp_max(c: CallArgs) -> QueryResult:
    s = c.vector()
    with np.errstate(all="ignore"):
        return _elementwise(c, s, go.go_min(c.scalar(1)[s.step], s.value))


@kernel("clamp_min")
def _clamp_min(c: CallArgs) -> QueryResult:
    s = c.vector()
    with np.errstate(all="ignore"):
        return _elementwise(c, s, go.go_max(c.scalar(1)[s.step], s.value))


_DATE = {
    "day_of_month": "day", "day_of_week": "weekday", "day_of_year": "yday", "hour": "hour",
    "minute": "minute", "month": "month", "year": "year", "days_in_month": "days_in_month",
}


@kernel(*_DATE)
def _date(c: CallArgs) -> QueryResult:
    name = c.node.func
    if not c.args:  # vector(time()): the step's own time, truncated to seconds (enh.Ts/1000)
        return c.per_step(False, _date_values(name, np.fix(c.grid / 1000).astype(np.int64)))
    s = c.vector()
    with np.errstate(all="ignore"):
        return _elementwise(c, s, _date_values(name, go.go_float_to_int64(s.value)))


@kernel("timestamp")
def _timestamp(c: CallArgs) -> QueryResult:
    if isinstance(unparen(c.node.args[0]), Selector):
        raise ValueError("timestamp() of a selector reads the raw samples' times: evaluate it on a backend")
    s = c.vector()
    return _elementwise(c, s, c.grid[s.step].astype(np.float64) / 1000)


# --------------------------------------------------------------------------------------
# Values at every step: pi, time, vector, scalar
# --------------------------------------------------------------------------------------


@kernel("pi")
def _pi(c: CallArgs) -> QueryResult:
    return c.per_step(True, np.full(len(c.grid), math.pi))


@kernel("time")
def _time(c: CallArgs) -> QueryResult:
    return c.per_step(True, c.grid.astype(np.float64) / 1000)


@kernel("vector")
def _vector(c: CallArgs) -> QueryResult:
    return c.per_step(False, c.scalar(0))


@kernel("scalar")
def _scalar(c: CallArgs) -> QueryResult:
    s = c.vector()
    counts = np.bincount(s.step, minlength=len(c.grid))
    values = np.full(len(c.grid), np.nan)
    values[s.step] = s.value
    values[counts != 1] = np.nan  # a value only where exactly one series has a sample
    return c.per_step(True, values)


# --------------------------------------------------------------------------------------
# Histograms, labels, order
# --------------------------------------------------------------------------------------


@kernel("histogram_count", "histogram_sum", "histogram_fraction")
def _native_only(c: CallArgs) -> QueryResult:
    """Native histograms only: float samples give nothing (the scalar arguments still are
    evaluated, and refused if they are not scalars)."""
    c.vector()
    for i, t in enumerate(FUNCTIONS[c.node.func].args):
        if t == "scalar":
            c.scalar(i)
    return QueryResult.empty(c.rtype, warnings=c.warnings, infos=c.infos)


@kernel("histogram_quantile")
def _histogram_quantile(c: CallArgs) -> QueryResult:
    from proxy.engine.histogram import histogram_quantile

    interner, sid, step, value = histogram_quantile(c.scalar(0), c.vector(), len(c.grid))
    check_unique(sid, step, len(c.grid))
    return build(c.rtype, c.grid, interner, sid, step, value, c.warnings, c.infos)


@kernel("label_replace", "label_join")
def _label_write(c: CallArgs) -> QueryResult:
    s = c.vector()
    labels = s.result.labels
    out = _label_replace(labels, c.args) if c.node.func == "label_replace" else _label_join(labels, c.args)
    return _per_series(c.rtype, c.grid, out, s, s.value, c.warnings, c.infos)


@kernel("sort", "sort_desc")
def _sort_kernel(c: CallArgs) -> QueryResult:
    return _sort(c.node.func, c.rtype, c.grid, c.vector(), c.warnings, c.infos)


INSTANT_FUNCTIONS: frozenset[str] = frozenset(KERNELS)


def _vector_arg(a: Arg) -> QueryResult:
    if not isinstance(a, QueryResult):
        raise TypeError(f"a vector argument must be a QueryResult, not {type(a).__name__}")
    return a


def _scalar_arg(a: Arg) -> QueryResult | float:
    if isinstance(a, str):
        raise TypeError("a scalar argument cannot be a string")
    return a


def _string_arg(a: Arg) -> str:
    if not isinstance(a, str):
        raise TypeError(f"a string argument must be a str, not {type(a).__name__}")
    return a


def _per_series(rtype: Literal["vector", "matrix"], g: I64, out_labels: list[dict[str, str]], s: Samples,
                value: F64, warnings: list[str], infos: list[str]) -> QueryResult:
    """Output samples whose label set is a function of their input series."""
    interner = Interner()
    ids = np.array([interner.add(d) for d in out_labels], dtype=np.int64)
    sid = ids[s.ser] if len(ids) else np.zeros(0, dtype=np.int64)
    if len(interner.labels) < len(out_labels):  # two series now share a label set
        check_unique(sid, s.step, len(g))
    return build(rtype, g, interner, sid, s.step, value, warnings, infos)


def _date_values(name: str, secs: I64) -> F64:
    f = go.go_date_fields(go.go_abs_seconds(secs))
    if name == "days_in_month":
        pairs = np.unique(np.stack([f["year"], f["month"]]), axis=1) if len(secs) else np.zeros((2, 0), np.int64)
        table = {(int(y), int(m)): go.go_days_in_month(int(y), int(m)) for y, m in pairs.T.tolist()}
        return np.array([table[(int(y), int(m))] for y, m in zip(f["year"].tolist(), f["month"].tolist())],
                        dtype=np.float64)
    field = _DATE[name]
    out = f[field] + 1 if field == "yday" else f[field]
    return out.astype(np.float64)


# --------------------------------------------------------------------------------------
# label_replace, label_join
# --------------------------------------------------------------------------------------


def _label_replace(labels: list[dict[str, str]], args: Sequence[Arg]) -> list[dict[str, str]]:
    import re2

    dst, repl, src, regex = (_string_arg(a) for a in args[1:5])
    opts = re2.Options()
    opts.log_errors = False
    try:
        rx = re2.compile("^(?:" + regex + ")$", opts)
    except re2.error:
        raise EvalError(f"invalid regular expression in label_replace(): {regex}") from None
    if not go.go_label_name_ok(dst):
        raise EvalError(f"invalid destination label name in label_replace(): {dst}")
    out = []
    for d in labels:
        m = rx.match(d.get(src, ""))
        if m is None:
            out.append(d)
            continue
        res = _expand(repl, m, rx)
        nd = {k: v for k, v in d.items() if k != dst}
        if res:
            nd[dst] = res
        out.append(nd)
    return out


def _expand(template: str, m: object, rx: object) -> str:
    """Go's Regexp.ExpandString: `$$` is `$`; `$name` / `${name}` takes the longest run of
    letters, digits and `_`; a name of ASCII digits (no leading zero, < 1e8) is a group
    index, other names are group names; unknown or unmatched groups expand to nothing; a
    malformed reference keeps its `$` literally."""
    groups: dict[str, int] = dict(getattr(rx, "groupindex", {}) or {})
    n_groups = int(getattr(rx, "groups", 0))
    out: list[str] = []
    while template:
        before, sep, after = template.partition("$")
        out.append(before)
        if not sep:
            return "".join(out)
        template = after
        if template.startswith("$"):
            out.append("$")
            template = template[1:]
            continue
        ext = _extract(template)
        if ext is None:
            out.append("$")
            continue
        name, num, template = ext
        idx = (num if num <= n_groups else None) if num >= 0 else groups.get(name)
        if idx is not None:
            val = m.group(idx)  # type: ignore[attr-defined]
            if val is not None:
                out.append(val)
    return "".join(out)


def _extract(s: str) -> tuple[str, int, str] | None:
    """Go's regexp extract(): (name, group number or -1, rest) after a '$', None if malformed."""
    if not s:
        return None
    brace = s[0] == "{"
    if brace:
        s = s[1:]
    i = 0
    while i < len(s) and (s[i] == "_" or unicodedata.category(s[i]).startswith("L")
                          or unicodedata.category(s[i]) == "Nd"):
        i += 1
    if i == 0:
        return None
    name = s[:i]
    if brace:
        if i >= len(s) or s[i] != "}":
            return None
        i += 1
    num = -1
    if all("0" <= c <= "9" for c in name) and len(name) <= 8 and not (name[0] == "0" and len(name) > 1):
        num = int(name)
    return name, num, s[i:]


def _label_join(labels: list[dict[str, str]], args: Sequence[Arg]) -> list[dict[str, str]]:
    dst, sep = _string_arg(args[1]), _string_arg(args[2])
    srcs = [_string_arg(a) for a in args[3:]]
    for src in srcs:
        if not go.go_label_name_ok(src):
            raise EvalError(f"invalid source label name in label_join(): {src}")
    if not go.go_label_name_ok(dst):
        raise EvalError(f"invalid destination label name in label_join(): {dst}")
    out = []
    for d in labels:
        joined = sep.join(d.get(src, "") for src in srcs)
        nd = {k: v for k, v in d.items() if k != dst}
        if joined:
            nd[dst] = joined
        out.append(nd)
    return out


# --------------------------------------------------------------------------------------
# sort, sort_desc
# --------------------------------------------------------------------------------------


def _sort(name: str, rtype: Literal["vector", "matrix"], g: I64, s: Samples, warnings: list[str],
          infos: list[str]) -> QueryResult:
    r = s.result
    if rtype == "matrix":  # rangeEval collects the steps in a map; the answer is sorted by labels
        return QueryResult("matrix", r.labels, r.offsets, r.t_ms, r.value, warnings, infos)
    items = list(range(r.n_series))
    v = r.value.tolist()
    if name == "sort":  # sort.Reverse(vectorByReverseValueHeap): Less(i, j) = h.Less(j, i)
        go_sort(items, lambda a, b: math.isnan(v[b]) or v[b] > v[a])
    else:  # sort.Reverse(vectorByValueHeap)
        go_sort(items, lambda a, b: math.isnan(v[b]) or v[b] < v[a])
    idx = np.asarray(items, dtype=np.int64)
    return QueryResult("vector", [r.labels[i] for i in items], r.offsets.copy(), r.t_ms[idx], r.value[idx],
                       warnings, infos)
