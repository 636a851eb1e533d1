"""The planned path below the merge: cached pieces, coalescing, and the fan-out of the rest.

    Lookup    slots and their cached cells (landing zone, store, a finer step's cells)
    Coalesce  pieces being fetched by another request are awaited from that call; the rest
              grouped into as few backend calls as run well in parallel
    FanOut    the calls, in parallel under the query's one deadline; any failure cancels the
              siblings and becomes the answer
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from shardplanner.plan import Piece

from ..cache import CacheKey
from ..codec.errors import Undecodable
from ..config import Config
from ..errors import PromError
from ..observe.metrics import METRICS
from ..result import QueryResult
from ..result.pieces import TimeCut, slice_time
from .answer_memo import AnswerMemo, Ticket
from .cache_read import CacheReader
from .context import RequestContext
from .daycells import DayCells
from .fetch import Fetcher
from .landing import Landing
from .slots import SlotMaker
from .stage import Stage
from .units import Fetch, Slot, coalesce_units, fit
from .values import Encoded, PieceFailed, Query

# (merge order, shard index, role, answer) of one piece
Segment = tuple[tuple[int, str, int], int, str | None, QueryResult]


@dataclass(frozen=True)
class Pieces:
    segments: list[Segment]
    status: str  # X-Cache: HIT | PARTIAL | MISS
    # Every piece found in the cache: the answer kept for the same cells (answer_memo.py),
    # or the ticket to keep this one under once it is written.
    encoded: Encoded | None = None
    ticket: Ticket | None = None


@dataclass(frozen=True)
class Work:
    q: Query
    slots: list[Slot]


@dataclass(frozen=True)
class Calls:
    q: Query
    fetches: list[Fetch]
    waits: list[asyncio.Future[QueryResult]]


class Lookup:
    """Stage: each piece's cache unit and its cached answer."""

    def __init__(self, config: Config, slots: SlotMaker, reader: CacheReader, days: DayCells,
                 next: Stage[Work, list[Segment]], memo: AnswerMemo | None = None) -> None:
        self.config = config
        self.slots = slots
        self.reader = reader
        self.days = days
        self.next = next
        self.memo = memo

    async def __call__(self, q: Query) -> Pieces:
        assert q.plan is not None
        slots = self.slots.slots(q.plan, q.cache, q.router)
        await self.reader.lookup(slots)
        if q.cache is not None and q.plan.day_cells_until_ms is not None:
            partial = await self.days.assemble(slots, q.cache, q.router, q.ctx)
            if q.ctx.explain is not None:
                q.ctx.explain.looked_up(slots)  # one slot per planned piece (before the split)
            slots = self.days.split(slots, partial, self.days.target_calls)
        elif q.ctx.explain is not None:
            q.ctx.explain.looked_up(slots)
        if q.cache is not None and self.config.cache.reuse_finer_steps:
            await self.reader.lookup_finer(slots, q.cache, q.router)
        ticket = self.memo.ticket(q, slots, self.reader.tagged) if self.memo is not None else None
        if ticket is not None:
            kept = ticket.memo.get(ticket)
            if kept is not None:
                return Pieces([], self.reader.count(slots, q.ctx.caller.record), encoded=kept)
        segments = await self.next(Work(q, slots))
        if q.ctx.explain is not None:  # not a lookup of the cache's statistics
            return Pieces(segments, "MISS")
        if ticket is None and self.memo is not None:
            # Fetched now: kept under the cells the next lookup finds (the landing zone's).
            ticket = self.memo.ticket(q, _as_found(slots, self.reader.landing), self.reader.tagged)
        return Pieces(segments, self.reader.count(slots, q.ctx.caller.record), ticket=ticket)


@dataclass
class _Found:
    """A slot as the next lookup will find it: answered by the first of its keys that the
    landing zone holds (CacheReader.lookup's rule), with that cell."""

    piece: Piece
    keys: tuple[CacheKey, ...]
    order: tuple[int, str, int]
    result: QueryResult | None
    answered_by: str | None


def _as_found(slots: list[Slot], landing: Landing) -> list[_Found]:
    out = []
    for s in slots:
        if s.result is not None and s.answered_by is not None:
            out.append(_Found(s.piece, s.keys, s.order, s.result, s.answered_by))
            continue
        hit = next(((k.digest, r) for k in s.keys if (r := landing.landed(k.digest)) is not None), None)
        out.append(_Found(s.piece, s.keys, s.order, hit[1] if hit else None, hit[0] if hit else None))
    return out


