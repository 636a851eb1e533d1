"""Day cells made from hour cells: a day cell missing from the cache is assembled from the
cached cells of its split intervals when every one of them is there, and stored.

Old days of a range query are planned as day pieces (`shardplanner.timesplit.split_range_days`):
a warm 7-day panel reads ~7 day cells instead of 168 hour cells. A day that was recent
yesterday was cached hour by hour; once it is old, its day cell is made from those hour cells
(no backend call), concatenated exactly as the merge would (`result.merge.concat`: a range
query's value at t does not depend on how the range was cut). A day that cannot be assembled
is fetched whole (one call covers it), or as its hours when some of them are cached or when a
query misses fewer days than it makes parallel calls (`DayCells.split`). The edges of a query (a day it holds only part of)
stay hour pieces that try the day cell first; such a day is assembled when the query's own
hours of it were all cached and cover at least half the day.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from shardplanner.timesplit import split_range

from ..cache import CacheKey
from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from ..result import QueryResult
from ..result.merge import MergeConflict, concat
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .context import RequestContext
from .hybrid.router import Router
from .slots import SlotMaker
from .units import Slot, Unit
from .values import CacheCtx

log = logging.getLogger("promaccel.cache")

# Partly asked-for days being stored at once: at most this many times edge_max_samples samples.
STORING_EDGES = 2

# Per day cell (key digest): its hour units and the cached answers found for them (None: missing).
Hours = dict[str, list[tuple[Unit, QueryResult | None]]]



class DayCells:
    def __init__(self, slots: SlotMaker, reader: CacheReader, writer: CacheWriter, target_calls: int = 4,
                 edge_max_samples: int = 524_288) -> None:
        self.target_calls = target_calls
        # A partly asked-for day is assembled only to be stored (the query has its hours):
        # its copy sits beside the query's own answer. A heavy panel's day (2,048 series,
        # 3 M samples) held a second 50 MB copy and its encoded payload at the peak of 20
        # heavy queries (issue 15); larger days wait for a query that asks for the whole day
        # (where the copy is that query's answer). `cache.day_cells_edge_max_samples`.
        self.edge_max_samples = edge_max_samples
        # Such days being stored (in the landing zone until their put lands), by key digest:
        # their samples. At most STORING_EDGES times edge_max_samples at once: under 20 heavy
        # cold queries at once (scenario (e)), queries admitted after others had cached the
        # same hours each made their day, and ~9 of them (5 MB each) waited to be stored at
        # the burst's peak (tracemalloc: 47 of the 148 MiB over idle).
        self._storing: dict[str, int] = {}
        self.slots = slots
        self.reader = reader
        self.writer = writer

    def wanted(self, slots: Sequence[Slot]) -> list[tuple[Unit, list[Slot]]]:
        """The day cells worth assembling: missing ones of whole-day pieces, and those of
        partly asked-for days whose asked-for hours were all cached (at least half the day)."""
        days: dict[str, tuple[Unit, list[Slot]]] = {}
        for s in slots:
            if s.day is not None and s.day.key is not None:
                days.setdefault(s.day.key.digest, (s.day, []))[1].append(s)
        out = []
        for digest, (day, members) in days.items():
            if any(s.answered_by == digest for s in members):
                continue  # the day cell is cached
            if any(s.piece.span == day.span for s in members):
                if all(s.result is None for s in members):
                    out.append((day, members))
                continue
            # A partly asked-for day is only worth its reads when the cell will be stored (with
            # revalidation on, cells are stored only when fetched, with their digests).
            if self.writer.revalidator is None and all(s.result is not None for s in members) \
                    and 2 * sum(s.piece.span.points for s in members) >= day.span.points:
                out.append((day, members))
        return out

    async def assemble(self, slots: Sequence[Slot], ctx: CacheCtx, router: Router | None,
                       request: RequestContext) -> Hours:
        """Missing day cells from their cached hour cells (one batched read for all days);
        whole-day pieces answered from them, and the cells stored (in the background).
        Returns, for each whole-day piece's day that could not be made, its hour units and
        the ones of their answers that were cached (for `split`). The cells it makes count
        against the allowance of new cache entries of `request`, the query they are made for."""
        interval = self.slots.split_interval_ms
        days = self.wanted(slots)
        partial: Hours = {}
        if not days or not interval:
            return partial
        plans: list[tuple[Unit, list[Slot], list[Unit]]] = []
        keys: dict[str, CacheKey] = {}
        for day, members in days:
            span = day.span
            try:
                hours = [self.slots.unit(members[0].piece, span.with_bounds(a, b), ctx, router)
                         for a, b in split_range(span.start_ms, span.end_ms, span.step, interval)]
            except PromError:
                continue
            if not all(h.storable and h.key is not None for h in hours):
                continue
            plans.append((day, members, hours))
            for h in hours:
                assert h.key is not None
                keys.setdefault(h.key.digest, h.key)
        if not plans:
            return partial
        read_at = wall_ms()  # an invalidation after this read refuses the put
        found: dict[str, QueryResult] = {}
        rest = []
        for digest, k in keys.items():
            landed = self.reader.landing.landed(digest)
            if landed is not None:
                found[digest] = landed
            else:
                rest.append(k)
        if rest:
            found.update(await self.reader.read(rest))  # a kept hour cell only checked unchanged
        for day, members, hours in plans:
            parts = [found.get(h.key.digest) if h.key is not None else None for h in hours]
            parts = [r if r is not None and r.result_type == "matrix" else None for r in parts]
            asked_whole = any(s.piece.span == day.span for s in members)
            whole = None
            if not asked_whole and not self._room_for(sum(r.n_samples for r in parts if r is not None)):
                if request.explain is None:
                    METRICS.cache_day_cells_skipped.inc()
                continue
            if all(r is not None for r in parts):
                try:
                    whole = concat([r for r in parts if r is not None])
                except MergeConflict as exc:  # cannot happen with cells of one grid; a miss then
                    log.warning("day cell from its hour cells: %s", exc)
            if whole is None:
                if day.key is not None and asked_whole:
                    partial[day.key.digest] = list(zip(hours, parts))
                continue
            if request.explain is None:  # explain only reads: the query itself makes the cell
                METRICS.cache_day_cells.inc()
                stored = self.writer.keep([day], [whole], read_at, {}, request)
                if not asked_whole and day.key is not None and day.key.digest in stored:
                    self._storing[day.key.digest] = whole.n_samples
            for s in members:
                if s.result is None and s.piece.span == day.span:
                    s.result, s.status, s.answered_by = whole, "hit", day.key.digest if day.key else None
        return partial

    def _room_for(self, samples: int) -> bool:
        """Whether a partly asked-for day of `samples` samples may be made now: it is at most
        edge_max_samples, and with the ones still being stored at most STORING_EDGES times that."""
        if samples > self.edge_max_samples:
            return False
        landing = self.reader.landing
        for digest in [d for d in self._storing if landing.landed(d) is None]:
            del self._storing[digest]  # stored (or given up): it left the landing zone
        return sum(self._storing.values()) + samples <= STORING_EDGES * self.edge_max_samples

    def split(self, slots: Sequence[Slot], partial: Hours, target_calls: int) -> list[Slot]:
        """Missing whole days that are better fetched as their hours, replaced by hour slots:
        a day some of whose hour cells are cached (only the others are fetched), and every
        missing day when there are fewer of them than the calls a query makes in parallel
        (`backends[].max_parallel`: a day is one unit, and one call, when fetched whole; a
        cold 24 h query would otherwise lose its parallel calls). Such a day's cell is made
        from its hour cells by a later lookup."""
        if not partial:
            return list(slots)

        def hours_of(s: Slot) -> list[tuple[Unit, QueryResult | None]] | None:
            if s.result is not None or s.day is None or s.day.key is None or s.piece.span != s.day.span:
                return None
            return partial.get(s.day.key.digest)

        empty = 0
        for s in slots:
            hours = hours_of(s)
            if hours is not None and all(r is None for _, r in hours):
                empty += 1
        out: list[Slot] = []
        for s in slots:
            hours = hours_of(s)
            if hours is None or (empty >= target_calls and all(r is None for _, r in hours)):
                out.append(s)
                continue
            for u, r in hours:
                sub = Slot(replace(s.piece, span=u.span), u, (u.key,) if u.key is not None else (), status="miss")
                if r is not None:
                    sub.result, sub.status, sub.answered_by = r, "hit", u.key.digest if u.key else None
                out.append(sub)
        return out
