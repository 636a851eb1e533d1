"""CacheWriter (proxy/pipeline/cache_write.py) over a store that records its puts: fetched
units landed at once and stored in the background, within the query's allowance of new cache
entries; fetch leases let go once the put landed; the bound on pending puts; revalidation
baselines taken (and recorded) for the caller's tenant."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.backends.tenancy import Caller, Tenant
from proxy.cache import CacheItem
from proxy.config import load_config
from proxy.pipeline.answer_bytes import AnswerBytes
from proxy.pipeline.cache_write import CacheWriter, digest_backend, groups_by_samples
from proxy.pipeline.context import Budget, RequestContext
from proxy.pipeline.landing import Landing
from proxy.pipeline.planning import Planner
from proxy.pipeline.revalidate import Revalidator
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.values import CacheCtx
from proxy.result import QueryResult
from tests.pipeline.stage_helpers import T0, FakeBackend, H, RecordingBackend, range_query, run, series

TEAM = Tenant((("x-scope-orgid", "team"),), "team")


class Store:
    """Records what is put; `gate` (when set) holds every put until it is released."""

    kind = "memory"

    def __init__(self) -> None:
        self.items: list[CacheItem] = []
        self.gate: asyncio.Event | None = None

    async def put_many(self, items: list[CacheItem]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.items.extend(items)


class Leases:
    def __init__(self) -> None:
        self.released: list[list[str]] = []

    def release(self, digests: Any) -> None:
        self.released.append(sorted(digests))


def config(**cache: Any) -> Any:
    return load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"split_interval": "1h"}, "cache": cache})


def units(cfg: Any, hours: int = 3) -> list[Any]:
    planner = Planner(cfg, FakeBackend())  # type: ignore[arg-type]
    q = range_query("up", hours=hours)
    plan = run(planner.plan(q.req))
    ctx = CacheCtx("", ("default",), T0 + 30 * 24 * H, q.req.lookback_ms)
    out = [s.unit for s in SlotMaker(cfg, planner.settings.split_interval_ms).slots(plan, ctx)]
    assert all(u.storable and u.key is not None for u in out)
    return out


def answers(us: list[Any]) -> list[QueryResult]:
    return [QueryResult.from_series("matrix", [series({u.start_ms: float(i)}, job="a")]) for i, u in enumerate(us)]


def test_keep_lands_at_once_and_stores_in_the_background() -> None:
    cfg = config()
    us = units(cfg)
    store, landing = Store(), Landing()
    writer = CacheWriter(cfg, lambda: store, landing)  # type: ignore[arg-type,return-value]

    async def main() -> None:
        store.gate = asyncio.Event()
        kept = writer.keep(us, answers(us), 10, {}, RequestContext())
        assert kept == {u.key.digest for u in us}
        # Landed before the put: another query may read them from memory.
        assert all(landing.landed(u.key.digest) is not None for u in us) and store.items == []
        store.gate.set()
        await asyncio.gather(*writer.tasks)
        assert sorted(i.key.digest for i in store.items) == sorted(kept)

    run(main())


def test_keep_respects_the_allowance_of_new_keys() -> None:
    cfg = config()
    us = units(cfg, hours=3)
    store, landing = Store(), Landing()
    writer = CacheWriter(cfg, lambda: store, landing)  # type: ignore[arg-type,return-value]
    ctx = RequestContext(budget=Budget(0, 2))

    async def main() -> set[str]:
        kept = writer.keep(us, answers(us), 10, {}, ctx)
        await asyncio.gather(*writer.tasks)
        return kept

    kept = run(main())
    assert kept == {us[0].key.digest, us[1].key.digest} and ctx.budget.keys == 2
    assert landing.landed(us[2].key.digest) is None and len(store.items) == 2


def test_keep_skips_answers_with_warnings_and_anything_fetched_before_an_invalidation() -> None:
    cfg = config()
    us = units(cfg, hours=2)
    store, landing = Store(), Landing()
    writer = CacheWriter(cfg, lambda: store, landing)  # type: ignore[arg-type,return-value]

    async def main() -> tuple[set[str], set[str]]:
        landing.invalidated_at_ms = 100
        stale = writer.keep(us, answers(us), 99, {}, RequestContext())
        landing.invalidated_at_ms = 0
        results = answers(us)
        results[0].warnings = ["partial answer"]  # an incomplete answer is never cached
        fresh = writer.keep(us, results, 200, {}, RequestContext())
        await asyncio.gather(*writer.tasks)
        return stale, fresh

    stale, fresh = run(main())
    assert stale == set() and fresh == {us[1].key.digest}
    assert [i.key.digest for i in store.items] == [us[1].key.digest]


def test_leases_are_let_go_after_the_put_landed() -> None:
    cfg = config()
    us = units(cfg, hours=2)
    store, leases = Store(), Leases()
    writer = CacheWriter(cfg, lambda: store, Landing(), leases)  # type: ignore[arg-type,return-value]
    mine = us[0].key.digest

    async def main() -> None:
        store.gate = asyncio.Event()
        writer.keep(us, answers(us), 10, {}, RequestContext(), leased={mine, "someone-elses"})
        await asyncio.sleep(0)
        assert leases.released == []  # the put has not landed: others still wait for it
        store.gate.set()
        await asyncio.gather(*writer.tasks)

    run(main())
    assert leases.released == [[mine]]  # only the leased digests this put stored


def test_leases_are_let_go_when_the_put_fails() -> None:
    cfg = config()
    us = units(cfg, hours=1)
    leases = Leases()

    class Broken(Store):
        async def put_many(self, items: list[CacheItem]) -> None:
            raise ConnectionError("redis went away")

    writer = CacheWriter(cfg, lambda: Broken(), Landing(), leases)  # type: ignore[arg-type,return-value]

    async def main() -> None:
        writer.keep(us, answers(us), 10, {}, RequestContext(), leased={us[0].key.digest})
        await asyncio.gather(*writer.tasks)

    run(main())
    assert leases.released == [[us[0].key.digest]]


def test_pending_puts_are_bounded() -> None:
    cfg = config(max_pending_puts=2)
    us = units(cfg, hours=3)
    store, landing = Store(), Landing()
    writer = CacheWriter(cfg, lambda: store, landing)  # type: ignore[arg-type,return-value]

    async def main() -> list[set[str]]:
        store.gate = asyncio.Event()
        kept = [writer.keep([u], [r], 10, {}, RequestContext()) for u, r in zip(us, answers(us))]
        assert len(writer.tasks) == 2
        store.gate.set()
        await asyncio.gather(*writer.tasks)
        return kept

    kept = run(main())
    assert [len(k) for k in kept] == [1, 1, 0]  # the third is dropped, not queued
    assert landing.landed(us[2].key.digest) is None and len(store.items) == 2


def test_a_put_holds_the_querys_reservation_until_it_lands() -> None:
    cfg = config()
    us = units(cfg, hours=1)
    store = Store()
    writer = CacheWriter(cfg, lambda: store, Landing())  # type: ignore[arg-type,return-value]

    async def main() -> tuple[int, int]:
        budget = AnswerBytes(1 << 30, 1.0)
        held = await budget.reserve(1000, 1.0)
        store.gate = asyncio.Event()
        writer.keep(us, answers(us), 10, {}, RequestContext(held=held))
        held.release()  # the answer is sent ...
        during = budget.used
        store.gate.set()
        await asyncio.gather(*writer.tasks)
        await asyncio.sleep(0)
        return during, budget.used

    during, after = run(main())
    assert during == 1000 and after == 0  # ... but the pieces stay in memory until the put lands


def test_baselines_are_taken_and_recorded_for_the_callers_tenant() -> None:
    cfg = config(revalidate_interval="1m")
    us = units(cfg, hours=2)
    backend = RecordingBackend()

    async def invalidate(*a: Any) -> int:
        return 0

    revalidator = Revalidator(backend, invalidate, interval_ms=60_000, max_age_ms=3_600_000, max_entries=100)
    store = Store()
    writer = CacheWriter(cfg, lambda: store, Landing(), None, revalidator)  # type: ignore[arg-type,return-value]
    caller = Caller(TEAM)

    async def main() -> tuple[Any, set[str]]:
        baselines = await writer.baselines(us, 5, caller)
        # A unit whose baseline could not be taken is not cached (it could not be revalidated).
        partial = dict(list(baselines.items())[:1])
        kept = writer.keep(us, answers(us), 10, partial, RequestContext(caller))
        await asyncio.gather(*writer.tasks)
        return baselines, kept

    baselines, kept = run(main())
    assert len(baselines) == 2 and len(backend.calls) == 2
    assert all(c[1] == "/api/v1/query" and c[3] is caller for c in backend.calls)  # the caller's headers
    assert len(kept) == 1 and len(store.items) == 1 and len(revalidator) == 1


def test_no_revalidator_no_baselines() -> None:
    cfg = config()
    writer = CacheWriter(cfg, lambda: Store(), Landing())  # type: ignore[arg-type,return-value]
    assert run(writer.baselines(units(cfg, 1), 5, Caller(TEAM))) == {}


def test_digest_backend_and_put_groups() -> None:
    class U:
        def __init__(self, route: str) -> None:
            self.route = route

    assert digest_backend(U("")) == ""  # type: ignore[arg-type]
    assert digest_backend(U("amp=abc")) == "amp"  # type: ignore[arg-type]
    assert digest_backend(U("overlap:a,b")) is None and digest_backend(U("split:a|b")) is None  # type: ignore[arg-type]

    class R:
        def __init__(self, n: int) -> None:
            self.n_samples = n

    entries = [(i, R(n)) for i, n in enumerate([3, 3, 5, 1, 1])]
    assert [[e[0] for e in g] for g in groups_by_samples(entries, 6)] == [[0, 1], [2, 3], [4]]  # type: ignore[arg-type]
