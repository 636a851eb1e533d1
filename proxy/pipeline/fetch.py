"""One fetch (a backend call covering one or more units): shared with identical calls in
flight (single-flight) or just finished (recent calls), announced so that requests needing
one of its units wait for it, answered by its route's backends, cut back into its units and
those stored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.tenancy import scope as tenant_scope
from ..cache import wall_ms
from ..errors import PromError
from ..hybrid import Router
from ..metrics import METRICS
from ..result import QueryResult
from ..result.pieces import split_time
from ..singleflight import SingleFlight
from .ask import instant_of, query_call
from .cache_write import CacheWriter
from .hybrid_fetch import RouteAnswer
from .landing import Landing
from .units import Fetch, Unit
from .values import CacheCtx, Pairs

# One DEBUG line per backend call (path, time range, units): which pieces were asked for.
fetch_log = logging.getLogger("promaccel.fetch")


def _retrieve(fut: asyncio.Future[QueryResult]) -> None:
    # Nobody may be waiting: mark a failure as seen so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


class Fetcher:
    def __init__(self, landing: Landing, writer: CacheWriter, route_answer: RouteAnswer, cache_enabled: bool) -> None:
        self.landing = landing
        self.writer = writer
        self.route_answer = route_answer
        self.cache_enabled = cache_enabled
        self.flight: SingleFlight[tuple[Any, ...], Any] = SingleFlight("backend")

    async def fetch(self, f: Fetch, extra: Pairs, timeout_s: float, ctx: CacheCtx | None,
                     router: Router | None = None) -> QueryResult:
        path, form = query_call(f.query, f.span, extra)
        tenant = ctx.tenant if ctx is not None else tenant_scope()
        key = ("piece", path, tuple(form), tenant, f.route)
        recent = self.landing.recent_call(key)
        if recent is not None:
            METRICS.coalesced.labels("recent").inc()
            result, fetched_at, baselines = recent
            # Its units may have left the landing zone without reaching the store (a
            # corrupt entry was deleted since): store them again.
            unlanded = [u for u in f.units if u.storable and u.key is not None
                        and u.key.digest not in self.landing.landing]
            if unlanded:
                self._store_fetch(f, unlanded, result, fetched_at, baselines)
            return result  # type: ignore[no-any-return]
        return await self.flight.do(  # type: ignore[no-any-return]
            key, lambda: self._fetch_now(key, f, path, form, timeout_s, router)
        )

    async def _fetch_now(self, key: tuple[Any, ...], f: Fetch, path: str, form: Pairs,
                         timeout_s: float, router: Router | None = None) -> QueryResult:
        # Announce the call's units, so that requests needing one of them wait for this call.
        loop = asyncio.get_running_loop()
        announced: dict[str, asyncio.Future[QueryResult]] = {}
        for u in f.units:
            if u.key is not None and u.key.digest not in self.landing.inflight:
                fut: asyncio.Future[QueryResult] = loop.create_future()
                fut.add_done_callback(_retrieve)
                announced[u.key.digest] = self.landing.inflight[u.key.digest] = fut
        try:
            result = await self._call(key, f, path, form, timeout_s, router)
        except BaseException as exc:
            for fut in announced.values():
                if fut.done():
                    continue
                if isinstance(exc, Exception):
                    fut.set_exception(exc)
                else:
                    fut.cancel()
            raise
        finally:
            for digest, fut in announced.items():
                if self.landing.inflight.get(digest) is fut:
                    del self.landing.inflight[digest]
        return result

    async def _call(self, key: tuple[Any, ...], f: Fetch, path: str, form: Pairs,
                    timeout_s: float, router: Router | None = None) -> QueryResult:
        storable = [u for u in f.units if u.storable] if self.cache_enabled else []
        baselines = await self.writer.baselines(storable, timeout_s) if storable else {}
        fetched_at = wall_ms()
        if fetch_log.isEnabledFor(logging.DEBUG):
            fetch_log.debug("fetch %s start_ms=%s end_ms=%s step_ms=%s time_ms=%s units=%d query=%s",
                            path, f.start_ms, f.end_ms, f.step_ms, f.time_ms, len(f.units), f.query)
        result = await self.route_answer.answer(f, path, form, timeout_s, router)
        keyed = [u for u in f.units if u.key is not None]
        parts = self.cut(f, keyed, result)
        for u, part in zip(keyed, parts or ()):
            assert u.key is not None
            fut = self.landing.inflight.get(u.key.digest)
            if fut is not None and not fut.done():
                fut.set_result(part)
        if parts is None:
            raise PromError("internal", f"a range query answered with a {result.result_type}")
        if storable and not result.warnings:
            by_digest = {u.key.digest: part for u, part in zip(keyed, parts) if u.key is not None}
            self.writer.keep(storable, [by_digest[u.key.digest] for u in storable if u.key is not None],
                       fetched_at, baselines)
            if len(storable) == len(f.units):
                self.landing.remember_call(key, (result, fetched_at, baselines), fetched_at)
        return result

    @staticmethod
    def cut(f: Fetch, units: Sequence[Unit], result: QueryResult) -> list[QueryResult] | None:
        """A fetched answer cut into `units` (units of `f`, in time order); None if it cannot
        be cut (a range call that did not answer with a matrix)."""
        if not f.span.is_range:
            return [result for _ in units]
        if result.result_type != "matrix":
            return None
        if f.instants:
            parts = split_time(result, [(u.span.time_ms, u.span.time_ms) for u in units])
            return [instant_of(part, f.query, u.span.time_ms) for u, part in zip(units, parts)]
        if len(units) == 1 and units[0].span == f.span:
            return [result]
        return split_time(result, [(u.span.start_ms, u.span.end_ms) for u in units])

    def _store_fetch(self, f: Fetch, units: Sequence[Unit], result: QueryResult, fetched_at: int,
                     baselines: Mapping[tuple[str, int], bytes]) -> None:
        """Keep `units` (storable units of `f`, in time order) cut from a fetched answer."""
        parts = self.cut(f, units, result)
        if parts is not None and not result.warnings:
            self.writer.keep(units, parts, fetched_at, baselines)
