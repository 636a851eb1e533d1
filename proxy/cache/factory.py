"""`make_store`: the piece store a configuration asks for.

The frames' MAC key (issue 26, frame.py). Every promaccel sharing a Redis must use the same
key, so it cannot be a per-process random one. In order:

1. `cache.secret_file`, `cache.secret` or `PROMACCEL_CACHE_SECRET`: the intended setup (the
   same secret on every replica); forged values are refused.
2. None of them: a key derived from the Redis credentials (the user in `cache.redis_url`
   and its password, or the one from `cache.redis_password_file` / PROMACCEL_REDIS_PASSWORD). Every replica sharing the Redis holds them, and they are a secret against
   whoever reaches Redis without them (a passwordless listener shared with other
   applications, a replica or backup reader turned writer, another ACL user). Someone who
   holds the password can forge values: a warning at start-up says so.
3. A URL without a password: a built-in key (frame.DEFAULT_SECRET). Frames are then checked
   for integrity only, not authenticity; a louder warning at start-up.

Whatever the key, a value's payload is bounded before it is decoded (`cache.max_piece_samples`,
`cache.max_piece_label_bytes`, bound.py). The in-process store needs no key.
"""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlsplit

from ..config import CacheConfig
from .bound import PayloadLimits
from .frame import DEFAULT_SECRET, frame_key
from .memory import MemoryStore
from .redis_store import RedisStore
from .store import PieceStore

__all__ = ["frame_secret", "make_store"]

log = logging.getLogger("promaccel.cache")


def frame_secret(cfg: CacheConfig) -> tuple[bytes, str]:
    """The shared secret of the frames and where it comes from (see the module docstring)."""
    secret, source = cfg.frame_secret()
    if secret is not None:
        return secret, source
    parts = urlsplit(cfg.redis_url or "")
    password = unquote(parts.password) if parts.password else cfg.redis_password()
    if password:
        user = unquote(parts.username or "")
        return b"promaccel redis url credentials\0" + user.encode() + b"\0" + password.encode(), "redis_url"
    return DEFAULT_SECRET, "default"


def limits_of(cfg: CacheConfig) -> PayloadLimits:
    return PayloadLimits(cfg.max_piece_samples, cfg.max_piece_label_bytes)


def make_store(cfg: CacheConfig) -> PieceStore:
    """The configured store: Redis when `cache.redis_url` is set, else in-process.

    Optional keys read when the config has them (durations in ms): redis_timeout,
    redis_max_wait, redis_max_connections, redis_put_timeout, generation_refresh,
    breaker_backoff, breaker_max_backoff.
    """
    if not cfg.redis_url:
        return MemoryStore(cfg.max_bytes, limits=limits_of(cfg))

    def opt(name: str, default: int) -> int:
        value = getattr(cfg, name, None)
        return default if value is None else int(value)

    secret, source = frame_secret(cfg)
    if source == "redis_url":
        log.warning("cache.secret_file is not set: values in Redis are authenticated with a key derived "
                    "from the Redis password, so whoever holds that password can forge cached answers; "
                    "give every promaccel sharing the Redis the same cache.secret_file (or "
                    "PROMACCEL_CACHE_SECRET)")
    elif source == "default":
        log.warning("cache.secret_file is not set and the Redis URL has no password: values in Redis are "
                    "authenticated with promaccel's built-in key, so whoever can write to Redis can forge "
                    "cached answers; give every promaccel sharing the Redis the same cache.secret_file (or "
                    "PROMACCEL_CACHE_SECRET)")
    elif len(secret) < 16:
        log.warning("the cache secret (%s) is shorter than 16 bytes", source)
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
        mac_key=frame_key(secret),
        limits=limits_of(cfg),
        password=cfg.redis_password(),
        tracking=cfg.redis_tracking,
    )