class Coalesce:
    """Stage: wait for pieces in flight elsewhere; group the missing ones into calls."""

    def __init__(self, config: Config, target_calls: int, landing: Landing,
                 next: Stage[Calls, tuple[list[list[QueryResult]], list[QueryResult]]],
                 cell_ms: int | None = None) -> None:
        self.config = config
        self.target_calls = target_calls
        self.cell_ms = cell_ms  # the split interval: day units weigh their hours in a call
        self.landing = landing
        self.next = next

    async def __call__(self, w: Work) -> list[Segment]:
        waits: list[tuple[Slot, asyncio.Future[QueryResult]]] = []
        missing: list[Slot] = []
        for s in w.slots:
            if s.result is not None:
                continue
            digest = s.unit.key.digest if s.unit.key is not None else None
            landed = self.landing.landed(digest)
            if landed is not None:
                s.result, s.status = fit(s, landed), "hit"
            elif digest is not None and digest in self.landing.inflight:
                waits.append((s, self.landing.inflight[digest]))
            else:
                missing.append(s)
        if waits:
            METRICS.coalesced.labels("piece").inc(len(waits))
        slot_of = {s.unit: s for s in missing}
        fetches = coalesce_units([s.unit for s in missing], calls_for(self.target_calls, w.q.ctx),
                                 self.config.limits.max_points, self.cell_ms)
        if w.q.ctx.explain is not None:
            w.q.ctx.explain.coalesced(len(fetches))
        else:
            w.q.ctx.budget.check(len(fetches))  # before any call is made: a 422 naming the limit

        fetches = [_keeping(f, [slot_of[u] for u in f.units]) for f in fetches]
        settled, shared = await self.next(Calls(w.q, fetches, [fut for _, fut in waits]))
        # Segments to merge: each cached or shared piece, and each fetched answer cut to
        # its pieces.
        segments = cached_segments(w.slots)
        for (s, _), got in zip(waits, shared):
            segments.append((s.order, s.unit.shard_index, s.piece.role, fit(s, got)))
        for f, parts in zip(fetches, settled):
            segments.extend(self._segments(f, [slot_of[u] for u in f.units], parts))
        del settled
        segments.sort(key=lambda seg: seg[0])
        return segments

    @staticmethod
    def _segments(f: Fetch, covered: list[Slot], parts: list[QueryResult]) -> list[Segment]:
        """A call's answer, as its fetcher cut it (`Fetcher.parts`), as the segments to merge:
        a part per unit fitted to its piece (an instant unit's as it is), or the one answer
        (cropped to the pieces it covers as it arrived: `Fetch.keep`)."""
        if f.instants:
            return [(s.order, f.shard_index, f.role, part) for s, part in zip(covered, parts)]
        if len(parts) > 1:
            return [(s.order, f.shard_index, f.role, fit(s, part)) for s, part in zip(covered, parts)]
        first = min(covered, key=lambda s: s.order)
        return [(first.order, f.shard_index, f.role, parts[0])]


def cached_segments(slots: list[Slot]) -> list[Segment]:
    """The segment of each piece answered before the calls (cache, landing zone). Consecutive
    pieces cut lazily from one kept cell are one cut of it, as a call answering several
    pieces is one segment: a day cell answering a window's hour pieces is then one run a
    series to splice and gzip (codec/deflate.py), not 23. The query's first and last pieces
    stay apart: a sliding window cuts its edges anew each time, and the cut between them is
    then the same from one refresh to the next (its deflated runs are reused)."""
    answered = sorted((s for s in slots if s.result is not None), key=lambda s: s.order)
    if len(answered) < 3:
        return [_segment(s) for s in answered]
    first_ms = min(s.piece.span.start_ms for s in slots)
    last_ms = max(s.piece.span.end_ms for s in slots)
    out: list[Segment] = []
    group: list[Slot] = []
    for s in answered:
        edge = s.piece.span.start_ms == first_ms or s.piece.span.end_ms == last_ms
        if group and (edge or not _joins(group[-1], s)):
            out.extend(_folded(group))
            group = []
        if edge or not _foldable(s):
            out.append(_segment(s))
        else:
            group.append(s)
    out.extend(_folded(group))
    return out


def _segment(s: Slot) -> Segment:
    assert s.result is not None
    return (s.order, s.unit.shard_index, s.piece.role, s.result)


def _foldable(s: Slot) -> bool:
    return isinstance(s.result, TimeCut) and s.answered_by is not None


def _joins(prev: Slot, s: Slot) -> bool:
    """Whether s is the piece right after prev, answered by the same cell."""
    assert prev.result is not None and s.result is not None
    step = prev.piece.span.step_ms
    return (_foldable(s) and s.answered_by == prev.answered_by and s.order[:2] == prev.order[:2]
            and step is not None and s.piece.span.step_ms == step
            and s.piece.span.start_ms == prev.piece.span.end_ms + step
            and s.result.origin is not None and prev.result.origin is not None
            and s.result.origin[0]() is prev.result.origin[0]())


