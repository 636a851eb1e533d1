"""SlotMaker (proxy/pipeline/slots.py): each planned piece with the cache unit fetched for it and
the keys that can answer it, best first.

The plans are the planner's own (`shardplanner.planner.plan`, split by the hour); times are
chosen so that the expected cells follow from the grid: hour cells of the query's step grid,
day cells of old days, and the freshness line `cache.max_freshness` (10 m by default) before
now."""

from __future__ import annotations

from dataclasses import replace

from loadtests.gen import iso_utc
from proxy.backends import Backend
from proxy.config import Config, build_config
from proxy.pipeline.hybrid.route import router_for
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.units import Slot
from proxy.pipeline.values import CacheCtx
from shardplanner.plan import Plan, PlannerSettings, QueryRequest, Span
from shardplanner.planner import plan

M = 60_000
H = 60 * M
D = 24 * H
T0 = 1_700_000_000_000 // D * D  # midnight UTC
CONFIG = build_config({"backends": [{"url": "http://127.0.0.1:1"}]})
OLD = CacheCtx("", ("prometheus",), T0 + 30 * D, 300_000)  # now: a month after the data


def planned(query: str, start_ms: int, end_ms: int, step_ms: int = M, days_until: int | None = None) -> Plan:
    return plan(QueryRequest.range(query, start_ms, end_ms, step_ms), PlannerSettings(split_interval_ms=H), {},
                day_cells_until_ms=days_until)


def slots(p: Plan, ctx: CacheCtx | None = OLD, config: Config = CONFIG) -> list[Slot]:
    return SlotMaker(config, H).slots(p, ctx)


def spans(s: Slot) -> list[tuple[int, int]]:
    return [(k.span.start_ms, k.span.end_ms) for k in s.keys]


def test_without_the_cache_each_piece_is_its_own_unit_without_keys() -> None:
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL)", T0 + 10 * M, T0 + 3 * H)
    got = slots(p, None)
    assert [s.piece for s in got] == list(p.pieces) and len(got) == 4
    assert all(s.unit.span == s.piece.span and s.unit.key is None and s.keys == () for s in got)


def test_an_old_partial_hour_is_fetched_and_found_as_its_whole_cell() -> None:
    # 00:10 .. 03:10 every minute: pieces 00:10-00:59, 01, 02, 03:00-03:10.
    p = planned("sum(rate(DCGM_FI_DEV_GPU_UTIL[5m]))", T0 + 10 * M, T0 + 3 * H + 10 * M)
    first, *middle, last = slots(p)
    assert [s.piece.span.start_ms for s in (first, *middle, last)] == [T0 + 10 * M, T0 + H, T0 + 2 * H, T0 + 3 * H]
    # A partial hour: the whole hour's cell is fetched (once stored it answers any later query
    # over any part of that hour) and looked up by the cell's key only: the piece is never
    # stored as itself (a sliding window's edge pieces would be a Redis read each for nothing).
    assert first.unit.span == Span.range(T0, T0 + H - M, M)
    assert spans(first) == [(T0, T0 + H - M)]
    assert last.unit.span == Span.range(T0 + 3 * H, T0 + 4 * H - M, M)
    assert spans(last) == [(T0 + 3 * H, T0 + 4 * H - M)]
    for s in middle:  # a whole hour is its own cell: one key
        assert s.unit.span == s.piece.span and spans(s) == [(s.piece.span.start_ms, s.piece.span.end_ms)]
    assert all(s.unit.storable and s.unit.ttl_ms == CONFIG.cache.ttl for s in (first, *middle, last))


def test_a_cell_is_not_extended_when_the_config_says_so_or_into_fresh_data() -> None:
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL)", T0 + 10 * M, T0 + 2 * H)
    off = build_config({"backends": [{"url": "http://127.0.0.1:1"}], "cache": {"extend_partial": False}})
    first = slots(p, config=off)[0]
    assert first.unit.span == first.piece.span  # fetched as asked ...
    assert spans(first) == [(T0, T0 + H - M), (T0 + 10 * M, T0 + H - M)]  # ... a stored cell still answers it
    # Now is 00:55: the hour's cell ends in data still changing: not extended, not stored.
    fresh = slots(p, replace(OLD, now_ms=T0 + 55 * M))[0]
    assert fresh.unit.span == fresh.piece.span and not fresh.unit.storable


def test_the_live_edge_is_not_stored() -> None:
    now = T0 + 3 * H
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL)", T0 + H, now)
    got = slots(p, replace(OLD, now_ms=now))
    # Pieces whose data ends more than max_freshness before now get the long TTL; the rest
    # (the default recent_ttl is 0) none.
    line = now - CONFIG.cache.max_freshness
    for s in got:
        old = s.piece.span.end_ms <= line
        assert s.unit.storable == old, (s.piece.span, line)
    assert got[0].unit.storable and not got[-1].unit.storable


