"""proxy/cache/leases.py: the lease table in Redis (`RedisLeases`, a Redis store's `leases`),
against a real redis-server. One holder per piece; only the holder renews or lets go; a lease
expires by itself; two processes asking for the same pieces at once get all of them each
way, never half; a lease promaccel did not make (no TTL, or a longer one) neither stalls
nor stays; a failing Redis answers None (the caller fetches by itself).
(proxy/pipeline/leases.py's waiting on them: tests/cache/test_fetch_leases.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from proxy.cache import CacheItem, CacheKey, PieceMeta, RedisStore
from proxy.cache.keys import KEY_PREFIX
from proxy.cache.leases import LEASE_PREFIX, lease_key
from proxy.codec.arrow import to_ipc_bytes
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.redis_cluster import RedisNode
from tests.servers import free_port

pytestmark = [pytest.mark.redis]

H = 3_600_000
BASE = CacheKey(query="sum(DCGM_FI_DEV_FB_USED)", span=Span.range(0, H - 30_000, 30_000), route=("prometheus",))
PAYLOAD = to_ipc_bytes(QueryResult.from_series("matrix", [({"job": "dcgm"}, [0, 30_000], [1.0, 2.0])]))


def key(i: int) -> CacheKey:
    return dataclasses.replace(BASE, span=BASE.span.with_bounds(i * H, (i + 1) * H - 30_000))


def keys(n: int, first: int = 0) -> list[CacheKey]:
    return [key(i) for i in range(first, first + n)]


def digests(ks: Sequence[CacheKey]) -> list[str]:
    return [k.digest for k in ks]


def store(url: str) -> RedisStore:
    return RedisStore(url, timeout_ms=500, breaker_backoff_ms=200, breaker_max_backoff_ms=400)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_lease_keys_live_apart_from_stored_pieces() -> None:
    k = key(0)
    assert lease_key(k.digest) == LEASE_PREFIX + k.digest
    assert lease_key(k.digest).startswith(KEY_PREFIX + ":")
    # No generation's storage key is a lease key (nor the other way round).
    for gen in (0, 1, 99):
        assert not k.redis_key(gen).startswith(LEASE_PREFIX)
        assert k.redis_key(gen) != lease_key(k.digest)
    assert lease_key(key(1).digest) != lease_key(k.digest)


def test_one_holder_per_piece_and_only_it_renews_or_lets_go(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        a, b = store(server.url), store(server.url)
        try:
            ks = keys(3)
            got = await a.leases.acquire(ks, ["tok-a"] * 3, 5_000)
            assert got == ([True, True, True], [None, None, None])
            # Another process: none of them, however often it asks.
            assert await b.leases.acquire(ks, ["tok-b"] * 3, 5_000) == ([False] * 3, [None] * 3)
            assert await b.leases.acquire(ks[:1], ["tok-a-guess"], 5_000) == ([False], [None])
            # Renewing: only with the holder's token.
            assert await b.leases.renew(digests(ks), ["tok-b"] * 3, 5_000) == [False] * 3
            await asyncio.sleep(0.3)
            assert r.pttl(lease_key(ks[0].digest)) <= 4_700
            assert await a.leases.renew(digests(ks), ["tok-a"] * 3, 5_000) == [True] * 3
            assert r.pttl(lease_key(ks[0].digest)) > 4_700  # extended again to the full lease
            # Letting go with the wrong token leaves the lease in place.
            assert await b.leases.release(digests(ks), ["tok-b"] * 3) is True
            held, _ = await b.leases.poll(ks)
            assert held == [True] * 3
            # The holder lets go of one: that one is free, for anyone.
            assert await a.leases.release(digests(ks[:1]), ["tok-a"]) is True
            held, _ = await b.leases.poll(ks)
            assert held == [False, True, True]
            assert await b.leases.acquire(ks, ["tok-b"] * 3, 5_000) == ([True, False, False], [None] * 3)
            # ... and a renewal of a lease no longer ours says so.
            assert await a.leases.renew(digests(ks), ["tok-a"] * 3, 5_000) == [False, True, True]
        finally:
            await a.aclose()
            await b.aclose()

    run(main())


def test_a_lease_expires_by_itself(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        a, b = store(server.url), store(server.url)
        try:
            ks = keys(2)
            assert (await a.leases.acquire(ks, ["a", "a"], 150))[0] == [True, True]
            assert 0 < r.pttl(lease_key(ks[0].digest)) <= 150
            assert (await b.leases.acquire(ks, ["b", "b"], 150))[0] == [False, False]
            await asyncio.sleep(0.3)
            assert (await b.leases.poll(ks))[0] == [False, False]
            assert (await b.leases.acquire(ks, ["b", "b"], 5_000))[0] == [True, True]
            # The first holder's late release does not free the new holder's lease.
            await a.leases.release(digests(ks), ["a", "a"])
            assert (await a.leases.poll(ks))[0] == [True, True]
        finally:
            await a.aclose()
            await b.aclose()

    run(main())


def test_acquire_and_poll_read_the_pieces_already_stored(server: RedisNode, r: redis.Redis) -> None:
    """A piece that landed since the caller's lookup needs no fetch: acquire and poll hand
    it back in the same round trip (and only sound frames: a planted value is not a piece)."""

    async def main() -> None:
        a = store(server.url)
        try:
            ks = keys(3)
            meta = PieceMeta(("DCGM_FI_DEV_FB_USED",), 0, H, int(time.time() * 1000))
            await a.put_many([CacheItem(ks[1], PAYLOAD, 600_000, meta)])
            r.set(ks[2].redis_key(0), b"PAXC-not-a-frame")
            taken, pieces = await a.leases.acquire(ks, ["t"] * 3, 5_000)
            assert taken == [True] * 3
            assert [None if p is None else bytes(p) for p in pieces] == [None, PAYLOAD, None]
            held, pieces = await a.leases.poll(ks)
            assert held == [True] * 3
            assert [None if p is None else bytes(p) for p in pieces] == [None, PAYLOAD, None]
        finally:
            await a.aclose()

    run(main())


def test_two_processes_asking_for_the_same_pieces_at_once_get_all_of_them_each_way(
        server: RedisNode, r: redis.Redis) -> None:
    """One transaction per acquire: whichever process comes first holds every piece, so
    neither waits on the other for half of its query while fetching the other half."""

    async def main() -> None:
        a, b = store(server.url), store(server.url)
        try:
            for trial in range(30):
                ks = keys(20, first=100 * trial)
                got_a, got_b = await asyncio.gather(a.leases.acquire(ks, ["a"] * 20, 5_000),
                                                    b.leases.acquire(ks, ["b"] * 20, 5_000))
                taken_a, taken_b = got_a[0], got_b[0]
                assert [x != y for x, y in zip(taken_a, taken_b)] == [True] * 20  # one holder each
                assert taken_a in ([True] * 20, [False] * 20), (trial, taken_a)
        finally:
            await a.aclose()
            await b.aclose()

    run(main())


def test_a_lease_without_a_ttl_or_with_a_longer_one_is_ignored(server: RedisNode, r: redis.Redis) -> None:
    """Someone with write access planted leases: one forever, one for a day. Polls read them
    as free (nobody waits on them); acquire deletes them and takes the leases."""

    async def main() -> None:
        a = store(server.url)
        try:
            ks = keys(4)
            r.set(lease_key(ks[0].digest), "forever")
            r.set(lease_key(ks[1].digest), "a day", px=86_400_000)
            r.set(lease_key(ks[2].digest), "a fair one", px=4_000)
            held, _ = await a.leases.poll(ks, max_ttl_ms=5_000)
            assert held == [False, False, True, False]
            held, _ = await a.leases.poll(ks)  # no cap: only the TTL-less one is not held
            assert held == [False, True, True, False]
            before = a.leases.ignored
            taken, _ = await a.leases.acquire(ks, ["mine"] * 4, 5_000)
            assert taken == [True, True, False, True]
            assert a.leases.ignored - before == 2
            assert r.get(lease_key(ks[0].digest)) == b"mine" and r.get(lease_key(ks[1].digest)) == b"mine"
            assert 0 < r.pttl(lease_key(ks[1].digest)) <= 5_000
            assert r.get(lease_key(ks[2].digest)) == b"a fair one"
        finally:
            await a.aclose()

    run(main())


def test_a_redis_that_cannot_be_reached_answers_none() -> None:
    async def main() -> list[Any]:
        down = store(f"redis://127.0.0.1:{free_port()}/0")
        try:
            ks = keys(2)
            return [await down.leases.acquire(ks, ["t", "t"], 1_000),
                    await down.leases.renew(digests(ks), ["t", "t"], 1_000),
                    await down.leases.release(digests(ks), ["t", "t"]),
                    await down.leases.poll(ks)]
        finally:
            await down.aclose()

    t0 = time.monotonic()
    assert run(main()) == [None, None, False, None]
    assert time.monotonic() - t0 < 5


def test_a_stalled_redis_answers_none_within_the_deadline(server: RedisNode, r: redis.Redis) -> None:
    """A Redis that accepts the call but does not answer (DEBUG SLEEP on the server) is a
    failure after the store's small-call deadline, not a stalled query."""

    async def main() -> tuple[Any, float]:
        a = RedisStore(server.url, timeout_ms=100, max_connections=1)
        blocker = redis.asyncio.Redis(port=server.port)
        try:
            sleeping = asyncio.create_task(blocker.execute_command("DEBUG", "SLEEP", "1"))
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            got = await a.leases.acquire(keys(1), ["t"], 1_000)
            elapsed = time.monotonic() - t0
            await sleeping
            return got, elapsed
        finally:
            await a.aclose()
            await blocker.aclose()

    got, elapsed = run(main())
    assert got is None
    assert elapsed < 0.9
