"""Fetch leases: a piece missing from the cache costs one backend call across the processes
sharing a Redis (proxy/pipeline/leases.py, proxy/cache/leases.py).

- the lease table and the waiting logic against a real redis-server, two `Leases` standing for
  two processes: a waiter reads what the owner stored; fetches itself when the lease goes
  without a piece, when it expires (owner gone), at half its deadline, and when Redis fails;
  the owner's renewals keep a lease past its TTL;
- two real promaccel processes sharing a real Redis, each in front of its own recording
  backend (in front of the real Prometheus): concurrent identical cold queries spread over
  both cost one process's backend calls and answer as Prometheus does; a winner whose backend
  fails, a winner killed mid-fetch, a waiter near its deadline and Redis stopped mid-wait all
  leave the waiters fetching for themselves, with Prometheus's answer.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from loadtests.compare import diff_answers
from proxy.cache import CacheItem, CacheKey, PieceMeta, RedisStore
from proxy.cache.leases import lease_key
from proxy.codec import arrow
from proxy.config import build_config
from proxy.observe.metrics import METRICS
from proxy.pipeline.cache_read import CacheReader
from proxy.pipeline.landing import Landing
from proxy.pipeline.leases import Claim, Leases
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.units import Unit
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.faulty import FaultyBackend
from tests.recording import Recorder, recording_backend
from tests.servers import Promaccel, RedisServer, free_port

pytestmark = [pytest.mark.redis]

H = 3600
QUERY_PATHS = ("/api/v1/query", "/api/v1/query_range")


# --- the lease table and the wait, in process ----------------------------------------------------


def unit(i: int) -> Unit:
    span = Span.range(i * H * 1000, (i + 1) * H * 1000 - 30_000, 30_000)
    key = CacheKey(query="sum(DCGM_FI_DEV_FB_USED)", span=span, route=("prometheus",))
    return Unit(key.query, None, -1, span, key=key, ttl_ms=600_000)


def cell(i: int) -> QueryResult:
    return QueryResult.from_series("matrix", [({"i": str(i)}, [i * H * 1000], [float(i)])])


class Proc:
    """What one promaccel process holds of leases: its store, reader and Leases."""

    def __init__(self, url: str, lease_ms: int = 2000, **store_kw: Any) -> None:
        self.config = build_config({"backends": [{"url": "http://127.0.0.1:1"}],
                                    "cache": {"redis_url": url, "fetch_lease": f"{lease_ms}ms"}})
        self.store = RedisStore(url, timeout_ms=200, **store_kw)
        reader = CacheReader(self.config, lambda: self.store, Landing(), SlotMaker(self.config, H * 1000))
        self.leases = Leases(self.config, lambda: self.store, reader)

    async def put(self, i: int) -> None:
        u = unit(i)
        assert u.key is not None
        await self.store.put_many([CacheItem(u.key, arrow.to_ipc_bytes(cell(i), None), 600_000,
                                             PieceMeta(("DCGM_FI_DEV_FB_USED",), 0, 1, int(time.time() * 1000)))])

    async def aclose(self) -> None:
        await self.leases.aclose()
        await self.store.aclose()


def lease_count(result: str) -> float:
    return METRICS.cache_leases.labels(result)._value.get()  # type: ignore[attr-defined, no-any-return]


@pytest.fixture()
def rurl(redis_server: RedisServer) -> str:
    arrow.to_ipc_bytes(cell(0), None)  # the first encoding imports pyarrow: not inside a timed step
    url = redis_server.url.rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(url).flushdb()
    return url


def test_a_lease_is_one_processs_and_only_its_owner_lets_it_go(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl), Proc(rurl)
        try:
            units = [unit(1), unit(2)]
            assert await a.leases.acquire(units) == Claim({u.key.digest for u in units if u.key}, {})
            assert await b.leases.acquire(units) == Claim(set(), {})
            # Another's token neither lets go nor renews it.
            table = b.store.leases
            assert table is not None
            d = units[0].key.digest if units[0].key else ""
            await table.release([d], ["not-the-owner"])
            assert await table.renew([d], ["not-the-owner"], 60_000) == [False]
            r = redis.Redis.from_url(rurl)
            assert r.exists(lease_key(d))
            held, payloads = await table.poll([u.key for u in units if u.key]) or ([], [])
            assert held == [True, True] and payloads == [None, None]
            a.leases.release([d])
            for _ in range(50):
                if not r.exists(lease_key(d)):
                    break
                await asyncio.sleep(0.01)
            assert not r.exists(lease_key(d))
            assert await b.leases.acquire([units[0]]) == Claim({d}, {})
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_piece_stored_since_the_lookup_is_read_not_fetched(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl), Proc(rurl)
        try:
            await a.put(10)  # landed between b's lookup and its fetch
            u, other = unit(10), unit(11)
            claim = await b.leases.acquire([u, other])
            assert claim is not None and u.key is not None and other.key is not None
            assert claim.won == {other.key.digest}
            assert claim.found[u.key.digest].labels == cell(10).labels
            r = redis.Redis.from_url(rurl)
            for _ in range(50):  # its lease, taken in the same round trip, is let go again
                if not r.exists(lease_key(u.key.digest)):
                    break
                await asyncio.sleep(0.01)
            assert not r.exists(lease_key(u.key.digest)) and r.exists(lease_key(other.key.digest))
            assert set(b.leases.held) == {other.key.digest}
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_renewals_keep_a_lease_past_its_ttl(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl, lease_ms=300), Proc(rurl, lease_ms=300)
        try:
            assert await a.leases.acquire([unit(3)]) == Claim({unit(3).key.digest if unit(3).key else ""}, {})
            await asyncio.sleep(1.0)  # 3 TTLs
            assert await b.leases.acquire([unit(3)]) == Claim(set(), {})
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_waiter_reads_what_the_owner_stored(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl), Proc(rurl)
        try:
            units = [unit(4), unit(5)]
            assert (await a.leases.acquire(units) or Claim(set(), {})).won
            assert await b.leases.acquire(units) == Claim(set(), {})
            before = lease_count("landed")
            waiting = asyncio.create_task(b.leases.wait(units, timeout_s=30))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await a.put(4)
            await a.put(5)
            a.leases.release([u.key.digest for u in units if u.key])
            landed, here = await asyncio.wait_for(waiting, 5)
            assert here == []
            for i, u in zip((4, 5), units):
                assert u.key is not None
                got = landed[u.key.digest]
                assert got.labels == cell(i).labels and got.t_ms.tolist() == cell(i).t_ms.tolist()
            assert lease_count("landed") - before == 2
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_waiter_fetches_itself_when_the_lease_goes_without_a_piece(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl), Proc(rurl)
        try:
            u = unit(6)
            assert (await a.leases.acquire([u]) or Claim(set(), {})).won
            waiting = asyncio.create_task(b.leases.wait([u], timeout_s=30))
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            a.leases.release([u.key.digest] if u.key else [])  # nothing stored (warnings, say)
            landed, here = await asyncio.wait_for(waiting, 5)
            assert landed == {} and here == [u]
            assert time.monotonic() - t0 < 0.5
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_waiter_fetches_itself_when_the_owner_is_gone_and_its_lease_expires(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl, lease_ms=400), Proc(rurl, lease_ms=400)
        try:
            u = unit(7)
            assert (await a.leases.acquire([u]) or Claim(set(), {})).won
            assert a.leases._renewer is not None
            a.leases._renewer.cancel()  # the owner died: nobody renews or releases
            before = lease_count("released")
            t0 = time.monotonic()
            landed, here = await asyncio.wait_for(b.leases.wait([u], timeout_s=30), 5)
            assert landed == {} and here == [u]
            assert 0.2 < time.monotonic() - t0 < 1.5
            assert lease_count("released") - before == 1
        finally:
            a.leases.held.clear()
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_waiter_gives_up_at_half_its_deadline(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl), Proc(rurl)
        try:
            u = unit(8)
            assert (await a.leases.acquire([u]) or Claim(set(), {})).won  # held and renewed: a slow fetch
            before = lease_count("timeout")
            t0 = time.monotonic()
            landed, here = await b.leases.wait([u], timeout_s=0.8)
            assert landed == {} and here == [u]
            assert 0.3 < time.monotonic() - t0 < 0.7
            assert lease_count("timeout") - before == 1
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_without_redis_there_are_no_leases_and_nobody_waits() -> None:
    async def main() -> None:
        p = Proc(f"redis://127.0.0.1:{free_port()}/0")
        try:
            before = lease_count("error")
            assert await p.leases.acquire([unit(9)]) is None
            landed, here = await p.leases.wait([unit(9)], timeout_s=30)
            assert landed == {} and here == [unit(9)]
            assert lease_count("error") - before == 2
        finally:
            await p.aclose()

    asyncio.run(main())


def test_leases_on_a_redis_cluster(tmp_path: Path) -> None:
    from tests.redis_cluster import LocalCluster

    cluster = LocalCluster.start(tmp_path / "cluster")
    try:
        async def main() -> None:
            a, b = Proc(cluster.url), Proc(cluster.url)
            try:
                units = [unit(i) for i in range(20, 30)]  # keys over every node
                digests = {u.key.digest for u in units if u.key}
                assert await a.leases.acquire(units) == Claim(digests, {})
                assert await b.leases.acquire(units) == Claim(set(), {})
                await a.put(20)
                a.leases.release(digests)
                landed, here = await asyncio.wait_for(b.leases.wait(units, timeout_s=30), 10)
                assert list(landed) == [units[0].key.digest if units[0].key else ""] and here == units[1:]
                assert await b.leases.acquire(units[1:]) == Claim(digests - set(landed), {})
                table = b.store.leases
                assert table is not None
                assert await table.renew([d for d in b.leases.held], [t for t, _ in b.leases.held.values()],
                                         60_000) == [True] * 9
            finally:
                await a.aclose()
                await b.aclose()

        asyncio.run(main())
    finally:
        cluster.stop()


def test_leases_off_or_in_process_store() -> None:
    cfg = build_config({"backends": [{"url": "http://127.0.0.1:1"}], "cache": {"fetch_lease": "0s"}})
    assert cfg.cache.fetch_lease == 0
    cfg = build_config({"backends": [{"url": "http://127.0.0.1:1"}]})
    assert cfg.cache.fetch_lease == 5_000
    from proxy.cache import MemoryStore

    store = MemoryStore(1 << 20)
    reader = CacheReader(cfg, lambda: store, Landing(), SlotMaker(cfg, H * 1000))
    assert Leases(cfg, lambda: store, reader).table() is None
    assert asyncio.run(Leases(cfg, lambda: store, reader).acquire([unit(1)])) is None


# --- two promaccel processes sharing a Redis --------------------------------------------------------

HTTP = httpx.Client(timeout=120)


def backend_calls(rec: Recorder) -> int:
    return sum(1 for s in rec.snapshot() if s.path in QUERY_PATHS)


def metric(proxy: Promaccel, name: str, label: str = "") -> float:
    text = HTTP.get(proxy.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and label in line and not line.startswith("#"))


def assert_same(direct: httpx.Response, proxied: httpx.Response, what: Any) -> None:
    assert proxied.status_code == direct.status_code, (what, proxied.text[:300])
    problems = diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content))
    assert problems == [], (what, problems[:5])


def start(workdir: Path, backend: str, redis_url: str, lease: str = "2s", query_timeout: str = "2m") -> Promaccel:
    cfg = workdir / f"config-{free_port()}.yaml"
    # The answer-bytes budget off: it would let a storm of identical queries in one after the
    # other (each then finds the cell in Redis), and these tests are about concurrent fetches.
    # The breaker off: some tests make the backend fail on purpose.
    cfg.write_text(yaml.safe_dump({"backends": [{"url": backend, "retries": 0, "breaker": {"failures": 0}}],
                                   "cache": {"redis_url": redis_url, "fetch_lease": lease},
                                   "limits": {"query_timeout": query_timeout, "max_inflight_answer_bytes": 0}}))
    return Promaccel.start(None, ("--config", str(cfg), "--split-interval", "1h"), workdir)


class Pair:
    """promaccel A and B sharing one Redis and one backend (as replicas do: the backend is part
    of every cache key): a recorder (counts calls, adds delays) in front of a fault injector
    in front of Prometheus. B's queries time out after 4 s (it stops waiting at 2 s)."""

    def __init__(self, prom: Any, workdir: Path, redis_url: str, rec: Recorder, faulty: FaultyBackend,
                 lease: str = "2s") -> None:
        self.prom, self.rec, self.faulty = prom, rec, faulty
        self.a = start(workdir, rec.url, redis_url, lease)
        self.b = start(workdir, rec.url, redis_url, lease, query_timeout="4s")

    def calls(self) -> int:
        return backend_calls(self.rec)

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


