"""PromQL aggregation operators on a decoded answer, as Prometheus 2.42 evaluates them.

    AGGREGATIONS                                              the operators known here
    evaluate_aggregation(node, inner, param, grid, is_range)  -> QueryResult

`node` is the `shardplanner.ast.Agg`, `inner` its evaluated expression (instant: "vector";
range: "matrix" on the step grid), `param` the evaluated parameter (topk/bottomk/quantile: a
float or a scalar QueryResult, count_values: a str, else None).

This is engine.go's aggregation() run at every step over the step's samples in evaluation
order (the input's series order), with its arithmetic:
- sum adds in input order from the first value; avg is the incremental mean
  `mean += v/n - mean/n` with its Inf rules; stddev/stdvar Welford's running update; min/max
  take a later value over NaN; count/group;
- topk/bottomk simulate container/heap exactly (which of equal values win), `k` from
  int64(param) with "Scalar value %v overflows int64", k < 1 -> nothing; an instant answer
  lists each group's winners as Go's sort.Sort(sort.Reverse(heap)) leaves them;
- quantile sorts with Go's pdqsort when a NaN is present (where it lands is Go's), then
  interpolates as quantile() (quantile.py, the one quantile_over_time uses too);
- count_values labels each series with strconv.FormatFloat(v, 'f', -1) and counts;
  `invalid label name "..."` for a bad label.
Output labels: `by` keeps the listed labels present, `without` drops them and `__name__`;
topk/bottomk keep the whole series. An instant answer lists groups in order of appearance
(Prometheus's orderedResult), a range answer is sorted by labels.

In a range query Prometheus feeds an aggregation over a *computed* expression (not a plain
selector or range function) in Go map order, which differs from run to run; here it is the
answer's series order (sorted by labels), so sums over such inputs may differ from
Prometheus's in the last bits and equal values in topk may pick another series -- as two
runs of Prometheus itself may.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt
from numba import njit

from proxy.engine.errors import EvalError
from proxy.engine.quantile import quantile, quantiles
from proxy.engine.stepwise import Interner, Samples, as_grid, build, notes, scalar_steps
from proxy.result import golang as go
from proxy.result.aggops import AVG, CODES, COUNT, GROUP, MAX, MIN, STDDEV, STDVAR, SUM
from proxy.result.gosort import go_sort
from proxy.result.query_result import QueryResult
from shardplanner.ast import Agg

__all__ = ["AGGREGATIONS", "evaluate_aggregation", "k_per_step"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

AGGREGATIONS: frozenset[str] = frozenset(CODES) | {"topk", "bottomk", "quantile", "count_values"}
# engine.go (v2.42) convertibleToInt64: `v <= maxInt64 && v >= minInt64` with
# maxInt64 = 9223372036854774784 (the largest float64 below 2**63) and minInt64 = -2**63.
_MAX_I64_F = 9223372036854774784.0
_MIN_I64_F = -9223372036854775808.0


@njit(cache=True, error_model="numpy")
def _reduce(op, v, starts):  # type: ignore[no-untyped-def]
    """One groupedAggregation per run [starts[r], starts[r+1]) of samples in input order."""
    out = np.empty(len(starts) - 1)
    for r in range(len(starts) - 1):
        s, e = starts[r], starts[r + 1]
        value = v[s]
        mean = v[s]
        cnt = 1.0
        if op == STDDEV or op == STDVAR:
            value = 0.0
        elif op == GROUP:
            value = 1.0
        for i in range(s + 1, e):
            x = v[i]
            if op == SUM:
                value += x
            elif op == AVG:
                cnt += 1.0
                if math.isinf(mean):
                    if math.isinf(x) and (mean > 0) == (x > 0):
                        continue
                    if not math.isinf(x) and not math.isnan(x):
                        continue
                mean += x / cnt - mean / cnt
            elif op == MIN:
                if value > x or math.isnan(value):
                    value = x
            elif op == MAX:
                if value < x or math.isnan(value):
                    value = x
            elif op == COUNT:
                cnt += 1.0
            elif op == STDDEV or op == STDVAR:
                cnt += 1.0
                delta = x - mean
                mean += delta / cnt
                value += delta * (x - mean)
        if op == AVG:
            value = mean
        elif op == COUNT:
            value = cnt
        elif op == STDVAR:
            value = value / cnt
        elif op == STDDEV:
            value = math.sqrt(value / cnt)
        out[r] = value
    return out


@njit(cache=True)
def _less(a, b, bottom):  # type: ignore[no-untyped-def]
    """vectorByValueHeap.Less (topk) / vectorByReverseValueHeap.Less (bottomk)."""
    if math.isnan(a):
        return True
    return a > b if bottom else a < b


@njit(cache=True)
def _select(v, starts, ks, bottom):  # type: ignore[no-untyped-def]
    """topk/bottomk per run: the heap's final contents (sample indexes, in heap order) and
    where each run's heap starts in that array."""
    heap_all = np.empty(len(v), dtype=np.int64)
    heap_start = np.zeros(len(starts), dtype=np.int64)
    o = 0
    for r in range(len(starts) - 1):
        s, e, k = starts[r], starts[r + 1], ks[r]
        h = heap_all[o:o + (e - s)]
        h[0] = s
        n = 1
        for i in range(s + 1, e):
            x = v[i]
            top = v[h[0]]
            if n < k or (top > x if bottom else top < x) or math.isnan(top):
                if n == k:
                    if k == 1:
                        h[0] = i
                        continue
                    # heap.Pop: swap root and last, down() over n-1, drop the last
                    n -= 1
                    h[0], h[n] = h[n], h[0]
                    j = 0
                    while True:
                        j1 = 2 * j + 1
                        if j1 >= n:
                            break
                        c = j1
                        if j1 + 1 < n and _less(v[h[j1 + 1]], v[h[j1]], bottom):
                            c = j1 + 1
                        if not _less(v[h[c]], v[h[j]], bottom):
                            break
                        h[j], h[c] = h[c], h[j]
                        j = c
                # heap.Push: append, up()
                h[n] = i
                j = n
                n += 1
                while j > 0:
                    p = (j - 1) // 2
                    if not _less(v[h[j]], v[h[p]], bottom):
                        break
                    h[p], h[j] = h[j], h[p]
                    j = p
        o += n
        heap_start[r + 1] = o
    return heap_all[:o], heap_start


