"""Merge kernels: piece answers (QueryResult) -> one answer, following a MergeRecipe.

    merge(pieces, recipe, time_ms=None, lazy=False)
                                           dispatch on recipe.kind (lazy: a large concat
                                           comes back ungathered, concat.py)
    concat(results)                        union of series, samples concatenated in time
    aggregate(pieces, recipe, time_ms=None)
                                           per timestamp, group by the output labels and
                                           re-aggregate: sum of sums, sum of counts, min of
                                           mins, max of maxes, group -> 1, avg as sum/count,
                                           topk/bottomk over the union of per-shard winners
                                           (recipe.combine_time: instant pieces evaluated at
                                           different times over sub-windows of one range
                                           selector, combined as if at `time_ms`)

combine_time (instant `max_over_time(x[7d])`, `sum by (g) (sum_over_time(x[7d]))`, ...; see
shardplanner.planner._instant_window): every piece is an instant vector at its own
evaluation time; all samples are re-stamped with the request's `time_ms`, so the one slot
holds every sub-window's value of a group and `op` combines them: max of maxes, min of mins,
sum of sums, sum of counts (the planner sends op "sum" for count_over_time). The planner makes
sum/count sub-windows disjoint, so no sample is counted twice; the merge only adds, in piece
order (time, then shard), so the answer is deterministic.

concat lives in concat.py (re-exported here).

`pieces` are (role, QueryResult) pairs in shard order; role is the Piece.role from the
plan ("sum" / "count" for the two halves of an avg, None otherwise). Partial sums are added
in the order of `pieces`, so the same inputs always give byte-identical output.

Output order follows Prometheus: a range answer (matrix) is sorted by label set with
labels.Compare (label by label in name order, name then value, a shorter set first when it
is a prefix). Prometheus leaves an instant vector in evaluation order, which a sharded
query cannot reproduce; we sort it by label set too (topk/bottomk: by group, then by value
as Prometheus orders a group's winners).

Prometheus 2.42 semantics kept here (promql/engine.go, aggregation()):
- sum: NaN and +Inf + -Inf give NaN, as in Prometheus (IEEE addition);
- min/max: a NaN is replaced by any later non-NaN (`v < cur || IsNaN(cur)`): the result is
  NaN only when every input is NaN;
- topk/bottomk: NaN ranks below every number for both; k = int(param), k < 1 -> nothing;
  ties at the k-th place go to the smaller label set (Prometheus keeps the series it met
  first, which for a plain selector is also the smaller label set);
- `by (a, b)` keeps the present labels among a, b; `without (a)` drops a and __name__;
  topk/bottomk keep the full label set of the winners.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numba import njit

from proxy.result.aggops import AVG, CODES, COUNT, GROUP, MAX, MIN, SUM
from proxy.result.concat import MergeConflict, concat, merged_notes, merged_result_type, order_by_labels
from proxy.result.query_result import QueryResult
from shardplanner.plan import MergeRecipe

__all__ = ["MergeConflict", "order_by_labels", "aggregate", "concat", "merge"]

Key = tuple[tuple[str, str], ...]
I64 = npt.NDArray[np.int64]


# Dense (group x timestamp) accumulators up to this many cells, else compact the cells.
DENSE_CELLS_LIMIT = 1 << 23

# The ops whose partials re-aggregate (aggops.py holds the codes the kernels share).
_OPS = frozenset({"sum", "count", "min", "max", "group", "avg"})


def merge(
    pieces: Sequence[tuple[str | None, QueryResult]],
    recipe: MergeRecipe,
    *,
    time_ms: int | None = None,
    lazy: bool = False,
) -> QueryResult:
    """`lazy`: a large concatenated matrix may come back as a `Concatenation` (its samples
    gathered when read; the JSON encoder streams it without a merged copy)."""
    if recipe.kind == "passthrough":
        if len(pieces) != 1:
            raise MergeConflict(f"passthrough with {len(pieces)} pieces")
        return pieces[0][1]
    if recipe.kind == "concat":
        merged = concat([r for _, r in pieces], lazy=lazy)
        if recipe.op in ("topk", "bottomk") and merged.result_type == "vector":
            return _in_topk_order(merged, recipe)
        return merged
    if recipe.kind == "aggregate":
        return aggregate(pieces, recipe, time_ms=time_ms)
    raise MergeConflict(f"unknown merge kind {recipe.kind!r}")


def _in_topk_order(result: QueryResult, recipe: MergeRecipe) -> QueryResult:
    """An instant `topk/bottomk by (g) (k, ...)` whose groups were evaluated whole in their
    shards, in Prometheus's order: group by group, each group's winners by value (topk
    descending, bottomk ascending, NaN last: Prometheus reverses its heap), ties by label set.
    Groups come in the order of their group labels (Prometheus: of their first input series,
    which for a fleet's uniform series is the same)."""
    n = result.n_series
    if n < 2 or result.n_samples != n:
        return result
    by = tuple(sorted(set(recipe.grouping)))
    drop = frozenset(recipe.grouping) | {"__name__"}
    keys = result.canonical_keys()
    values = result.value

    def rank(i: int) -> tuple[object, ...]:
        d = result.labels[i]
        if recipe.without:
            group = tuple(sorted(kv for kv in d.items() if kv[0] not in drop))
        else:
            group = tuple((k, d[k]) for k in by if k in d)
        v = float(values[i])
        nan = math.isnan(v)
        return (group, nan, 0.0 if nan else (-v if recipe.op == "topk" else v), keys[i])

    order = sorted(range(n), key=rank)
    if order == list(range(n)):
        return result
    idx = np.asarray(order, dtype=np.int64)
    return QueryResult("vector", [result.labels[i] for i in order], result.offsets.copy(), result.t_ms[idx],
                       result.value[idx], result.warnings, result.infos)


# --------------------------------------------------------------------------------------
# aggregate
# --------------------------------------------------------------------------------------


@njit(cache=True)
def _time_slots(t):  # type: ignore[no-untyped-def]
    """(t_min, spacing) such that every t is t_min + spacing * slot; spacing = gcd."""
    n = len(t)
    tmin = t[0]
    for i in range(n):
        if t[i] < tmin:
            tmin = t[i]
    g = 0
    for i in range(n):
        d = t[i] - tmin
        while d != 0:
            g, d = d, g % d
        if g == 1:
            break
    return tmin, g


def _slots(t: I64) -> tuple[I64, I64]:
    """(slot of every sample, timestamp of every slot)."""
    if len(t) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    tmin, g = _time_slots(t)
    tmin, g = int(tmin), int(g)
    if g == 0:
        return np.zeros(len(t), dtype=np.int64), np.array([tmin], dtype=np.int64)
    n_slots = (int(t.max()) - tmin) // g + 1
    if n_slots <= max(4 * len(t), 1 << 16):
        return (t - tmin) // g, tmin + g * np.arange(n_slots, dtype=np.int64)
    uniq, inv = np.unique(t, return_inverse=True)
    return inv.astype(np.int64), uniq


@njit(cache=True, nogil=True)
def _accumulate(cell, v, role, op, n_cells):  # type: ignore[no-untyped-def]
    """Combine samples into cells in input order. For avg, role 0 adds to the sum, role 1
    to the count; `state` bit 1 = sum seen, bit 2 = count seen."""
    acc = np.zeros(n_cells, dtype=np.float64)
    acc2 = np.zeros(n_cells, dtype=np.float64)
    state = np.zeros(n_cells, dtype=np.uint8)
    for i in range(len(cell)):
        c = cell[i]
        x = v[i]
        if op == AVG:
            if role[i] == 0:
                if state[c] & 1:
                    acc[c] += x
                else:
                    acc[c] = x
                state[c] |= 1
            else:
                if state[c] & 2:
                    acc2[c] += x
                else:
                    acc2[c] = x
                state[c] |= 2
            continue
        if state[c] == 0:
            acc[c] = 1.0 if op == GROUP else x
            state[c] = 3
        elif op == SUM or op == COUNT:
            acc[c] += x
        elif op == MIN:
            if acc[c] > x or acc[c] != acc[c]:
                acc[c] = x
        elif op == MAX:
            if acc[c] < x or acc[c] != acc[c]:
                acc[c] = x
    if op == AVG:
        for c in range(n_cells):
            if state[c] == 3:
                acc[c] = acc[c] / acc2[c]
    return acc, state


class _Flat:
    """All pieces' samples flattened, with a group id, a full-series id and a slot each."""

    def __init__(
        self,
        pieces: Sequence[tuple[str | None, QueryResult]],
        recipe: MergeRecipe,
        time_ms: int | None,
    ) -> None:
        results = [r for _, r in pieces]
        self.rtype = merged_result_type(results)
        if self.rtype not in ("matrix", "vector"):
            raise MergeConflict(f"cannot aggregate {self.rtype} results")
        self.warnings, self.infos = merged_notes(results)
        group_of: dict[Key, int] = {}
        self.group_keys: list[Key] = []
        self.group_labels: list[dict[str, str]] = []
        series_of: dict[bytes, tuple[int, int]] = {}  # canonical key -> (series id, group id)
        self.series_labels: list[dict[str, str]] = []
        by = tuple(sorted(set(recipe.grouping)))
        drop = frozenset(recipe.grouping) | {"__name__"}
        gids, sids, roles = [], [], []
        for role, r in pieces:
            g_ser = np.empty(r.n_series, dtype=np.int64)
            s_ser = np.empty(r.n_series, dtype=np.int64)
            for s, ck in enumerate(r.canonical_keys()):
                ids = series_of.get(ck)
                if ids is None:
                    d = r.labels[s]
                    if recipe.without:
                        gkey = tuple(sorted(kv for kv in d.items() if kv[0] not in drop))
                    else:
                        gkey = tuple((k, d[k]) for k in by if k in d)
                    gid = group_of.get(gkey)
                    if gid is None:
                        gid = group_of[gkey] = len(self.group_keys)
                        self.group_keys.append(gkey)
                        self.group_labels.append(dict(gkey))
                    ids = series_of[ck] = (len(self.series_labels), gid)
                    self.series_labels.append(d)
                s_ser[s], g_ser[s] = ids
            counts = r.counts
            gids.append(np.repeat(g_ser, counts))
            sids.append(np.repeat(s_ser, counts))
            roles.append(np.full(r.n_samples, 1 if role == "count" else 0, dtype=np.uint8))
        self.gid = np.concatenate(gids) if gids else np.zeros(0, dtype=np.int64)
        self.sid = np.concatenate(sids) if sids else np.zeros(0, dtype=np.int64)
        self.role = np.concatenate(roles) if roles else np.zeros(0, dtype=np.uint8)
        self.v = np.concatenate([r.value for r in results])
        t = np.concatenate([r.t_ms for r in results])
        if recipe.combine_time:
            if time_ms is None:
                raise MergeConflict("combine_time needs the request's time_ms")
            if self.rtype != "vector":
                raise MergeConflict(f"combine_time merges instant vectors, not {self.rtype}")
            t = np.full(len(t), time_ms, dtype=np.int64)
        self.slot, self.slot_t = _slots(t)
        self.group_rank = _ranks(self.group_keys)

    def series_rank(self) -> I64:
        return _ranks([tuple(sorted(d.items())) for d in self.series_labels])

    def empty(self) -> QueryResult:
        return QueryResult.empty(self.rtype, warnings=self.warnings, infos=self.infos)  # type: ignore[arg-type]


def _ranks(keys: list[Key]) -> I64:
    order = sorted(range(len(keys)), key=keys.__getitem__)
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys), dtype=np.int64)
    return rank


