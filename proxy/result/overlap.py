"""The migration-overlap merge: one piece answered by several backends that hold the same data.

    merge_overlap(answers, *, edge_ms) -> QueryResult

During a migration two backends (say a local Prometheus and AMP) both hold a metric for a
while; the executor asks both for the same piece (`Route.kind == "overlap"`) and merges
their answers here. `answers` are that piece's answers in preference order (the primary
backend first, then higher priority, then config order: `Route.backends`), all range
answers on the same step grid (matrix) or all instant vectors.

Semantics, per series (label set) and step (timestamp):

- Union of series by label set: a series missing entirely from a backend is simply taken
  from the others. Identical samples dedupe naturally (each (series, step) is output once).
- A value at a step comes from the most preferred backend that has one there ...
- ... except next to that backend's gaps. A *gap* of backend b in a series is a maximal run
  of steps where b has no value for the series while another backend has one (a scraper
  outage, a backend that was down while the other was not). b computed its values next to a
  gap from incomplete data: before it, a stale last sample still inside the 5 m lookback;
  after it, a rate over a half-empty window. So a value of b is *edge-tainted* when it lies
  within `edge_ms` of one of b's gaps, measured from the gap's bordering present steps:
  `t >= p - edge_ms` where p is the last step b has before the gap, and `t <= q + edge_ms`
  where q is the first step b has after it. (Measured from the present steps rather than the
  first/last missing step, the zone is one step wider: the last sample b read before the
  gap can be as old as `p - lookback`, not only `first_missing - lookback`.) A tainted value
  is replaced by the value of the next backend, in preference order, that has an untainted
  value at that step (no gap of its own nearby); when every backend that has a value there
  is tainted, the most preferred one's value stands. Leading and trailing gaps (a series
  that starts late or ends early in b only) count as gaps. `edge_ms` comes from the
  executor: the lookback plus the longest range the query reads (subqueries included).
- Whole-backend outages: a step where backend b answered nothing at all (no series) while
  another backend answered something is a *silent* step of b; runs of silent steps have
  edges as above (over the answer's steps, not one series'). Only the answers of backends
  clear of such zones count as evidence of silence (computed to a fixed point): a filter
  that selects nothing at a step on the complete backend, while the other backend's stale
  data still passes it, is not an outage of the complete one. Where at least one backend is
  clear at a step (not in, nor within `edge_ms` of, a silent run of its own), the values of the backends inside a zone are dropped at that step, series and all:
  a series that lost its last samples in b's outage has no gap of its own in b, and a
  filter (`x > 60`, `and`, `topk`) evaluated on b's stale data keeps points that the
  complete data drops. Where every backend is inside a zone, nothing is dropped.
- A NaN is a value like any other (it is not a gap and is not replaced).
- Instant vectors (and scalars, strings): preference + union only; no edge handling (one
  step has no neighbours). A scalar or string answer is the first answer's.
- Output order as Prometheus (and proxy/result/merge.py concat): series sorted by label set
  (labels.Compare), samples in time order. Warnings and infos: the union of the answers',
  in first-seen order.

The merge sees only the answers it is given: an outage that starts just after the last
step (or ends just before the first) leaves no silent step in them, so the edge values next
to it are not recognised. Callers should ask the backends for `edge_ms` more on both sides
of a piece (on the same step grid), merge, and crop.

Limitations (by construction, the answers alone cannot tell): an outage shorter than the
lookback plus the longest range read (e.g. 40 min under `increase(x[1h])`) leaves no
missing step, so it is not seen and the preferred backend's values there, computed from
fewer samples, stand; an instant vector has no neighbouring steps, so an instant query
inside an outage that its reads still reach (`max_over_time(x[30m:1m])`) keeps the
preferred backend's value; and a backend missing data that still answers something at every
step (`absent(x)`, `scalar(...)` as NaN, `... or vector(0)`, `count_values`) is not seen as
silent, so its answer is unioned with (or preferred over) the complete one.

Cost: numpy over the columnar arrays (a few sorts of the union of samples); Python work is
per series (label-set keys), never per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from proxy.result.concat import merged_notes, order_by_labels
from proxy.result.merge import MergeConflict
from proxy.result.query_result import QueryResult

__all__ = ["merge_overlap"]

I64 = npt.NDArray[np.int64]


def _tainted(cell_rank: I64, cell_t: I64, present: npt.NDArray[np.bool_], edge_ms: int,
             gap: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
    """Per cell (sorted by series rank then time), whether this backend's value there lies
    within edge_ms of one of its gaps in the same series (see the module docstring).
    `gap`: the gap cells (default: every cell without a value); a cell neither present nor
    a gap is neutral, and the edges are measured from the present cells next to a gap."""
    n = len(cell_rank)
    idx = np.arange(n, dtype=np.int64)
    if gap is None:
        gap = ~present
    if not gap.any() or not present.any():
        return np.zeros(n, dtype=bool)
    # next gap cell at or after i, previous gap cell at or before i
    nxt = np.minimum.accumulate(np.where(gap, idx, n)[::-1])[::-1]
    prv = np.maximum.accumulate(np.where(gap, idx, -1))
    last_present = np.maximum.accumulate(np.where(present, idx, -1))
    next_present = np.minimum.accumulate(np.where(present, idx, n)[::-1])[::-1]
    # before a gap: p, the last present cell before the gap's first cell (i itself at least)
    has_next = nxt < n
    j = np.where(has_next, nxt, 0)
    p = np.maximum(last_present[j], 0)
    before = has_next & (cell_rank[j] == cell_rank) & (cell_t >= cell_t[p] - edge_ms)
    # after a gap: q, the first present cell after the gap's last cell (i itself at most)
    has_prev = prv >= 0
    k = np.where(has_prev, prv, 0)
    q = np.minimum(next_present[k], n - 1)
    after = has_prev & (cell_rank[k] == cell_rank) & (cell_t <= cell_t[q] + edge_ms)
    return present & (before | after)


def _clear(steps: I64, has: npt.NDArray[np.bool_], edge_ms: int) -> npt.NDArray[np.bool_]:
    """Per step and backend: not in (nor within edge_ms of) a silent run of the backend.
    Backend b is silent at a step where it answered nothing while a backend that is clear
    there answered something. Starting from "everyone is clear", this is iterated to a
    fixed point (a few rounds), so that one backend's stale points next to its outage do
    not make the other, complete backend look silent."""
    nb = has.shape[1]
    zero = np.zeros(len(steps), dtype=np.int64)
    clear = np.ones_like(has)
    for _ in range(4):
        evidence = has & clear
        new = np.empty_like(has)
        for b in range(nb):
            others = np.delete(evidence, b, axis=1).any(axis=1)
            silent = ~has[:, b] & others
            new[:, b] = ~(silent | _tainted(zero, steps, has[:, b], edge_ms, gap=silent))
        if np.array_equal(new, clear):
            break
        clear = new
    return clear


def merge_overlap(answers: Sequence[QueryResult], *, edge_ms: int) -> QueryResult:
    """Merge the same piece's answers from several backends, preferred first (see module)."""
    if not answers:
        raise MergeConflict("nothing to merge")
    if edge_ms < 0:
        raise ValueError(f"edge_ms must not be negative, got {edge_ms}")
    types = {r.result_type for r in answers}
    if len(types) != 1:
        raise MergeConflict(f"overlap answers of different result types: {sorted(types)}")
    (rtype,) = types
    warnings, infos = merged_notes(answers)
    if rtype in ("scalar", "string"):
        first = answers[0]
        return QueryResult(rtype, first.labels, first.offsets, first.t_ms, first.value, warnings, infos,
                           string_value=first.string_value)
    nb = len(answers)

    # Union of series by canonical label JSON, ordered as Prometheus orders them.
    gid_of: dict[bytes, int] = {}
    per_answer_gids: list[I64] = []
    for r in answers:
        setdefault = gid_of.setdefault
        per_answer_gids.append(np.array([setdefault(ck, len(gid_of)) for ck in r.canonical_keys()], dtype=np.int64))
    ckeys = list(gid_of)
    order = order_by_labels(ckeys)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)

    # Flatten every answer's samples with (series rank, time, backend).
    r_all = np.concatenate([np.repeat(rank[g], r.counts) if len(g) else np.zeros(0, np.int64)
                            for g, r in zip(per_answer_gids, answers)])
    t_all = np.concatenate([r.t_ms for r in answers]).astype(np.int64, copy=False)
    v_all = np.concatenate([r.value for r in answers]).astype(np.float64, copy=False)
    b_all = np.concatenate([np.full(r.n_samples, b, dtype=np.int64) for b, r in enumerate(answers)])
    if len(r_all) == 0:
        return QueryResult.empty(rtype, warnings=warnings, infos=infos)  # type: ignore[arg-type]

    if rtype == "vector":
        # One sample per series: key cells by series only, preference decides.
        t_key = np.zeros(len(t_all), dtype=np.int64)
    else:
        t_key = t_all
    # Sort by (series, time), backends in preference order within a cell: the answers are
    # concatenated in that order, so a stable sort of one combined key does it.
    t_min = int(t_key.min())
    span = int(t_key.max()) - t_min + 1
    if len(order) * span < 2**62:
        srt = np.argsort(r_all * span + (t_key - t_min), kind="stable")
    else:  # pragma: no cover - a range wider than centuries
        srt = np.lexsort((b_all, t_key, r_all))
    r_s, tk_s, b_s = r_all[srt], t_key[srt], b_all[srt]
    new_cell = np.ones(len(srt), dtype=bool)
    new_cell[1:] = (r_s[1:] != r_s[:-1]) | (tk_s[1:] != tk_s[:-1])
    cell = np.cumsum(new_cell) - 1
    n_cells = int(cell[-1]) + 1
    if np.any(~new_cell[1:] & (b_s[1:] == b_s[:-1])):
        i = int(np.flatnonzero(~new_cell[1:] & (b_s[1:] == b_s[:-1]))[0]) + 1
        raise MergeConflict(f"an answer holds one series twice at t_ms={int(t_all[srt[i]])}")
    firsts = np.flatnonzero(new_cell)
    cell_rank = r_s[firsts]
    cell_t = tk_s[firsts]

    # present[c, b], and the sample index of backend b's value in cell c
    present = np.zeros((n_cells, nb), dtype=bool)
    src = np.zeros((n_cells, nb), dtype=np.int64)
    present[cell, b_s] = True
    src[cell, b_s] = srt

    if rtype == "matrix" and nb > 1:
        # Backend level: steps where a backend answered nothing at all while another did
        # (a whole-backend outage) and their edges; where some backend is clear of such a
        # zone, the values of the backends inside one are dropped altogether.
        steps = np.unique(cell_t)
        step_of_cell = np.searchsorted(steps, cell_t)
        has = np.zeros((len(steps), nb), dtype=bool)
        for b in range(nb):
            has[step_of_cell[present[:, b]], b] = True
        clear = _clear(steps, has, edge_ms)[step_of_cell]
        usable = present & (clear | ~clear.any(axis=1, keepdims=True))
        # Series level: gaps of one series in one backend and their edges.
        ok = usable.copy()
        for b in range(nb):
            ok[:, b] &= ~_tainted(cell_rank, cell_t, present[:, b], edge_ms)
        choice = np.where(ok.any(axis=1), ok.argmax(axis=1), usable.argmax(axis=1))
        live = usable.any(axis=1)
    else:
        choice = present.argmax(axis=1)
        live = np.ones(n_cells, dtype=bool)
    pick = src[np.arange(n_cells), choice][live]
    cell_rank = cell_rank[live]
    t = t_all[pick]
    v = v_all[pick]

    counts = np.bincount(cell_rank, minlength=len(order))
    keep = counts > 0
    offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    kept = [g for g, k in zip(order, keep[: len(order)].tolist()) if k]
    # The label sets are parsed from their keys if they are read.
    return QueryResult(rtype, None, offsets, t, v, warnings, infos,  # type: ignore[arg-type]
                       keys=[ckeys[g] for g in kept])
