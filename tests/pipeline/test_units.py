"""proxy/pipeline/units.py: how planned pieces become cache units and backend calls.

`cell_of`: the grid points of a split interval (checked by its defining properties over many
grids). `coalesce_units`: every unit in exactly one call; a call covers contiguous units of
one query, shard, role, grid and route, never a gap, never more than `max_points` steps, and
about `target_calls` calls in all; evenly spaced instants become one range call over those
times. `fit`: a cell's answer cut to its piece. Pure logic: no I/O."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from proxy.pipeline.units import Fetch, Slot, Unit, bare_unit, cell_of, coalesce_units, fit
from proxy.result import QueryResult
from shardplanner.plan import Piece, ShardSpec, Span

H = 3_600_000
STEP = 30_000
T0 = 1_700_000_000_000 // H * H  # an hour boundary


def hour_units(n: int, *, query: str = "sum(up)", step: int = STEP, start: int = T0, shard: int = -1,
               role: str | None = None, route: str = "") -> list[Unit]:
    """n consecutive hour cells of one grid (each ends one step before the next starts)."""
    out = []
    for i in range(n):
        a = start + i * H
        out.append(Unit(query, role, shard, Span.range(a, a + H - step, step), route=route))
    return out


def check_fetches(units: list[Unit], fetches: list[Fetch], max_points: int) -> None:
    """The invariants every grouping must keep."""
    seen = Counter(id(u) for f in fetches for u in f.units)
    assert sorted(seen) == sorted(id(u) for u in units) and set(seen.values()) == {1}  # each once
    for f in fetches:
        us = f.units
        assert {(u.query, u.role, u.shard_index, u.route) for u in us} == {(f.query, f.role, f.shard_index, f.route)}
        if f.instants:
            assert f.span.is_range and [u.span.time_ms for u in us] == list(
                range(f.span.start_ms, f.span.end_ms + 1, f.span.step))
            assert len(us) <= max_points
            continue
        if not f.span.is_range:
            assert us == (units[[id(u) for u in units].index(id(us[0]))],) and f.span == us[0].span
            continue
        step = f.span.step
        assert all(u.span.step == step for u in us)
        assert f.span.start_ms == us[0].span.start_ms and f.span.end_ms == us[-1].span.end_ms
        for a, b in zip(us, us[1:]):  # contiguous on the grid: no gap fetched, none missed
            assert b.span.start_ms == a.span.end_ms + step
        if len(us) > 1:
            assert f.span.points <= max_points


# --- cell_of -----------------------------------------------------------------------------------


def test_cell_of_by_its_defining_properties() -> None:
    rng = random.Random(29)
    for _ in range(5_000):
        interval = rng.choice([H, 2 * H, 86_400_000, 7_000])
        step = rng.choice([1, 1_000, 15_000, 30_000, 45_000, 60_000, 7_000, 86_400_000, 3 * H])
        start = rng.randrange(0, 2 * 10**12)
        first, last = cell_of(start, step, interval)
        lo = start // interval * interval
        hi = lo + interval - 1
        # Points of start's grid (start + k*step, k of any sign) ...
        assert (first - start) % step == 0 and (last - start) % step == 0
        # ... the first and last of them inside [lo, hi].
        assert lo <= first and first - step < lo
        if first <= hi:
            assert first <= last <= hi and last + step > hi
        else:  # a step longer than the interval may have no point in it
            assert last < first


def test_cell_of_worked_example() -> None:
    # 10:07:15 on a 60 s grid, hour cells: the cell's points run 10:00:15 .. 10:59:15.
    start = T0 + 7 * 60_000 + 15_000
    assert cell_of(start, 60_000, H) == (T0 + 15_000, T0 + 59 * 60_000 + 15_000)


# --- units and slots ---------------------------------------------------------------------------


def test_a_unit_is_storable_only_with_a_key_and_a_ttl() -> None:
    from proxy.cache import CacheKey

    span = Span.range(T0, T0 + H - STEP, STEP)
    key = CacheKey("up", span)
    assert Unit("up", None, -1, span, key=key, ttl_ms=60_000).storable
    assert not Unit("up", None, -1, span, key=key, ttl_ms=0).storable  # recent data
    assert not Unit("up", None, -1, span, key=key, ttl_ms=None).storable
    assert not Unit("up", None, -1, span, key=None, ttl_ms=60_000).storable


def test_bare_unit_and_slot_order() -> None:
    shard = ShardSpec("Hostname", 2, 4, "=~", "a|b")
    p = Piece("sum(up)", Span.range(T0, T0 + H, STEP), shard=shard, role="count")
    u = bare_unit(p)
    assert (u.query, u.role, u.shard_index, u.span, u.key) == ("sum(up)", "count", 2, p.span, None)
    assert bare_unit(Piece("up", Span.instant(T0))).shard_index == -1
    # Slots sort by shard, then role, then time: the merge's order.
    slots = [Slot(Piece("q", Span.range(T0 + i * H, T0 + i * H, STEP), shard=ShardSpec("h", s, 4, "=~", "x"),
                      role=r), u) for i, s, r in [(2, 1, "sum"), (1, 1, "sum"), (0, 1, "count"), (5, 0, None)]]
    assert [s.order for s in sorted(slots, key=lambda s: s.order)] == [
        (0, "", T0 + 5 * H), (1, "count", T0), (1, "sum", T0 + H), (1, "sum", T0 + 2 * H)]


# --- coalesce_units ----------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "target"), [(1, 4), (4, 4), (24, 4), (24, 1), (24, 24), (24, 100), (7, 3), (168, 6)])
def test_contiguous_cells_become_about_target_calls(n: int, target: int) -> None:
    units = hour_units(n)
    fetches = coalesce_units(units, target)
    check_fetches(units, fetches, 11_000)
    assert len(fetches) == min(n, target)
    # Parts of ceil(n / calls) cells, the last one holding the rest.
    sizes = [len(f.units) for f in fetches]
    assert sizes[:-1] == [-(-n // len(fetches))] * (len(fetches) - 1) and 1 <= sizes[-1] <= sizes[0]
    assert [f.span.start_ms for f in fetches] == sorted(f.span.start_ms for f in fetches)


def test_a_gap_is_never_fetched() -> None:
    units = hour_units(3) + hour_units(3, start=T0 + 5 * H)  # hours 3 and 4 are cached
    fetches = coalesce_units(units, 1)
    check_fetches(units, fetches, 11_000)
    assert len(fetches) == 2
    assert [(f.span.start_ms, f.span.end_ms) for f in fetches] == [
        (T0, T0 + 3 * H - STEP), (T0 + 5 * H, T0 + 8 * H - STEP)]


def test_units_of_different_queries_shards_roles_grids_or_routes_are_never_mixed() -> None:
    units = (hour_units(4) + hour_units(4, query="max(up)") + hour_units(4, shard=0) + hour_units(4, shard=1)
             + hour_units(4, role="sum") + hour_units(4, role="count") + hour_units(4, step=60_000)
             + hour_units(4, route="amp"))
    random.Random(1).shuffle(units)
    fetches = coalesce_units(units, 8)
    check_fetches(units, fetches, 11_000)
    assert len(fetches) == 8  # one per kind: each run of 4 contiguous cells is one call
    # The same query on a grid shifted by 15 s: its cells interleave with the others', none
    # contiguous with another, so each is a call of its own (never one call over both grids).
    shifted = hour_units(4) + hour_units(4, start=T0 + 15_000)
    fetches = coalesce_units(shifted, 2)
    check_fetches(shifted, fetches, 11_000)
    assert len(fetches) == 8


def test_no_call_asks_for_more_than_max_points_steps() -> None:
    units = hour_units(48, step=15_000)  # 240 points an hour
    for max_points in (240, 241, 500, 1_000, 11_000):
        fetches = coalesce_units(units, 1, max_points=max_points)
        check_fetches(units, fetches, max_points)
        assert len(fetches) == -(-48 * 240 // (max_points // 240 * 240))
    # A single unit longer than the limit is never cut (its cell was planned that way).
    day = [Unit("q", None, -1, Span.range(T0, T0 + 86_400_000 - 15_000, 15_000))]
    assert [f.units for f in coalesce_units(day, 4, max_points=1_000)] == [tuple(day)]


def test_weights_by_cells_spread_time_evenly() -> None:
    """Six day cells then 24 hour cells (one contiguous week): weighed by the cells they span,
    the calls get equal time ranges; counted as units, day cells crowd into one call."""
    day, step = 86_400_000, 60_000
    days = [Unit("sum(up)", None, -1, Span.range(T0 + i * day, T0 + (i + 1) * day - step, step)) for i in range(6)]
    hours = hour_units(24, start=T0 + 6 * day, step=step)
    units = days + hours
    # 7 days in 7 calls, weighed in hour cells: a day each (the 24 hour cells are one day).
    fetches = coalesce_units(units, 7, cell_ms=H)
    check_fetches(units, fetches, 11_000)
    assert [f.span.end_ms - f.span.start_ms + step for f in fetches] == [day] * 7
    # Counted in units instead, 30 units in 7 calls: 5 units a call, the first five days in one.
    unweighted = coalesce_units(units, 7)
    check_fetches(units, unweighted, 11_000)
    assert unweighted[0].span.end_ms - unweighted[0].span.start_ms + step == 5 * day


def test_evenly_spaced_instants_become_one_range_call_over_those_times() -> None:
    step = 86_400_000
    times = [T0 + i * step for i in range(30)]
    units = [Unit("max_over_time(up[1d])", None, -1, Span.instant(t)) for t in reversed(times)]
    fetches = coalesce_units(units, 4)
    check_fetches(units, fetches, 11_000)
    assert len(fetches) == 1 and fetches[0].instants
    assert fetches[0].span == Span.range(times[0], times[-1], step)
    # At most max_points times a call.
    fetches = coalesce_units(units, 4, max_points=7)
    check_fetches(units, fetches, 7)
    assert [len(f.units) for f in fetches] == [7, 7, 7, 7, 2]


def test_uneven_duplicate_or_lone_instants_are_fetched_alone() -> None:
    q = "max_over_time(up[1d])"
    units = [Unit(q, None, -1, Span.instant(t)) for t in (T0, T0 + 10, T0 + 20, T0 + 20, T0 + 35)]
    fetches = coalesce_units(units, 4)
    check_fetches(units, fetches, 11_000)
    ranged = [f for f in fetches if f.instants]
    assert [[u.span.time_ms for u in f.units] for f in ranged] == [[T0, T0 + 10, T0 + 20]]
    alone = sorted(f.span.time_ms for f in fetches if not f.instants)
    assert alone == [T0 + 20, T0 + 35]  # the repeated time, and the one off the spacing
    # Any two instants are evenly spaced: a range call of two points.
    pair = [Unit(q, None, -1, Span.instant(t)) for t in (T0 + 35, T0 + 1_000)]
    assert [f.span for f in coalesce_units(pair, 4)] == [Span.range(T0 + 35, T0 + 1_000, 965)]
    # A lone instant of another query is its own call, not joined to these.
    other = Unit("up", None, -1, Span.instant(T0 + 30))
    fetches = coalesce_units([*units, other], 4)
    assert [f.units for f in fetches if f.query == "up"] == [(other,)]


def test_units_whose_route_changes_along_their_range_are_fetched_alone() -> None:
    split = hour_units(3, route="split:amp|prometheus")
    instant = Unit("q", None, -1, Span.instant(T0), route="split:x")
    fetches = coalesce_units([*split, instant], 1)
    check_fetches([*split, instant], fetches, 11_000)
    assert sorted(len(f.units) for f in fetches) == [1, 1, 1, 1]


def test_no_units_no_calls() -> None:
    assert coalesce_units([], 4) == []


# --- fit ---------------------------------------------------------------------------------------


def test_fit_cuts_a_cells_answer_to_the_piece() -> None:
    cell = Span.range(T0, T0 + H - STEP, STEP)
    ts = list(range(T0, T0 + H, STEP))
    answer = QueryResult.from_series("matrix", [({"a": "1"}, ts, [float(i) for i in range(len(ts))]),
                                                ({"a": "2"}, ts[:10], [1.0] * 10)])
    part = Span.range(T0 + 20 * STEP, T0 + 40 * STEP, STEP)
    slot = Slot(Piece("q", part), Unit("q", None, -1, cell))
    cut = fit(slot, answer)
    rows = cut.to_pylist()
    assert [labels for labels, _, _ in rows] == [{"a": "1"}]  # the second series has no point in it
    assert rows[0][1] == list(range(part.start_ms, part.end_ms + 1, STEP))
    assert rows[0][2] == [float(i) for i in range(20, 41)]
    # The whole cell asked for, or an instant: the answer as it is.
    assert fit(Slot(Piece("q", cell), Unit("q", None, -1, cell)), answer) is answer
    vec = QueryResult.from_series("vector", [({}, [T0], [1.0])])
    assert fit(Slot(Piece("q", Span.instant(T0)), Unit("q", None, -1, Span.instant(T0))), vec) is vec