def aggregate(
    pieces: Sequence[tuple[str | None, QueryResult]],
    recipe: MergeRecipe,
    *,
    time_ms: int | None = None,
) -> QueryResult:
    """Re-aggregate shard answers of `op by/without (grouping) (...)`."""
    if not pieces:
        raise MergeConflict("nothing to merge")
    op = recipe.op
    if op in ("topk", "bottomk"):
        return _top_bottom(pieces, recipe, time_ms)
    if op not in _OPS:
        raise MergeConflict(f"cannot re-aggregate {op!r}")
    if op == "avg":
        roles = {role for role, _ in pieces}
        if not roles <= {"sum", "count"}:
            raise MergeConflict(f"avg pieces need roles 'sum'/'count', got {sorted(map(str, roles))}")
    flat = _Flat(pieces, recipe, time_ms)
    if len(flat.v) == 0:
        return flat.empty()
    n_slots = len(flat.slot_t)
    n_groups = len(flat.group_keys)
    key = flat.group_rank[flat.gid] * n_slots + flat.slot
    if n_groups * n_slots <= DENSE_CELLS_LIMIT:
        cell, n_cells, cell_key = key, n_groups * n_slots, None
    else:
        cell_key, inv = np.unique(key, return_inverse=True)
        cell, n_cells = inv.astype(np.int64), len(cell_key)
    acc, state = _accumulate(cell, flat.v, flat.role, CODES[op], n_cells)
    present = np.flatnonzero(state == 3)
    keys_out = present if cell_key is None else cell_key[present]
    out_rank = keys_out // n_slots
    t = flat.slot_t[keys_out % n_slots]
    v = acc[present]
    rank_counts = np.bincount(out_rank, minlength=n_groups)
    order = np.argsort(flat.group_rank)  # group ids in rank order
    keep = rank_counts > 0
    labels = [flat.group_labels[g] for g, k in zip(order.tolist(), keep.tolist()) if k]
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(rank_counts[keep], out=offsets[1:])
    return QueryResult(flat.rtype, labels, offsets, t, v, flat.warnings, flat.infos)  # type: ignore[arg-type]


