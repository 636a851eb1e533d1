"""Slots: each planned piece with the cache unit fetched for it and the keys that can answer it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from shardplanner.footprint import footprint
from shardplanner.plan import Piece, Plan, Span
from shardplanner.timesplit import DAY_MS, day_cell

from ..cache import CacheKey, ttl_for
from ..config import Config
from ..errors import PromError
from .hybrid.router import Router
from .units import Slot, Unit, bare_unit, cell_of
from .values import CacheCtx

# Cache keys made lately, for the next requests of the same cells (`SlotMaker.key`).
KEYS_KEPT = 4096


class SlotMaker:
    def __init__(self, config: Config, split_interval_ms: int | None) -> None:
        self.config = config
        self.split_interval_ms = split_interval_ms
        self._keys: OrderedDict[tuple[object, ...], CacheKey] = OrderedDict()

    def unit(self, p: Piece, span: Span, ctx: CacheCtx, router: Router | None = None) -> Unit:
        """The cache unit of piece `p` over `span` (the piece's own, or its whole cell); on a
        hybrid fleet it carries its route (id and route, as the router hands them back)."""
        rid, routed = router.route_of(p.query, span) if router is not None else ("", None)
        shard = p.shard.index if p.shard else -1
        fp = footprint(p.query, span.start_ms, span.end_ms, lookback_ms=ctx.lookback_ms)
        if fp is None:
            return Unit(p.query, p.role, shard, span, route=rid, routed=routed)
        route = (rid, *ctx.route[1:]) if rid else ctx.route
        return Unit(p.query, p.role, shard, span, self.key(p, span, ctx, route),
                    ttl_for(fp.end_ms, ctx.now_ms, self.config.cache), fp, route=rid, routed=routed)

    def key(self, p: Piece, span: Span, ctx: CacheCtx, route: tuple[str, ...]) -> CacheKey:
        """`CacheKey.for_piece` of `p` over `span`, the same object for the same cell as long
        as it is kept: its canonical text and digest (JSON and SHA-256) are computed once, not
        on every refresh of the panel (issue 28: the tiny panel's per-request cost). Everything
        the key holds is in the memo's key."""
        memo = (p.query, span, p.shard, ctx.lookback_ms, route, ctx.tenant)
        key = self._keys.get(memo)
        if key is not None:
            self._keys.move_to_end(memo)
            return key
        key = CacheKey.for_piece(replace(p, span=span), lookback_ms=ctx.lookback_ms, route=route, tenant=ctx.tenant)
        self._keys[memo] = key
        if len(self._keys) > KEYS_KEPT:
            self._keys.popitem(last=False)
        return key

    @staticmethod
    def day_of(plan: Plan, span: Span) -> Span | None:
        """The day cell that holds range piece `span` when the plan cut old days as day cells
        and its day is one of them (a day the query holds whole is one piece, that cell)."""
        until = plan.day_cells_until_ms
        if until is None or not span.is_range or (span.start_ms // DAY_MS + 1) * DAY_MS > until:
            return None
        first, last = day_cell(span.start_ms, span.start_ms, span.step)
        return span.with_bounds(first, last) if span.end_ms <= last else None

    def slots(self, plan: Plan, ctx: CacheCtx | None, router: Router | None = None) -> list[Slot]:
        """One slot per planned piece, with its cache unit and lookup keys (none when the
        cache is off or the piece is not cacheable). A piece in an old day (day cells) is
        answered by its day's cell first."""
        if ctx is None:
            if router is None:
                return [Slot(p, bare_unit(p)) for p in plan.pieces]
            routed_slots: list[Slot] = []
            for p in plan.pieces:
                rid, routed = router.route_of(p.query, p.span)
                routed_slots.append(Slot(p, replace(bare_unit(p), route=rid, routed=routed)))
            return routed_slots
        cc = self.config.cache
        interval = self.split_interval_ms
        slots: list[Slot] = []
        # A day's unit for each of the plan's pieces in that day: by the piece's query, shard
        # and role as well (each shard's pieces are answered by that shard's day cell).
        days: dict[tuple[Span, str, int, str | None], Unit | None] = {}
        for p in plan.pieces:
            span = p.span
            exact = self.unit(p, span, ctx, router)
            day_span = self.day_of(plan, span)
            if day_span == span:  # a whole day: its own cell
                slots.append(Slot(p, exact, (exact.key,) if exact.storable and exact.key else (),
                                  day=exact if exact.storable else None))
                continue
            day = None
            if day_span is not None:
                which = (day_span, p.query, p.shard.index if p.shard else -1, p.role)
                if which not in days:
                    try:
                        days[which] = self.unit(p, day_span, ctx, router)
                    except PromError:
                        days[which] = None
                day = days[which]
                if day is not None and not day.storable:
                    day = None
            cell = None
            if span.is_range and interval:
                cell = span.with_bounds(*cell_of(span.start_ms, span.step, interval))
                if span.end_ms > cell.end_ms:
                    cell = None  # a coarsened piece: cached as itself
            first = (day.key,) if day is not None and day.key is not None else ()
            if cell is None or cell == span:
                slots.append(Slot(p, exact, (*first, *((exact.key,) if exact.storable and exact.key else ())),
                                  day=day))
                continue
            try:
                whole = self.unit(p, cell, ctx, router)
            except PromError:
                # The piece's own steps have a home, its whole cell's do not (a cross-store
                # stretch of steps that ends inside the cell): cached as itself.
                slots.append(Slot(p, exact, (exact.key,) if exact.storable and exact.key else ()))
                continue
            old = whole.footprint is not None and whole.footprint.end_ms <= ctx.now_ms - cc.max_freshness
            # Never extend past what one backend call may ask for (Prometheus: 11,000 steps).
            small = cell.points <= self.config.limits.max_points
            extend = whole.storable and old and small and cc.extend_partial and plan.time_split
            # A piece fetched as its whole cell is stored as that cell, never as itself: its own
            # key is not looked up (a sliding window's edge pieces are new keys every refresh,
            # each a read of Redis for nothing).
            keys = (*first, *(u.key for u in ((whole,) if extend else (whole, exact)) if u.storable and u.key))
            slots.append(Slot(p, whole if extend else exact, keys, day=day))
        return slots