def _folded(group: list[Slot]) -> list[Segment]:
    if len(group) < 2:
        return [_segment(s) for s in group]
    first, last = group[0], group[-1]
    assert first.result is not None and first.result.origin is not None
    cell = first.result.origin[0]()
    if cell is None:  # pragma: no cover -- held by each cut until it is read
        return [_segment(s) for s in group]
    cut = slice_time(cell, first.piece.span.start_ms, last.piece.span.end_ms, lazy=True)
    return [(first.order, first.unit.shard_index, first.piece.role, cut)]


def _keeping(f: Fetch, covered: list[Slot]) -> Fetch:
    """`f` with the times of the pieces it answers (`Fetch.keep`) when they are narrower than
    its span."""
    if f.instants or not f.span.is_range:
        return f
    lo = min(s.piece.span.start_ms for s in covered)
    hi = max(s.piece.span.end_ms for s in covered)
    if (f.span.start_ms, f.span.end_ms) == (lo, hi):
        return f
    return replace(f, keep=(lo, hi))


# A query whose answer is reserved at this many bytes or more (answer_bytes.py) makes at most
# LARGE_CALLS_AT_ONCE of its backend calls at a time: each call's body and decoded arrays are
# held until it is cut and packed (~15 + 12 MB for 6 h of a 2,048-GPU raw panel), and four
# at once were most of such a query's peak (issue 15).
LARGE_ANSWER_BYTES = 16 << 20
LARGE_CALLS_AT_ONCE = 2
# Such a query's calls are also cut smaller: about this many bytes of its reservation each
# (a 24 h raw panel of 2,048 GPUs, ~46 MiB reserved, makes 6 calls of 4 h rather than 4 of 6 h:
# the median peak of 20 heavy queries at once went from +128 to +116 MiB over idle), at most
# LARGE_CALLS_MAX of them, and never more than limits.max_backend_calls allows.
LARGE_CALL_BYTES = 8 << 20
LARGE_CALLS_MAX = 16


def large_reservation(ctx: RequestContext) -> int | None:
    """The query's reservation in bytes if it is LARGE_ANSWER_BYTES or more."""
    held = ctx.held
    return held.size if held is not None and held.size >= LARGE_ANSWER_BYTES else None


def calls_for(target_calls: int, ctx: RequestContext) -> int:
    """The calls to aim for: `target_calls`, more for a query reserved at LARGE_ANSWER_BYTES
    or more (so that each call's body and arrays stay small, LARGE_CALLS_AT_ONCE at a time)."""
    size = large_reservation(ctx)
    if size is None:
        return target_calls
    more = min(LARGE_CALLS_MAX, -(-size // LARGE_CALL_BYTES))
    budget = ctx.budget
    if budget.max_calls:
        more = min(more, budget.max_calls - budget.calls)
    return max(target_calls, more)


class FanOut:
    """Stage: every call (and every wait for another request's call) under one deadline."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher

    async def __call__(self, c: Calls) -> tuple[list[list[QueryResult]], list[QueryResult]]:
        q = c.q
        if q.ctx.explain is not None:  # the leaf that never fetches: explain's
            return [], []
        gate = (asyncio.Semaphore(LARGE_CALLS_AT_ONCE)
                if large_reservation(q.ctx) is not None and len(c.fetches) > LARGE_CALLS_AT_ONCE else None)
        try:
            # The query's one deadline (its context's): the waits above (admission, the answer's
            # bytes) and the planning took their share of it.
            async with asyncio.timeout(max(min(q.timeout_s, q.ctx.left()), 0.0)):
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self._fetch(c, i, gate)) for i in range(len(c.fetches))]
                    shared = [tg.create_task(_wait(fut)) for fut in c.waits]
        except* PieceFailed as group:
            raise _first(group.exceptions) from None
        except* PromError as group:
            raise _first(group.exceptions) from None
        except* Undecodable as group:
            raise _first(group.exceptions) from None
        except* TimeoutError:
            raise PromError(
                "timeout", f"query timed out after {q.timeout_s:g}s ({len(c.fetches)} backend calls)"
            ) from None
        return [t.result() for t in tasks], [t.result() for t in shared]

    async def _fetch(self, c: Calls, i: int, gate: asyncio.Semaphore | None) -> list[QueryResult]:
        if gate is None:
            return await self.fetcher.parts(c.fetches[i], c.q)
        async with gate:
            return await self.fetcher.parts(c.fetches[i], c.q)


async def _wait(fut: asyncio.Future[QueryResult]) -> QueryResult:
    # shield: a request giving up (deadline, client gone) must not cancel the shared call.
    return await asyncio.shield(fut)


def _first(excs: tuple[BaseException, ...]) -> BaseException:
    # Relay the backend's verdict over our own errors, so a bad query reads like Prometheus.
    for e in excs:
        if isinstance(e, PieceFailed):
            return e
    return excs[0]
