"""Piece store: finished pieces (Arrow IPC bytes) kept in process or in Redis.

The only module of promaccel that imports `redis`. The executor looks pieces up with one
`get_many` per query and writes them back with `put_many` as a background task; neither
ever raises or stalls a query: a failing, slow or down Redis reads as misses and drops
writes (`promaccel_cache_errors_total{op}`), a circuit breaker then skips Redis for a short
back-off, and the store recovers by itself. Concurrent lookups of the same keys share one
read (`promaccel_coalesced_calls_total{flight="cache_read"}`), from a bounded blocking
connection pool, under deadlines that count the event loop's idle time, not its lag.

Keys. `CacheKey` holds everything that changes a piece's answer; `canonical()` is its
deterministic text (ASCII JSON of a fixed field list) and `redis_key(gen)` is
`promaccel:v1:g<gen>:<sha256 of canonical>`. No Redis Cluster hash tag: keys spread over all
slots and a batched read is split per node (`mget_nonatomic`).

Values. `encode_value` frames a payload as

    magic b"PAXC" | frame version u8 | len(canonical) u32 | crc32(canonical + payload) u32
    | canonical | payload

and `decode_value` checks magic, version, length, checksum and that the stored canonical
equals the requested one. Any failure is a miss and the value is deleted -- a canonical
mismatch under the same sha256 too: a true collision is astronomically unlikely, so a
mismatch means a bug or a foreign writer, and dropping it costs one miss (if it ever were a
real collision, the two pieces would evict each other rather than answer for each other).

Freshness (`ttl_for`). A piece whose data ends within `cache.max_freshness` of now gets
`cache.recent_ttl` (0: not cached); an older piece gets `cache.ttl`.

Invalidation. Each put carries a `PieceMeta`: the metric names the piece reads (empty:
unknown, so any invalidation matches it) and the time range of samples it reads. The store
indexes entries by metric (in Redis: one sorted set per metric and generation, members
`<start_ms>:<end_ms>:<sha>` scored by expiry and trimmed on every write), and
`invalidate(metrics, start_ms, end_ms)` drops the entries of those metrics that overlap the
range. `bump_generation()` makes every existing key unreachable (Redis: `INCR
promaccel:generation`, which every proxy re-reads at most every `generation_refresh_ms`).
Both record the time of the invalidation (`promaccel:invalidated_at`); a put whose piece was
fetched before that (allowing `skew_ms` of clock skew between proxies) is dropped, and a put
that sees the marker move while it writes deletes what it wrote, so a piece fetched before
an invalidation never survives it.

Redis URLs: `redis://`, `rediss://`, `unix://` for one server; `redis+cluster://host:port`
(or `rediss+cluster://`, several seed nodes comma-separated) for Redis Cluster.
Recommended server setting: `maxmemory-policy volatile-lru` -- every entry has a TTL and
the generation key has none, so Redis evicts entries but never the generation.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shardplanner.plan import Piece, ShardSpec

from .config import CacheConfig
from .errors import PromError
from .metrics import METRICS

log = logging.getLogger("promaccel.cache")

__all__ = [
    "FORMAT_VERSION",
    "CacheItem",
    "CacheKey",
    "CircuitBreaker",
    "CorruptValue",
    "MemoryStore",
    "PieceMeta",
    "PieceStore",
    "RedisStore",
    "decode_value",
    "encode_value",
    "make_store",
    "ttl_for",
]

# Version of the payload layout (arrowcodec's Arrow IPC table); part of every key, so a new
# layout never reads an old one.
FORMAT_VERSION = 1
KEY_PREFIX = "promaccel:v1"
GENERATION_KEY = "promaccel:generation"
INVALIDATED_AT_KEY = "promaccel:invalidated_at"
# Index name for pieces whose metric names are unknown: every invalidation matches them.
ANY_METRIC = "*"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------------------
# Keys


@dataclass(frozen=True)
class CacheKey:
    """Everything that changes a piece's answer.

    query           the piece's PromQL exactly as sent to the backend (after normalisation)
    start_ms/end_ms/step_ms   range piece; time_ms: instant piece
    step_offset_ms  offset of the query's step grid (start mod step of the whole query)
    shard           the injected shard matcher, None when not sharded
    lookback_ms     the query's lookback delta
    route           backend name(s) the piece is answered from, in merge order
    tenant          tenant / auth scope: one caller's data never answers another
    format_version  payload layout version
    """

    query: str
    start_ms: int | None = None
    end_ms: int | None = None
    step_ms: int | None = None
    time_ms: int | None = None
    step_offset_ms: int = 0
    shard: ShardSpec | None = None
    lookback_ms: int = 300_000
    route: tuple[str, ...] = ()
    tenant: str = ""
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_piece(
        cls,
        piece: Piece,
        *,
        lookback_ms: int,
        route: Sequence[str],
        tenant: str = "",
        step_offset_ms: int | None = None,
        format_version: int = FORMAT_VERSION,
    ) -> CacheKey:
        if step_offset_ms is None:
            step_offset_ms = (
                piece.start_ms % piece.step_ms
                if piece.step_ms and piece.start_ms is not None
                else 0
            )
        return cls(
            query=piece.query,
            start_ms=piece.start_ms,
            end_ms=piece.end_ms,
            step_ms=piece.step_ms,
            time_ms=piece.time_ms,
            step_offset_ms=step_offset_ms,
            shard=piece.shard,
            lookback_ms=lookback_ms,
            route=tuple(route),
            tenant=tenant,
            format_version=format_version,
        )

    def canonical(self) -> str:
        return self._canonical

    @cached_property
    def _canonical(self) -> str:
        s = self.shard
        shard = None if s is None else [s.label, s.index, s.count, s.matcher_op, s.matcher_value]
        fields = [
            "piece",
            self.format_version,
            self.query,
            self.start_ms,
            self.end_ms,
            self.step_ms,
            self.time_ms,
            self.step_offset_ms,
            shard,
            self.lookback_ms,
            list(self.route),
            self.tenant,
        ]
        # ASCII JSON: unambiguous (no delimiter can be forged inside a string) and stable.
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":"))

    @cached_property
    def canonical_bytes(self) -> bytes:
        return self._canonical.encode("ascii")

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_bytes).hexdigest()

    def redis_key(self, generation: int) -> str:
        return f"{KEY_PREFIX}:g{generation}:{self.digest}"


@dataclass(frozen=True)
class PieceMeta:
    """What invalidation needs to know about a stored piece.

    metrics        metric names the piece reads; empty when unknown (e.g. a regex on
                   __name__): such a piece matches every invalidation
    start_ms/end_ms  time range of the samples the piece reads, i.e. its first evaluation
                   time minus the longest range/lookback/offset, to its last evaluation time
    fetched_at_ms  wall-clock time the backend call for the piece was sent; a piece fetched
                   before an invalidation is not stored
    """

    metrics: tuple[str, ...]
    start_ms: int
    end_ms: int
    fetched_at_ms: int

    def overlaps(self, start_ms: int | None, end_ms: int | None) -> bool:
        return (end_ms is None or self.start_ms <= end_ms) and (start_ms is None or self.end_ms >= start_ms)


class CacheItem(NamedTuple):
    """One piece to store. `ttl_ms` None or <= 0: not stored (pass `ttl_for`'s answer)."""

    key: CacheKey
    payload: bytes
    ttl_ms: int | None
    meta: PieceMeta


def ttl_for(piece_end_ms: int, now_ms: int, cfg: CacheConfig) -> int | None:
    """TTL for a piece whose data ends at `piece_end_ms` (instant piece: its time), or None.

    Recent pieces still change (late scrapes, out-of-order samples), so they get the short
    `recent_ttl` (0: not cached) -- enough for a storm of identical refreshes to cost one
    backend call. With `out_of_order_window`/`out_of_order_ttl` configured, pieces inside
    the backend's out-of-order window get that shorter TTL instead of the long one.
    """
    if piece_end_ms > now_ms - cfg.max_freshness:
        return cfg.recent_ttl or None
    # Optional keys (not every CacheConfig has them): 0 means "no out-of-order window".
    ooo_window = int(getattr(cfg, "out_of_order_window", 0) or 0)
    ooo_ttl = int(getattr(cfg, "out_of_order_ttl", 0) or 0)
    if ooo_window and piece_end_ms > now_ms - ooo_window:
        return ooo_ttl or None
    return cfg.ttl or None


# --------------------------------------------------------------------------------------
# Value framing

MAGIC = b"PAXC"
FRAME_VERSION = 1
_HEADER = struct.Struct(">4sBII")  # magic, frame version, len(canonical), crc32


class CorruptValue(Exception):
    """A stored value that is not a valid frame for the requested key."""

    def __init__(self, reason: Literal["truncated", "magic", "version", "checksum", "collision"]) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_value(key: CacheKey, payload: bytes) -> bytes:
    canonical = key.canonical_bytes
    crc = zlib.crc32(payload, zlib.crc32(canonical))
    return b"".join((_HEADER.pack(MAGIC, FRAME_VERSION, len(canonical), crc), canonical, payload))


def decode_value(key: CacheKey, value: bytes, *, verify_checksum: bool = True) -> bytes:
    """The payload of `value` if it is a sound frame for `key`, else CorruptValue.

    The checksum costs about 1 ms per MB; the in-process store skips it (its values never
    leave process memory) but still checks the frame and the key."""
    if len(value) < _HEADER.size:
        raise CorruptValue("truncated")
    magic, version, clen, crc = _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise CorruptValue("magic")
    if version != FRAME_VERSION:
        raise CorruptValue("version")
    body = _HEADER.size + clen
    if len(value) < body:
        raise CorruptValue("truncated")
    view = memoryview(value)
    if verify_checksum and zlib.crc32(view[body:], zlib.crc32(view[_HEADER.size : body])) != crc:
        raise CorruptValue("checksum")
    if view[_HEADER.size : body] != key.canonical_bytes:
        raise CorruptValue("collision")
    return value[body:]


# --------------------------------------------------------------------------------------
# Store interface


class _RateLimitedLog:
    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, topic: str, message: str) -> None:
        """Log `message` unless `topic` was logged less than the interval ago."""
        now = time.monotonic()
        last = self._last.get(topic)
        if last is not None and now - last < self._interval_s:
            self._suppressed[topic] = self._suppressed.get(topic, 0) + 1
            return
        self._last[topic] = now
        more = self._suppressed.pop(topic, 0)
        log.warning("%s%s", message, f" ({more} more since the last report)" if more else "")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PieceStore(ABC):
    """Where finished pieces live. Reads and writes never raise; admin calls may."""

    kind: str
    verify_checksum = True

    def __init__(self, log_interval_s: float = 30.0) -> None:
        self._log = _RateLimitedLog(log_interval_s)
        self._n: dict[str, int] = {
            "hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0, "stored": 0,
            "not_cached": 0, "too_large": 0, "raced": 0, "corrupt": 0, "invalidated": 0,
            "errors": 0, "bypassed": 0,
        }

    @abstractmethod
    async def get_many(self, keys: Sequence[CacheKey]) -> list[bytes | None]:
        """Payloads in key order, None for misses. One round trip for all keys."""

    @abstractmethod
    async def put_many(self, items: Sequence[CacheItem]) -> None:
        """Store pieces (pipelined). Never raises: meant to run as a background task."""

    @abstractmethod
    async def invalidate(
        self,
        metric_names: Sequence[str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        """Drop entries that read any of `metric_names` (None: all) and whose data overlaps
        [start_ms, end_ms] (None: unbounded). Returns how many were dropped. Raises
        PromError("unavailable") when the store cannot be reached."""

    @abstractmethod
    async def bump_generation(self) -> int:
        """Make every existing entry unreachable; returns the new generation."""

    @abstractmethod
    async def aclose(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        return {"kind": self.kind, **self._n}

    # Shared bookkeeping ----------------------------------------------------------------

    def _decode_all(
        self, keys: Sequence[CacheKey], skeys: Sequence[str], values: Sequence[bytes | None]
    ) -> tuple[list[bytes | None], list[str]]:
        """Verify raw values: payloads (None for misses) and the storage keys to delete."""
        out, bad = self._verify(keys, skeys, values)
        self._count_payloads(out)
        return out, bad

    def _count_payloads(self, payloads: Sequence[bytes | None]) -> None:
        hits = sum(1 for p in payloads if p is not None)
        self._count_lookups(hits, len(payloads) - hits, sum(len(p) for p in payloads if p is not None))

    def _verify(
        self, keys: Sequence[CacheKey], skeys: Sequence[str], values: Sequence[bytes | None]
    ) -> tuple[list[bytes | None], list[str]]:
        """Payloads of sound frames (None for misses and corrupt values), and the storage
        keys of the corrupt ones (to delete). Counts corrupt values, not lookups."""
        out: list[bytes | None] = []
        bad: list[str] = []
        for key, skey, value in zip(keys, skeys, values):
            if value is None:
                out.append(None)
                continue
            try:
                payload = decode_value(key, value, verify_checksum=self.verify_checksum)
            except CorruptValue as exc:
                METRICS.cache_corrupt.labels(self.kind, exc.reason).inc()
                self._n["corrupt"] += 1
                self._log.warning("corrupt", f"cache entry {skey} is corrupt ({exc.reason}): deleting it")
                bad.append(skey)
                out.append(None)
                continue
            out.append(payload)
        return out, bad

    def _count_lookups(self, hits: int, misses: int, read: int = 0) -> None:
        self._n["hits"] += hits
        self._n["misses"] += misses
        self._n["bytes_read"] += read
        if hits:
            METRICS.cache_pieces.labels(self.kind, "hit").inc(hits)
            METRICS.cache_read_bytes.labels(self.kind).inc(read)
        if misses:
            METRICS.cache_pieces.labels(self.kind, "miss").inc(misses)

    def _count_put(self, result: str, n: int = 1, written: int = 0) -> None:
        if n:
            self._n[result] += n
            METRICS.cache_puts.labels(self.kind, result).inc(n)
        if written:
            self._n["bytes_written"] += written
            METRICS.cache_written_bytes.labels(self.kind).inc(written)


# --------------------------------------------------------------------------------------
# In-process store


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

    Values are framed as in Redis and checked the same way, except for the checksum."""

    kind = "memory"
    verify_checksum = False

    def __init__(
        self,
        max_bytes: int,
        *,
        clock: Callable[[], int] = wall_ms,
        sweep_interval_ms: int = 1_000,
        skew_ms: int = 0,
    ) -> None:
        super().__init__()
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

    async def get_many(self, keys: Sequence[CacheKey]) -> list[bytes | None]:
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
            skey = self.storage_key(item.key)
            value = encode_value(item.key, item.payload)
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


# --------------------------------------------------------------------------------------
# Redis store


class CircuitBreaker:
    """Skips Redis for a back-off after `failures` consecutive failures, then lets one
    probe call through: success closes it, failure re-opens it with twice the back-off
    (up to `max_backoff_ms`)."""

    def __init__(
        self,
        failures: int = 3,
        backoff_ms: int = 1_000,
        max_backoff_ms: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = max(1, failures)
        self._base_s = backoff_ms / 1000
        self._max_s = max(max_backoff_ms, backoff_ms) / 1000
        self._clock = clock
        self._failures = 0
        self._backoff_s = self._base_s
        self._open_until: float | None = None
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        if self._open_until is None:
            return True
        if self._clock() < self._open_until or self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        self._failures = 0
        self._backoff_s = self._base_s
        self._open_until = None
        self._probing = False
        METRICS.cache_breaker_open.set(0)

    def failure(self) -> None:
        self._failures += 1
        if self._probing or (self._open_until is None and self._failures >= self._threshold):
            self._probing = False
            self._open_until = self._clock() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._max_s)
            METRICS.cache_breaker_open.set(1)

    def release(self) -> None:
        """The probe ended without an answer either way (cancelled)."""
        self._probing = False


_T = TypeVar("_T")
_FAILED: Any = object()


_SCHEDSTAT = threading.local()


def _busy_s() -> float:
    """Seconds this thread has been running or runnable: its CPU time plus its time waiting
    for a CPU (Linux /proc/thread-self/schedstat), or its CPU time where that is missing."""
    fd = getattr(_SCHEDSTAT, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _SCHEDSTAT.fd = fd
    if fd >= 0:
        try:
            run_ns, wait_ns, _ = os.pread(fd, 128, 0).split()
            return (int(run_ns) + int(wait_ns)) / 1e9
        except (OSError, ValueError):
            pass
    return time.thread_time()


async def _idle_timeout(aw: Awaitable[_T], idle_s: float, max_wall_s: float) -> _T:
    """Await `aw` until this thread has been *idle* (blocked waiting for I/O: wall time minus
    its CPU time and its time waiting for a CPU) for `idle_s`, or `max_wall_s` of wall time
    passed; then cancel it, TimeoutError.

    Under load the event loop runs other requests' work (encoding answers, merging) between
    a Redis reply's arrival and its reading, and on a busy machine it also waits for a CPU;
    a plain wall-clock deadline counts that lag against Redis and turns healthy reads into
    misses. A stalled Redis leaves the loop idle, so this still times out after `idle_s`.

    Like asyncio.timeout, `aw` runs in the calling task (no task of its own per call: this
    wraps every cache read and write); a timer re-checks the idle time when it fires and
    cancels the task only once the deadline has really passed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    wall0, busy0 = time.monotonic(), _busy_s()
    expired = False

    def check() -> None:
        nonlocal handle, expired
        wall = time.monotonic() - wall0
        idle = wall - (_busy_s() - busy0)
        wait_s = min(idle_s - idle, max_wall_s - wall)
        if wait_s <= 0:
            expired = True
            task.cancel()
        else:
            handle = loop.call_later(wait_s, check)

    handle = loop.call_later(max(0.0, min(idle_s, max_wall_s)), check)
    try:
        return await aw
    except asyncio.CancelledError:
        if expired and task.uncancel() <= cancelling:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()
        if asyncio.iscoroutine(aw):
            aw.close()  # never started (cancelled at once): no "never awaited" warning


def _connect(url: str, connect_timeout_s: float, max_connections: int = 64) -> tuple[Any, bool]:
    """A redis.asyncio client for `url`, and whether it is a cluster client.

    One server: a *blocking* pool of `max_connections` (a caller waits for a free
    connection, within the store's own deadline). redis-py's default pool raises
    MaxConnectionsError as soon as 100 commands are in flight, which 50 dashboard users (300
    concurrent panel requests) hit at once: every such read was a cache error, three in a row
    opened the breaker, and the whole cache was bypassed. Cluster: `max_connections` per node
    (redis-py's cluster pool does not block; reads are coalesced, so few are in flight)."""
    common: dict[str, Any] = {
        # Reads are bounded by the store's per-call deadlines instead (asyncio.timeout;
        # redis-py drops a connection whose read was cancelled): a socket timeout would
        # cut a large batch at the fixed connect timeout.
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout_s,
        "health_check_interval": 0,
        "decode_responses": False,
        "client_name": "promaccel",
    }
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("redis+cluster", "rediss+cluster"):
        userinfo, _, hosts = parts.netloc.rpartition("@")
        seeds = [h for h in hosts.split(",") if h]
        if not seeds:
            raise ValueError(f"cache.redis_url {url!r}: no cluster node given")
        first = urlunsplit((scheme.split("+")[0], f"{userinfo}@{seeds[0]}" if userinfo else seeds[0],
                            parts.path, parts.query, ""))
        others = []
        for seed in seeds[1:]:
            host, _, port = seed.rpartition(":")
            others.append(ClusterNode(host.strip("[]"), int(port)))
        # One retry without back-off lets a MOVED answer after resharding be followed; the
        # store's own deadline bounds the call either way.
        client = RedisCluster.from_url(first, startup_nodes=others or None, retry=Retry(NoBackoff(), 1),
                                       max_connections=max_connections, **common)
        return client, True
    if scheme in ("redis", "rediss", "unix"):
        # No client-side retries: a failed call is a miss, and the breaker handles outages.
        # timeout=None: waiting for a connection is bounded by the store's deadlines.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, retry=Retry(NoBackoff(), 0), **common
        )
        return aioredis.Redis.from_pool(pool), False
    raise ValueError(
        f"cache.redis_url {url!r}: expected redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
    )


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


class RedisStore(PieceStore):
    """Pieces in Redis or Redis Cluster (redis.asyncio, hiredis parser).

    timeout_ms            the deadline of a read (get_many) ...
    timeout_per_key_ms    ... plus this much per key: a batch of 50 pieces of 100 KB takes
                          15-30 ms on loopback (most of it client-side parsing), so a fixed
                          deadline would turn big batches into misses. The read deadline
                          counts only the time the event loop's thread was blocked waiting
                          for I/O (wall time minus its CPU time and its wait for a CPU,
                          `_idle_timeout`): under load the loop runs other requests' work for
                          a second before it reads Redis's reply, and on a busy machine it
                          waits for a CPU; that lag says nothing about Redis. A stalled
                          Redis leaves the loop idle, so it still times out in time.
    max_wait_ms           ... but a read never takes more than this much wall time (a
                          background write: 5x put_timeout_ms, at least this); also the
                          connect timeout
    put_timeout_ms        deadline of a background write, in idle time as for reads
    max_connections       connection pool size (per node for Redis Cluster); a read or write
                          waits for a free connection within its deadline
    admin_timeout_ms      deadline of invalidate / bump_generation (these raise on failure)
    generation_refresh_ms how often the generation number is re-read
    breaker_*             see CircuitBreaker
    index_ttl_ms          lifetime of the invalidation indexes: at least the longest entry TTL
    skew_ms               clock skew allowed between proxies for the invalidation marker
    """

    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int = 100,
        timeout_per_key_ms: float = 1.0,
        max_wait_ms: int = 5_000,
        max_connections: int = 64,
        put_timeout_ms: int = 2_000,
        admin_timeout_ms: int = 30_000,
        generation_refresh_ms: int = 2_000,
        breaker_failures: int = 3,
        breaker_backoff_ms: int = 1_000,
        breaker_max_backoff_ms: int = 10_000,
        index_ttl_ms: int = 7 * 86_400_000,
        skew_ms: int = 5_000,
        log_interval_s: float = 30.0,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        super().__init__(log_interval_s)
        self.url = url
        # Connect timeout: wall clock inside redis-py, so not the read deadline (a loop that
        # lags under load would fail healthy connects); reads and writes stay bounded by
        # their own deadlines, and a refused connection fails at once anyway.
        self._client, self.cluster = _connect(url, max(max_wait_ms, timeout_ms) / 1000, max_connections)
        self._timeout_s = timeout_ms / 1000
        self._per_key_s = timeout_per_key_ms / 1000
        self._max_wait_s = max(max_wait_ms, timeout_ms) / 1000
        # Reads in flight, per key digest: a lookup for a key that another lookup is reading
        # right now waits for that read (50 users on one dashboard: one MGET, not 50).
        self._reads: dict[str, asyncio.Future[bytes | None]] = {}
        self._read_tasks: set[asyncio.Task[None]] = set()
        self._put_timeout_s = put_timeout_ms / 1000
        self._admin_timeout_s = admin_timeout_ms / 1000
        self._gen_refresh_s = generation_refresh_ms / 1000
        self._index_ttl_ms = index_ttl_ms
        self._skew_ms = skew_ms
        self._clock = clock
        self.breaker = CircuitBreaker(breaker_failures, breaker_backoff_ms, breaker_max_backoff_ms)
        self._generation = 0
        self._gen_read_at: float | None = None

    # Guarding ---------------------------------------------------------------------------

    async def _guarded(self, op: str, deadline_s: float, fn: Callable[[], Awaitable[_T]],
                       *, idle_deadline: bool = False, max_wall_s: float | None = None) -> _T:
        """fn() within the deadline, or _FAILED (counted, logged, fed to the breaker).
        idle_deadline: the deadline counts the loop's idle time only (see the class doc)."""
        if not self.breaker.allow():
            self._n["bypassed"] += 1
            METRICS.cache_bypassed.labels(op).inc()
            return _FAILED  # type: ignore[no-any-return]
        try:
            if idle_deadline:
                result = await _idle_timeout(fn(), deadline_s, max_wall_s or self._max_wait_s)
            else:
                async with asyncio.timeout(deadline_s):
                    result = await fn()
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        except Exception as exc:  # noqa: BLE001 -- the cache never fails a query
            self._failed(op, exc)
            return _FAILED  # type: ignore[no-any-return]
        self.breaker.success()
        return result

    def _failed(self, op: str, exc: BaseException) -> None:
        self._n["errors"] += 1
        METRICS.cache_errors.labels(op).inc()
        self.breaker.failure()
        self._log.warning(op, f"redis cache {op} failed, bypassing the cache: {_describe(exc)}")

    async def _admin(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        try:
            async with asyncio.timeout(self._admin_timeout_s):
                return await fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._n["errors"] += 1
            METRICS.cache_errors.labels(op).inc()
            log.warning("redis cache %s failed: %s", op, _describe(exc))
            raise PromError("unavailable", f"cache {op} failed: {_describe(exc)}") from exc

    # Generation -------------------------------------------------------------------------

    def _take_generation(self, raw: bytes | None) -> tuple[int, bool]:
        """Adopt the remote generation; never go backwards. Returns (generation, lost)
        where lost means the remote key is gone (restart, eviction) and must be restored."""
        remote = int(raw) if raw is not None else 0
        self._generation = max(self._generation, remote)
        self._gen_read_at = time.monotonic()
        return self._generation, raw is None and self._generation > 0

    async def _current_generation(self) -> int:
        read_at = self._gen_read_at
        if read_at is not None and time.monotonic() - read_at < self._gen_refresh_s:
            return self._generation
        gen, lost = self._take_generation(await self._client.get(GENERATION_KEY))
        if lost:
            await self._client.set(GENERATION_KEY, gen, nx=True)
        return gen

    # Reads ------------------------------------------------------------------------------

    def storage_key(self, key: CacheKey) -> str:
        return key.redis_key(self._generation)

    async def get_many(self, keys: Sequence[CacheKey]) -> list[bytes | None]:
        """Keys another lookup is reading right now are awaited from that read; the rest
        are read with one MGET (per node for a cluster) in a task of their own, so a caller
        that gives up does not fail the lookups that joined its read."""
        if not keys:
            return []
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[bytes | None]] = []
        mine: dict[str, tuple[CacheKey, asyncio.Future[bytes | None]]] = {}
        joined = 0
        for k in keys:
            fut = self._reads.get(k.digest)
            if fut is None:
                fut = self._reads[k.digest] = loop.create_future()
                mine[k.digest] = (k, fut)
            else:
                joined += 1
            futs.append(fut)
        if joined:
            METRICS.coalesced.labels("cache_read").inc(joined)
        if mine:
            task = loop.create_task(self._read([k for k, _ in mine.values()], [f for _, f in mine.values()]))
            self._read_tasks.add(task)
            task.add_done_callback(self._read_tasks.discard)
        # asyncio.wait, not gather: a caller cancelled here must not cancel shared reads.
        await asyncio.wait(set(futs))
        out = [f.result() for f in futs]
        self._count_payloads(out)
        return out

    async def _read(self, keys: list[CacheKey], futs: list[asyncio.Future[bytes | None]]) -> None:
        """One batched read; resolves every future (None on any failure), never raises."""
        out: list[bytes | None] = [None] * len(keys)
        try:
            deadline_s = self._timeout_s + self._per_key_s * len(keys)
            fetched = await self._guarded("get", deadline_s, lambda: self._mget(keys), idle_deadline=True)
            if fetched is not _FAILED:
                skeys, values = fetched
                out, bad = self._verify(keys, skeys, values)
                if bad:
                    self._spawn_read_task(self._guarded("delete", self._timeout_s, lambda: self._unlink(bad)))
        except BaseException:  # noqa: BLE001 -- cancelled at shutdown: the waiters read misses
            pass
        finally:
            for k, fut, payload in zip(keys, futs, out):
                if self._reads.get(k.digest) is fut:
                    del self._reads[k.digest]
                if not fut.done():
                    fut.set_result(payload)

    def _spawn_read_task(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._read_tasks.add(task)
        task.add_done_callback(self._read_tasks.discard)

    async def _mget(self, keys: Sequence[CacheKey]) -> tuple[list[str], list[bytes | None]]:
        gen = await self._current_generation()
        skeys = [k.redis_key(gen) for k in keys]
        if self.cluster:
            values = await self._client.mget_nonatomic(skeys)
        else:
            values = await self._client.mget(skeys)
        return skeys, values

    async def _unlink(self, skeys: Sequence[str]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for skey in skeys:
            # execute_command: a cluster pipeline's unlink() is a coroutine, not queued.
            pipe.execute_command("UNLINK", skey)
        await pipe.execute()

    # Writes -----------------------------------------------------------------------------

    async def put_many(self, items: Sequence[CacheItem]) -> None:
        keep = [it for it in items if it.ttl_ms is not None and it.ttl_ms > 0]
        self._count_put("not_cached", len(items) - len(keep))
        if keep:
            await self._guarded("put", self._put_timeout_s, lambda: self._put(keep), idle_deadline=True,
                                max_wall_s=max(self._max_wait_s, 5 * self._put_timeout_s))

    async def _put(self, items: list[CacheItem]) -> None:
        """One round trip: [GET marker, index updates, SETs, GET marker]. Entries fetched
        before the marker read first, or all of them when the marker moved while the
        pipeline ran (an invalidation interleaved with it and may have scanned the indexes
        before our entries were in them), are unlinked again; an invalidation that sets
        the marker after the last GET scans indexes that already hold our entries."""
        gen = await self._current_generation()
        now = self._clock()
        index_ttl = max(self._index_ttl_ms, *(it.ttl_ms or 0 for it in items))
        by_metric: dict[str, dict[str, int]] = {}
        skeys: list[str] = []
        pipe = self._client.pipeline(transaction=False)
        pipe.get(INVALIDATED_AT_KEY)
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
        written = 0
        for it in items:
            skey = it.key.redis_key(gen)
            value = encode_value(it.key, it.payload)
            pipe.set(skey, value, px=it.ttl_ms)
            skeys.append(skey)
            written += len(value)
        pipe.get(INVALIDATED_AT_KEY)
        replies = await pipe.execute()
        marker_before, marker_after = replies[0], replies[-1]
        if marker_after != marker_before:
            doomed = skeys
        elif marker_before is not None:
            cut = int(marker_before) + self._skew_ms
            doomed = [k for k, it in zip(skeys, items) if it.meta.fetched_at_ms < cut]
        else:
            doomed = []
        if doomed:
            await self._unlink(doomed)
            self._count_put("raced", len(doomed))
        stored = len(items) - len(doomed)
        if stored:
            self._count_put("stored", stored, written * stored // len(items))

    # Admin ------------------------------------------------------------------------------

    async def invalidate(
        self,
        metric_names: Sequence[str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        dropped = await self._admin("invalidate", lambda: self._invalidate(metric_names, start_ms, end_ms))
        self._n["invalidated"] += dropped
        METRICS.cache_invalidated.labels(self.kind).inc(dropped)
        return dropped

    async def _invalidate(
        self, metric_names: Sequence[str] | None, start_ms: int | None, end_ms: int | None
    ) -> int:
        # The marker first: puts of pieces fetched before now are dropped from here on.
        await self._client.set(INVALIDATED_AT_KEY, self._clock())
        self._reads.clear()  # lookups from now on read afresh
        self._gen_read_at = None
        gen = await self._current_generation()
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
            async for member, _score in self._client.zscan_iter(idx, count=1000):
                start_s, end_s, digest = member.decode().split(":", 2)
                if (end_ms is None or int(start_s) <= end_ms) and (start_ms is None or int(end_s) >= start_ms):
                    doomed.add(f"{KEY_PREFIX}:g{gen}:{digest}")
                    stale_members.setdefault(idx, []).append(member)
        dropped = 0
        doomed_list = sorted(doomed)
        for i in range(0, len(doomed_list), 1000):
            pipe = self._client.pipeline(transaction=False)
            for skey in doomed_list[i : i + 1000]:
                pipe.execute_command("UNLINK", skey)
            dropped += sum(int(r) for r in await pipe.execute())
        for idx, members in stale_members.items():
            for i in range(0, len(members), 1000):
                await self._client.zrem(idx, *members[i : i + 1000])
        return dropped

    async def bump_generation(self) -> int:
        async def bump() -> int:
            await self._client.set(INVALIDATED_AT_KEY, self._clock())
            self._reads.clear()  # lookups from now on read afresh
            gen = int(await self._client.incr(GENERATION_KEY))
            if gen <= self._generation:
                # The key was lost (restart, eviction) while we knew a higher number.
                gen = self._generation + 1
                await self._client.set(GENERATION_KEY, gen)
            self._generation = gen
            self._gen_read_at = time.monotonic()
            return gen

        return await self._admin("bump", bump)

    async def aclose(self) -> None:
        for task in list(self._read_tasks):
            task.cancel()
        try:
            await self._client.aclose()
        except Exception as exc:  # closing a broken connection must not fail shutdown
            log.debug("closing the redis cache client: %s", exc)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "url": _redact(self.url),
            "cluster": self.cluster,
            "generation": self._generation,
            "breaker_open": self.breaker.is_open,
        }


# --------------------------------------------------------------------------------------


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
