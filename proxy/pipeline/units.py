"""Cache units, slots and fetches: how planned pieces become cache entries and backend calls.

    piece  --(slot: its unit and lookup keys)-->  unit  --(coalesce_units)-->  fetch

A unit is what one cache entry holds (a cell of the step grid inside one split interval, or
a whole piece); a fetch is one backend call covering one or more units of the same query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardplanner.footprint import Footprint
from shardplanner.plan import Piece, Span, Timed
from shardplanner.routing import Route

from ..cache import CacheKey
from ..result import QueryResult
from ..result.pieces import slice_time


def cell_of(start_ms: int, step_ms: int, interval_ms: int) -> tuple[int, int]:
    """First and last point of `start_ms`'s step grid inside the epoch-aligned interval of
    length `interval_ms` that holds `start_ms` (the grid extends before `start_ms`)."""
    lo = (start_ms // interval_ms) * interval_ms
    first = lo + (start_ms - lo) % step_ms
    last = first + ((lo + interval_ms - 1 - first) // step_ms) * step_ms
    return first, last


@dataclass(frozen=True)
class Unit(Timed):
    """What one cache entry holds and one fetch covers at least: a cell or a whole piece.
    `key` None: not cacheable. `ttl_ms` None or 0: not stored (recent data)."""

    query: str
    role: str | None
    shard_index: int
    span: Span
    key: CacheKey | None = None
    ttl_ms: int | None = None
    footprint: Footprint | None = None
    # Hybrid fleets: the unit's route id (`proxy/pipeline/hybrid/router.py` route_id); "" = the primary.
    route: str = ""
    # ... and the route itself, as the router handed it back (None: the primary). Not part of
    # the unit's identity: the id names it.
    routed: Route | None = field(default=None, compare=False, repr=False)

    @property
    def storable(self) -> bool:
        return self.key is not None and bool(self.ttl_ms)


@dataclass(eq=False)
class Slot:
    """One planned piece on its way through the cache: the unit fetched for it when it is
    missing, the keys that can answer it (best first), and its answer once known."""

    piece: Piece
    unit: Unit
    keys: tuple[CacheKey, ...] = ()
    result: QueryResult | None = None
    status: str = "uncacheable"  # hit | miss | uncacheable
    # The day cell that can answer the piece (a whole old day, or part of one), when the plan
    # cut old days as day cells: a missing one may be assembled from its cached hour cells.
    day: Unit | None = None
    # The digest of the key the answer was read from (None: not read from the cache).
    answered_by: str | None = None

    @property
    def order(self) -> tuple[int, str, int]:
        p = self.piece
        return (p.shard.index if p.shard else -1, p.role or "", p.span.start_ms)


@dataclass(frozen=True)
class Fetch(Timed):
    """One backend call covering one or more contiguous units of the same query."""

    query: str
    role: str | None
    shard_index: int
    span: Span
    units: tuple[Unit, ...] = field(default=(), compare=False)
    route: str = ""
    # A range call over instant units that lie on its step grid (an instant query's
    # sub-windows): its answer at each unit's time is that unit's instant answer.
    instants: bool = False
    # The route of its units (all have the same id), read by `RouteAnswer`.
    routed: Route | None = field(default=None, compare=False, repr=False)
    # The times of the pieces it answers, when narrower than its span (a unit widened to its
    # whole cache cell): what the merge keeps of the answer (or of its first and last cells),
    # cropped as the answer arrives (`Fetcher.parts`), set by Coalesce.
    keep: tuple[int, int] | None = field(default=None, compare=False, repr=False)


def bare_unit(p: Piece) -> Unit:
    return Unit(p.query, p.role, p.shard.index if p.shard else -1, p.span)


def coalesce_units(units: Sequence[Unit], target_calls: int, max_points: int = 11_000,
                   cell_ms: int | None = None) -> list[Fetch]:
    """Group contiguous range units (same query, shard, role and grid) into about
    `target_calls` fetches in all, none longer than `max_points` steps. With `cell_ms` (the
    split interval) a unit weighs the cells it spans (a day cell 24 hour cells), so the calls
    get about equal time ranges; without, each unit weighs one. Instant units of the
    same query at evenly spaced times (the sub-windows of `max_over_time(x[30d])`) become
    range calls over those times (`Fetch.instants`): one call instead of one per time; a lone
    instant unit is fetched by itself."""
    groups: dict[tuple[str, str | None, int, int, str], list[Unit]] = {}
    fetches: list[Fetch] = []
    instants: dict[tuple[str, str | None, int, str], list[Unit]] = {}
    for u in units:
        if not u.is_range:
            if u.route.startswith("split:"):
                fetches.append(Fetch(u.query, u.role, u.shard_index, u.span, (u,), u.route, routed=u.routed))
            else:
                instants.setdefault((u.query, u.role, u.shard_index, u.route), []).append(u)
            continue
        # A unit whose route changes along its range (split_time) is fetched by itself.
        groups.setdefault((u.query, u.role, u.shard_index, u.span.step,
                           u.route if not u.route.startswith("split:") else f"{u.route}#{u.span.start_ms}"),
                          []).append(u)
    for (query, role, shard_index, route), members in instants.items():
        for run, step in _even_runs(members):
            if step is None:
                fetches.append(Fetch(query, role, shard_index, run[0].span, (run[0],), route, routed=run[0].routed))
                continue
            for i in range(0, len(run), max_points):
                chunk = run[i:i + max_points]
                span = Span.range(chunk[0].span.time_ms, chunk[-1].span.time_ms, step)
                fetches.append(Fetch(query, role, shard_index, span, tuple(chunk), route, instants=True,
                                     routed=chunk[0].routed))
    if not groups:
        return fetches
    per_group = max(1, target_calls // len(groups))

    def weight(u: Unit) -> int:
        return max(1, (u.span.end_ms - u.span.start_ms + u.span.step) // cell_ms) if cell_ms else 1

    for (query, role, shard_index, step, _), members in groups.items():
        members.sort(key=lambda u: u.span.start_ms)
        # Contiguous runs on the same grid only.
        runs: list[list[Unit]] = []
        for u in members:
            if runs:
                if u.span.start_ms == runs[-1][-1].span.end_ms + step:
                    runs[-1].append(u)
                    continue
            runs.append([u])
        # Spread the group's call budget over its runs, splitting runs evenly (by weight).
        budget = max(per_group, len(runs))
        weights = [[weight(u) for u in r] for r in runs]
        total = sum(sum(w) for w in weights)
        for run, ws in zip(runs, weights):
            n_calls = max(1, min(len(run), round(budget * sum(ws) / total)))
            for part in _even_parts(run, ws, -(-sum(ws) // n_calls)):
                for chunk in _within_points(part, step, max_points):
                    span = Span.range(chunk[0].span.start_ms, chunk[-1].span.end_ms, step)
                    fetches.append(Fetch(query, role, shard_index, span, tuple(chunk), chunk[0].route,
                                         routed=chunk[0].routed))
    return fetches


def _even_runs(units: list[Unit]) -> list[tuple[list[Unit], int | None]]:
    """Instant units (one query) in runs of evenly spaced times, oldest first, with their
    spacing; a unit in no run of two or more comes alone with spacing None."""
    ordered = sorted(units, key=lambda u: u.span.time_ms)
    runs: list[tuple[list[Unit], int | None]] = []
    run: list[Unit] = []
    step: int | None = None
    for u in ordered:
        t = u.span.time_ms
        if run and t == run[-1].span.time_ms:
            runs.append(([u], None))  # the same instant twice: its own call
            continue
        if len(run) >= 2 and step is not None and t - run[-1].span.time_ms == step:
            run.append(u)
            continue
        if len(run) == 1:
            step = t - run[0].span.time_ms
            run.append(u)
            continue
        if run:
            runs.append((run, step if len(run) > 1 else None))
        run, step = [u], None
    if run:
        runs.append((run, step if len(run) > 1 else None))
    return runs


def _even_parts(run: list[Unit], weights: list[int], capacity: int) -> list[list[Unit]]:
    """`run` in consecutive parts of about `capacity` weight: a unit joins the current part
    when its middle is within the capacity. With unit weights: parts of `capacity` units."""
    parts: list[list[Unit]] = []
    size = capacity
    for u, w in zip(run, weights):
        if not parts or 2 * size + w > 2 * capacity:
            parts.append([])
            size = 0
        parts[-1].append(u)
        size += w
    return parts


def _within_points(chunk: list[Unit], step: int, max_points: int) -> list[list[Unit]]:
    """`chunk` cut so that no call asks for more than `max_points` steps (Prometheus
    rejects (end - start) / step > 11,000); a single unit is never cut."""
    out: list[list[Unit]] = [[]]
    for u in chunk:
        cur = out[-1]
        if cur and (u.span.end_ms - cur[0].span.start_ms) // step > max_points - 1:
            out.append([u])
        else:
            cur.append(u)
    return out


def fit(slot: Slot, unit_result: QueryResult) -> QueryResult:
    """A unit's answer cut to the slot's piece (a cell's answer for a partial piece)."""
    p, u = slot.piece.span, slot.unit.span
    if p.is_range and p != u:
        return slice_time(unit_result, p.start_ms, p.end_ms)
    return unit_result
