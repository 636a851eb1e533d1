"""One fetch (a backend call covering one or more units): shared with identical calls in
flight (single-flight) or just finished (their cells, in the landing zone), announced so
that requests needing one of its units wait for it, answered by its route's backends, cut
back into its units and those stored. Across processes sharing a Redis, units another
process is fetching right now (it holds their fetch leases, `leases.py`) are awaited from
Redis instead."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Any

from ..codec import arrow
from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from ..primitives.singleflight import SingleFlight
from ..result import QueryResult
from ..result.merge import concat
from ..result.pieces import iter_split_time, slice_time, split_time
from ..runtime.memory import give_back_soon
from .ask import instant_of, query_call
from .cache_write import CacheWriter
from .context import RequestContext
from .hybrid.fetch import RouteAnswer
from .hybrid.router import Router
from .landing import Landing
from .leases import Leases
from .refusals import Answerer
from .units import Fetch, Unit
from .values import Pairs, Query

# One DEBUG line per backend call (path, time range, units): which pieces were asked for.
fetch_log = logging.getLogger("promaccel.fetch")


def _retrieve(fut: asyncio.Future[QueryResult]) -> None:
    # Nobody may be waiting: mark a failure as seen so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


class Fetcher:
    def __init__(self, landing: Landing, writer: CacheWriter, route_answer: RouteAnswer | Answerer, cache_enabled: bool,
                 leases: Leases | None = None) -> None:
        self.landing = landing
        self.writer = writer
        self.route_answer = route_answer
        self.cache_enabled = cache_enabled
        self.leases = leases
        self.flight: SingleFlight[tuple[Any, ...], Any] = SingleFlight(
            "backend", on_shared=METRICS.coalesced.labels("backend").inc)

    async def fetch(self, f: Fetch, q: Query) -> QueryResult:
        """`f`'s answer, for query `q` (its parameters, deadline, route and context); the call
        is shared with the identical calls of other queries of the same tenant, and made with
        the context of the query that made it first."""
        extra, timeout_s, router, ctx = q.extra, q.timeout_s, q.router, q.ctx
        path, form = query_call(f.query, f.span, extra)
        key = ("piece", path, tuple(form), ctx.scope, f.route)
        landed = self._landed(f)
        if landed is not None:
            METRICS.coalesced.labels("recent").inc()
            return landed
        return await self.flight.do(  # type: ignore[no-any-return]
            key, lambda: self._fetch_now(key, f, extra, path, form, timeout_s, router, ctx)
        )

    async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
        """`f`'s answer (`fetch`) cut where it was fetched into what the merge keeps: one part
        per unit -- an instant unit's answer at its time, or, for a range call whose every cell
        just landed, those cells (they live until their put lands anyway) -- else the answer
        itself, one part for all of its units. Cut as each call's answer arrives, so the whole
        answer of a long call (a 6 h quarter of a 24 h answer is ~12 MB) is let go then, not
        once the slowest sibling call is back."""
        result = await self.fetch(f, q)
        if f.instants:
            parts = self.cut(f, f.units, result)
            assert parts is not None  # the call checked that the answer is a matrix
            return parts
        if f.span.is_range and len(f.units) > 1:
            cells = [self.landing.landed(u.key.digest if u.key is not None else None) for u in f.units]
            if all(c is not None for c in cells):
                kept = [c for c in cells if c is not None]
                if f.keep is not None:  # the edge cells cropped now, as the merge keeps them
                    kept[0] = slice_time(kept[0], *f.keep)
                    kept[-1] = slice_time(kept[-1], *f.keep)
                return kept
        if f.keep is not None and f.span.is_range:
            return [slice_time(result, *f.keep)]  # the whole answer is let go now
        return [result]

    def _landed(self, f: Fetch) -> QueryResult | None:
        """The answer of `f` from the landing zone when an identical call just fetched every
        one of its units (a request that looked the cache up just before that call's cells
        landed): its cells, in time order, are the call's answer. Nothing else is kept of a
        finished call (its whole answer, kept a few seconds, was a second copy of its cells:
        up to 16 MiB after a burst, issue 15)."""
        if f.instants or not f.units:
            return None
        cells = []
        for u in f.units:
            cell = self.landing.landed(u.key.digest) if u.key is not None else None
            if cell is None:
                return None
            cells.append(cell)
        return cells[0] if len(cells) == 1 else concat(cells, lazy=True)

    async def _fetch_now(self, key: tuple[Any, ...], f: Fetch, extra: Pairs, path: str, form: Pairs,
                         timeout_s: float, router: Router | None, ctx: RequestContext) -> QueryResult:
        # Announce the call's units, so that requests needing one of them wait for this call.
        loop = asyncio.get_running_loop()
        announced: dict[str, asyncio.Future[QueryResult]] = {}
        for u in f.units:
            if u.key is not None and u.key.digest not in self.landing.inflight:
                fut: asyncio.Future[QueryResult] = loop.create_future()
                fut.add_done_callback(_retrieve)
                announced[u.key.digest] = self.landing.inflight[u.key.digest] = fut
        try:
            result = await self._leased(key, f, extra, path, form, timeout_s, router, ctx)
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

    async def _leased(self, key: tuple[Any, ...], f: Fetch, extra: Pairs, path: str, form: Pairs,
                      timeout_s: float, router: Router | None, ctx: RequestContext) -> QueryResult:
        """`f` under fetch leases: the units whose leases this process wins (or all, without
        leases) are fetched here; those stored meanwhile are read; those another process
        holds are awaited from Redis, or fetched here when that process stores nothing. The
        answer is then the units' cells in time order (a range call's answer is the union of
        its cells')."""
        leases = self.leases
        candidates = ([u for u in f.units if u.storable]
                      if leases is not None and self.cache_enabled and not f.instants else [])
        claim = await leases.acquire(candidates) if leases is not None and candidates else None
        if leases is None or claim is None or len(claim.won) == len(candidates):
            return (await self._call(key, f, path, form, timeout_s, router, ctx, claim.won if claim else ()))[0]
        won, found = claim.won, claim.found
        lost = [u for u in candidates if u.key is not None and u.key.digest not in won and u.key.digest not in found]
        index = {id(u): i for i, u in enumerate(f.units)}
        parts: dict[int, QueryResult] = {}
        for u in candidates:
            assert u.key is not None
            cell = found.get(u.key.digest)
            if cell is not None:
                parts[index[id(u)]] = cell
                self._resolve(u, cell)

        async def fetch_here(units: Sequence[Unit], won: Collection[str]) -> None:
            for sub in _runs(f, units):
                sub_path, sub_form = query_call(sub.query, sub.span, extra)
                _, cut = await self._call(None, sub, sub_path, sub_form, timeout_s, router, ctx, won)
                for u, part in zip(sub.units, cut):
                    parts[index[id(u)]] = part

        async def wait_elsewhere() -> None:
            landed, here = await leases.wait(lost, timeout_s)
            for u in lost:
                assert u.key is not None
                cell = landed.get(u.key.digest)
                if cell is not None:
                    parts[index[id(u)]] = cell
                    self._resolve(u, cell)
            if here:
                await fetch_here(here, ())

        elsewhere = {id(u) for u in lost}
        mine = [u for u in f.units if index[id(u)] not in parts and id(u) not in elsewhere]
        try:
            async with asyncio.TaskGroup() as tg:
                if mine:
                    tg.create_task(fetch_here(mine, won))
                if lost:
                    tg.create_task(wait_elsewhere())
        except BaseExceptionGroup as group:
            raise _leaf(group) from None
        cells = [parts[i] for i in range(len(f.units))]
        return cells[0] if len(cells) == 1 else concat(cells)

    def _resolve(self, u: Unit, cell: QueryResult) -> None:
        """Requests of this process waiting for unit `u` get `cell`."""
        fut = self.landing.inflight.get(u.key.digest) if u.key is not None else None
        if fut is not None and not fut.done():
            fut.set_result(cell)

    async def _call(self, key: tuple[Any, ...] | None, f: Fetch, path: str, form: Pairs, timeout_s: float,
                    router: Router | None, ctx: RequestContext,
                    won: Collection[str] = ()) -> tuple[QueryResult, list[QueryResult]]:
        """One backend call for `f`: its answer and, for a part of a flight (`key` None: not
        remembered as a recent call), the answer cut into each of `f`'s units (else into its
        keyed units only). The leases of `won` are let go once their units are stored, at
        once if they will not be."""
        kept: set[str] = set()
        try:
            storable = [u for u in f.units if u.storable] if self.cache_enabled else []
            baselines = await self.writer.baselines(storable, timeout_s, ctx.caller) if storable else {}
            fetched_at = wall_ms()
            if fetch_log.isEnabledFor(logging.DEBUG):
                fetch_log.debug("fetch %s start_ms=%s end_ms=%s step_ms=%s time_ms=%s units=%d query=%s",
                                path, f.start_ms, f.end_ms, f.step_ms, f.time_ms, len(f.units), f.query)
            result = await self.route_answer.answer(f, path, form, timeout_s, router, ctx)
            units = f.units if key is None else [u for u in f.units if u.key is not None]
            parts = await self._cut_packed(f, units, result) if storable and not result.warnings else None
            if parts is None:
                parts = self.cut(f, units, result)
            if parts is None:
                # Not promaccel's fault: a backend's garbage (RouteAnswer refuses it first).
                who = "backend " + "+".join(map(repr, f.routed.backends)) if f.routed is not None else "the backend"
                raise PromError("unavailable", f"{who} answered a range query with a {result.result_type}, "
                                "not a matrix", status=502)
            for u, part in zip(units, parts):
                fut = self.landing.inflight.get(u.key.digest) if u.key is not None else None
                if fut is not None and not fut.done():
                    fut.set_result(part)
            if storable and not result.warnings:
                by_digest = {u.key.digest: part for u, part in zip(units, parts) if u.key is not None}
                kept = self.writer.keep(storable, [by_digest[u.key.digest] for u in storable if u.key is not None],
                                        fetched_at, baselines, ctx, leased=won)
            return result, parts
        finally:
            if won and self.leases is not None:
                self.leases.release(d for d in won if d not in kept)

    async def _cut_packed(self, f: Fetch, units: Sequence[Unit], result: QueryResult) -> list[QueryResult] | None:
        """A large range answer cut into `units` with the cells to be stored packed as their
        cache payloads (`arrow.pack`), one cell at a time, off the event loop: the
        cells waiting in the landing zone and the answer merged from them then hold a few
        megabytes packed instead of tens decoded (the 24 cells of a 2,048-GPU day: ~47 MB
        of columns), and the call's answer is never held twice over (issue 15). None when
        there is nothing to pack (`cut` does the rest)."""
        compression = self.writer.config.cache.compression
        pack_from = self.writer.config.cache.pack_min_samples
        if (compression == "none" or not pack_from or f.instants or not f.span.is_range
                or result.result_type != "matrix" or result.n_samples < pack_from):
            return None

        def run() -> list[QueryResult]:
            whole = len(units) == 1 and units[0].span == f.span
            cells = iter([result]) if whole else iter_split_time(
                result, [(u.span.start_ms, u.span.end_ms) for u in units])
            out = []
            for u, cell in zip(units, cells):
                if u.storable and u.key is not None:
                    cell = arrow.pack(cell, compression, pack_from)
                    if cell.packed_samples() is not None:
                        METRICS.cells_packed.labels("fetched").inc()
                out.append(cell)
            return out

        out = await asyncio.to_thread(run)
        # The call's body and the copies its cells were cut from are freed by now: a heavy
        # query's next calls reuse pages given back, not fresh ones (proxy/runtime/memory.py).
        give_back_soon()
        return out

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


def _runs(f: Fetch, units: Sequence[Unit]) -> list[Fetch]:
    """`units` (some of `f`'s, in `f`'s order) as calls over their contiguous runs."""
    if len(f.units) == 1 or not f.span.is_range:
        return [f]
    at = {id(u): i for i, u in enumerate(f.units)}
    runs: list[list[Unit]] = []
    for u in units:
        if runs and at[id(runs[-1][-1])] == at[id(u)] - 1:
            runs[-1].append(u)
        else:
            runs.append([u])
    return [Fetch(f.query, f.role, f.shard_index, f.span.with_bounds(r[0].span.start_ms, r[-1].span.end_ms),
                  tuple(r), f.route, routed=f.routed) for r in runs]


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception of a task group's failure, unwrapped (a backend's verdict first)."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[Any]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    from .values import PieceFailed

    for e in leaves:
        if isinstance(e, PieceFailed):
            return e
    return leaves[0]
