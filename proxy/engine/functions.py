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

__all__ = ["INSTANT_FUNCTIONS", "evaluate_call"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Arg = QueryResult | float | str


def _rad(v: F64) -> F64:
    return v * math.pi / 180


def _deg(v: F64) -> F64:
    return v * 180 / math.pi


def _sgn(v: F64) -> F64:
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


_SIMPLE: dict[str, Callable[[F64], F64]] = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "sqrt": np.sqrt, "ln": gomath.go_log,
    "log2": gomath.go_log2, "log10": gomath.go_log10, "sin": gomath.go_sin, "cos": gomath.go_cos,
    "tan": gomath.go_tan,
    "asin": go.go_asin, "acos": go.go_acos, "atan": go.go_atan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "rad": _rad,
    "deg": _deg, "sgn": _sgn,
}
_DATE = {
    "day_of_month": "day", "day_of_week": "weekday", "day_of_year": "yday", "hour": "hour",
    "minute": "minute", "month": "month", "year": "year", "days_in_month": "days_in_month",
}
_NATIVE_ONLY = frozenset({"histogram_count", "histogram_sum", "histogram_fraction"})
_OTHERS = frozenset({
    "round", "clamp", "clamp_min", "clamp_max", "pi", "time", "scalar", "vector", "timestamp",
    "label_replace", "label_join", "sort", "sort_desc", "histogram_quantile",
})
INSTANT_FUNCTIONS: frozenset[str] = frozenset(_SIMPLE) | frozenset(_DATE) | _NATIVE_ONLY | _OTHERS



def evaluate_call(node: Call, args: Sequence[Arg], grid: Sequence[int] | I64, is_range: bool) -> QueryResult:
    """`node.func(*args)` as Prometheus 2.42 evaluates it over `grid`."""
    name = node.func
    if name not in INSTANT_FUNCTIONS:
        raise ValueError(f"{name}() is not an instant-vector function evaluate_call knows")
    if len(args) != len(node.args):
        raise ValueError(f"{name}() got {len(args)} evaluated arguments for {len(node.args)} in the query")
    g = as_grid(grid)
    if not is_range and len(g) != 1:
        raise ValueError("an instant query has one evaluation time")
    warnings, infos = notes(args)
    rtype: Literal["vector", "matrix"] = "matrix" if is_range else "vector"

    if name == "pi":
        return per_step_answer(True, is_range, g, np.full(len(g), math.pi), warnings, infos)
    if name == "time":
        return per_step_answer(True, is_range, g, g.astype(np.float64) / 1000, warnings, infos)
    if name == "vector":
        return per_step_answer(False, is_range, g, scalar_steps(_scalar_arg(args[0]), g), warnings, infos)
    if name in _DATE and not args:
        secs = np.fix(g / 1000).astype(np.int64)  # enh.Ts/1000 (truncating) seconds
        return per_step_answer(False, is_range, g, _date_values(name, secs), warnings, infos)
    if name == "timestamp" and isinstance(unparen(node.args[0]), Selector):
        raise ValueError("timestamp() of a selector reads the raw samples' times: evaluate it on a backend")

    vec_pos = 1 if name == "histogram_quantile" else 2 if name == "histogram_fraction" else 0
    s = Samples.of(_vector_arg(args[vec_pos]), g, is_range)
    labels = s.result.labels

    if name == "scalar":
        counts = np.bincount(s.step, minlength=len(g))
        values = np.full(len(g), np.nan)
        values[s.step] = s.value
        values[counts != 1] = np.nan
        return per_step_answer(True, is_range, g, values, warnings, infos)
    if name in _NATIVE_ONLY:
        for a in args[:vec_pos]:
            scalar_steps(_scalar_arg(a), g)
        return QueryResult.empty(rtype, warnings=warnings, infos=infos)
    if name in ("label_replace", "label_join"):
        out_labels = _label_replace(labels, args) if name == "label_replace" else _label_join(labels, args)
        return _per_series(rtype, g, out_labels, s, s.value, warnings, infos)
    if name in ("sort", "sort_desc"):
        return _sort(name, rtype, g, s, warnings, infos)
    if name == "histogram_quantile":
        from proxy.engine.histogram import histogram_quantile

        interner, sid, step, value = histogram_quantile(scalar_steps(_scalar_arg(args[0]), g), s, len(g))
        check_unique(sid, step, len(g))
        return build(rtype, g, interner, sid, step, value, warnings, infos)

    dropped = [without_name(d) for d in labels]
    v = s.value
    keep: npt.NDArray[np.bool_] | None = None
    with np.errstate(all="ignore"):
        if name in _SIMPLE:
            out = _SIMPLE[name](v)
        elif name in _DATE:
            out = _date_values(name, go.go_float_to_int64(v))
        elif name == "timestamp":
            out = g[s.step].astype(np.float64) / 1000
        elif name == "round":
            to_nearest = scalar_steps(_scalar_arg(args[1]), g)[s.step] if len(args) > 1 else np.ones(len(v))
            inv = 1.0 / to_nearest
            out = np.floor(v * inv + 0.5) / inv
        elif name == "clamp":
            lo = scalar_steps(_scalar_arg(args[1]), g)[s.step]
            hi = scalar_steps(_scalar_arg(args[2]), g)[s.step]
            out = go.go_max(lo, go.go_min(hi, v))
            keep = ~(hi < lo)
        elif name == "clamp_max":
            out = go.go_min(scalar_steps(_scalar_arg(args[1]), g)[s.step], v)
        elif name == "clamp_min":
            out = go.go_max(scalar_steps(_scalar_arg(args[1]), g)[s.step], v)
        else:  # pragma: no cover - INSTANT_FUNCTIONS is covered above
            raise AssertionError(name)
    s2 = s if keep is None else Samples(s.result, s.ser[keep], s.step[keep], s.value[keep])
    return _per_series(rtype, g, dropped, s2, np.asarray(out, dtype=np.float64)[keep] if keep is not None
                       else np.asarray(out, dtype=np.float64), warnings, infos)


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
