"""`make_store`: the piece store a configuration asks for."""

from __future__ import annotations

from ..config import CacheConfig
from .memory import MemoryStore
from .redis_store import RedisStore
from .store import PieceStore

__all__ = ["make_store"]


def make_store(cfg: CacheConfig) -> PieceStore:
    """The configured store: Redis when `cache.redis_url` is set, else in-process.

    Optional keys read when the config has them (durations in ms): redis_timeout,
    redis_max_wait, redis_max_connections, redis_put_timeout, generation_refresh,
    breaker_backoff, breaker_max_backoff.
    """
    if not cfg.redis_url:
        return MemoryStore(cfg.max_bytes)

    def opt(name: str, default: int) -> int:
        value = getattr(cfg, name, None)
        return default if value is None else int(value)

    return RedisStore(
        cfg.redis_url,
        timeout_ms=opt("redis_timeout", 100),
        max_wait_ms=opt("redis_max_wait", 5_000),
        max_connections=opt("redis_max_connections", 64),
        put_timeout_ms=opt("redis_put_timeout", 2_000),
        generation_refresh_ms=opt("generation_refresh", 2_000),
        breaker_backoff_ms=opt("breaker_backoff", 1_000),
        breaker_max_backoff_ms=opt("breaker_max_backoff", 10_000),
        index_ttl_ms=max(cfg.ttl, cfg.recent_ttl, int(getattr(cfg, "out_of_order_ttl", 0) or 0)),
    )
