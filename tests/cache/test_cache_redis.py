"""Piece store against real redis-server processes: one server and a three-node cluster.

Faults are real too: the server is stopped and restarted on the same port, stalled with
DEBUG SLEEP and paused with CLIENT PAUSE, and bad values are planted under real keys.
Invalidation and generations: tests/cache/test_redis_invalidation.py; reads shared by
concurrent lookups, without Redis: tests/cache/test_shared_reads.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from proxy.cache import (
    CacheItem,
    RedisStore,
    encode_value,
    make_store,
)
from proxy.codec import arrow
from proxy.config import CacheConfig
from proxy.result import QueryResult
from tests.cache.redis_helpers import H, item, key, meta, mget_calls, run, store_for
from tests.redis_cluster import LocalCluster, RedisNode, redis_cli
from tests.servers import free_port

pytestmark = pytest.mark.redis

# --------------------------------------------------------------------------------------
# One server


def test_round_trip_and_ttl(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            payloads = [os.urandom(1000 + i) for i in range(5)]
            await store.put_many([item(key(i), p, ttl_ms=60_000 + i) for i, p in enumerate(payloads)])
            assert await store.get_many([key(i) for i in range(6)]) == [*payloads, None]
            skey = store.storage_key(key(2))
            assert skey.startswith("promaccel:v1:g0:")
            assert 0 < r.pttl(skey) <= 60_002
            stats = store.stats()
            assert (stats["hits"], stats["misses"], stats["stored"], stats["errors"]) == (5, 1, 5, 0)
            # Pieces that must not be cached are not written.
            await store.put_many([CacheItem(key(7), b"x", None, meta()), CacheItem(key(8), b"x", 0, meta())])
            assert not r.exists(store.storage_key(key(7)), store.storage_key(key(8)))
        finally:
            await store.aclose()

    run(main())


def test_batched_get_is_one_round_trip(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            keys = [key(i) for i in range(50)]
            await store.put_many([item(k, b"%d" % i) for i, k in enumerate(keys[::2])])
            await store.get_many(keys[:1])  # reads the generation
            before = mget_calls(r)
            got = await store.get_many(keys)
            after = mget_calls(r)
            assert [g is not None for g in got] == [i % 2 == 0 for i in range(50)]
            assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
        finally:
            await store.aclose()

    run(main())


def test_corrupt_value_under_a_real_key_is_a_miss_and_is_deleted(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            await store.put_many([item(key(0), b"good" * 100), item(key(1), b"fine")])
            skey = store.storage_key(key(0))
            good = r.get(skey)
            assert good is not None
            damaged = bytearray(good)
            damaged[len(damaged) // 2] ^= 0xFF
            r.set(skey, bytes(damaged))
            assert await store.get_many([key(0), key(1)]) == [None, b"fine"]
            assert not r.exists(skey)
            r.set(skey, b"garbage")
            assert await store.get_many([key(0)]) == [None]
            assert not r.exists(skey)
            assert store.stats()["corrupt"] == 2
        finally:
            await store.aclose()

    run(main())


def test_colliding_value_under_a_real_key_is_a_miss(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            await store.get_many([key(0)])
            skey = store.storage_key(key(0))
            other = dataclasses.replace(key(0), tenant="another-tenant")
            r.set(skey, encode_value(other, b"another tenant's data"))
            assert await store.get_many([key(0)]) == [None]
            assert not r.exists(skey)
        finally:
            await store.aclose()

    run(main())


def test_make_store_uses_redis(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = make_store(CacheConfig(redis_url=server.url))
        try:
            assert isinstance(store, RedisStore)
            # Its payloads are bounded (cache.max_piece_samples): Arrow IPC, not any bytes.
            payload = arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"a": "1"}, [key(0).span.start_ms], [1.0])]))
            await store.put_many([item(key(0), payload), item(key(1), b"v")])
            assert await store.get_many([key(0), key(1)]) == [payload, None]
            assert store.stats()["too_large"] == 1
        finally:
            await store.aclose()

    run(main())


def test_get_many_latency_50_pieces_of_100kb(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> list[float]:
        store = store_for(server.url)
        try:
            keys = [key(i) for i in range(50)]
            await store.put_many([item(k, os.urandom(100_000)) for k in keys])
            times = []
            for _ in range(30):
                t0 = time.perf_counter()
                got = await store.get_many(keys)
                times.append(time.perf_counter() - t0)
                assert all(g is not None and len(g) == 100_000 for g in got)
            return times
        finally:
            await store.aclose()

    times = run(main())
    median_ms = statistics.median(times) * 1000
    print(f"get_many 50 x 100 KB: median {median_ms:.1f} ms, max {max(times) * 1000:.1f} ms")
    # Every read above was a hit, so within the default deadline (100 ms + 1 ms per key);
    # the median keeps a margin to it even on a busy machine.
    assert median_ms < 100


def test_many_concurrent_lookups_share_reads_and_never_exhaust_the_pool(server: RedisNode, r: redis.Redis) -> None:
    """50 users x 6 panel requests look up the same keys at once: one MGET per wave of
    identical lookups, no "Too many connections", no error, every lookup a hit."""

    async def main() -> None:
        store = store_for(server.url, max_connections=4)
        try:
            keys = [key(i) for i in range(14)]
            payloads = [os.urandom(50_000) for _ in keys]
            await store.put_many([item(k, p) for k, p in zip(keys, payloads)])
            await store.get_many(keys[:1])  # reads the generation
            before = mget_calls(r)
            got = await asyncio.gather(*(store.get_many(keys[i % 3:]) for i in range(300)))
            after = mget_calls(r)
            assert all(g == payloads[i % 3:] for i, g in enumerate(got))
            assert store.stats()["errors"] == 0 and not store.stats()["breaker_open"]
            assert after[0] - before[0] <= 3 and after[1] == before[1]
            # Distinct keys, far more concurrent reads than connections: callers wait for one.
            more = [key(100 + i) for i in range(200)]
            await store.put_many([item(k, b"%d" % i) for i, k in enumerate(more)])
            got = await asyncio.gather(*(store.get_many([k]) for k in more))
            assert got == [[b"%d" % i] for i in range(200)]
            assert store.stats()["errors"] == 0
        finally:
            await store.aclose()

    run(main())


def test_event_loop_lag_is_not_counted_against_the_read_deadline(server: RedisNode, r: redis.Redis) -> None:
    """The loop busy with other requests' CPU work for 3x the deadline: still a hit."""

    async def busy(seconds: float) -> None:
        await asyncio.sleep(0)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    async def main() -> None:
        store = store_for(server.url, timeout_ms=100)
        try:
            await store.put_many([item(key(0), b"v")])
            await store.get_many([key(0)])
            lookup = asyncio.ensure_future(store.get_many([key(0)]))
            await asyncio.gather(busy(0.3), busy(0.05))
            assert await lookup == [b"v"]
            assert store.stats()["errors"] == 0
        finally:
            await store.aclose()

    run(main())


