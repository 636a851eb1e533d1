"""The planned path below the merge (proxy/pipeline/lookup.py), each stage with a fake next
stage or fetcher: Lookup sends every slot down, Coalesce serves landed pieces, awaits pieces in
flight elsewhere and groups the rest into calls (a 422 before any call past the budget),
FanOut runs them under one deadline (a failure cancels the siblings; a large reservation's
calls are cut smaller and made LARGE_CALLS_AT_ONCE at a time); under explain the leaf calls
nothing."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from proxy.backends import BackendReply
from proxy.codec.json_encode import encode_prometheus_json
from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.answer_bytes import AnswerBytes, Reservation
from proxy.pipeline.cache_read import CacheReader
from proxy.pipeline.cache_write import CacheWriter
from proxy.pipeline.context import Budget, RequestContext
from proxy.pipeline.daycells import DayCells
from proxy.pipeline.explain import Explanation
from proxy.pipeline.landing import Landing
from proxy.pipeline.lookup import (
    LARGE_ANSWER_BYTES,
    LARGE_CALL_BYTES,
    LARGE_CALLS_AT_ONCE,
    Calls,
    Coalesce,
    FanOut,
    Lookup,
    Work,
    cached_segments,
    calls_for,
)
from proxy.pipeline.planning import Planner
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.units import Fetch
from proxy.pipeline.values import CacheCtx, PieceFailed, Query
from proxy.result import QueryResult
from proxy.result.merge import merge
from proxy.result.pieces import TimeCut, slice_time
from shardplanner.plan import Span
from tests.pipeline.stage_helpers import T0, FakeBackend, H, Recorder, config, range_query, run, series


def planned(cfg: Any, hours: int) -> tuple[Planner, Query]:
    planner = Planner(cfg, FakeBackend())  # type: ignore[arg-type]
    q = range_query("up", hours=hours)
    return planner, replace(q, plan=run(planner.plan(q.req)))


def answer_calls(calls: Calls) -> tuple[list[list[QueryResult]], list[QueryResult]]:
    """As FanOut does, without a fetcher: each call answered whole (one part) with one series
    over its span."""
    out = []
    for f in calls.fetches:
        assert f.start_ms is not None and f.end_ms is not None
        out.append([QueryResult.from_series("matrix", [series({f.start_ms: 1.0, f.end_ms: 2.0}, job="a")])])
    return out, []


def test_lookup_without_cache_sends_every_slot_down() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 3)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms)
    reader = CacheReader(cfg, lambda: None, Landing(), slots)  # type: ignore[arg-type,return-value]
    writer = CacheWriter(cfg, lambda: None, reader.landing)  # type: ignore[arg-type,return-value]
    rec = Recorder(lambda work: [])
    pieces = run(Lookup(cfg, slots, reader, DayCells(slots, reader, writer), rec)(q))
    (work,) = rec.got
    assert len(work.slots) == 3 and all(s.result is None and not s.keys for s in work.slots)
    assert pieces.status == "MISS" and pieces.segments == []


def test_lookup_notes_each_pieces_cache_status_for_explain() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 2)
    explanation = Explanation(cache_enabled=False)
    explanation.planned(q.plan)  # type: ignore[arg-type]
    slots = SlotMaker(cfg, planner.settings.split_interval_ms)
    reader = CacheReader(cfg, lambda: None, Landing(), slots)  # type: ignore[arg-type,return-value]
    writer = CacheWriter(cfg, lambda: None, reader.landing)  # type: ignore[arg-type,return-value]
    stage = Lookup(cfg, slots, reader, DayCells(slots, reader, writer), Recorder(lambda work: []))
    pieces = run(stage(replace(q, ctx=RequestContext(explain=explanation))))
    doc = explanation.document()
    assert [p["cache"] for p in doc["pieces"]] == ["uncacheable", "uncacheable"]
    assert doc["cache"] == {"enabled": False, "hits": 0, "misses": 0, "uncacheable": 2}
    assert pieces.status == "MISS"


def test_coalesce_groups_contiguous_pieces_and_serves_landed_ones() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 4)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)  # type: ignore[arg-type]
    landing = Landing()
    rec = Recorder(answer_calls)
    segments = run(Coalesce(cfg, 2, landing, rec)(Work(q, slots)))
    (calls,) = rec.got
    # Four contiguous hour pieces of one query in two calls (target_calls=2), in time order.
    assert [(f.start_ms, f.end_ms) for f in calls.fetches] == [
        (T0, T0 + 2 * H - 60_000), (T0 + 2 * H, T0 + 4 * H - 60_000)]
    assert [s[0][2] for s in segments] == sorted(s[0][2] for s in segments)


def test_coalesce_fits_a_calls_parts_to_its_pieces() -> None:
    """A call cut by its fetcher into one part per unit: each part is its piece's segment; an
    answer handed up whole is one segment, cropped to the pieces it covers."""
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 2)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)  # type: ignore[arg-type]
    first = QueryResult.from_series("matrix", [series({T0: 1.0}, part="first")])
    second = QueryResult.from_series("matrix", [series({T0 + H: 2.0}, part="second")])

    def cut(calls: Calls) -> tuple[list[list[QueryResult]], list[QueryResult]]:
        (f,) = calls.fetches  # two contiguous hours in one call (target_calls 1)
        assert len(f.units) == 2
        return [[first, second]], []

    segments = run(Coalesce(cfg, 1, Landing(), Recorder(cut))(Work(q, slots)))
    assert [seg[3].to_pylist()[0][0]["part"] for seg in segments] == ["first", "second"]
    assert [seg[0] for seg in segments] == [s.order for s in slots]

    whole = QueryResult.from_series("matrix", [series({T0: 1.0, T0 + H: 2.0}, part="whole")])
    segments = run(Coalesce(cfg, 1, Landing(), Recorder(lambda c: ([[whole]], [])))(Work(q, slots)))
    (seg,) = segments
    assert seg[0] == slots[0].order and seg[3] is whole


def test_coalesce_refuses_past_the_budget_before_any_call() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 4)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)  # type: ignore[arg-type]
    rec = Recorder(answer_calls)
    limited = replace(q, ctx=RequestContext(budget=Budget(1, 0)))
    with pytest.raises(PromError, match="limits.max_backend_calls") as err:
        run(Coalesce(cfg, 2, Landing(), rec)(Work(limited, slots)))
    assert err.value.status == 422 and rec.got == [] and limited.ctx.budget.calls == 0


def cached_slots(hours: int) -> tuple[Any, Query, list[Any]]:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={"planner": {"split_interval": "1h"}})
    planner, q = planned(cfg, hours)
    ctx = CacheCtx("", ("default",), T0 + 30 * 24 * H, q.req.lookback_ms)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, ctx)  # type: ignore[arg-type]
    assert all(s.unit.key is not None for s in slots)
    return cfg, q, slots


def test_coalesce_serves_landed_pieces_and_awaits_pieces_in_flight_elsewhere() -> None:
    cfg, q, slots = cached_slots(3)
    landed = QueryResult.from_series("matrix", [series({T0: 7.0}, job="landed")])
    shared = QueryResult.from_series("matrix", [series({T0 + H: 8.0}, job="shared")])

    async def main() -> tuple[list[Any], Calls]:
        landing = Landing()
        landing.land(slots[0].unit.key.digest, landed, 1)
        elsewhere: asyncio.Future[QueryResult] = asyncio.get_running_loop().create_future()
        elsewhere.set_result(shared)
        landing.inflight[slots[1].unit.key.digest] = elsewhere

        got: list[Calls] = []

        async def fan_out(calls: Calls) -> tuple[list[list[QueryResult]], list[QueryResult]]:
            got.append(calls)
            settled, _ = answer_calls(calls)
            return settled, [await f for f in calls.waits]

        segments = await Coalesce(cfg, 4, landing, fan_out)(Work(q, slots))
        return segments, got[0]

    segments, calls = run(main())
    # Only the third hour is asked of the backend; the second is awaited from the call in flight.
    assert [(f.start_ms, f.end_ms) for f in calls.fetches] == [(T0 + 2 * H, T0 + 3 * H - 60_000)]
    assert len(calls.waits) == 1 and slots[0].status == "hit"
    jobs = [seg[3].to_pylist()[0][0]["job"] for seg in segments]
    assert jobs == ["landed", "shared", "a"]  # in the pieces' order


def test_coalesce_counts_the_calls_for_explain_without_charging() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 4)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)  # type: ignore[arg-type]
    explanation = Explanation(cache_enabled=False)
    ctx = RequestContext(budget=Budget(1, 0), explain=explanation)  # 2 calls would be over the budget
    run(Coalesce(cfg, 2, Landing(), Recorder(lambda c: ([], [])))(Work(replace(q, ctx=ctx), slots)))
    assert explanation.document()["fetches"] == 2 and ctx.budget.calls == 0


def large(size: int) -> RequestContext:
    return RequestContext(held=Reservation(AnswerBytes(0, 1.0), size))


def test_a_large_reservation_is_fetched_in_smaller_calls() -> None:
    assert calls_for(4, RequestContext()) == 4
    assert calls_for(4, large(LARGE_ANSWER_BYTES - 1)) == 4  # under the threshold: as planned
    assert calls_for(4, large(6 * LARGE_CALL_BYTES)) == 6  # one call per LARGE_CALL_BYTES reserved
    assert calls_for(4, large(1000 * LARGE_CALL_BYTES)) == 16  # at most LARGE_CALLS_MAX
    ctx = replace(large(6 * LARGE_CALL_BYTES), budget=Budget(5, 0))
    ctx.budget.charge()
    assert calls_for(2, ctx) == 4  # never more than the budget has left
    assert calls_for(8, large(6 * LARGE_CALL_BYTES)) == 8  # never fewer than planned


class CountingFetcher:
    """Records how many fetches run at once; each takes `delay` s, answering an empty matrix."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.now = self.most = 0
        self.fetched: list[Fetch] = []

    async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
        self.fetched.append(f)
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.now -= 1
        return [QueryResult.empty("matrix")]


