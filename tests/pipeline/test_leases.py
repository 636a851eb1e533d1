"""Fetch leases (proxy/pipeline/leases.py) shared between processes through a real Redis.

- real OS processes racing for the same pieces: each piece's lease is won by exactly one, and
  each lets go of what it holds when it shuts down;
- a waiter never waits past twice the lease time, however long its deadline;
- a lease held past what a query may run (a leak) is no longer renewed: it expires and
  another process takes it;
- a unit without a key gets no lease; a process lets go of its leases at shutdown.

The lease table itself (proxy/cache/leases.py) and the rest of the waiting (a piece landing,
an owner failing or dying, half the deadline, Redis down, a cluster):
tests/cache/test_fetch_leases.py; two promaccel processes end to end there too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from proxy.cache import CacheKey, RedisStore
from proxy.cache.leases import lease_key
from proxy.config import build_config
from proxy.pipeline.cache_read import CacheReader
from proxy.pipeline.landing import Landing
from proxy.pipeline.leases import Claim, Leases
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.units import Unit
from shardplanner.plan import Span

pytestmark = [pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
H = 3_600_000
QUERY = "max by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)"  # no other test's keys
RACERS = 3
BARRIER_S = 60.0


def unit(i: int) -> Unit:
    span = Span.range(i * H, (i + 1) * H - 30_000, 30_000)
    key = CacheKey(query=QUERY, span=span, route=("prometheus",))
    return Unit(QUERY, None, -1, span, key=key, ttl_ms=600_000)


def digest(u: Unit) -> str:
    assert u.key is not None
    return u.key.digest


class Proc:
    """What one promaccel process holds of leases: its Redis store and its Leases."""

    def __init__(self, url: str, lease_ms: int = 2_000, query_timeout_ms: int = 120_000) -> None:
        self.config = build_config({"backends": [{"url": "http://127.0.0.1:1"}],
                                    "cache": {"redis_url": url, "fetch_lease": f"{lease_ms}ms"},
                                    "limits": {"query_timeout": f"{query_timeout_ms}ms"}})
        self.store = RedisStore(url, timeout_ms=2_000)
        reader = CacheReader(self.config, lambda: self.store, Landing(), SlotMaker(self.config, H))
        self.leases = Leases(self.config, lambda: self.store, reader)

    async def aclose(self) -> None:
        await self.leases.aclose()
        await self.store.aclose()


@pytest.fixture()
def rurl(redis_server: Any) -> str:
    url = str(redis_server.url).rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(url).flushdb()
    return url


def _barrier(r: redis.Redis, name: str, n: int) -> None:
    r.incr(name)
    give_up = time.monotonic() + BARRIER_S
    while int(r.get(name) or 0) < n:
        if time.monotonic() > give_up:
            raise TimeoutError(name)
        time.sleep(0.005)


def race(url: str, n: int, k: int, units: int) -> None:
    """One racing process (run by the test in its own interpreter): once all `n` are up, take
    the leases of the same `units` units one at a time, the `k`th from its own `k`th of them
    on (so that the processes' asks meet); once all have asked, print the won digests and shut
    down (letting go of them)."""
    r = redis.Redis.from_url(url)

    async def main() -> list[str]:
        p = Proc(url, lease_ms=30_000)
        try:
            await p.leases.acquire([unit(1_000 + os.getpid())])  # connected before the race
            _barrier(r, "test:ready", n)
            me = k * units // n
            won: set[str] = set()
            for i in range(units):
                claim = await p.leases.acquire([unit((me + i) % units)])
                assert claim is not None
                won |= claim.won
                await asyncio.sleep(0.005)  # paced: the others' asks come in between
            _barrier(r, "test:claimed", n)  # nobody lets go before everyone has asked
            return sorted(won)
        finally:
            await p.aclose()

    print(orjson.dumps(asyncio.run(main())).decode())


def test_processes_racing_for_the_same_pieces_win_each_lease_once_and_let_go_at_shutdown(rurl: str) -> None:
    units = 24
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from tests.pipeline.test_leases import race; race({!r}, {}, {}, {})"
    procs = [subprocess.Popen([sys.executable, "-c", code.format(rurl, RACERS, k, units)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(RACERS)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err.decode()[-2000:] for _, err in outs]
    won = [set(orjson.loads(out.strip().splitlines()[-1])) for out, _ in outs]
    every = {digest(unit(i)) for i in range(units)}
    assert set().union(*won) == every  # every piece has a fetcher ...
    assert sum(len(w) for w in won) == units  # ... and only one
    r = redis.Redis.from_url(rurl)
    assert not any(r.exists(lease_key(d)) for d in every)  # 30 s leases, let go at shutdown


def test_a_waiter_gives_up_at_twice_the_lease_time(rurl: str) -> None:
    async def main() -> None:
        a, b = Proc(rurl, lease_ms=300), Proc(rurl, lease_ms=300)
        try:
            u = unit(1)
            assert await a.leases.acquire([u]) == Claim({digest(u)}, {})  # held and renewed: a slow fetch
            t0 = time.monotonic()
            landed, here = await b.leases.wait([u], timeout_s=60)  # half of it: 30 s
            waited = time.monotonic() - t0
            assert landed == {} and here == [u]
            assert 0.5 < waited < 2.0, waited  # 2 x 300 ms, polled every <= 50 ms
            assert digest(u) in a.leases.held  # the owner still holds it: b gave up, not a
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_lease_held_longer_than_a_query_may_run_is_let_expire(rurl: str) -> None:
    async def main() -> None:
        # Held at most query_timeout + fetch_lease = 600 ms + 300 ms, renewed every 100 ms.
        a, b = Proc(rurl, lease_ms=300, query_timeout_ms=600), Proc(rurl, lease_ms=300)
        try:
            u = unit(2)
            assert await a.leases.acquire([u]) == Claim({digest(u)}, {})
            await asyncio.sleep(0.6)  # two TTLs: renewed
            assert digest(u) in a.leases.held and await b.leases.acquire([u]) == Claim(set(), {})
            give_up = time.monotonic() + 5
            while digest(u) in a.leases.held and time.monotonic() < give_up:
                await asyncio.sleep(0.02)
            assert digest(u) not in a.leases.held  # a leak: no longer renewed ...
            await asyncio.sleep(0.4)  # ... so it expires within its TTL
            assert await b.leases.acquire([u]) == Claim({digest(u)}, {})
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_unit_without_a_key_gets_no_lease_and_shutdown_lets_go(rurl: str) -> None:
    async def main() -> None:
        a = Proc(rurl)
        kept = unit(3)
        live = Unit(QUERY, None, -1, unit(4).span)  # no key: not cacheable, nothing to wait for
        try:
            assert await a.leases.acquire([kept, live]) == Claim({digest(kept)}, {})
            assert set(a.leases.held) == {digest(kept)}
        finally:
            await a.aclose()
        assert not redis.Redis.from_url(rurl).exists(lease_key(digest(kept)))

    asyncio.run(main())
