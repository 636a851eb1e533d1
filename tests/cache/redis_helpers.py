"""Helpers of the Redis store tests (tests/cache/test_cache_redis.py,
test_redis_invalidation.py): keys, items, a store, MGET counts. Their fixtures (a real
redis-server per test module, a flushed client): tests/cache/conftest.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import redis

from proxy.cache import CacheItem, CacheKey, PieceMeta, RedisStore
from shardplanner.plan import Span

BASE = CacheKey(query="sum by (Hostname) (DCGM_FI_DEV_FB_USED)",
                span=Span.range(1_700_000_000_000, 1_700_003_600_000, 30_000), route=("prometheus",))
H = 3_600_000


def key(i: int, **kw: Any) -> CacheKey:
    return dataclasses.replace(BASE, span=BASE.span.with_bounds(i * H, (i + 1) * H), **kw)


def meta(metrics: tuple[str, ...] = ("DCGM_FI_DEV_FB_USED",), start_ms: int = 0, end_ms: int = H) -> PieceMeta:
    return PieceMeta(metrics, start_ms, end_ms, fetched_at_ms=time.time_ns() // 1_000_000)


def item(k: CacheKey, payload: bytes, ttl_ms: int = 600_000, m: PieceMeta | None = None) -> CacheItem:
    return CacheItem(k, payload, ttl_ms, m or meta())


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def mget_calls(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("commandstats")
    return (stats.get("cmdstat_mget", {}).get("calls", 0), stats.get("cmdstat_get", {}).get("calls", 0))


def store_for(url: str, **kw: Any) -> RedisStore:
    options: dict[str, Any] = {"timeout_ms": 100, "breaker_backoff_ms": 200, "breaker_max_backoff_ms": 400}
    options.update(kw)
    return RedisStore(url, **options)
