"""Is a sharded topk/bottomk answer exactly Prometheus's?

Prometheus picks topk winners with a k-sized heap; among series of EQUAL value at the k-th
place, which ones survive depends on the heap's layout over the whole input, which no
sharded plan can replay. So a sharded topk/bottomk answer is exact only where no tie
crosses the k-th place. Per (group, timestamp), with v_k the global k-th value:
  (a) a candidate outside the global top k has value v_k, or
  (b) a shard returned exactly k series whose k-th value is v_k — its cut-off series may
      hold v_k too (a full shard's minimum is always >= v_k, and its hidden series are
      <= that minimum, so only equality can tie).
Either makes the answer ambiguous; the executor then runs the query unsharded.
NaN counts as equal to NaN (Prometheus ranks NaN last for both topk and bottomk).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardplanner.plan import MergeRecipe

from .query_result import QueryResult


def _group_key(labels: dict[str, str], recipe: MergeRecipe) -> tuple[tuple[str, str], ...]:
    if recipe.without:
        drop = set(recipe.grouping) | {"__name__"}
        return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))
    return tuple(sorted((k, labels[k]) for k in recipe.grouping if k in labels))


def topk_ambiguous(shard_results: Sequence[tuple[int, QueryResult]], recipe: MergeRecipe) -> bool:
    """shard_results: (shard index, that shard's topk/bottomk answer), any time pieces."""
    k = int(recipe.param) if recipe.param is not None else 0
    if k < 1:
        return False
    groups: dict[tuple[tuple[str, str], ...], int] = {}
    g_parts, t_parts, v_parts, s_parts = [], [], [], []
    for shard, res in shard_results:
        if res.n_samples == 0:
            continue
        gids = np.fromiter((groups.setdefault(_group_key(lb, recipe), len(groups)) for lb in res.labels),
                           dtype=np.int64, count=res.n_series)
        counts = res.counts
        g_parts.append(np.repeat(gids, counts))
        t_parts.append(res.t_ms)
        v_parts.append(res.value)
        s_parts.append(np.full(res.n_samples, shard, dtype=np.int64))
    if not g_parts:
        return False
    g = np.concatenate(g_parts)
    t = np.concatenate(t_parts)
    v = np.concatenate(v_parts)
    s = np.concatenate(s_parts)
    # Rank key: larger is better for topk, smaller for bottomk; NaN always last.
    rank = -v if recipe.op == "topk" else v.copy()
    rank = np.where(np.isnan(v), np.inf, rank)
    order = np.lexsort((rank, t, g))
    g, t, v, s, rank = g[order], t[order], v[order], s[order], rank[order]
    n = len(g)
    new_cell = np.ones(n, dtype=bool)
    new_cell[1:] = (g[1:] != g[:-1]) | (t[1:] != t[:-1])
    cell_start = np.flatnonzero(new_cell)
    cell_id = np.cumsum(new_cell) - 1
    cell_len = np.diff(np.append(cell_start, n))
    # v_k per cell (only for cells with at least k candidates; fewer means no cut at all).
    full_cells = cell_len >= k
    kth_rank = np.full(len(cell_start), np.nan)
    kth_rank[full_cells] = rank[cell_start[full_cells] + k - 1]
    # (a) the (k+1)-th candidate ties with the k-th.
    has_next = cell_len > k
    nxt = cell_start[has_next] + k
    if np.any(rank[nxt] == rank[nxt - 1]):
        return True
    # (b) a full shard whose last (k-th) entry in the cell ties with the global k-th value.
    order2 = np.lexsort((rank, s, cell_id))
    c2, s2, r2 = cell_id[order2], s[order2], rank[order2]
    new_grp = np.ones(n, dtype=bool)
    new_grp[1:] = (c2[1:] != c2[:-1]) | (s2[1:] != s2[:-1])
    grp_start = np.flatnonzero(new_grp)
    grp_len = np.diff(np.append(grp_start, n))
    full = grp_len == k
    last = grp_start[full] + k - 1
    cells = c2[last]
    return bool(np.any(r2[last] == kth_rank[cells]))
