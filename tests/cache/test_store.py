"""The piece store interface and its shared bookkeeping (proxy/cache/store.py): `Tagged` reads,
`get_tagged` of a store without tags (the in-process one), `verify`, the rate-limited log.
The Redis store's tagged reads against a real server: tests/cache/test_redis_store.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest

from proxy.cache import CacheItem, CacheKey, MemoryStore, PieceMeta, encode_value
from proxy.cache.store import RateLimitedLog, Tagged, describe
from shardplanner.plan import Span

KEY = CacheKey(query="up", span=Span.range(0, 3_600_000, 30_000), route=("prometheus",))


def key(i: int) -> CacheKey:
    return dataclasses.replace(KEY, query=f"up{i}")


def item(k: CacheKey, payload: bytes) -> CacheItem:
    return CacheItem(k, payload, 600_000, PieceMeta(("up",), 0, 3_600_000, time.time_ns() // 1_000_000))


def test_tagged_reads_say_read_unchanged_or_missing() -> None:
    assert Tagged(b"p", b"t" * 32).same is False  # read now, with its tag
    assert Tagged(b"p").same is False  # read now, from a store without tags
    assert Tagged(None, b"t" * 32).same is True  # the frame the reader keeps
    assert Tagged(None).same is False and Tagged(None) == Tagged(None, None)  # a miss


def test_a_store_without_tags_reads_every_payload_whatever_is_known() -> None:
    async def main() -> None:
        store = MemoryStore(1 << 20)
        await store.put_many([item(key(0), b"zero"), item(key(1), b"one")])
        got = await store.get_tagged([key(0), key(1), key(2)], [b"t" * 32, None, b"u" * 32])
        assert [bytes(t.payload) if t.payload is not None else None for t in got] == [b"zero", b"one", None]
        assert all(t.tag is None and not t.same for t in got)
        assert store.stats()["hits"] == 2 and store.stats()["misses"] == 1

    asyncio.run(main())


def test_verify_sorts_sound_frames_from_corrupt_ones() -> None:
    store = MemoryStore(1 << 20)
    skeys = [store.storage_key(key(i)) for i in range(4)]
    values = [
        encode_value(key(0), b"good", mac_key=None, skey=skeys[0]),
        encode_value(key(0), b"other key's", mac_key=None, skey=skeys[1]),  # under key(1): a collision
        b"garbage",
        None,
    ]
    out, bad = store.verify([key(i) for i in range(4)], skeys, values)
    assert [bytes(p) if p is not None else None for p in out] == [b"good", None, None, None]
    assert bad == skeys[1:3] and store.stats()["corrupt"] == 2


def test_rate_limited_log_suppresses_repeats_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(interval_s=0.5)
    with caplog.at_level(logging.WARNING, logger="promaccel.cache"):
        for _ in range(3):
            log.warning("get", "redis down")
        log.warning("put", "redis down for puts")
    assert [r.getMessage() for r in caplog.records] == ["redis down", "redis down for puts"]
    time.sleep(0.6)  # an interval later: the next one says how many were left out
    with caplog.at_level(logging.WARNING, logger="promaccel.cache"):
        log.warning("get", "redis down")
    assert caplog.records[-1].getMessage() == "redis down (2 more since the last report)"
    assert describe(ValueError("x")) == "ValueError: x" and describe(TimeoutError()) == "TimeoutError"