def evaluate_aggregation(node: Agg, inner: QueryResult, param: QueryResult | float | str | None,
                         grid: npt.ArrayLike, is_range: bool) -> QueryResult:
    """`node.op by/without (...) ([param,] inner)` as Prometheus 2.42 evaluates it."""
    op = node.op
    if op not in AGGREGATIONS:
        raise ValueError(f"{op} is not an aggregation evaluate_aggregation knows")
    g = as_grid(np.asarray(grid))
    if not is_range and len(g) != 1:
        raise ValueError("an instant query has one evaluation time")
    n_steps = len(g)
    rtype: Literal["vector", "matrix"] = "matrix" if is_range else "vector"
    warnings, infos = notes([inner, param])
    s = Samples.of(inner, g, is_range)
    grouping = tuple(node.grouping or ())
    without = node.without

    ks: I64 | None = None
    q: F64 | None = None
    value_label = ""
    if op in ("topk", "bottomk"):
        if param is None or isinstance(param, str):
            raise TypeError(f"{op} needs a scalar parameter")
        ks = k_per_step(scalar_steps(param, g))
    elif op == "quantile":
        if param is None or isinstance(param, str):
            raise TypeError("quantile needs a scalar parameter")
        q = scalar_steps(param, g)
    elif op == "count_values":
        if not isinstance(param, str):
            raise TypeError("count_values needs a string parameter")
        value_label = param
        if not go.go_label_name_ok(value_label):
            raise EvalError(f"invalid label name {go.go_quote(value_label)}")

    # Group labels per series (count_values: per series and formatted value).
    ser, step, value = s.ser, s.step, s.value
    interner = Interner()
    if op == "count_values":
        uniq, vid = np.unique(value.view(np.int64), return_inverse=True)
        texts = [go.go_format_f(float(x)) for x in uniq.view(np.float64).tolist()]
        pair = ser * max(len(uniq), 1) + vid.reshape(-1)
        upairs, pinv = np.unique(pair, return_inverse=True)
        by = tuple(sorted(set(grouping) | {value_label}))
        gids = np.empty(len(upairs), dtype=np.int64)
        for j, p in enumerate(upairs.tolist()):
            si, ti = divmod(p, max(len(uniq), 1))
            d = dict(s.result.labels[si])
            d[value_label] = texts[ti]
            gids[j] = interner.add(_group_labels(d, by, without, grouping))
        gid = gids[pinv.reshape(-1)]
    else:
        by = tuple(sorted(set(grouping)))
        per_series = np.array([interner.add(_group_labels(d, by, without, grouping)) for d in s.result.labels],
                              dtype=np.int64)
        gid = per_series[ser] if len(per_series) else np.zeros(0, dtype=np.int64)

    if ks is not None:  # k < 1 at a step: that step has no answer
        live = ks[step] >= 1
        ser, step, value, gid = ser[live], step[live], value[live], gid[live]
        s = Samples(s.result, ser, step, value)
    cell = gid * n_steps + step
    order = np.argsort(cell, kind="stable")  # each cell's samples in series (evaluation) order
    cell_o = cell[order]
    heads = np.ones(len(order), dtype=bool)
    heads[1:] = cell_o[1:] != cell_o[:-1]
    starts = np.append(np.flatnonzero(heads), len(order)).astype(np.int64)
    cells = cell_o[heads]
    v_o = value[order]
    # Instant: groups in order of appearance (each cell's first sample, in series order).
    appear = np.argsort(order[starts[:-1]], kind="stable") if len(cells) else np.zeros(0, dtype=np.int64)

    if op in ("topk", "bottomk"):
        assert ks is not None
        return _topk(op, rtype, g, s, order, v_o, starts, cells, ks, appear, warnings, infos)
    if op == "quantile":
        assert q is not None
        out = _quantile_cells(q[cells % n_steps], v_o, starts)
    else:
        out = _reduce(CODES.get(op, COUNT), v_o, starts)  # count_values counts
    return build(rtype, g, interner, (cells // n_steps)[appear], (cells % n_steps)[appear], out[appear],
                 warnings, infos)


def _group_labels(d: dict[str, str], by: tuple[str, ...], without: bool,
                  grouping: tuple[str, ...]) -> dict[str, str]:
    if without:
        drop = set(grouping) | {"__name__"}
        return {k: v for k, v in d.items() if k not in drop}
    return {k: d[k] for k in by if k in d}


def k_per_step(param: F64) -> I64:
    """topk's k at every step, with Prometheus's check (the first failing step raises)."""
    for f in param.tolist():
        if not (f <= _MAX_I64_F and f >= _MIN_I64_F):
            raise EvalError(f"Scalar value {go.go_format_v(f)} overflows int64")
    return go.go_float_to_int64(param)


def _quantile_cells(q: F64, v: F64, starts: I64) -> F64:
    out: F64 = quantiles(q, v, starts)
    nan = np.isnan(v)
    if nan.any():  # where NaNs land is decided by Go's sort: redo those cells with it
        runs = np.searchsorted(starts, np.flatnonzero(nan), side="right") - 1
        for r in np.unique(runs).tolist():
            vals = v[starts[r]:starts[r + 1]].tolist()
            go_sort(vals, lambda a, b: math.isnan(a) or a < b)
            out[r] = quantile(q[r], 0, np.asarray(vals, dtype=np.float64))
    return out


def _topk(op: str, rtype: Literal["vector", "matrix"], g: I64, s: Samples, order: I64, v_o: F64, starts: I64,
          cells: I64, ks: I64, appear: I64, warnings: list[str], infos: list[str]) -> QueryResult:
    n_steps = len(g)
    bottom = op == "bottomk"
    heap, heap_start = _select(v_o, starts, ks[cells % n_steps], bottom)
    picked = order[heap]  # sample indexes in the input
    interner = Interner()
    series_ids = np.array([interner.add(d) for d in s.result.labels], dtype=np.int64)
    if rtype == "matrix":
        return build(rtype, g, interner, series_ids[s.ser[picked]], s.step[picked], s.value[picked], warnings,
                     infos)
    # Instant: groups in order of appearance, each group's heap as sort.Sort(sort.Reverse(h)).
    sel: list[int] = []
    v = s.value
    for r in appear.tolist():
        items = picked[heap_start[r]:heap_start[r + 1]].tolist()
        if len(items) > 1:
            if bottom:
                go_sort(items, lambda a, b: math.isnan(v[b]) or v[b] > v[a])
            else:
                go_sort(items, lambda a, b: math.isnan(v[b]) or v[b] < v[a])
        sel += items
    idx = np.asarray(sel, dtype=np.int64)
    return build(rtype, g, interner, series_ids[s.ser[idx]], s.step[idx], v[idx], warnings, infos)