def test_old_days_are_answered_by_their_day_cell_first() -> None:
    # 22:00 on day 0 .. 02:00 on day 2, every 5 m; days before day 2 are cut as day cells.
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL)", T0 + 22 * H, T0 + 2 * D + 2 * H, 5 * M, days_until=T0 + 2 * D)
    got = slots(p)
    day0 = (T0, T0 + D - 5 * M)
    by_start = {s.piece.span.start_ms: s for s in got}
    # Day 0 is held in part: its hour pieces are looked up in the day's cell first.
    for h in (22, 23):
        s = by_start[T0 + h * H]
        assert s.day is not None and (s.day.span.start_ms, s.day.span.end_ms) == day0
        assert spans(s)[0] == day0 and spans(s)[-1] == (s.piece.span.start_ms, s.piece.span.end_ms)
    # Day 1 is held whole: one piece, its own day cell.
    whole = by_start[T0 + D]
    assert (whole.piece.span.start_ms, whole.piece.span.end_ms) == (T0 + D, T0 + 2 * D - 5 * M)
    assert whole.day is whole.unit and spans(whole) == [(T0 + D, T0 + 2 * D - 5 * M)]
    # Day 2 is after the line: hour cells only.
    assert all(s.day is None for s in got if s.piece.span.start_ms >= T0 + 2 * D)


def test_each_shards_pieces_are_answered_by_that_shards_day_cell() -> None:
    """A sharded query's pieces in a day held in part: each shard's are looked up in its own
    day cell. (One day unit per day was once shared by all shards: every shard read shard 0's
    cell, and the merge met the same samples four times.)"""
    hosts = [f"gpu-node-{i:04d}" for i in range(8)]
    p = plan(QueryRequest.range("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", T0 + 20 * H, T0 + D + 2 * H, 5 * M),
             PlannerSettings(split_interval_ms=H, shards=4), {"Hostname": hosts}, day_cells_until_ms=T0 + D)
    got = [s for s in slots(p) if s.piece.span.start_ms < T0 + D]
    assert {s.piece.shard.index for s in got if s.piece.shard} == {0, 1, 2, 3}
    for s in got:
        assert s.day is not None and s.day.key is not None and s.piece.shard is not None
        assert s.keys[0] == s.day.key
        assert s.day.query == s.piece.query  # the day cell of this shard's query
    by_shard = {s.piece.shard.index: s.day.key.digest for s in got if s.piece.shard and s.day and s.day.key}
    assert len(set(by_shard.values())) == 4


def test_a_query_the_cache_cannot_key_has_no_key() -> None:
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL", T0, T0 + H - M)  # does not parse: forwarded as is
    assert all(s.unit.key is None and s.keys == () for s in slots(p))
    # A query that reads nothing (no selector) is keyed: its answer never changes.
    assert all(s.unit.storable for s in slots(planned("vector(1)", T0, T0 + H - M)))


def test_keys_are_per_tenant_and_route() -> None:
    p = planned("sum(DCGM_FI_DEV_GPU_UTIL)", T0, T0 + H - M)
    maker = SlotMaker(CONFIG, H)  # one maker for all: whatever it keeps must not mix them up
    (a,), (b,), (c,) = (maker.slots(p, ctx) for ctx in (OLD, replace(OLD, tenant="team-b"),
                                                         replace(OLD, route=("other",))))
    (again,) = maker.slots(p, OLD)
    assert again.unit.key == a.unit.key
    assert a.unit.key is not None and b.unit.key is not None and c.unit.key is not None
    assert len({a.unit.key.digest, b.unit.key.digest, c.unit.key.digest}) == 3
    assert (b.unit.key.tenant, c.unit.key.route) == ("team-b", ("other",))


def test_on_a_hybrid_fleet_each_unit_carries_its_pieces_route() -> None:
    # amp holds the data until T0+2h30m, local since T0+2h: the first hour is amp's, the last local's.
    cfg = build_config({"backends": [
        {"name": "local", "url": "http://127.0.0.1:1", "holds": {"since": iso_utc((T0 + 2 * H) // 1000)}},
        {"name": "amp", "url": "http://127.0.0.1:2", "holds": {"until": iso_utc((T0 + 150 * M) // 1000)}},
    ]})
    req = QueryRequest.range("sum(DCGM_FI_DEV_GPU_UTIL)", T0, T0 + 4 * H - M, M)
    p = plan(req, PlannerSettings(split_interval_ms=H), {})
    router = router_for([Backend(b) for b in cfg.backends], req, p)
    for ctx in (OLD, None):
        got = SlotMaker(cfg, H).slots(p, ctx, router)
        first, last = got[0].unit, got[-1].unit
        assert first.routed is not None and first.routed.backends == ("amp",)
        assert last.routed is not None and last.routed.backends == ("local",)
        assert first.route != last.route
        if ctx is not None:  # the route id is the first part of the key's route
            assert first.key is not None and last.key is not None
            assert (first.key.route[0], last.key.route[0]) == (first.route, last.route)