@contextmanager
def pair_of(prom: Any, workdir: Path, redis_url: str, lease: str = "2s") -> Iterator[Pair]:
    faulty = FaultyBackend(prom.url).start()
    try:
        with recording_backend(faulty.url) as rec:
            p = Pair(prom, workdir, redis_url, rec, faulty, lease)
            try:
                yield p
            finally:
                p.stop()
    finally:
        faulty.stop()


def window(prom: Any, hour: int, hours: int = 2) -> tuple[int, int]:
    s0 = (prom.start_s // H + 1) * H + hour * H
    return s0, s0 + hours * H - 30


def params(q: str, start: int, end: int, **kw: str) -> dict[str, str]:
    return {"query": q, "start": str(start), "end": str(end), "step": "30", **kw}


def db(server: RedisServer, n: int) -> str:
    url = server.url.rsplit("/", 1)[0] + f"/{n}"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def pair(prom: Any, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    try:
        with pair_of(prom, tmp_path_factory.mktemp("leases"), db(redis_server, 12)) as p:
            yield p
    finally:
        HTTP.close()


async def _storm(requests: list[tuple[str, dict[str, str]]], stagger_s: float = 0.0) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        async def one(i: int, url: str, p: dict[str, str]) -> httpx.Response:
            await asyncio.sleep(i * stagger_s)
            return await client.post(url + "/api/v1/query_range", data=p)

        return await asyncio.gather(*(one(i, url, p) for i, (url, p) in enumerate(requests)))


def leases(proxy: Promaccel, result: str) -> float:
    return metric(proxy, "promaccel_cache_leases_total", f'result="{result}"')


# One hour on the hour: one piece, the query left whole (Forward); two hours: planned pieces
# fetched as cells (Coalesce, FanOut, Fetcher).
PATHS = pytest.mark.parametrize("hours", [1, 2], ids=["whole", "planned"])


@PATHS
def test_identical_cold_queries_over_two_processes_cost_one_processs_calls(pair: Pair, hours: int) -> None:
    q = f"sum by (namespace, modelName) (DCGM_FI_DEV_FB_USED) * {hours}"
    pair.rec.delay_s = 0.2  # calls overlap the way a cold dashboard's do
    try:
        before = pair.calls()
        HTTP.post(pair.a.url + "/api/v1/query_range", data=params(q, *window(pair.prom, 0, hours)))
        one = pair.calls() - before
        assert one >= hours
        p = params(q, *window(pair.prom, 2, hours))
        before = pair.calls()
        answers = asyncio.run(_storm([(pair.a.url if i % 2 else pair.b.url, p) for i in range(20)]))
        both = pair.calls() - before
    finally:
        pair.rec.delay_s = 0.0
    direct = HTTP.post(pair.prom.url + "/api/v1/query_range", data=p)
    for a in answers:
        assert_same(direct, a, "storm")
    assert both == one, (both, one)
    assert leases(pair.a, "landed") + leases(pair.b, "landed") >= 1


@PATHS
def test_a_winner_whose_backend_fails_leaves_the_waiters_fetching_themselves(pair: Pair, hours: int) -> None:
    p = params(f"max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) * {hours}", *window(pair.prom, 1, hours))
    pair.faulty.set("json503", first=1)  # the first call fails (after the recorder's second)
    pair.rec.delay_s = 1.0
    released = leases(pair.b, "released")
    before = pair.calls()
    try:
        # A first (it takes the lease; its call fails after 1 s); B waits for it, then fetches.
        failed, answered = asyncio.run(_storm([(pair.a.url, p), (pair.b.url, p)], stagger_s=0.4))
    finally:
        pair.faulty.set(None)
        pair.rec.delay_s = 0.0
    assert failed.status_code >= 500, failed.text[:300]
    assert_same(HTTP.post(pair.prom.url + "/api/v1/query_range", data=p), answered, "waiter")
    assert pair.calls() - before == 2 * hours  # B's own calls, once A's failed
    assert leases(pair.b, "released") > released


def test_a_waiter_near_its_deadline_fetches_itself(pair: Pair) -> None:
    p = params("min by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", *window(pair.prom, 3, hours=1))
    pair.faulty.set("stall", first=1)  # the first call takes 3 s, the next is answered at once
    timeouts = leases(pair.b, "timeout")
    try:
        t0 = time.monotonic()
        slow, quick = asyncio.run(_storm([(pair.a.url, p), (pair.b.url, p)], stagger_s=0.4))
        took_s = time.monotonic() - t0
    finally:
        pair.faulty.set(None)
    direct = HTTP.post(pair.prom.url + "/api/v1/query_range", data=p)
    assert_same(direct, slow, "winner")
    assert_same(direct, quick, "waiter")  # within its 4 s: it waited 2 s, then fetched
    assert leases(pair.b, "timeout") > timeouts
    assert took_s >= 2.9  # the winner's stalled call
    assert quick.elapsed.total_seconds() < 2.9  # the waiter did not wait for it


def test_a_winner_killed_mid_fetch_lets_its_lease_expire(prom: Any, redis_server: RedisServer,
                                                        tmp_path: Path) -> None:
    with pair_of(prom, tmp_path, db(redis_server, 13), lease="1s") as pair:
        p = params("avg by (namespace) (DCGM_FI_DEV_POWER_USAGE)", *window(prom, 1, hours=1))
        pair.faulty.set("stall", first=1)

        async def main() -> httpx.Response:
            async with httpx.AsyncClient(timeout=60) as client:
                doomed = asyncio.create_task(client.post(pair.a.url + "/api/v1/query_range", data=p))
                for _ in range(100):  # A holds the lease once its call reaches the backend
                    if pair.calls():
                        break
                    await asyncio.sleep(0.05)
                waiter = asyncio.create_task(client.post(pair.b.url + "/api/v1/query_range", data=p))
                await asyncio.sleep(0.3)
                pair.a.proc.send_signal(signal.SIGKILL)
                got = await waiter
                doomed.cancel()
                return got

        answered = asyncio.run(main())
        pair.faulty.set(None)
        assert pair.calls() == 2
        assert_same(HTTP.post(prom.url + "/api/v1/query_range", data=p), answered, "after the owner died")
        assert leases(pair.b, "released") >= 1


def test_redis_stopped_while_waiting(prom: Any, tmp_path: Path) -> None:
    server = RedisServer.start(tmp_path / "redis-doomed")
    try:
        with pair_of(prom, tmp_path, server.url) as pair:
            p = params("count by (modelName) (DCGM_FI_DEV_GPU_UTIL > 10)", *window(prom, 2, hours=1))
            direct = HTTP.post(prom.url + "/api/v1/query_range", data=p)
            pair.faulty.set("stall", first=1)

            async def main() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=60) as client:
                    first = asyncio.create_task(client.post(pair.a.url + "/api/v1/query_range", data=p))
                    await asyncio.sleep(0.5)
                    second = asyncio.create_task(client.post(pair.b.url + "/api/v1/query_range", data=p))
                    await asyncio.sleep(0.5)
                    server.stop()
                    return [await first, await second]

            for r in asyncio.run(main()):
                assert_same(direct, r, "redis stopped mid-wait")
            pair.faulty.set(None)
            other = params("sum(DCGM_FI_DEV_GPU_UTIL)", *window(prom, 3, hours=1))
            d2 = HTTP.post(prom.url + "/api/v1/query_range", data=other)
            for proxy in (pair.a, pair.b):
                assert_same(d2, HTTP.post(proxy.url + "/api/v1/query_range", data=other), "redis down")
            assert leases(pair.b, "error") >= 1
    finally:
        server.stop()
