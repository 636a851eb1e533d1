"""The in-process piece store: an LRU bounded in bytes, with TTLs and invalidation indexes."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from .bound import PayloadLimits
from .frame import encode_value
from .keys import CacheItem, CacheKey, Payload, PieceMeta
from .store import ANY_METRIC, PieceStore

__all__ = ["MemoryStore"]

log = logging.getLogger("promaccel.cache")

@dataclass
class _MemEntry:
    value: bytes
    expires_ms: int
    meta: PieceMeta
    size: int


# Bookkeeping per entry beyond key and value bytes (dict slots, objects), so that many
# tiny entries cannot exceed the bound.
_ENTRY_OVERHEAD = 200


class MemoryStore(PieceStore):
    """In-process LRU bounded in bytes (`cache.max_bytes`; 0 disables it), TTLs honoured.

    Values are framed as in Redis and checked the same way, except for the MAC: they never
    leave process memory (no MAC is computed either). Pieces over `limits` are not stored."""

    kind = "memory"
    verify_mac = False
    mac_key = None

    def __init__(
        self,
        max_bytes: int,
        *,
        clock: Callable[[], int] = wall_ms,
        sweep_interval_ms: int = 1_000,
        skew_ms: int = 0,
        limits: PayloadLimits | None = None,
    ) -> None:
        super().__init__()
        self.limits = limits
        self.max_bytes = max_bytes
        self._clock = clock
        self._sweep_interval_ms = sweep_interval_ms
        self._skew_ms = skew_ms
        self._entries: OrderedDict[str, _MemEntry] = OrderedDict()
        self._index: dict[str, set[str]] = {}
        self._used = 0
        self._generation = 0
        self._invalidated_at_ms: int | None = None
        self._last_sweep_ms = clock()
        self._evictions = 0

    def storage_key(self, key: CacheKey) -> str:
        return key.redis_key(self._generation)

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Payload | None]:
        now = self._clock()
        skeys = [self.storage_key(k) for k in keys]
        values: list[bytes | None] = []
        for skey in skeys:
            entry = self._entries.get(skey)
            if entry is not None and entry.expires_ms <= now:
                self._remove(skey, "expired")
                entry = None
            if entry is None:
                values.append(None)
            else:
                self._entries.move_to_end(skey)
                values.append(entry.value)
        out, bad = self._decode_all(keys, skeys, values)
        for skey in bad:
            self._remove(skey, None)
        self._publish()
        return out

    async def put_many(self, items: Sequence[CacheItem]) -> None:
        try:
            self._put_many(items)
        except Exception:  # a bug here must not fail the background task noisily
            self._n["errors"] += 1
            METRICS.cache_errors.labels("put").inc()
            log.exception("in-process cache put failed")

    def _put_many(self, items: Sequence[CacheItem]) -> None:
        now = self._clock()
        if now - self._last_sweep_ms >= self._sweep_interval_ms:
            self._sweep(now)
        for item in items:
            if item.ttl_ms is None or item.ttl_ms <= 0 or self.max_bytes <= 0:
                self._count_put("not_cached")
                continue
            if self._raced(item.meta):
                self._count_put("raced")
                continue
            if not self._fits(item):
                self._count_put("too_large")
                continue
            skey = self.storage_key(item.key)
            value = encode_value(item.key, item.payload, mac_key=None, skey=skey)
            size = len(value) + len(skey) + _ENTRY_OVERHEAD
            if size > self.max_bytes:
                self._count_put("too_large")
                continue
            self._insert(skey, _MemEntry(value, now + item.ttl_ms, item.meta, size))
            self._count_put("stored", written=len(value))
        self._publish()

    def _raced(self, meta: PieceMeta) -> bool:
        marker = self._invalidated_at_ms
        return marker is not None and meta.fetched_at_ms < marker + self._skew_ms

    def _insert(self, skey: str, entry: _MemEntry) -> None:
        if skey in self._entries:
            self._remove(skey, None)
        self._entries[skey] = entry
        self._used += entry.size
        for metric in entry.meta.metrics or (ANY_METRIC,):
            self._index.setdefault(metric, set()).add(skey)
        while self._used > self.max_bytes:
            oldest = next(iter(self._entries))
            self._remove(oldest, "size")

    def _remove(self, skey: str, reason: Literal["size", "expired"] | None) -> None:
        entry = self._entries.pop(skey, None)
        if entry is None:
            return
        self._used -= entry.size
        for metric in entry.meta.metrics or (ANY_METRIC,):
            keys = self._index.get(metric)
            if keys is not None:
                keys.discard(skey)
                if not keys:
                    del self._index[metric]
        if reason is not None:
            self._evictions += 1
            METRICS.cache_evictions.labels(reason).inc()

    def _sweep(self, now: int) -> None:
        self._last_sweep_ms = now
        for skey in [k for k, e in self._entries.items() if e.expires_ms <= now]:
            self._remove(skey, "expired")

    def _put_raw(self, skey: str, value: bytes, ttl_ms: int, meta: PieceMeta) -> None:
        """Test hook: plant an arbitrary value under a storage key."""
        size = len(value) + len(skey) + _ENTRY_OVERHEAD
        self._insert(skey, _MemEntry(value, self._clock() + ttl_ms, meta, size))

    async def invalidate(
        self,
        metric_names: Sequence[str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        self._invalidated_at_ms = self._clock()
        if metric_names is None:
            candidates: set[str] = set(self._entries)
        else:
            candidates = set()
            for metric in (*metric_names, ANY_METRIC):
                candidates |= self._index.get(metric, set())
        dropped = 0
        for skey in candidates:
            entry = self._entries.get(skey)
            if entry is not None and entry.meta.overlaps(start_ms, end_ms):
                self._remove(skey, None)
                dropped += 1
        self._n["invalidated"] += dropped
        METRICS.cache_invalidated.labels(self.kind).inc(dropped)
        self._publish()
        return dropped

    async def bump_generation(self) -> int:
        self._invalidated_at_ms = self._clock()
        self._generation += 1
        # Old entries can never match again: free their memory now.
        self._entries.clear()
        self._index.clear()
        self._used = 0
        self._publish()
        return self._generation

    async def aclose(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._used = 0
        self._publish()

    def _publish(self) -> None:
        METRICS.cache_memory_bytes.set(self._used)
        METRICS.cache_memory_entries.set(len(self._entries))

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "entries": len(self._entries),
            "bytes": self._used,
            "max_bytes": self.max_bytes,
            "evictions": self._evictions,
            "generation": self._generation,
        }