def _top_bottom(
    pieces: Sequence[tuple[str | None, QueryResult]],
    recipe: MergeRecipe,
    time_ms: int | None,
) -> QueryResult:
    flat = _Flat(pieces, recipe, time_ms)
    param = recipe.param
    if param is None or not math.isfinite(param) or int(param) < 1 or len(flat.v) == 0:
        return flat.empty()
    k = int(param)
    n_slots = len(flat.slot_t)
    cell = flat.group_rank[flat.gid] * n_slots + flat.slot
    v = flat.v
    nan = np.isnan(v)
    val_key = -v if recipe.op == "topk" else v
    val_key = np.where(nan, 0.0, val_key)
    srank = flat.series_rank()[flat.sid]
    order = np.lexsort((srank, val_key, nan, cell))
    cell_o = cell[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = cell_o[1:] != cell_o[:-1]
    start_pos = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    winners = order[(np.arange(len(order)) - start_pos) < k]  # cell order, then rank order
    if flat.rtype == "vector":
        sel = winners
    else:
        sel = winners[np.lexsort((flat.slot[winners], srank[winners]))]
    s_sel = srank[sel]
    if len(sel) > 1:
        dup = (np.diff(s_sel) == 0) & (np.diff(flat.slot[sel]) == 0)
        if flat.rtype == "matrix" and dup.any():
            raise MergeConflict("two pieces hold the same sample of a topk/bottomk series")
    t = flat.slot_t[flat.slot[sel]]
    vals = v[sel]
    sid_sel = flat.sid[sel]
    if flat.rtype == "vector":
        # One sample per series: each winner is its own series, in winner order.
        labels = [flat.series_labels[s] for s in sid_sel.tolist()]
        if len(set(s_sel.tolist())) != len(labels):
            raise MergeConflict("two pieces hold the same sample of a topk/bottomk series")
        offsets = np.arange(len(labels) + 1, dtype=np.int64)
    else:
        new = np.ones(len(sel), dtype=bool)
        new[1:] = s_sel[1:] != s_sel[:-1]
        firsts = np.flatnonzero(new)
        labels = [flat.series_labels[s] for s in sid_sel[firsts].tolist()]
        offsets = np.append(firsts, len(sel)).astype(np.int64)
    return QueryResult(flat.rtype, labels, offsets, t, vals, flat.warnings, flat.infos)  # type: ignore[arg-type]