def fetches(n: int) -> list[Fetch]:
    return [Fetch("up", None, -1, Span.instant(T0 + i)) for i in range(n)]


def test_fan_out_makes_a_large_reservations_calls_a_few_at_a_time() -> None:
    small, big = CountingFetcher(), CountingFetcher()
    q = range_query("up")
    run(FanOut(small)(Calls(q, fetches(6), [])))  # type: ignore[arg-type]
    results, _ = run(FanOut(big)(Calls(replace(q, ctx=large(LARGE_ANSWER_BYTES)), fetches(6), [])))  # type: ignore[arg-type]
    assert small.most == 6 and big.most == LARGE_CALLS_AT_ONCE
    assert len(results) == 6 and len(big.fetched) == 6


def test_fan_out_under_explain_makes_no_call() -> None:
    fetcher = CountingFetcher()
    q = replace(range_query("up"), ctx=RequestContext(explain=Explanation(False)))
    assert run(FanOut(fetcher)(Calls(q, fetches(3), []))) == ([], [])  # type: ignore[arg-type]
    assert fetcher.fetched == []


def test_fan_out_hands_up_each_calls_parts_in_call_order() -> None:
    class Parts:
        async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
            await asyncio.sleep(0.03 - 0.01 * (f.span.time_ms - T0))  # the first call ends last
            return [QueryResult.from_series("vector", [series({f.span.time_ms: 1.0}, call=str(f.span.time_ms - T0))])]

    results, _ = run(FanOut(Parts())(Calls(range_query("up"), fetches(3), [])))  # type: ignore[arg-type]
    assert [parts[0].to_pylist()[0][0]["call"] for parts in results] == ["0", "1", "2"]


