"""Landing's recent calls: bounded in count and in bytes, expired ones let go at once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.pipeline import landing as landing_mod
from proxy.pipeline.landing import Landing


@dataclass
class Reply:
    body: bytes


def test_recent_calls_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landing_mod, "RECENT_CALLS_MAX_BYTES", 10_000)
    zone = Landing()
    for i in range(4):
        zone.remember_call(("k", i), (Reply(b"x" * 3_000), 0, {}), 0)
    # 3 x 3,000 bytes fit in 10,000; the fourth does not.
    assert [zone.recent_call(("k", i)) is not None for i in range(4)] == [True, True, True, False]
    assert zone.recent_call(("k", 0))[0].body == b"x" * 3_000
    # Too big alone, as before.
    zone.remember_call(("big",), Reply(b"x" * (landing_mod.RECENT_CALL_MAX_BYTES + 1)), 0)
    assert zone.recent_call(("big",)) is None


def test_expired_calls_are_let_go_when_the_next_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(landing_mod.time, "monotonic", lambda: now[0])
    zone = Landing()
    zone.remember_call(("a",), Reply(b"a" * 100), 0)
    zone.remember_call(("b",), Reply(b"b" * 100), 0)
    now[0] += landing_mod.RECENT_CALL_S + 1
    zone.remember_call(("c",), Reply(b"c" * 100), 0)
    # a and b expired: gone (not only when the table is full), their bytes given back.
    assert set(zone._recent) == {("c",)} and zone._recent_bytes == 100
    assert zone.recent_call(("c",)) is not None
    zone.remember_call(("c",), Reply(b"c" * 50), 0)  # the same call again: replaced, not counted twice
    assert zone._recent_bytes == 50
    zone.forget_all()
    assert zone._recent_bytes == 0 and zone.recent_call(("c",)) is None


def test_large_pieces_leave_the_landing_zone_when_their_put_lands() -> None:
    """A heavy query's pieces are tens of megabytes: gone once stored (the next request
    reads the store); small ones stay for the grace, sparing a duplicate call."""
    import asyncio

    import numpy as np

    from proxy.result import QueryResult

    def piece(n: int) -> QueryResult:
        return QueryResult("matrix", [{"a": "b"}], np.array([0, n]), np.arange(n, dtype=np.int64),
                           np.zeros(n))

    async def scenario() -> None:
        zone = Landing()
        big, small = piece(landing_mod.GRACE_MAX_SAMPLES + 1), piece(10)
        zone.land("big", big, 0)
        zone.land("small", small, 0)
        zone.unland_later([("big", big), ("small", small)])
        assert zone.landed("big") is None and zone.landed("small") is small

    asyncio.run(scenario())


def test_the_grace_holds_a_few_megabytes_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small units stay for the grace while GRACE_MAX_BYTES of them are in it; beyond, they
    leave when their put lands (a burst of heavy queries kept 10-20 MiB of them), and the
    room comes back when the grace of the earlier ones is over."""
    import asyncio

    import numpy as np

    from proxy.result import QueryResult

    monkeypatch.setattr(landing_mod, "LANDING_GRACE_S", 0.1)
    n = landing_mod.GRACE_MAX_SAMPLES  # 1 MiB of samples each

    def piece() -> QueryResult:
        return QueryResult("matrix", [{"a": "b"}], np.array([0, n]), np.arange(n, dtype=np.int64), np.zeros(n))

    async def scenario() -> None:
        zone = Landing()
        pieces = [(f"p{i}", piece()) for i in range(6)]
        for d, r in pieces:
            zone.land(d, r, 0)
        zone.unland_later(pieces)
        fits = landing_mod.GRACE_MAX_BYTES // (16 * n)
        assert 0 < fits < 6
        assert [zone.landed(d) is not None for d, _ in pieces] == [i < fits for i in range(6)]
        assert zone._grace_bytes == fits * 16 * n
        await asyncio.sleep(0.2)
        assert all(zone.landed(d) is None for d, _ in pieces) and zone._grace_bytes == 0
        later = ("p9", piece())
        zone.land(*later, 0)
        zone.unland_later([later])
        assert zone.landed("p9") is later[1]

    asyncio.run(scenario())


