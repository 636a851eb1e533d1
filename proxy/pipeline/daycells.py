"""Day cells made from hour cells: a day cell missing from the cache is assembled from the
cached cells of its split intervals when every one of them is there, and stored.

Old days of a range query are planned as day pieces (`shardplanner.timesplit.split_range_days`):
a warm 7-day panel reads ~7 day cells instead of 168 hour cells. A day that was recent
yesterday was cached hour by hour; once it is old, its day cell is made from those hour cells
(no backend call), concatenated exactly as the merge would (`result.merge.concat`: a range
query's value at t does not depend on how the range was cut). A day that cannot be assembled
is fetched whole (one call covers it). The edges of a query (a day it holds only part of)
stay hour pieces that try the day cell first; such a day is assembled when the query's own
hours of it were all cached and cover at least half the day.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shardplanner.timesplit import split_range

from ..cache import CacheKey, wall_ms
from ..errors import PromError
from ..hybrid import Router
from ..metrics import METRICS
from ..result import QueryResult
from ..result.merge import MergeConflict, concat
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .slots import SlotMaker
from .units import Slot, Unit
from .values import CacheCtx

log = logging.getLogger("promaccel.cache")


class DayCells:
    def __init__(self, slots: SlotMaker, reader: CacheReader, writer: CacheWriter) -> None:
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

    async def assemble(self, slots: Sequence[Slot], ctx: CacheCtx, router: Router | None) -> None:
        """Missing day cells from their cached hour cells (one batched read for all days);
        whole-day pieces answered from them, and the cells stored (in the background)."""
        interval = self.slots.split_interval_ms
        days = self.wanted(slots)
        if not days or not interval:
            return
        plans: list[tuple[Unit, list[Slot], list[CacheKey]]] = []
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
            hour_keys = [h.key for h in hours if h.key is not None]
            plans.append((day, members, hour_keys))
            for k in hour_keys:
                keys.setdefault(k.digest, k)
        if not plans:
            return
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
            found.update(await self.reader.decode(rest, await self.reader.store().get_many(rest)))
        for day, members, hour_keys in plans:
            parts = [found.get(k.digest) for k in hour_keys]
            if any(r is None or r.result_type != "matrix" for r in parts):
                continue
            try:
                whole = concat([r for r in parts if r is not None])
            except MergeConflict as exc:  # cannot happen with cells of one grid; a miss then
                log.warning("day cell from its hour cells: %s", exc)
                continue
            METRICS.cache_day_cells.inc()
            self.writer.keep([day], [whole], read_at, {})
            for s in members:
                if s.result is None and s.piece.span == day.span:
                    s.result, s.status, s.answered_by = whole, "hit", day.key.digest if day.key else None