def test_cancelled_lookup_does_not_fail_the_lookups_that_joined_it(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            await store.put_many([item(key(0), b"v")])
            first = asyncio.ensure_future(store.get_many([key(0)]))
            second = asyncio.ensure_future(store.get_many([key(0)]))
            await asyncio.sleep(0)
            first.cancel()
            assert await second == [b"v"]
            with pytest.raises(asyncio.CancelledError):
                await first
        finally:
            await store.aclose()

    run(main())


# --------------------------------------------------------------------------------------
# Faults


def test_redis_stopped_then_restarted_on_the_same_port(tmp_path: Path) -> None:
    node = RedisNode(free_port(), tmp_path / "redis").start()

    async def main() -> None:
        store = store_for(node.url)
        try:
            await store.put_many([item(key(0), b"v")])
            assert await store.get_many([key(0)]) == [b"v"]

            node.stop()
            for _ in range(10):
                t0 = time.monotonic()
                assert await store.get_many([key(0), key(1)]) == [None, None]
                await store.put_many([item(key(1), b"w")])  # never raises
                assert time.monotonic() - t0 < 0.5
            assert store.stats()["errors"] >= 1
            assert store.stats()["breaker_open"]

            node.start()  # empty, same port
            deadline = time.monotonic() + 5
            while True:
                await store.put_many([item(key(2), b"back")])
                if await store.get_many([key(2)]) == [b"back"]:
                    break
                assert time.monotonic() < deadline, "the store did not recover after Redis came back"
                await asyncio.sleep(0.05)
            assert not store.stats()["breaker_open"]
        finally:
            await store.aclose()

    try:
        run(main())
    finally:
        node.stop()


@pytest.mark.parametrize("stall", ["DEBUG SLEEP", "CLIENT PAUSE"])
def test_slow_redis_reads_as_misses_within_the_timeout(server: RedisNode, r: redis.Redis, stall: str) -> None:
    async def main() -> None:
        store = store_for(server.url, timeout_ms=100)
        try:
            await store.put_many([item(key(0), b"v")])
            assert await store.get_many([key(0)]) == [b"v"]
            if stall == "DEBUG SLEEP":
                sleeper = subprocess.Popen(
                    ["redis-cli", "-p", str(server.port), "DEBUG", "SLEEP", "1"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            else:
                assert "OK" in redis_cli(server.port, "CLIENT", "PAUSE", "1000", "ALL")
                sleeper = None
            await asyncio.sleep(0.1)  # the server is now stalled
            for _ in range(3):
                t0 = time.monotonic()
                assert await store.get_many([key(0)]) == [None]
                assert time.monotonic() - t0 < 0.3
            await store.put_many([item(key(1), b"w")])  # background write: waits, never raises
            if sleeper is not None:
                sleeper.wait(timeout=10)
            else:
                await asyncio.sleep(1.0)
            deadline = time.monotonic() + 5
            while await store.get_many([key(0)]) != [b"v"]:
                assert time.monotonic() < deadline, "the store did not recover after the stall"
                await asyncio.sleep(0.05)
        finally:
            await store.aclose()

    run(main())


# --------------------------------------------------------------------------------------
# Redis Cluster


def test_cluster_round_trip_batch_and_invalidation(cluster: LocalCluster) -> None:
    async def main() -> None:
        store = store_for(cluster.url, timeout_ms=500)
        try:
            assert store.cluster
            keys = [key(i) for i in range(50)]
            payloads = [os.urandom(10_000) for _ in keys]
            await store.put_many([item(k, p, m=meta(start_ms=i * H, end_ms=(i + 1) * H))
                                  for i, (k, p) in enumerate(zip(keys, payloads))])
            assert store.stats()["stored"] == 50 and store.stats()["errors"] == 0
            # Keys spread over every node; a batch is one pipeline per node (sent in
            # parallel) of one MGET per slot, and no per-key GET.
            nodes = [redis.Redis(port=n.port) for n in cluster.nodes]
            try:
                assert all(n.dbsize() > 0 for n in nodes)
                for n in nodes:
                    n.config_resetstat()
                assert await store.get_many(keys + [key(99)]) == payloads + [None]
                calls = [mget_calls(n) for n in nodes]
                slots = {key_slot(store.storage_key(k).encode()) for k in keys + [key(99)]}
                assert sum(c[0] for c in calls) == len(slots)
                assert sum(c[1] for c in calls) == 0
            finally:
                for n in nodes:
                    n.close()

            # Corrupt value planted on whichever node owns the key.
            rc = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
            try:
                skey = store.storage_key(keys[3])
                rc.set(skey, b"garbage")
                got = await store.get_many(keys[:5])
                assert got[3] is None and got[:3] == payloads[:3]
                assert not rc.exists(skey)
            finally:
                rc.close()

            assert await store.invalidate(["DCGM_FI_DEV_FB_USED"], 10 * H + 1, 12 * H - 1) == 2
            got = await store.get_many(keys)
            assert [i for i, g in enumerate(got) if g is None] == [3, 10, 11]
            assert await store.bump_generation() == 1
            assert await store.get_many(keys[:3]) == [None] * 3
        finally:
            await store.aclose()

    run(main())