def test_fan_out_runs_calls_under_one_deadline() -> None:
    class SlowFetcher:
        async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
            await asyncio.sleep(0.01 if f.span.time_ms == 1 else 5)
            return [QueryResult.empty("vector")]

    q = replace(range_query("up"), timeout_s=0.2)
    fast = Fetch("up", None, -1, Span.instant(1))
    results, shared = run(FanOut(SlowFetcher())(Calls(q, [fast], [])))  # type: ignore[arg-type]
    assert len(results) == 1 and shared == []
    slow = Fetch("up", None, -1, Span.instant(2))
    with pytest.raises(PromError, match="timed out after 0.2s") as err:
        run(FanOut(SlowFetcher())(Calls(q, [fast, slow], [])))  # type: ignore[arg-type]
    assert err.value.kind == "timeout"


def test_fan_out_stops_at_the_querys_deadline() -> None:
    class Slow:
        async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
            await asyncio.sleep(0.3)
            return [QueryResult.empty("vector")]

    # The query arrived with 5 s to go, and most of them went above FanOut (admission, planning).
    q = replace(range_query("up"), timeout_s=5,
                ctx=RequestContext(timeout_s=5, deadline=time.monotonic() + 0.02))
    with pytest.raises(PromError, match="timed out"):
        run(FanOut(Slow())(Calls(q, fetches(1), [])))  # type: ignore[arg-type]


def test_fan_out_a_failure_cancels_the_siblings_and_is_the_answer() -> None:
    cancelled: list[int] = []
    reply = BackendReply(422, b"{}", "application/json")

    class FailingFetcher:
        async def parts(self, f: Fetch, *a: Any) -> list[QueryResult]:
            if f.span.time_ms != 2:
                try:
                    await asyncio.sleep(5)
                except asyncio.CancelledError:
                    cancelled.append(f.span.time_ms)  # type: ignore[arg-type]
                    raise
                return [QueryResult.empty("vector")]
            await asyncio.sleep(0.01)
            raise PieceFailed(reply)

    calls = [Fetch("up", None, -1, Span.instant(t)) for t in (1, 2, 3)]

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(PieceFailed) as err:
            await FanOut(FailingFetcher())(Calls(range_query("up"), calls, []))  # type: ignore[arg-type]
        assert err.value.reply is reply  # the backend's verdict, relayed
        return loop.time() - t0

    assert run(main()) < 2 and sorted(cancelled) == [1, 3]


