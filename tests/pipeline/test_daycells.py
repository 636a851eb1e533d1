"""proxy/pipeline/daycells.py: a day cell missing from the cache is made from its 24 cached
hour cells (concatenated exactly, stored, and answering the whole-day piece), or, when some
hours are missing, the day is fetched as its hours (only the missing ones) -- with small fakes
of its collaborators (the slot maker, the cache reader and the writer), no store, no backend."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.cache import CacheKey
from proxy.errors import PromError
from proxy.pipeline.context import RequestContext
from proxy.pipeline.daycells import STORING_EDGES, DayCells
from proxy.pipeline.units import Slot, Unit
from proxy.result import QueryResult
from shardplanner.plan import Piece, Span

H = 3_600_000
DAY = 86_400_000
STEP = 60_000
D0 = 1_700_000_000_000 // DAY * DAY  # a day boundary
Q = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"


def span(a: int, b: int) -> Span:
    return Span.range(a, b, STEP)


def day_span(d: int = 0) -> Span:
    return span(D0 + d * DAY, D0 + (d + 1) * DAY - STEP)


def hour_span(d: int, h: int) -> Span:
    a = D0 + d * DAY + h * H
    return span(a, a + H - STEP)


def unit(s: Span, query: str = Q) -> Unit:
    return Unit(query, None, -1, s, key=CacheKey(query, s, route=("prometheus",)), ttl_ms=600_000)


def hour_answer(s: Span, hosts: tuple[str, ...] = ("node-1", "node-2")) -> QueryResult:
    """Each host's value at t is a function of t and the host: concatenation is checkable."""
    ts = list(range(s.start_ms, s.end_ms + 1, STEP))
    return QueryResult.from_series("matrix", [
        ({"Hostname": h}, ts, [float((t - D0) // STEP) + 0.5 * i for t in ts]) for i, h in enumerate(hosts)])


@dataclass
class FakeSlots:
    """The slot maker: the split interval and the cache unit of a piece's part."""

    split_interval_ms: int = H
    refuse: set[int] = field(default_factory=set)  # starts of units it cannot make
    unstorable: set[int] = field(default_factory=set)

    def unit(self, piece: Piece, s: Span, ctx: Any, router: Any) -> Unit:
        if s.start_ms in self.refuse:
            raise PromError("bad_data", "cannot plan this part")
        u = unit(s, piece.query)
        return Unit(u.query, None, -1, s, key=u.key, ttl_ms=0) if s.start_ms in self.unstorable else u


class FakeLanding:
    def __init__(self) -> None:
        self.results: dict[str, QueryResult] = {}

    def landed(self, digest: str | None) -> QueryResult | None:
        return self.results.get(digest) if digest is not None else None


class FakeStore:
    def __init__(self, cached: dict[str, QueryResult]) -> None:
        self.cached = cached
        self.asked: list[list[str]] = []

    async def get_many(self, keys: list[CacheKey]) -> list[Any]:
        self.asked.append([k.digest for k in keys])
        return [k.digest if k.digest in self.cached else None for k in keys]  # stands for a payload


class FakeReader:
    """The cache reader: what landed in this process, the store, and decoding."""

    def __init__(self, cached: dict[str, QueryResult]) -> None:
        self.landing = FakeLanding()
        self._store = FakeStore(cached)

    def store(self) -> FakeStore:
        return self._store

    async def read(self, keys: list[CacheKey]) -> dict[str, QueryResult]:
        """The cells of `keys` in the store, by digest (one batched read; misses left out)."""
        payloads = await self._store.get_many(keys)
        return {k.digest: self._store.cached[p] for k, p in zip(keys, payloads) if p is not None}


@dataclass
class FakeWriter:
    """The cache writer: what it was given to keep, landed (as the real one does) until the
    test says the put landed (`FakeLanding.results` cleared)."""

    revalidator: Any = None
    kept: list[tuple[list[Unit], list[QueryResult]]] = field(default_factory=list)
    landing: FakeLanding | None = None

    def keep(self, units: list[Unit], results: list[QueryResult], fetched_at_ms: int, *rest: Any) -> set[str]:
        self.kept.append((list(units), list(results)))
        digests = set()
        for u, r in zip(units, results):
            assert u.key is not None
            digests.add(u.key.digest)
            if self.landing is not None:
                self.landing.results[u.key.digest] = r
        return digests


def cache_hours(d: int, hours: range | list[int], cached: dict[str, QueryResult] | None = None) -> dict[str, QueryResult]:
    cached = {} if cached is None else cached
    for h in hours:
        s = hour_span(d, h)
        key = unit(s).key
        assert key is not None
        cached[key.digest] = hour_answer(s)
    return cached


def whole_day_slot(d: int = 0) -> Slot:
    day = unit(day_span(d))
    return Slot(Piece(Q, day_span(d)), day, (day.key,) if day.key else (), status="miss", day=day)


def made(cached: dict[str, QueryResult], slots: list[Slot], **kw: Any) -> tuple[DayCells, FakeReader, FakeWriter]:
    reader = FakeReader(cached)
    writer = FakeWriter(**{k: v for k, v in kw.items() if k == "revalidator"}, landing=reader.landing)
    cells = DayCells(kw.get("maker", FakeSlots()), reader, writer,  # type: ignore[arg-type]
                     edge_max_samples=kw.get("edge_max_samples", 524_288))
    return cells, reader, writer


def assemble(cells: DayCells, slots: list[Slot]) -> Any:
    return asyncio.run(cells.assemble(slots, None, None, RequestContext()))  # type: ignore[arg-type]


def test_a_missing_day_is_made_from_its_24_cached_hours_exactly() -> None:
    slot = whole_day_slot()
    cells, reader, writer = made(cache_hours(0, range(24)), [slot])
    partial = assemble(cells, [slot])
    assert partial == {}
    whole = slot.result
    assert whole is not None and slot.status == "hit"
    assert slot.day is not None and slot.day.key is not None and slot.answered_by == slot.day.key.digest
    # The day's answer is its hours' samples in order: every grid point of the day, per host.
    expected = hour_answer(day_span())
    assert whole.to_pylist() == expected.to_pylist()
    # The cell is stored (in the background), once, under the day's unit.
    assert [(units, [r.to_pylist() for r in results]) for units, results in writer.kept] == [
        ([slot.day], [expected.to_pylist()])]
    # One batched read for the 24 hours.
    assert [len(a) for a in reader.store().asked] == [24]


def test_hours_that_landed_in_this_process_are_used_without_a_read() -> None:
    slot = whole_day_slot()
    cached = cache_hours(0, range(20))
    cells, reader, writer = made(cached, [slot])
    for h in range(20, 24):  # fetched here a moment ago, their puts not landed yet
        key = unit(hour_span(0, h)).key
        assert key is not None
        reader.landing.results[key.digest] = hour_answer(hour_span(0, h))
    assemble(cells, [slot])
    assert slot.result is not None and slot.result.to_pylist() == hour_answer(day_span()).to_pylist()
    assert [len(a) for a in reader.store().asked] == [20]


@pytest.mark.parametrize("missing", [[0], [23], [5, 6, 7], list(range(24))])
def test_a_day_with_a_missing_hour_is_not_made_and_its_hours_are_handed_back(missing: list[int]) -> None:
    slot = whole_day_slot()
    cells, _, writer = made(cache_hours(0, [h for h in range(24) if h not in missing]), [slot])
    partial = assemble(cells, [slot])
    assert slot.result is None and writer.kept == []
    assert slot.day is not None and slot.day.key is not None
    hours = partial[slot.day.key.digest]
    assert [u.span for u, _ in hours] == [hour_span(0, h) for h in range(24)]
    assert [h for h, (_, r) in enumerate(hours) if r is None] == missing


def test_a_cached_hour_of_the_wrong_shape_counts_as_missing() -> None:
    slot = whole_day_slot()
    cached = cache_hours(0, range(24))
    key = unit(hour_span(0, 3)).key
    assert key is not None
    cached[key.digest] = QueryResult.from_series("vector", [({}, [hour_span(0, 3).start_ms], [1.0])])
    cells, _, writer = made(cached, [slot])
    partial = assemble(cells, [slot])
    assert slot.result is None and writer.kept == []
    assert [h for h, (_, r) in enumerate(next(iter(partial.values()))) if r is None] == [3]


def test_days_already_answered_or_cached_are_left_alone() -> None:
    cached = cache_hours(0, range(24))
    answered = whole_day_slot()
    assert answered.day is not None and answered.day.key is not None
    answered.result, answered.status, answered.answered_by = hour_answer(day_span()), "hit", answered.day.key.digest
    cells, reader, writer = made(cached, [answered])
    assert cells.wanted([answered]) == []
    assert assemble(cells, [answered]) == {} and reader.store().asked == [] and writer.kept == []


def test_no_split_interval_or_an_unplannable_or_unstorable_hour_means_no_day_cell() -> None:
    for maker in (FakeSlots(split_interval_ms=0), FakeSlots(refuse={hour_span(0, 7).start_ms}),
                  FakeSlots(unstorable={hour_span(0, 7).start_ms})):
        slot = whole_day_slot()
        cells, reader, writer = made(cache_hours(0, range(24)), [slot], maker=maker)
        assert assemble(cells, [slot]) == {}
        assert slot.result is None and reader.store().asked == [] and writer.kept == []


def test_several_days_are_read_in_one_batch_and_each_made_or_not_on_its_own() -> None:
    cached = cache_hours(0, range(24))
    cache_hours(1, range(12), cached)
    cache_hours(2, range(24), cached)
    slots = [whole_day_slot(d) for d in range(3)]
    cells, reader, writer = made(cached, slots)
    partial = assemble(cells, slots)
    assert [s.result is not None for s in slots] == [True, False, True]
    assert len(reader.store().asked) == 1 and len(reader.store().asked[0]) == 72
    assert len(writer.kept) == 2
    assert slots[1].day is not None and slots[1].day.key is not None
    assert set(partial) == {slots[1].day.key.digest}


# --- a day the query holds only part of (its edge) --------------------------------------------


def edge_slots(hours: range) -> list[Slot]:
    """The query's own hour pieces of day 0 (each answered from the cache already), each
    able to be answered by the day cell."""
    day = unit(day_span())
    out = []
    for h in hours:
        s = hour_span(0, h)
        u = unit(s)
        out.append(Slot(Piece(Q, s), u, (u.key,) if u.key else (), result=hour_answer(s), status="hit", day=day))
    return out


def test_an_edge_day_is_made_when_its_asked_hours_were_cached_and_cover_half_the_day() -> None:
    slots = edge_slots(range(12, 24))  # the query's last 12 hours of the day
    cells, _, writer = made(cache_hours(0, range(24)), slots)
    assert [len(m) for _, m in cells.wanted(slots)] == [12]
    assemble(cells, slots)
    assert len(writer.kept) == 1  # stored for the next query that asks for the whole day
    assert writer.kept[0][1][0].to_pylist() == hour_answer(day_span()).to_pylist()
    # The query's own slots keep their hour answers.
    assert [s.result.to_pylist() for s in slots if s.result] == [hour_answer(hour_span(0, h)).to_pylist()
                                                                   for h in range(12, 24)]


@pytest.mark.parametrize(
    ("hours", "missing_one", "revalidating", "wanted"),
    [
        (range(13, 24), False, False, False),  # 11 hours: less than half the day
        (range(12, 24), True, False, False),  # one of its hours not cached
        (range(12, 24), False, True, False),  # revalidation stores only cells it fetched
        (range(0, 24, 2), False, False, True),  # half the day, not contiguous: still half
    ],
)
def test_when_an_edge_day_is_not_worth_its_reads(hours: range, missing_one: bool, revalidating: bool,
                                                 wanted: bool) -> None:
    slots = edge_slots(hours)
    if missing_one:
        slots[0].result = None
    cells, _, _ = made(cache_hours(0, range(24)), slots, revalidator=object() if revalidating else None)
    assert bool(cells.wanted(slots)) is wanted


def test_a_heavy_edge_day_is_not_copied() -> None:
    """An edge day's cell is a copy beside the query's own answer: over edge_max_samples it
    waits for a query that asks for the whole day."""
    slots = edge_slots(range(12, 24))
    samples = hour_answer(day_span()).n_samples
    cells, _, writer = made(cache_hours(0, range(24)), slots, edge_max_samples=samples - 1)
    assemble(cells, slots)
    assert writer.kept == []
    cells, _, writer = made(cache_hours(0, range(24)), slots, edge_max_samples=samples)
    assemble(cells, slots)
    assert len(writer.kept) == 1
    # A whole-day piece is made whatever its size: it is the query's answer.
    slot = whole_day_slot()
    cells, _, writer = made(cache_hours(0, range(24)), [slot], edge_max_samples=1)
    assemble(cells, [slot])
    assert slot.result is not None and len(writer.kept) == 1


def test_edge_days_being_stored_at_once_are_bounded() -> None:
    """Partly asked-for days are made only to be stored: at most STORING_EDGES times
    edge_max_samples of them wait for their puts at once (20 heavy cold queries at once each
    made one, and ~9 sat in memory at the burst's peak); the next is made once one landed."""
    samples = hour_answer(day_span()).n_samples
    cached: dict[str, QueryResult] = {}
    for d in range(STORING_EDGES + 1):
        cache_hours(d, range(24), cached)
    cells, reader, writer = made(cached, [], edge_max_samples=samples)

    def edge_of(d: int) -> list[Slot]:
        day = unit(day_span(d))
        return [Slot(Piece(Q, hour_span(d, h)), unit(hour_span(d, h)), (), result=hour_answer(hour_span(d, h)),
                     status="hit", day=day) for h in range(12, 24)]

    for d in range(STORING_EDGES):
        assemble(cells, edge_of(d))
    assert len(writer.kept) == STORING_EDGES
    assemble(cells, edge_of(STORING_EDGES))  # the others still being stored: not made now
    assert len(writer.kept) == STORING_EDGES
    reader.landing.results.pop(next(iter(reader.landing.results)))  # one put landed
    assemble(cells, edge_of(STORING_EDGES))
    assert len(writer.kept) == STORING_EDGES + 1
    assert writer.kept[-1][1][0].to_pylist() == hour_answer(day_span(STORING_EDGES)).to_pylist()


# --- split: missing days fetched as their hours --------------------------------------------------


def partial_for(slots: list[Slot], cached_hours: dict[int, list[int]]) -> dict[str, Any]:
    out = {}
    for d, slot in enumerate(slots):
        assert slot.day is not None and slot.day.key is not None
        hours = [(unit(hour_span(d, h)), hour_answer(hour_span(d, h)) if h in cached_hours.get(d, []) else None)
                 for h in range(24)]
        out[slot.day.key.digest] = hours
    return out


def test_a_day_with_some_cached_hours_is_fetched_as_its_missing_hours_only() -> None:
    slots = [whole_day_slot(0)]
    partial = partial_for(slots, {0: list(range(20))})
    cells, _, _ = made({}, slots)
    out = cells.split(slots, partial, target_calls=4)
    assert [s.piece.span for s in out] == [hour_span(0, h) for h in range(24)]
    assert all(s.piece.query == Q for s in out)
    assert [s.status for s in out] == ["hit"] * 20 + ["miss"] * 4
    assert [s.result is not None for s in out] == [True] * 20 + [False] * 4
    for s in out:
        assert s.keys == (s.unit.key,) and s.unit.span == s.piece.span
        assert s.answered_by == (s.unit.key.digest if s.result is not None and s.unit.key else None)


def test_wholly_missing_days_stay_whole_when_there_are_enough_for_the_parallel_calls() -> None:
    slots = [whole_day_slot(d) for d in range(4)]
    partial = partial_for(slots, {})
    cells, _, _ = made({}, slots)
    assert cells.split(slots, partial, target_calls=4) == slots  # 4 days, 4 calls: a day a call
    # Fewer missing days than parallel calls: cut into hours, so the calls run in parallel.
    out = cells.split(slots[:2], {k: partial[k] for k in list(partial)[:2]}, target_calls=4)
    assert len(out) == 48 and all(s.status == "miss" for s in out)


def test_split_leaves_other_slots_alone() -> None:
    answered = whole_day_slot(0)
    answered.result = hour_answer(day_span(0))
    no_day = Slot(Piece(Q, hour_span(5, 0)), unit(hour_span(5, 0)))
    slots = [answered, no_day]
    cells, _, _ = made({}, slots)
    assert cells.split(slots, partial_for([whole_day_slot(0)], {0: [1]}), 4) == slots
    assert cells.split(slots, {}, 4) == slots
