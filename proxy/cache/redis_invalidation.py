"""The Redis store's invalidation state: the generation, the per-metric indexes and the marker.

Indexes: one sorted set per metric and generation, members `<start_ms>:<end_ms>:<sha>` scored
by expiry and trimmed on every write, and one set of the metrics indexed. The generation is
`INCR promaccel:generation`, which every proxy re-reads at most every `generation_refresh_ms`;
the invalidation marker is `promaccel:invalidated_at`. A put reads the marker before and after
it writes (`write_indexes` / `raced`): entries fetched before the marker, or all of them when it
moved while the put ran, are unlinked again.

Kept apart from `redis_store.RedisStore`, which owns the guarding (deadlines, breaker) and the
entries themselves: these calls raise, and the store decides how a failure reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .keys import KEY_PREFIX, CacheItem
from .store import ANY_METRIC

__all__ = ["GENERATION_KEY", "INVALIDATED_AT_KEY", "RedisInvalidation"]

GENERATION_KEY = "promaccel:generation"
INVALIDATED_AT_KEY = "promaccel:invalidated_at"
_BATCH = 1000  # members / keys per SCAN page, UNLINK pipeline and ZREM


class RedisInvalidation:
    """The generation this process knows (never going backwards), the indexes a put writes and
    an invalidation scans, and the marker that makes racing puts undo themselves.

    client                redis.asyncio client (or cluster client) shared with the store
    generation_refresh_ms how often the generation number is re-read
    index_ttl_ms          lifetime of the indexes: at least the longest entry TTL
    skew_ms               clock skew allowed between proxies for the marker
    clock                 wall clock in ms (the marker's time and the indexes' expiry scores)
    marked                called as soon as an invalidation or bump has set the marker (the
                          store forgets its reads in flight: lookups from then on read afresh)
    """

    def __init__(self, client: Any, *, generation_refresh_ms: int, index_ttl_ms: int, skew_ms: int,
                 clock: Callable[[], int], marked: Callable[[], None]) -> None:
        self._client = client
        self._marked = marked
        self._refresh_s = generation_refresh_ms / 1000
        self._index_ttl_ms = index_ttl_ms
        self._skew_ms = skew_ms
        self._clock = clock
        self.known = 0  # the highest generation seen; keys are written and read under it
        self._read_at: float | None = None

    # Generation -------------------------------------------------------------------------

    def _take(self, raw: bytes | None) -> tuple[int, bool]:
        """Adopt the remote generation; never go backwards. Returns (generation, lost)
        where lost means the remote key is gone (restart, eviction) and must be restored."""
        remote = int(raw) if raw is not None else 0
        self.known = max(self.known, remote)
        self._read_at = time.monotonic()
        return self.known, raw is None and self.known > 0

    def stale(self) -> None:
        """Read the generation again on the next `current` (Redis said its key changed)."""
        self._read_at = None

    async def current(self) -> int:
        """The current generation, re-read at most every `generation_refresh_ms`."""
        read_at = self._read_at
        if read_at is not None and time.monotonic() - read_at < self._refresh_s:
            return self.known
        gen, lost = self._take(await self._client.get(GENERATION_KEY))
        if lost:
            await self._client.set(GENERATION_KEY, gen, nx=True)
        return gen

    async def bump(self) -> int:
        """Set the marker and move every proxy to a new generation (existing keys become
        unreachable). Raises on failure."""
        await self._client.set(INVALIDATED_AT_KEY, self._clock())
        self._marked()
        gen = int(await self._client.incr(GENERATION_KEY))
        if gen <= self.known:
            # The key was lost (restart, eviction) while we knew a higher number.
            gen = self.known + 1
            await self._client.set(GENERATION_KEY, gen)
        self.known = gen
        self._read_at = time.monotonic()
        return gen

    # Puts -------------------------------------------------------------------------------

    def write_indexes(self, pipe: Any, gen: int, items: Sequence[CacheItem]) -> None:
        """Queue on `pipe`: GET marker, then the index updates of `items` under `gen`. The
        caller queues the entries' SETs and then `read_marker`, and hands the replies of
        both GETs to `raced`."""
        now = self._clock()
        index_ttl = max(self._index_ttl_ms, *(it.ttl_ms or 0 for it in items))
        by_metric: dict[str, dict[str, int]] = {}
        self.read_marker(pipe)
        for it in items:
            expires = now + (it.ttl_ms or 0)
            member = f"{it.meta.start_ms}:{it.meta.end_ms}:{it.key.digest}"
            for metric in it.meta.metrics or (ANY_METRIC,):
                members = by_metric.setdefault(metric, {})
                members[member] = max(expires, members.get(member, 0))
        metrics_key = f"{KEY_PREFIX}:g{gen}:metrics"
        for metric, members in by_metric.items():
            idx = f"{KEY_PREFIX}:g{gen}:m:{metric}"
            pipe.zadd(idx, members)
            pipe.zremrangebyscore(idx, "-inf", now)
            pipe.pexpire(idx, index_ttl)
        # GT keeps the latest expiry of each metric (and still adds new ones).
        pipe.zadd(metrics_key, {m: max(ms.values()) for m, ms in by_metric.items()}, gt=True)
        pipe.zremrangebyscore(metrics_key, "-inf", now)
        pipe.pexpire(metrics_key, index_ttl)

    @staticmethod
    def read_marker(pipe: Any) -> None:
        pipe.get(INVALIDATED_AT_KEY)

    def raced(self, marker_before: bytes | None, marker_after: bytes | None, skeys: Sequence[str],
              items: Sequence[CacheItem]) -> list[str]:
        """The keys a put must unlink again: all of them when the marker moved while the
        pipeline ran (an invalidation interleaved with it and may have scanned the indexes
        before our entries were in them), else those fetched before the marker (with skew).
        An invalidation that sets the marker after the last GET scans indexes that already
        hold our entries."""
        if marker_after != marker_before:
            return list(skeys)
        if marker_before is not None:
            cut = int(marker_before) + self._skew_ms
            return [k for k, it in zip(skeys, items) if it.meta.fetched_at_ms < cut]
        return []

    # Invalidation -----------------------------------------------------------------------

    async def invalidate(self, metric_names: Sequence[str] | None, start_ms: int | None,
                         end_ms: int | None) -> int:
        """Set the marker, then unlink the entries of these metrics (None: every metric
        indexed) overlapping `[start_ms, end_ms]` (None: unbounded). Returns how many were
        dropped. Raises on failure."""
        # The marker first: puts of pieces fetched before now are dropped from here on.
        await self._client.set(INVALIDATED_AT_KEY, self._clock())
        self._marked()
        self._read_at = None
        gen = await self.current()
        if metric_names is None:
            names = [m.decode() for m in await self._client.zrange(f"{KEY_PREFIX}:g{gen}:metrics", 0, -1)]
        else:
            names = list(metric_names)
        if ANY_METRIC not in names:
            names.append(ANY_METRIC)
        doomed: set[str] = set()
        stale_members: dict[str, list[bytes]] = {}
        for metric in names:
            idx = f"{KEY_PREFIX}:g{gen}:m:{metric}"
            async for member, _score in self._client.zscan_iter(idx, count=_BATCH):
                start_s, end_s, digest = member.decode().split(":", 2)
                if (end_ms is None or int(start_s) <= end_ms) and (start_ms is None or int(end_s) >= start_ms):
                    doomed.add(f"{KEY_PREFIX}:g{gen}:{digest}")
                    stale_members.setdefault(idx, []).append(member)
        dropped = 0
        doomed_list = sorted(doomed)
        for i in range(0, len(doomed_list), _BATCH):
            pipe = self._client.pipeline(transaction=False)
            for skey in doomed_list[i : i + _BATCH]:
                pipe.execute_command("UNLINK", skey)
            dropped += sum(int(r) for r in await pipe.execute())
        for idx, members in stale_members.items():
            for i in range(0, len(members), _BATCH):
                await self._client.zrem(idx, *members[i : i + _BATCH])
        return dropped