def test_fan_out_a_shared_call_is_not_cancelled_by_this_query_giving_up() -> None:
    async def main() -> bool:
        elsewhere: asyncio.Future[QueryResult] = asyncio.get_running_loop().create_future()

        class Failing:
            async def parts(self, f: Fetch, q: Query) -> list[QueryResult]:
                await asyncio.sleep(0.01)
                raise PromError("unavailable", "down")

        with pytest.raises(PromError, match="down"):
            await FanOut(Failing())(Calls(range_query("up"), fetches(1), [elsewhere]))  # type: ignore[arg-type]
        return elsewhere.cancelled()

    assert run(main()) is False


def _day_cell(hours: int, step: int = 60_000) -> QueryResult:
    """A kept cell over `hours` hours (as a day cell is): three series, a point a step."""
    times = range(T0, T0 + hours * H, step)
    cell = QueryResult.from_series("matrix", [series({t: float(k * i) for i, t in enumerate(times)}, node=f"n{k}")
                                              for k in range(3)])
    cell.keeps_json = True
    return cell


def test_consecutive_cuts_of_one_cell_are_one_segment_between_the_edges() -> None:
    """A day cell answering a window's hour pieces (each cut lazily by the lookup): the pieces
    between the window's first and last are one cut of the cell; the edges stay apart; and
    the merge of the segments is the same answer as the merge of the pieces."""
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 6)
    assert q.plan is not None
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)
    cell = _day_cell(6)
    for s in slots:
        s.result = slice_time(cell, s.piece.span.start_ms, s.piece.span.end_ms, lazy=True)
        s.status, s.answered_by = "hit", "day-digest"
    assert all(isinstance(s.result, TimeCut) for s in slots)
    segments = cached_segments(slots)
    assert len(segments) == 3
    first, middle, last = (seg[3] for seg in segments)
    assert first is slots[0].result and last is slots[-1].result
    assert isinstance(middle, TimeCut) and middle.origin is not None and middle.origin[0]() is cell
    assert middle.series_bounds() is not None
    assert [int(b.min()) for b in middle.series_bounds()] == [T0 + H, T0 + 5 * H - 60_000]  # type: ignore[union-attr]
    assert [seg[0] for seg in segments] == [slots[0].order, slots[1].order, slots[-1].order]
    folded = merge([(None, seg[3]) for seg in segments], q.plan.merge, lazy=True)
    apart = merge([(None, s.result) for s in slots if s.result is not None], q.plan.merge, lazy=True)
    assert encode_prometheus_json(folded) == encode_prometheus_json(apart) == encode_prometheus_json(cell)


def test_cuts_are_not_folded_across_cells_gaps_or_eager_pieces() -> None:
    cfg = config(split_interval="1h")
    planner, q = planned(cfg, 6)
    assert q.plan is not None
    slots = SlotMaker(cfg, planner.settings.split_interval_ms).slots(q.plan, None)
    a, b = _day_cell(6), _day_cell(6)
    cells = [a, a, b, b, a, a]  # hours 1-2 from one cell, 3-4 from another
    for s, c in zip(slots, cells):
        s.result = slice_time(c, s.piece.span.start_ms, s.piece.span.end_ms, lazy=True)
        s.status, s.answered_by = "hit", f"digest-{id(c)}"
    segments = cached_segments(slots)
    # [edge][hour 1][hours 2-3 of b][hour 4][edge]: hour 1 and hour 4 have no neighbour of
    # their own cell inside the edges.
    assert len(segments) == 5
    assert segments[2][3].origin[0]() is b  # type: ignore[union-attr]
    # An eager cut (a cell not kept: landed) is never folded, nor is a piece with no answer.
    for s in slots:
        s.result = slice_time(a, s.piece.span.start_ms, s.piece.span.end_ms)
        s.answered_by = "digest-a"
    slots[3].result = None
    assert len(cached_segments(slots)) == 5
    lazy = [replace(s, result=slice_time(a, s.piece.span.start_ms, s.piece.span.end_ms, lazy=True)) for s in slots]
    lazy[3].result = None
    segments = cached_segments(lazy)
    assert len(segments) == 4  # [edge][hours 1-2][hour 4][edge]
    assert sum(seg[3].n_samples for seg in segments) == sum(s.result.n_samples for s in lazy if s.result is not None)
