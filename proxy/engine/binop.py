"""PromQL binary operators on decoded answers, with Prometheus 2.42's semantics.

    evaluate_binary(node, lhs, rhs) -> QueryResult | float

The executor evaluates `node.lhs` and `node.rhs` (possibly on different backends) and hands
the two decoded answers here; `node` (a `shardplanner.ast.Binary`) gives the operator, `bool`
and the vector matching. This is promql/engine.go's VectorBinop / VectorAnd / VectorOr /
VectorUnless / VectorscalarBinop / scalarBinop / vectorElemBinop / resultMetric, run the way
rangeEval runs them: independently at every step timestamp present in either operand.

Operands (what the executor may pass):
- a Python float (or int): a scalar constant (number literal, or a step-invariant scalar);
- a `QueryResult` of result_type "scalar" (an instant query's scalar answer);
- a `QueryResult` of result_type "vector" (instant) or "matrix" (range; every sample on the
  query's step grid);
- a "matrix" `QueryResult` for a side whose expression is scalar-typed (`scalar(x)`,
  `time()`, `1 + scalar(y)`, ...): a range answer of a scalar expression, one series with
  no labels. Whether a matrix is a scalar is decided from the AST side (`is_scalar_expr`),
  as `vector(1)` and `scalar(x)` have identical range answers.
An instant vector and a matrix cannot be mixed (ValueError).

Results: vector in -> vector out (in Prometheus's evaluation order); matrix in -> matrix out,
series sorted by labels.Compare as Prometheus sorts a range answer, series without samples
dropped; scalar op scalar -> float when both are floats, else a "scalar" (instant) or a
one-series "matrix" (range) QueryResult, as Prometheus would answer.

Semantics (each from engine.go, checked against a real 2.42 in tests/result/test_binop_prometheus.py):
- arithmetic `+ - * / % ^` drops __name__; `atan2` keeps it (shouldDropMetricName omits it);
  comparisons filter and keep the lhs value and labels (scalar on the left: the vector's
  value); `bool` gives 0/1 and drops __name__.
- group_right with a filtering comparison keeps the value of the LEFT ("one") side and the
  labels of the right ("many") side: vectorElemBinop returns its lhs after the sides are
  swapped back. Prometheus does this; so do we.
- one-to-one output labels: on(l) keeps only l, ignoring(l) drops l; group_x keeps all the
  "many" side's labels, then sets each include label from the "one" side (absent there ->
  removed).
- set operators are many-to-many: `and` keeps lhs series with a signature in rhs at that
  step; `unless` the others; `or` all of lhs then rhs series whose signature lhs lacks at
  that step (which side wins is decided per step).
- errors, with Prometheus's text, raised for the first step (in time) that fails: duplicate
  series on the "one" side (only if the other side has samples at that step), two matches
  of one signature in one-to-one matching, grouping labels not unique, and a step whose
  output holds one label set twice ("vector cannot contain metrics with the same
  labelset", e.g. `{__name__=~"a|b"} * 2`).
- `%` is Go's math.Mod (C fmod, sign of the dividend); `^` is Go's math.Pow, reproduced
  operation by operation (exact for integer exponents; for fractional exponents Go's own
  Exp/Log may differ from the C library's by an ulp); `atan2` is Go's math.Atan2 (pure Go
  on amd64, ported bit for bit); + - * / and comparisons are IEEE, identical.

How: every series gets a matching signature (one dict lookup per series), every sample a
step index; a join is a sort/searchsorted on `signature * n_steps + step`, and values are
computed with numpy over all matched samples at once. Steps where anything could go wrong
(a repeated key on the "one" side, a repeated output label set, a repeated signature among
one-to-one matches) are replayed by `binop_step`, a line-by-line transcription of
VectorBinop over that one step, which either raises Prometheus's error or supplies that
step's output. Go's math.Pow, math.Atan2 and strconv.Quote are in golang.py; the matching rules
and the per-step reference in matching.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import DuplicateLabelset, EvalError
from proxy.engine.matching import (
    DROP_NAME,
    Matching,
    Sample,
    apply_op,
    binop_step,
    result_metric,
    scalar_values,
)
from proxy.engine.stepwise import Interner
from proxy.result.query_result import QueryResult
from shardplanner.analysis import is_scalar_expr
from shardplanner.ast import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    SET_OPS,
    Binary,
)

__all__ = ["evaluate_binary", "is_scalar_expr"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Labels = dict[str, str]
Key = tuple[tuple[str, str], ...]


# --------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------


def evaluate_binary(node: Binary, lhs: QueryResult | float, rhs: QueryResult | float) -> QueryResult | float:
    """`lhs <node.op> rhs` on evaluated operands, as Prometheus 2.42 evaluates it."""
    op = node.op
    lo = _operand(lhs, is_scalar_expr(node.lhs))
    ro = _operand(rhs, is_scalar_expr(node.rhs))
    if isinstance(lo, _Scalar) and isinstance(ro, _Scalar):
        return _scalar_scalar(node, lo, ro)
    if op in SET_OPS and (isinstance(lo, _Scalar) or isinstance(ro, _Scalar)):
        raise EvalError(f'set operator "{op}" not allowed in binary scalar expression')
    if op not in COMPARISON_OPS | ARITHMETIC_OPS | SET_OPS:  # pragma: no cover - Binary checks
        raise ValueError(f"unknown operator {op!r}")

    vecs = [o for o in (lo, ro) if isinstance(o, _Vector)]
    rtypes: set[str] = {v.result.result_type for v in vecs}
    rtypes |= {{"scalar": "vector", "matrix": "matrix"}[o.kind] for o in (lo, ro)
               if isinstance(o, _Scalar) and o.kind != "float"}
    if len(rtypes) > 1:
        raise ValueError("cannot combine an instant vector with a range matrix")
    rtype: Literal["vector", "matrix"] = "matrix" if "matrix" in rtypes else "vector"
    grid = _Grid.of([lo, ro])
    warnings, infos = _notes([lo, ro])

    if isinstance(lo, _Vector) and isinstance(ro, _Vector):
        m = Matching.of(node)
        if op in SET_OPS:
            out = _set_op(op, lo, ro, m, grid)
        else:
            out = _vector_vector(node, lo, ro, m, grid)
    elif isinstance(lo, _Vector):
        assert isinstance(ro, _Scalar)
        out = _vector_scalar(node, lo, ro, grid, swap=False)
    else:
        assert isinstance(lo, _Scalar) and isinstance(ro, _Vector)
        out = _vector_scalar(node, ro, lo, grid, swap=True)
    return out.build(rtype, grid, warnings, infos)


# --------------------------------------------------------------------------------------
# Operands and the step grid
# --------------------------------------------------------------------------------------


@dataclass
class _Vector:
    result: QueryResult
    ser: I64  # series index of every sample
    steps_t: I64  # timestamp of every sample (mapped to step indexes by the grid)

    @classmethod
    def of(cls, r: QueryResult) -> _Vector:
        return cls(r, np.repeat(np.arange(r.n_series, dtype=np.int64), r.counts), r.t_ms)


@dataclass
class _Scalar:
    const: float | None  # a constant, or per-step values below
    t_ms: I64 | None = None
    value: F64 | None = None
    kind: Literal["float", "scalar", "matrix"] = "float"
    result: QueryResult | None = None


_Operand = _Vector | _Scalar


def _operand(x: QueryResult | float, scalar_typed: bool) -> _Operand:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return _Scalar(float(x))
    if not isinstance(x, QueryResult):
        raise TypeError(f"operand must be a QueryResult or a float, not {type(x).__name__}")
    if x.result_type == "string":
        raise EvalError("binary expressions are not allowed on strings")
    if x.result_type == "scalar":
        return _Scalar(None, x.t_ms.copy(), x.value.copy(), "scalar", x)
    if x.result_type == "matrix" and scalar_typed:
        if x.n_series > 1:
            raise ValueError("a scalar-typed range answer has at most one series")
        return _Scalar(None, x.t_ms.copy(), x.value.copy(), "matrix", x)
    return _Vector.of(x)


def _notes(ops: Sequence[_Operand]) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    infos: list[str] = []
    for o in ops:
        r = o.result
        if r is None:
            continue
        warnings += [w for w in r.warnings if w not in warnings]
        infos += [i for i in r.infos if i not in infos]
    return warnings, infos


@dataclass
class _Grid:
    """The union of all timestamps of the operands: step i is at `t[i]`."""

    t: I64

    @classmethod
    def of(cls, ops: Sequence[_Operand]) -> _Grid:
        maybe = [o.steps_t if isinstance(o, _Vector) else o.t_ms for o in ops]
        parts: list[I64] = [p for p in maybe if p is not None]
        t = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        return cls(t.astype(np.int64))

    @property
    def n(self) -> int:
        return max(len(self.t), 1)

    def index(self, t: I64) -> I64:
        """Step index of each timestamp (all of them are on the grid)."""
        if len(self.t) > 1:
            d = int(self.t[1] - self.t[0])
            if d > 0 and int(self.t[-1] - self.t[0]) == d * (len(self.t) - 1) and np.all(np.diff(self.t) == d):
                out: I64 = (t - self.t[0]) // d  # a regular grid: no search needed
                return out
        return np.searchsorted(self.t, t).astype(np.int64)


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------


@dataclass
class _Out:
    """Output samples in evaluation order: (output series id, step, value)."""

    series: Interner
    sid: I64
    step: I64
    value: F64

    def build(self, rtype: Literal["vector", "matrix"], grid: _Grid, warnings: list[str],
              infos: list[str]) -> QueryResult:
        n = len(self.sid)
        if n == 0:
            return QueryResult.empty(rtype, warnings=warnings, infos=infos)
        if rtype == "matrix":
            present = np.unique(self.sid)
            order_keys = sorted(present.tolist(), key=lambda i: self.series.keys[i])
            rank = np.full(len(self.series.labels), -1, dtype=np.int64)
            rank[np.asarray(order_keys, dtype=np.int64)] = np.arange(len(order_keys))
            r = rank[self.sid]
            # Samples come in runs (one input series at a time, steps increasing): a stable
            # sort by output series is enough unless one output series has several runs.
            idx = np.argsort(r, kind="stable")
            r_sorted = r[idx]
            st = self.step[idx]
            if np.any((r_sorted[1:] == r_sorted[:-1]) & (st[1:] <= st[:-1])):
                idx = np.lexsort((self.step, r))
                r_sorted = r[idx]
            counts = np.bincount(r_sorted, minlength=len(order_keys))
            labels = [self.series.labels[i] for i in order_keys]
            step, value = self.step[idx], self.value[idx]
        else:
            # An instant vector keeps evaluation order; one sample per series (checked).
            labels = [self.series.labels[i] for i in self.sid.tolist()]
            counts = np.ones(n, dtype=np.int64)
            step, value = self.step, self.value
        offsets = np.zeros(len(labels) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        t = grid.t[step].astype(np.int64)
        return QueryResult(rtype, labels, offsets, t, value.astype(np.float64), warnings, infos)


def _dup_steps(sid: I64, step: I64, n_steps: int, origin: I64 | None = None) -> I64:
    """Steps at which one id occurs twice. `origin` (the input series of each sample, whose
    steps never repeat) lets the sort skip every id that only one input series produces."""
    if len(sid) < 2:
        return np.zeros(0, dtype=np.int64)
    if origin is not None:
        head = np.ones(len(sid), dtype=bool)
        head[1:] = (sid[1:] != sid[:-1]) | (origin[1:] != origin[:-1])
        pairs = np.unique(sid[head] * (int(origin.max()) + 1) + origin[head])
        ids = pairs // (int(origin.max()) + 1)
        shared = ids[1:][ids[1:] == ids[:-1]]
        if len(shared) == 0:
            return np.zeros(0, dtype=np.int64)
        sel = np.isin(sid, shared)
        sid, step = sid[sel], step[sel]
    key = sid * n_steps + step
    s = np.sort(key)
    d = s[1:][s[1:] == s[:-1]]
    return np.unique(d % n_steps)


def _empty_out() -> _Out:
    z = np.zeros(0, dtype=np.int64)
    return _Out(Interner(), z, z.copy(), np.zeros(0))


# --------------------------------------------------------------------------------------
# scalar op scalar
# --------------------------------------------------------------------------------------


def _scalar_scalar(node: Binary, lo: _Scalar, ro: _Scalar) -> QueryResult | float:
    op = node.op
    if op in SET_OPS:
        raise EvalError(f'set operator "{op}" not allowed in binary scalar expression')
    if op in COMPARISON_OPS and not node.return_bool:
        raise EvalError("comparisons between scalars must use BOOL modifier")
    if lo.const is not None and ro.const is not None:
        return float(scalar_values(op, np.array([lo.const]), np.array([ro.const]))[0])
    kinds = {lo.kind, ro.kind} - {"float"}
    if kinds == {"scalar", "matrix"}:
        raise ValueError("cannot combine an instant scalar with a range matrix")
    grid = _Grid.of([lo, ro])
    a = _per_step(lo, grid)
    b = _per_step(ro, grid)
    ok = ~np.isnan(a[1]) & ~np.isnan(b[1])  # presence masks
    v = scalar_values(op, a[0][ok], b[0][ok])
    t = grid.t[ok]
    warnings, infos = _notes([lo, ro])
    if "scalar" in kinds:
        if len(t) != 1:
            raise ValueError("an instant scalar has exactly one sample")
        return QueryResult.scalar(int(t[0]), float(v[0]), warnings=warnings, infos=infos)
    if len(t) == 0:
        return QueryResult.empty("matrix", warnings=warnings, infos=infos)
    return QueryResult("matrix", [{}], np.array([0, len(t)], dtype=np.int64), t.astype(np.int64),
                       v.astype(np.float64), warnings, infos)


def _per_step(s: _Scalar, grid: _Grid) -> tuple[F64, F64]:
    """(values, presence as 0.0 / NaN) of a scalar at every step of the grid."""
    vals = np.zeros(len(grid.t))
    pres = np.full(len(grid.t), np.nan)
    if s.const is not None:
        vals[:] = s.const
        pres[:] = 0.0
    else:
        assert s.t_ms is not None and s.value is not None
        i = grid.index(s.t_ms)
        vals[i] = s.value
        pres[i] = 0.0
    return vals, pres


# --------------------------------------------------------------------------------------
# vector op scalar (VectorscalarBinop)
# --------------------------------------------------------------------------------------


def _vector_scalar(node: Binary, vec: _Vector, sc: _Scalar, grid: _Grid, *, swap: bool) -> _Out:
    op = node.op
    step = grid.index(vec.steps_t)
    vals = vec.result.value
    ser = vec.ser
    if sc.const is not None:
        svals = np.full(len(vals), sc.const)
    else:
        sv, pres = _per_step(sc, grid)
        have = ~np.isnan(pres[step]) if len(grid.t) else np.zeros(len(step), dtype=bool)
        step, vals, ser = step[have], vals[have], ser[have]
        svals = sv[step]
    a, b = (svals, vals) if swap else (vals, svals)
    value, keep = apply_op(op, a, b)
    if op in COMPARISON_OPS and swap:
        value = vals  # the vector's value, even when the scalar is on the left
    if node.return_bool:
        value = keep.astype(np.float64)
        keep = np.ones(len(keep), dtype=bool)
    ser, step, value = ser[keep], step[keep], value[keep]

    drop = op in DROP_NAME or node.return_bool
    interner = Interner()
    series_labels = vec.result.labels
    used = np.unique(ser)
    sid_of = np.zeros(max(len(series_labels), 1), dtype=np.int64)
    for i in used.tolist():
        lab = series_labels[i]
        if drop and "__name__" in lab:
            lab = {k: v for k, v in lab.items() if k != "__name__"}
        sid_of[i] = interner.add(lab)
    sid = sid_of[ser]
    if len(_dup_steps(sid, step, grid.n, ser)):
        raise DuplicateLabelset()
    return _Out(interner, sid, step, value.astype(np.float64))


# --------------------------------------------------------------------------------------
# Set operators (VectorAnd / VectorOr / VectorUnless)
# --------------------------------------------------------------------------------------


def _sig_ids(vec: _Vector, m: Matching, table: dict[Key, int]) -> I64:
    out = np.empty(vec.result.n_series, dtype=np.int64)
    for i, lab in enumerate(vec.result.labels):
        out[i] = table.setdefault(m.signature(lab), len(table))
    return out


def _set_op(op: str, lo: _Vector, ro: _Vector, m: Matching, grid: _Grid) -> _Out:
    table: dict[Key, int] = {}
    lsig, rsig = _sig_ids(lo, m, table), _sig_ids(ro, m, table)
    n = grid.n
    lstep, rstep = grid.index(lo.steps_t), grid.index(ro.steps_t)
    lkey = lsig[lo.ser] * n + lstep
    rkey = rsig[ro.ser] * n + rstep
    lval, rval = lo.result.value, ro.result.value
    interner = Interner()
    lids = np.array([interner.add(lab) for lab in lo.result.labels], dtype=np.int64)
    if op == "and":
        k = np.isin(lkey, rkey)
        return _Out(interner, lids[lo.ser[k]], lstep[k], lval[k])
    if op == "unless":
        k = ~np.isin(lkey, rkey)
        return _Out(interner, lids[lo.ser[k]], lstep[k], lval[k])
    # or: all of lhs, then the rhs samples whose signature lhs lacks at that step.
    rids = np.array([interner.add(lab) for lab in ro.result.labels], dtype=np.int64)
    k = ~np.isin(rkey, lkey)
    sid = np.concatenate([lids[lo.ser], rids[ro.ser[k]]])
    step = np.concatenate([lstep, rstep[k]])
    value = np.concatenate([lval, rval[k]])
    origin = np.concatenate([lo.ser, ro.ser[k] + lo.result.n_series])
    if len(_dup_steps(sid, step, n, origin)):  # cannot happen: equal label sets share a signature
        raise DuplicateLabelset()
    return _Out(interner, sid, step, value)


# --------------------------------------------------------------------------------------
# vector op vector (VectorBinop)
# --------------------------------------------------------------------------------------


def _vector_vector(node: Binary, lo: _Vector, ro: _Vector, m: Matching, grid: _Grid) -> _Out:
    op, rb = node.op, node.return_bool
    n = grid.n
    swapped = m.card == "one-to-many"
    many, one = (ro, lo) if swapped else (lo, ro)
    table: dict[Key, int] = {}
    msig, osig = _sig_ids(many, m, table), _sig_ids(one, m, table)
    mstep, ostep = grid.index(many.steps_t), grid.index(one.steps_t)
    mkey = msig[many.ser] * n + mstep
    okey = osig[one.ser] * n + ostep

    suspicious: set[int] = set()
    # The "one" side holding a signature twice at a step.
    suspicious.update(_dup_steps(osig[one.ser], ostep, n, one.ser).tolist())
    order = np.argsort(okey, kind="stable")
    sk = okey[order]
    first = np.ones(len(sk), dtype=bool)
    first[1:] = sk[1:] != sk[:-1]
    uk, ui = sk[first], order[first]

    pos = np.searchsorted(uk, mkey)
    posc = np.minimum(pos, max(len(uk) - 1, 0))
    hit = (uk[posc] == mkey) if len(uk) else np.zeros(len(mkey), dtype=bool)
    mi = np.nonzero(hit)[0]
    oi = ui[posc[mi]]
    vm, vo = many.result.value[mi], one.result.value[oi]
    vl, vr = (vo, vm) if swapped else (vm, vo)
    value, keep = apply_op(op, vl, vr)
    if rb:
        value = keep.astype(np.float64)
    else:
        mi, oi, value = mi[keep], oi[keep], value[keep]
    step = mstep[mi]

    # Output label sets: per "many" series (one-to-one) or per (many, one) series pair.
    interner = Interner()
    mser, oser = many.ser[mi], one.ser[oi]
    n_one = max(one.result.n_series, 1)
    pair = mser if m.card == "one-to-one" else mser * n_one + oser
    # Matched samples come in runs of one pair (series-major input): label each run once.
    head = np.ones(len(pair), dtype=bool)
    head[1:] = pair[1:] != pair[:-1]
    run_pairs = pair[head]
    upairs, inv = np.unique(run_pairs, return_inverse=True)
    ids = np.empty(len(upairs), dtype=np.int64)
    for j, p in enumerate(upairs.tolist()):
        a, b = (p, -1) if m.card == "one-to-one" else divmod(p, n_one)
        lab = result_metric(many.result.labels[a], one.result.labels[b] if b >= 0 else {}, op, m, rb)
        ids[j] = interner.add(lab)
    sid = np.repeat(ids[inv.reshape(-1)], np.diff(np.append(np.nonzero(head)[0], len(pair))))

    suspicious.update(_dup_steps(sid, step, n, mser).tolist())
    if m.card == "one-to-one":
        suspicious.update(_dup_steps(msig[mser], step, n, mser).tolist())

    if not suspicious:
        return _Out(interner, sid, step, value)

    # Replay the suspicious steps in time order with the reference: the first failing step
    # raises Prometheus's error; the others supply their own output.
    replaced: list[tuple[int, list[Sample]]] = []
    lstep_all, rstep_all = grid.index(lo.steps_t), grid.index(ro.steps_t)
    for st in sorted(suspicious):
        lsel = np.nonzero(lstep_all == st)[0]
        rsel = np.nonzero(rstep_all == st)[0]
        lv = [(lo.result.labels[int(lo.ser[i])], float(lo.result.value[i])) for i in lsel]
        rv = [(ro.result.labels[int(ro.ser[i])], float(ro.result.value[i])) for i in rsel]
        replaced.append((st, binop_step(op, rb, m, lv, rv)))
    keep_mask = ~np.isin(step, np.array([st for st, _ in replaced], dtype=np.int64))
    sid, step, value = sid[keep_mask], step[keep_mask], value[keep_mask]
    extra_sid, extra_step, extra_val = [], [], []
    for st, samples in replaced:
        for lab, v in samples:
            extra_sid.append(interner.add(lab))
            extra_step.append(st)
            extra_val.append(v)
    return _Out(
        interner,
        np.concatenate([sid, np.asarray(extra_sid, dtype=np.int64)]),
        np.concatenate([step, np.asarray(extra_step, dtype=np.int64)]),
        np.concatenate([value, np.asarray(extra_val, dtype=np.float64)]),
    )
