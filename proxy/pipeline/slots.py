"""Slots: each planned piece with the cache unit fetched for it and the keys that can answer it."""

from __future__ import annotations

from dataclasses import replace

from shardplanner.footprint import footprint
from shardplanner.plan import Piece, Plan

from ..cache import CacheKey, ttl_for
from ..config import Config
from ..hybrid import Router
from .units import Slot, Unit, bare_unit, cell_of
from .values import CacheCtx


class SlotMaker:
    def __init__(self, config: Config, split_interval_ms: int | None) -> None:
        self.config = config
        self.split_interval_ms = split_interval_ms

    def route_of(self, router: Router, p: Piece, start_ms: int | None, end_ms: int | None) -> str:
        """Route id of piece `p` over `[start_ms, end_ms]` (a 422 if nobody holds it)."""
        q = p.query if router.by_piece else None
        if p.is_range:
            assert start_ms is not None and end_ms is not None and p.step_ms is not None
            r = router.range_route(start_ms, end_ms, p.step_ms, q)
        else:
            assert p.time_ms is not None
            r = router.instant_route(p.time_ms, q)
        rid = router.id(router.checked(r))
        router.routes[rid] = r
        return rid

    def unit(self, p: Piece, start_ms: int | None, end_ms: int | None, ctx: CacheCtx,
              router: Router | None = None) -> Unit:
        rid = self.route_of(router, p, start_ms, end_ms) if router is not None else ""
        bare = Unit(p.query, p.role, p.shard.index if p.shard else -1, start_ms, end_ms, p.step_ms, p.time_ms,
                    route=rid)
        if p.is_range:
            assert start_ms is not None and end_ms is not None
            lo, hi = start_ms, end_ms
        else:
            assert p.time_ms is not None
            lo = hi = p.time_ms
        fp = footprint(p.query, lo, hi, lookback_ms=ctx.lookback_ms)
        if fp is None:
            return bare
        piece = replace(p, start_ms=start_ms, end_ms=end_ms) if p.is_range else p
        route = (rid, *ctx.route[1:]) if rid else ctx.route
        key = CacheKey.for_piece(piece, lookback_ms=ctx.lookback_ms, route=route, tenant=ctx.tenant)
        return replace(bare, key=key, ttl_ms=ttl_for(fp.end_ms, ctx.now_ms, self.config.cache), footprint=fp)

    def slots(self, plan: Plan, ctx: CacheCtx | None, router: Router | None = None) -> list[Slot]:
        """One slot per planned piece, with its cache unit and lookup keys (none when the
        cache is off or the piece is not cacheable)."""
        if ctx is None:
            if router is None:
                return [Slot(p, bare_unit(p)) for p in plan.pieces]
            return [Slot(p, replace(bare_unit(p), route=self.route_of(router, p, p.start_ms, p.end_ms)))
                    for p in plan.pieces]
        cc = self.config.cache
        interval = self.split_interval_ms
        slots: list[Slot] = []
        for p in plan.pieces:
            exact = self.unit(p, p.start_ms, p.end_ms, ctx, router)
            cell = None
            if p.is_range and interval:
                assert p.start_ms is not None and p.end_ms is not None and p.step_ms is not None
                cell = cell_of(p.start_ms, p.step_ms, interval)
                if p.end_ms > cell[1]:
                    cell = None  # a coarsened piece: cached as itself
            if cell is None or cell == (p.start_ms, p.end_ms):
                slots.append(Slot(p, exact, (exact.key,) if exact.storable and exact.key else ()))
                continue
            whole = self.unit(p, cell[0], cell[1], ctx, router)
            keys = tuple(u.key for u in (whole, exact) if u.storable and u.key)
            old = whole.footprint is not None and whole.footprint.end_ms <= ctx.now_ms - cc.max_freshness
            # Never extend past what one backend call may ask for (Prometheus: 11,000 steps).
            small = (cell[1] - cell[0]) // (p.step_ms or 1) <= self.config.limits.max_points - 1
            extend = whole.storable and old and small and cc.extend_partial and plan.time_split
            slots.append(Slot(p, whole if extend else exact, keys))
        return slots
