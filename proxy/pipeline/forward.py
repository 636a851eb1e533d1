"""A query the planner left whole: Forward sends it to Relay, the leaf that answers it with its
cached answer or the backend's bytes untouched (or, when another process sharing the Redis
holds its fetch lease, the answer it stores)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..backends import Backend, BackendReply
from ..codec.json_encode import encode_prometheus_json
from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from ..primitives.singleflight import SingleFlight
from ..result import QueryResult
from .ask import Asker, needs_range_form
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .context import Refused
from .landing import Landing
from .leases import Leases
from .refusals import RefusalSplitter, refusal
from .slots import SlotMaker
from .stage import Stage
from .units import Unit
from .values import Answer, PieceFailed, Query

fetch_log = logging.getLogger("promaccel.fetch")
JSON = "application/json"


def forwards_whole(q: Query) -> bool:
    """Nothing was rewritten (one piece, the client's query and times): the client's bytes go
    out unchanged and the backend's come back unchanged."""
    plan = q.plan
    assert plan is not None
    if q.want_arrow or (q.whole is not None and q.whole.kind != "single"):
        return False
    if q.unmergeable:
        return True
    if len(plan.pieces) != 1 or plan.merge.kind != "passthrough":
        return False
    piece = plan.pieces[0]
    return piece.query == plan.request.query and piece.start_ms == plan.request.start_ms \
        and piece.end_ms == plan.request.end_ms and piece.time_ms == plan.request.time_ms


class Forward:
    """Stage (a branch, as Route is): a query left whole goes to `relay`, the leaf that relays
    its backend's bytes; anything else -- and a whole query the backend refused for its size
    or time, which the planned path then cuts finer -- to the planned path (`next`)."""

    def __init__(self, relay: Stage[Query, Answer], next: Stage[Query, Answer], *,
                 refusals: RefusalSplitter | None = None) -> None:
        self.relay = relay
        self.next = next
        self.refusals = refusals  # refused queries cut finer (refusals.py); None: relayed

    async def __call__(self, q: Query) -> Answer:
        # Explained as its one piece through the planned path: the same slot and cache unit.
        if not forwards_whole(q) or self._remembered(q) or q.ctx.explain is not None:
            return await self.next(q)
        try:
            answer = await self.relay(q)
        except PromError as exc:
            if not self._splits(q, exc):
                raise
            return await self._cut_finer(q, exc)
        reply = answer.reply
        if reply is not None and not reply.ok and self._splits(q, PieceFailed(reply)):
            return await self._cut_finer(q, PieceFailed(reply))
        return answer

    def _splits(self, q: Query, exc: BaseException) -> bool:
        """A refusal for size or time of a query the planner can cut (refusals.py)."""
        return (self.refusals is not None and not q.unmergeable and q.plan is not None and q.plan.expr is not None
                and refusal(exc) is not None)

    def _remembered(self, q: Query) -> bool:
        """The query's metric was refused lately and answered cut finer: the planned path
        starts it cut that way (refusals.py) instead of being refused again whole."""
        return (self.refusals is not None and not q.unmergeable and q.plan is not None and q.plan.expr is not None
                and self.refusals.remembers(q.plan.expr, q.plan.pieces[0].span, q.ctx.scope))

    async def _cut_finer(self, q: Query, exc: BaseException) -> Answer:
        """The refused query through the planned path, whose fetch starts from this refusal
        (the context's `refused`) and cuts it finer instead of asking the same call again."""
        assert q.plan is not None
        piece = q.plan.pieces[0]
        return await self.next(replace(q, ctx=replace(q.ctx, refused=Refused(piece.query, piece.span, exc))))


class Relay:
    """Leaf stage: the query asked whole of one backend (its route's, else the primary), the
    reply relayed as the backend gave it (made sound: an error as Prometheus-style JSON). A
    query left whole (`forwards_whole`: the client's query is its one piece) is first looked
    up as its cached whole answer, and its answer is stored; identical calls in flight or just
    made are shared. Forward, Fallback (an answer the merge cannot model) and CrossStore (a
    query it cannot read) hand queries here: no other stage above the leaves talks to a
    backend."""

    def __init__(self, backends: Mapping[str, Backend], primary: Backend, slots: SlotMaker, reader: CacheReader,
                 writer: CacheWriter, landing: Landing, flight: SingleFlight[tuple[Any, ...], Any], ask: Asker,
                 leases: Leases | None = None) -> None:
        self.by_name = backends
        self.primary = primary
        self.slots = slots
        self.reader = reader
        self.writer = writer
        self.landing = landing
        self.flight = flight
        self.ask = ask
        self.leases = leases

    async def __call__(self, q: Query) -> Answer:
        assert q.plan is not None
        backend = self.by_name[q.whole.backend] if q.whole is not None else self.primary
        cache = q.cache
        cacheable = cache is not None and not q.unmergeable and forwards_whole(q)
        slots = self.slots.slots(q.plan, cache, q.router) if cacheable else []
        if slots and slots[0].keys:
            await self.reader.lookup(slots)
            if slots[0].result is not None:
                status = self.reader.count(slots, q.ctx.caller.record)
                return Answer(result=slots[0].result, headers={"X-Promaccel-Pieces": "1", "X-Cache": status})
        unit = slots[0].unit if slots and slots[0].unit.storable else None
        key = ("whole", q.path, tuple(q.pairs), q.ctx.scope, backend.name)
        reply: BackendReply | QueryResult | None = self.landing.recent_call(key) if unit is not None else None
        if reply is not None:
            METRICS.coalesced.labels("recent").inc()
        else:
            reply = await self.flight.do(key, lambda: self._leased(key, q, unit, backend))
        headers = {"X-Promaccel-Pieces": "1", "X-Cache": self.reader.count(slots, q.ctx.caller.record)}
        if isinstance(reply, QueryResult):  # stored by another process meanwhile
            return Answer(result=reply, headers=headers)
        return Answer(reply=reply, headers=headers)

    async def _leased(self, key: tuple[Any, ...], q: Query, unit: Unit | None,
                      backend: Backend) -> BackendReply | QueryResult:
        """The answer of another process sharing the Redis when it holds the unit's fetch
        lease (or just stored it), else the backend's (`leases.py`)."""
        leases = self.leases
        if unit is None or unit.key is None or leases is None:
            return await self._forward(key, q, unit, backend)
        claim = await leases.acquire([unit])
        won: set[str] = set()
        if claim is not None:
            cell = claim.found.get(unit.key.digest)
            if cell is None and not claim.won:
                landed, _ = await leases.wait([unit], q.timeout_s)
                cell = landed.get(unit.key.digest)
            if cell is not None:
                return cell
            won = claim.won
        return await self._forward(key, q, unit, backend, won)

    async def _forward(self, key: tuple[Any, ...], q: Query, unit: Unit | None, backend: Backend,
                       won: set[str] | None = None) -> BackendReply:
        kept: set[str] = set()
        try:
            return await self._forward_now(key, q, unit, backend, won or set(), kept)
        finally:
            if won and self.leases is not None:
                self.leases.release(won - kept)

    async def _forward_now(self, key: tuple[Any, ...], q: Query, unit: Unit | None, backend: Backend,
                           won: set[str], kept: set[str]) -> BackendReply:
        baselines = await self.writer.baselines([unit], q.timeout_s, q.ctx.caller) if unit is not None else {}
        fetched_at = wall_ms()
        fetch_log.debug("fetch %s whole from %s", q.path, backend.name)
        # A sound reply or none: the client never gets a broken body or an HTML page.
        reply, result = await self.ask.sound(backend, q.path, q.pairs, q.timeout_s, q.ctx)
        if needs_range_form(backend, q.path, reply) and any(k == "time" for k, _ in q.pairs):
            try:
                result = await self.ask.range_form(backend, q.pairs, q.timeout_s, q.ctx)
            except PieceFailed as failed:
                return failed.reply
            reply = BackendReply(200, encode_prometheus_json(result), JSON)
        if unit is not None and reply.ok:
            self.landing.remember_call(key, reply, fetched_at)
            if result is not None:
                kept |= self.writer.keep_whole(result, unit, fetched_at, baselines, q.ctx, leased=won)
        return reply
