"""Invalidation of the Redis store against a real redis-server (proxy/cache/redis_invalidation.py
through RedisStore): by metric and time range through the per-metric indexes, the indexes'
trimming, the marker that makes racing puts undo themselves, and generations every proxy
follows."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from proxy.cache.redis_invalidation import GENERATION_KEY, INVALIDATED_AT_KEY
from tests.cache.redis_helpers import H, item, key, meta, run, store_for
from tests.redis_cluster import RedisNode

pytestmark = pytest.mark.redis


def test_invalidation_by_metric_and_range(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            await store.put_many([
                item(key(0), b"fb-0", m=meta(("DCGM_FI_DEV_FB_USED",), 0, H)),
                item(key(1), b"fb-1", m=meta(("DCGM_FI_DEV_FB_USED",), H, 2 * H)),
                item(key(2), b"util-1", m=meta(("DCGM_FI_DEV_GPU_UTIL",), H, 2 * H)),
                item(key(3), b"both-0", m=meta(("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"), 0, H)),
                item(key(4), b"any-5", m=meta((), 5 * H, 6 * H)),
            ])
            keys = [key(i) for i in range(5)]
            assert await store.invalidate(["DCGM_FI_DEV_FB_USED"], H + 1, 3 * H) == 1
            assert [g is not None for g in await store.get_many(keys)] == [True, False, True, True, True]
            assert await store.invalidate(["DCGM_FI_DEV_GPU_UTIL"]) == 3  # util-1, both-0, any-5
            assert [g is not None for g in await store.get_many(keys)] == [True, False, False, False, False]
            assert await store.invalidate(None) == 1
            assert await store.get_many(keys) == [None] * 5
            # The indexes are cleaned as entries go.
            assert r.zcard("promaccel:v1:g0:m:DCGM_FI_DEV_FB_USED") == 0
        finally:
            await store.aclose()

    run(main())


def test_index_is_trimmed_with_the_ttl(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            await store.put_many([item(key(i), b"x", ttl_ms=50) for i in range(10)])
            assert r.zcard("promaccel:v1:g0:m:DCGM_FI_DEV_FB_USED") == 10
            assert 0 < r.pttl("promaccel:v1:g0:m:DCGM_FI_DEV_FB_USED") <= 7 * 86_400_000
            await asyncio.sleep(0.1)
            await store.put_many([item(key(20), b"y")])
            assert r.zcard("promaccel:v1:g0:m:DCGM_FI_DEV_FB_USED") == 1
        finally:
            await store.aclose()

    run(main())


def test_piece_fetched_before_an_invalidation_is_not_stored(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url, skew_ms=0)
        try:
            fetched_before = meta()
            await asyncio.sleep(0.005)
            await store.invalidate(["DCGM_FI_DEV_FB_USED"])
            await asyncio.sleep(0.005)
            await store.put_many([item(key(0), b"stale", m=fetched_before), item(key(1), b"fresh")])
            assert await store.get_many([key(0), key(1)]) == [None, b"fresh"]
            assert store.stats()["raced"] == 1
        finally:
            await store.aclose()

    run(main())


def test_invalidation_while_a_put_is_in_flight_unlinks_what_it_wrote(server: RedisNode, r: redis.Redis) -> None:
    """An invalidation that sets its marker between the put's first and last command may
    have scanned the indexes before the put's entries were in them: the put drops them."""

    async def main() -> None:
        store = store_for(server.url, skew_ms=0)
        make_pipeline = store._client.pipeline

        def interleaved(*args: Any, **kw: Any) -> Any:
            pipe = make_pipeline(*args, **kw)
            execute = pipe.execute

            async def execute_with_invalidation() -> Any:
                # The last queued command is the put's closing GET of the marker: an
                # invalidation's SET lands just before it, as another proxy's would.
                last = pipe.command_stack.pop()
                pipe.set(INVALIDATED_AT_KEY, int(time.time() * 1000))
                pipe.command_stack.append(last)
                replies = await execute()
                del replies[-2]
                return replies

            pipe.execute = execute_with_invalidation
            return pipe

        try:
            store._client.pipeline = interleaved
            await store.put_many([item(key(i), b"v") for i in range(3)])
            store._client.pipeline = make_pipeline
            assert await store.get_many([key(i) for i in range(3)]) == [None, None, None]
            assert store.stats()["raced"] == 3
            assert store.stats().get("stored", 0) == 0
        finally:
            store._client.pipeline = make_pipeline
            await store.aclose()

    run(main())


def test_generation_bump_is_seen_by_every_proxy(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        a = store_for(server.url, generation_refresh_ms=100, skew_ms=0)
        b = store_for(server.url, generation_refresh_ms=100, skew_ms=0)
        try:
            await a.put_many([item(key(0), b"before")])
            assert await b.get_many([key(0)]) == [b"before"]
            assert await a.bump_generation() == 1
            assert r.get(GENERATION_KEY) == b"1"
            assert await a.get_many([key(0)]) == [None]
            await asyncio.sleep(0.15)
            assert await b.get_many([key(0)]) == [None]
            assert b.storage_key(key(0)).startswith("promaccel:v1:g1:")
            await a.put_many([item(key(0), b"after")])
            assert await b.get_many([key(0)]) == [b"after"]
            # The generation key lost (restart, eviction): it never goes back to 0.
            r.delete(GENERATION_KEY)
            await asyncio.sleep(0.15)
            assert await b.get_many([key(0)]) == [b"after"]
            assert r.get(GENERATION_KEY) == b"1"
        finally:
            await a.aclose()
            await b.aclose()

    run(main())
