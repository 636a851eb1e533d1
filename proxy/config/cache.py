"""The `cache:` section: where pieces are kept, for how long, and the secrets that guard them
(the frames' HMAC key, Redis's password), read from files or the environment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from .base import DurationMs, OptDurationMs, StrictModel

__all__ = ["CacheConfig"]


_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


class CacheConfig(StrictModel):
    """Results cache. Durations in ms inside; see README's configuration reference.

    Read by proxy/cache/ (store), proxy/pipeline/ (what is cached when) and proxy/api/admin.py
    (admin endpoints)."""

    enabled: bool = True
    redis_url: str | None = None
    # The Redis password (AUTH; with an ACL user, the user goes in the URL: redis://promaccel@host)
    # kept out of the URL and this file: `redis_password_file` (a mounted secret), else env
    # PROMACCEL_REDIS_PASSWORD. A password in the URL itself excludes redis_password_file.
    redis_password_file: str | None = None
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    # Buffer compression of the cached Arrow IPC pieces. lz4 reads back ~3x faster than zstd
    # (a warm refresh decodes hundreds of pieces) for ~35% more bytes; entries written with
    # either are read whatever this says.
    compression: Literal["lz4", "zstd", "none"] = "lz4"
    # Cells of at least this many samples stay packed in memory, as their cached Arrow
    # payloads, from the moment they are fetched or read: an answer merged from them reads
    # them a batch at a time (a 2,048-GPU 24 h panel holds ~10 MB packed instead of ~47 MB
    # decoded). 0: never (with compression "none", fetched cells are not packed either).
    pack_min_samples: int = Field(default=65_536, ge=0)
    # What a warm refresh reuses in this process instead of reading it from the cache again:
    # decoded cells (at most this many samples in all, ~16-20 bytes each) and, for the cells
    # kept, their samples as encoded JSON (at most this many bytes), spliced into the next
    # answers instead of written again (~8 ns a byte). One 24 h GPU-fleet dashboard refresh
    # reads ~1.2 M samples, ~27 MB of JSON (issue 28): sized to keep about two of those.
    # Nothing is kept for cold answers; 0: nothing kept.
    decoded_max_samples: int = Field(default=2_500_000, ge=0)
    json_memo_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # Whole answers made of cached cells, kept as the bytes sent (gzip) for the same window
    # asked again (viewers of one dashboard, a panel re-rendered): sent as they are while the
    # cache still finds the same cells (pipeline/answer_memo.py). 0: none.
    answer_memo_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    # Redis's invalidation messages (CLIENT TRACKING, broadcasting, on one connection of
    # each process) keep what a read found -- an entry's tag, or its absence -- trusted, so
    # that a lookup or an answer kept whole needs no round trip until the key is written,
    # deleted or expires (cache/tracking.py; at most 30 s without asking again). Not for
    # Redis Cluster.
    redis_tracking: bool = True
    max_freshness: DurationMs = 600_000
    recent_ttl: DurationMs = 0
    ttl: DurationMs = 7 * 86_400_000
    # Planning interval used when planner.split_interval is not set at all: the cache only
    # helps a range query that is cut into epoch-aligned pieces. null: never split by default.
    split_interval: OptDurationMs = 3_600_000
    # A missing edge piece that covers only part of an old split interval is fetched for
    # the whole interval (when the query spans several intervals), so that the next refresh
    # of a sliding window finds it.
    extend_partial: bool = True
    # Day cells: the time pieces of days that ended at least this long ago are a day each
    # (cut on the step grid like the split_interval pieces, which must divide a day): a warm
    # 7-day panel reads ~7 cells, not 168. A missing day cell is assembled from its cached
    # split_interval cells when they are all there, else fetched whole. 0: off.
    day_cells_after: DurationMs = Field(default=86_400_000, ge=0)
    # A day a query holds only part of (at least half, its hours all cached) is assembled
    # only to be stored, beside the query's own answer: not when it has more samples than
    # this (a 2,048-GPU panel's day is 3 M); a query that asks for the whole day makes it.
    day_cells_edge_max_samples: int = Field(default=524_288, ge=0)
    out_of_order_window: DurationMs = 0
    out_of_order_ttl: DurationMs = 600_000
    # Deadline of a lookup (plus 1 ms per key), counting only the time the event loop waits
    # on I/O: under load the loop's own lag (and waiting for a CPU) turned healthy reads into
    # misses. A read still never takes more than redis_max_wait of wall time.
    redis_timeout: DurationMs = 500
    redis_max_wait: DurationMs = 5_000
    # Connection pool size (per node for Redis Cluster); callers wait for a free connection.
    redis_max_connections: int = Field(default=64, ge=1)
    redis_put_timeout: DurationMs = 2_000
    generation_refresh: DurationMs = 2_000
    breaker_backoff: DurationMs = 1_000
    breaker_max_backoff: DurationMs = 10_000
    max_pending_puts: int = Field(default=64, ge=1)
    # Redis: a piece missing from the cache is fetched by one process of all those sharing
    # the Redis; the others wait for it to land (pipeline/leases.py). The lease lives this
    # long unless its owner renews it (it does while it fetches and stores). 0: off.
    fetch_lease: DurationMs = Field(default=5_000, ge=0)
    # Values in Redis are authenticated (HMAC-SHA256, proxy/cache/frame.py) with this secret,
    # the same for every promaccel sharing the Redis: `secret_file` (a mounted secret) or
    # `secret` (>= 16 bytes), else env PROMACCEL_CACHE_SECRET; without one, a key derived
    # from the Redis URL's password, else a built-in one (a warning at start-up either way).
    secret: SecretStr | None = None
    secret_file: str | None = None
    # Bounds of what a cached value may decode to, checked before it is decompressed (a miss
    # beyond them; pieces beyond them are not stored): samples, and bytes of its label list.
    max_piece_samples: int = Field(default=16_000_000, ge=1)
    max_piece_label_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    revalidate_interval: DurationMs = 0
    revalidate_max_age: DurationMs = 3_600_000
    revalidate_max_entries: int = Field(default=10_000, ge=1)
    admin_token: str | None = None
    # Zooming out: a piece missing at step S is served from a cached piece at one of these
    # finer steps that divides S (subsampled; exact). Empty: off.
    reuse_finer_steps: list[DurationMs] = Field(
        default_factory=lambda: [15_000, 30_000, 60_000, 120_000, 300_000, 600_000])

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        scheme = v.partition("://")[0].lower() if "://" in v else ""
        if scheme not in _REDIS_SCHEMES:
            shown = v.rpartition("@")[2] if "@" in v else v
            raise ValueError(
                "expected a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// "
                f"URL, got {shown!r}"
            )
        if scheme != "unix" and not v.partition("://")[2].rpartition("@")[2].split("/")[0]:
            raise ValueError("the redis URL names no host")
        return v

    @model_validator(mode="after")
    def _secret(self) -> "CacheConfig":
        if self.secret is not None and self.secret_file is not None:
            raise ValueError("give at most one of cache.secret and cache.secret_file")
        if self.secret is not None and len(self.secret.get_secret_value().encode()) < 16:
            raise ValueError("cache.secret must hold at least 16 bytes")
        if self.secret_file is not None:
            self.frame_secret()  # a clear error now rather than at the first lookup
        if self.redis_password_file is not None:
            if self.redis_url and urlsplit(self.redis_url).password:
                raise ValueError("cache.redis_url holds a password: give it there or in "
                                 "cache.redis_password_file, not both")
            self.redis_password()  # unreadable or empty: an error at start-up
        return self

    def redis_password(self) -> str | None:
        """The Redis password kept outside the URL: `redis_password_file` (its content without
        a trailing newline), else env PROMACCEL_REDIS_PASSWORD; None when the URL holds one
        (redis-py reads it there) or neither is set."""
        if self.redis_url and urlsplit(self.redis_url).password:
            return None
        if self.redis_password_file is not None:
            try:
                data = Path(self.redis_password_file).read_text().rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                why = getattr(exc, "strerror", None) or "not UTF-8 text"
                raise ValueError(f"cannot read cache.redis_password_file {self.redis_password_file!r}: {why}") from None
            if not data:
                raise ValueError(f"cache.redis_password_file {self.redis_password_file!r} is empty")
            return data
        return os.environ.get("PROMACCEL_REDIS_PASSWORD") or None

    def frame_secret(self) -> tuple[bytes | None, str]:
        """The shared secret of the cache's frames and where it came from (secret_file,
        secret, env), or (None, "none"): proxy/cache/factory.py decides then."""
        if self.secret_file is not None:
            try:
                data = Path(self.secret_file).read_bytes().strip()
            except OSError as exc:
                raise ValueError(f"cannot read cache.secret_file {self.secret_file!r}: {exc.strerror}") from None
            if len(data) < 16:
                raise ValueError(f"cache.secret_file {self.secret_file!r} must hold at least 16 bytes")
            return data, "secret_file"
        if self.secret is not None:
            return self.secret.get_secret_value().encode(), "secret"
        env = os.environ.get("PROMACCEL_CACHE_SECRET", "").strip()
        if env:
            return env.encode(), "env"
        return None, "none"
