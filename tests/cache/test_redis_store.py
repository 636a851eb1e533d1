"""RedisStore.get_tagged (proxy/cache/redis_store.py, redis_reads.py) against real redis-server
processes: an entry the reader keeps decoded is checked by its frame's MAC alone (32 bytes,
GETRANGE), and whatever another process did to it -- wrote it again, invalidated it, bumped
the generation, forged it, replaced it with another type -- is never reported unchanged.
The rest of the store: tests/cache/test_cache_redis.py."""

from __future__ import annotations

import os

import pytest
import redis

from proxy.cache import RedisStore, encode_value
from proxy.cache.frame import MAC_OFFSET, MAC_SIZE, frame_key, frame_mac
from proxy.cache.store import Tagged
from tests.cache.redis_helpers import H, item, key, meta, mget_calls, run, store_for
from tests.redis_cluster import LocalCluster, RedisNode

pytestmark = pytest.mark.redis


def getrange_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))


def test_get_tagged_tags_fresh_reads_with_the_frame_mac(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            keys = [key(i) for i in range(3)]
            payloads = [os.urandom(5_000) for _ in keys]
            await store.put_many([item(k, p) for k, p in zip(keys, payloads)])
            r.config_resetstat()
            got = await store.get_tagged(keys + [key(9)], [None] * 4)
            assert [t.payload for t in got] == payloads + [None]
            assert mget_calls(r) == (1, 0) and getrange_calls(r) == 0  # no tag known: one MGET
            for k, t in zip(keys, got):
                value = r.get(store.storage_key(k))
                assert value is not None and t.tag == frame_mac(value) == value[MAC_OFFSET:MAC_OFFSET + MAC_SIZE]
                assert not t.same
            assert got[3] == Tagged(None, None) and not got[3].same
        finally:
            await store.aclose()

    run(main())


def test_unchanged_entries_are_read_as_their_mac_only(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url)
        try:
            keys = [key(i) for i in range(4)]
            payloads = [os.urandom(200_000) for _ in keys]
            await store.put_many([item(k, p) for k, p in zip(keys[:3], payloads[:3])])
            tags = [t.tag for t in await store.get_tagged(keys[:3], [None] * 3)]
            await store.put_many([item(keys[3], payloads[3])])
            r.config_resetstat()
            read_before = store.stats()["bytes_read"]
            got = await store.get_tagged(keys, [*tags, None])
            assert [t.same for t in got] == [True, True, True, False]
            assert [t.tag for t in got[:3]] == tags and all(t.payload is None for t in got[:3])
            assert got[3].payload == payloads[3] and got[3].tag is not None
            # One round trip: the three MACs and the unknown entry's MGET in one pipeline;
            # 3 x 32 bytes read for the kept entries instead of 3 x 200 KB.
            assert getrange_calls(r) == 3 and mget_calls(r) == (1, 0)
            assert store.stats()["bytes_read"] - read_before == 3 * MAC_SIZE + len(payloads[3])
            assert store.stats()["errors"] == 0
        finally:
            await store.aclose()

    run(main())


def test_an_entry_written_again_by_another_process_is_read_whole(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        mine, other = store_for(server.url), store_for(server.url)
        try:
            k = key(0)
            await mine.put_many([item(k, b"first" * 1000)])
            tag = (await mine.get_tagged([k], [None]))[0].tag
            assert tag is not None
            await other.put_many([item(k, b"second" * 1000)])  # another replica refetched it
            got = (await mine.get_tagged([k], [tag]))[0]
            assert not got.same and got.payload == b"second" * 1000 and got.tag not in (None, tag)
            # Byte for byte the same content written again: the same MAC, so unchanged.
            await other.put_many([item(k, b"second" * 1000)])
            assert (await mine.get_tagged([k], [got.tag]))[0].same
        finally:
            await mine.aclose()
            await other.aclose()

    run(main())


def test_invalidated_expired_and_other_generation_entries_are_misses(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        mine = store_for(server.url, generation_refresh_ms=0)
        admin = store_for(server.url)
        try:
            keys = [key(i) for i in range(3)]
            await mine.put_many([item(k, b"x" * 1000, m=meta(start_ms=i * H, end_ms=(i + 1) * H))
                                 for i, k in enumerate(keys)])
            tags = [t.tag for t in await mine.get_tagged(keys, [None] * 3)]
            assert await admin.invalidate(["DCGM_FI_DEV_FB_USED"], 0, H - 1) == 1  # another process
            r.pexpire(mine.storage_key(keys[1]), 1)
            while r.exists(mine.storage_key(keys[1])):
                pass
            got = await mine.get_tagged(keys, tags)
            assert got[0] == Tagged(None, None) and got[1] == Tagged(None, None) and got[2].same
            await admin.bump_generation()  # every proxy's old entries become unreachable
            assert await mine.get_tagged(keys, tags) == [Tagged(None, None)] * 3
        finally:
            await mine.aclose()
            await admin.aclose()

    run(main())


def test_forged_entries_are_never_reported_unchanged_or_served(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        store = store_for(server.url, mac_key=frame_key(b"the shared secret"))
        try:
            k = key(0)
            await store.put_many([item(k, b"genuine" * 1000)])
            tag = (await store.get_tagged([k], [None]))[0].tag
            assert tag is not None
            skey = store.storage_key(k)
            # A frame made without the secret: another MAC, read whole, refused and deleted.
            r.set(skey, encode_value(k, b"forged" * 1000, mac_key=frame_key(b"a guess"), skey=skey))
            assert await store.get_tagged([k], [tag]) == [Tagged(None, None)]
            assert not r.exists(skey) and store.stats()["corrupt"] == 1
            # Another type under the key: not unchanged, and a miss rather than an error.
            r.rpush(skey, b"a list")
            assert await store.get_tagged([k], [tag]) == [Tagged(None, None)]
            assert store.stats()["errors"] == 0
        finally:
            await store.aclose()

    run(main())


def test_concurrent_tagged_lookups_share_one_read(server: RedisNode, r: redis.Redis) -> None:
    async def main() -> None:
        import asyncio

        store = store_for(server.url)
        try:
            keys = [key(i) for i in range(5)]
            await store.put_many([item(k, os.urandom(1000)) for k in keys])
            tags = [t.tag for t in await store.get_tagged(keys, [None] * 5)]
            r.config_resetstat()
            waves = await asyncio.gather(*(store.get_tagged(keys, tags) for _ in range(50)))
            assert all(t.same for wave in waves for t in wave)
            assert getrange_calls(r) == 5  # one read for all 50 lookups
            # A lookup that keeps nothing does not join a tagged read: it needs the payloads.
            plain = await store.get_many(keys)
            assert all(p is not None for p in plain)
        finally:
            await store.aclose()

    run(main())


def test_cluster_tagged_reads(cluster: LocalCluster) -> None:
    async def main() -> None:
        store: RedisStore = store_for(cluster.url, timeout_ms=500)
        other: RedisStore = store_for(cluster.url, timeout_ms=500)
        try:
            keys = [key(i) for i in range(20)]
            payloads = [os.urandom(2_000) for _ in keys]
            await store.put_many([item(k, p) for k, p in zip(keys, payloads)])
            tags = [t.tag for t in await store.get_tagged(keys, [None] * 20)]
            await other.put_many([item(keys[4], b"new" * 100)])
            got = await store.get_tagged(keys + [key(99)], [*tags[:10], *([None] * 10), None])
            assert [t.same for t in got[:10]] == [i != 4 for i in range(10)]
            assert got[4].payload == b"new" * 100
            assert [t.payload for t in got[10:]] == payloads[10:] + [None]
            assert store.stats()["errors"] == 0
        finally:
            await store.aclose()
            await other.aclose()

    run(main())