def test_recent_calls_go_when_they_expire_though_no_call_comes_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a burst nothing calls again: the last calls (megabytes each) must still go."""
    import asyncio

    monkeypatch.setattr(landing_mod, "RECENT_CALL_S", 0.2)

    async def scenario() -> None:
        zone = Landing()
        zone.remember_call(("a",), Reply(b"a" * 100), 0)
        await asyncio.sleep(0.1)
        zone.remember_call(("b",), Reply(b"b" * 200), 0)
        assert zone._recent_bytes == 300
        await asyncio.sleep(0.15)  # a expired (0.2 s), b not yet (0.3 s)
        assert set(zone._recent) == {("b",)} and zone._recent_bytes == 200
        await asyncio.sleep(0.3)
        assert zone._recent == {} and zone._recent_bytes == 0 and zone._expiry is None

    asyncio.run(scenario())


def test_a_call_whose_cells_all_just_landed_is_answered_from_them() -> None:
    """A request that looked the cache up just before an identical call's cells landed gets
    them from the landing zone, without a backend call and without anything of that call
    kept besides its cells (the whole answer, kept a few seconds, was a second copy)."""
    import asyncio

    from proxy.cache import CacheKey
    from proxy.pipeline.fetch import Fetcher
    from proxy.pipeline.units import Fetch, Unit
    from proxy.pipeline.values import Query
    from proxy.result import QueryResult
    from shardplanner.plan import QueryRequest, Span

    step = 60_000
    hours = [(h * 3_600_000, (h + 1) * 3_600_000 - step) for h in range(3)]
    units = tuple(Unit("up", None, 0, Span.range(a, b, step), key=CacheKey("up", Span.range(a, b, step),
                                                                            lookback_ms=0)) for a, b in hours)
    cells = [QueryResult.from_series("matrix", [({"i": "1"}, [a, b], [1.0, 2.0])]) for a, b in hours]
    calls: list[Fetch] = []

    class Route:
        async def answer(self, f: Fetch, *args: object) -> QueryResult:
            calls.append(f)
            raise AssertionError("no backend call expected")

    async def scenario() -> None:
        zone = Landing()
        fetcher = Fetcher(zone, writer=None, route_answer=Route(), cache_enabled=True)  # type: ignore[arg-type]
        f = Fetch("up", None, 0, Span.range(hours[0][0], hours[-1][1], step), units)
        for u, c in zip(units, cells):
            assert u.key is not None
            zone.land(u.key.digest, c, 0)
        q = Query(req=QueryRequest.range("up", hours[0][0], hours[-1][1], step), pairs=[], path="/api/v1/query_range",
                  timeout_s=5.0)
        got = await fetcher.fetch(f, q)
        assert calls == [] and got.to_pylist() == [({"i": "1"}, [t for a, b in hours for t in (a, b)],
                                                     [1.0, 2.0] * 3)]
        one = Fetch("up", None, 0, units[1].span, units[1:2])
        assert await fetcher.fetch(one, q) is cells[1]

    asyncio.run(scenario())


def test_a_stored_unit_is_told_with_its_frames_tag_while_it_is_landed() -> None:
    """The tag the store wrote a landed unit under (RedisStore.put_many) is what an answer made
    of it is recalled by (pipeline/answer_memo.py); it goes with the unit, a new fetch of the
    same digest, or an invalidation."""
    import numpy as np

    from proxy.result import QueryResult

    def piece() -> QueryResult:
        return QueryResult("matrix", [{"a": "b"}], np.array([0, 1]), np.arange(1, dtype=np.int64), np.zeros(1))

    zone = Landing()
    a, other = piece(), piece()
    zone.land("a", a, 0)
    assert zone.tagged("a") is None
    zone.stored("a", b"tag-a", other)  # not the unit landed under that digest: ignored
    assert zone.tagged("a") is None
    zone.stored("a", b"tag-a", a)
    assert zone.tagged("a") == (b"tag-a", a)
    zone.land("a", other, 0)  # fetched again: its tag is not known yet
    assert zone.tagged("a") is None
    zone.stored("a", b"tag-b", other)
    zone.forget_all()
    assert zone.tagged("a") is None
