"""histogram_quantile over classic `le` buckets: promql/functions.go's funcHistogramQuantile and
promql/quantile.go's bucketQuantile of Prometheus 2.42, per group and step.

A series takes part when its `le` parses with Go's strconv.ParseFloat (else it is skipped, as
Prometheus skips it); series are grouped by all their labels but `le` (the metric name
included), and a group's output labels drop `le` and `__name__`. Per step, a group's buckets
come in evaluation order, are sorted by upper bound with Go's sort.Sort (only observable when
two buckets share a bound or a bound is NaN: those groups are sorted by the pdqsort port, the
rest by a plain argsort, which then gives the same order), coalesced, made monotonic, and the
rank is found with sort.Search's bisection -- all in Go's float order of operations.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from proxy.engine.stepwise import Interner, Samples
from proxy.result.golang import go_parse_float
from proxy.result.gosort import go_sort

__all__ = ["go_parse_float", "histogram_quantile"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

@njit(cache=True, error_model="numpy")
def _bucket_quantile(q, ub, cnt):  # type: ignore[no-untyped-def]
    """bucketQuantile after sort.Sort: `ub`/`cnt` are one group's buckets at one step, sorted."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    n = len(ub)
    if not (math.isinf(ub[n - 1]) and ub[n - 1] > 0):
        return math.nan
    cub = np.empty(n)
    ccnt = np.empty(n)
    last_ub, last_cnt = ub[0], cnt[0]
    m = 0
    for b in range(1, n):
        if ub[b] == last_ub:
            last_cnt += cnt[b]
        else:
            cub[m], ccnt[m] = last_ub, last_cnt
            m += 1
            last_ub, last_cnt = ub[b], cnt[b]
    cub[m], ccnt[m] = last_ub, last_cnt
    m += 1
    mx = ccnt[0]
    for i in range(1, m):
        if ccnt[i] > mx:
            mx = ccnt[i]
        elif ccnt[i] < mx:
            ccnt[i] = mx
    if m < 2:
        return math.nan
    observations = ccnt[m - 1]
    if observations == 0:
        return math.nan
    rank = q * observations
    lo, hi = 0, m - 1  # sort.Search(m-1, count >= rank)
    while lo < hi:
        h = (lo + hi) >> 1
        if not (ccnt[h] >= rank):
            lo = h + 1
        else:
            hi = h
    b = lo
    if b == m - 1:
        return cub[m - 2]
    if b == 0 and cub[0] <= 0:
        return cub[0]
    start = 0.0
    end = cub[b]
    count = ccnt[b]
    if b > 0:
        start = cub[b - 1]
        count -= ccnt[b - 1]
        rank -= ccnt[b - 1]
    return start + (end - start) * (rank / count)


@njit(cache=True, error_model="numpy")
def _cells(q_of_cell, ub, cnt, starts):  # type: ignore[no-untyped-def]
    out = np.empty(len(starts) - 1)
    for c in range(len(starts) - 1):
        a, b = starts[c], starts[c + 1]
        out[c] = _bucket_quantile(q_of_cell[c], ub[a:b], cnt[a:b])
    return out


def histogram_quantile(q: F64, s: Samples, n_steps: int) -> tuple[Interner, I64, I64, F64]:
    """(output label sets, output id, step, value) of every group present at a step; for an
    instant query in the order groups first appear (Prometheus: Go map order)."""
    labels = s.result.labels
    group_of: dict[tuple[tuple[str, str], ...], int] = {}
    interner = Interner()
    out_id: list[int] = []
    gid = np.full(len(labels), -1, dtype=np.int64)
    ubs = np.full(len(labels), np.nan)
    for i, d in enumerate(labels):
        ub = go_parse_float(d["le"]) if "le" in d else None
        if ub is None:
            continue
        key = tuple(sorted((k, v) for k, v in d.items() if k != "le"))
        g = group_of.get(key)
        if g is None:
            g = group_of[key] = len(out_id)
            out_id.append(interner.add({k: v for k, v in d.items() if k not in ("le", "__name__")}))
        gid[i], ubs[i] = g, ub
    sample_g = gid[s.ser]
    use = sample_g >= 0
    sample_g, step, ser, value = sample_g[use], s.step[use], s.ser[use], s.value[use]
    n_groups = len(out_id)
    if n_groups == 0:
        z = np.zeros(0, dtype=np.int64)
        return interner, z, z.copy(), np.zeros(0)
    # Groups whose bounds are all distinct and not NaN sort the same with any algorithm.
    plain = np.ones(n_groups, dtype=bool)
    for g in range(n_groups):
        b = ubs[gid == g]
        if np.isnan(b).any() or len(np.unique(b)) != len(b):
            plain[g] = False
    cell = sample_g * n_steps + step
    order = np.lexsort((ubs[ser], cell)) if plain.all() else np.argsort(cell, kind="stable")
    cell_o = cell[order]
    heads = np.ones(len(order), dtype=bool)
    heads[1:] = cell_o[1:] != cell_o[:-1]
    starts = np.append(np.flatnonzero(heads), len(order)).astype(np.int64)
    cells = cell_o[heads]
    ub_o, cnt_o = ubs[ser[order]], value[order]
    if not plain.all():
        for c, (a, b) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist())):
            g = int(cells[c]) // n_steps
            items = list(range(a, b))
            if plain[g]:
                items.sort(key=lambda i: ub_o[i])
            else:
                go_sort(items, lambda i, j: bool(ub_o[i] < ub_o[j]))
            idx = np.asarray(items, dtype=np.int64)
            ub_o[a:b], cnt_o[a:b] = ub_o[idx], cnt_o[idx]
    steps = cells % n_steps
    values = _cells(q[steps], ub_o, cnt_o, starts)
    # Instant: groups in order of appearance (first sample of each cell, in series order).
    first = order[starts[:-1]]
    appear = np.argsort(first, kind="stable")
    gids = np.asarray(out_id, dtype=np.int64)[cells // n_steps]
    return interner, gids[appear], steps[appear], values[appear]
