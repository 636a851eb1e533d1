"""The piece store interface (`PieceStore`) and the bookkeeping every store shares.

The executor looks pieces up with one `get_many` per query and writes them back with
`put_many` as a background task; neither ever raises or stalls a query (a failing store
reads as misses and drops writes). Admin calls (`invalidate`, `bump_generation`) may raise.

Invalidation. Each put carries a `PieceMeta`: the metric names the piece reads (empty:
unknown, so any invalidation matches it) and the time range of samples it reads.
`invalidate(metrics, start_ms, end_ms)` drops the entries of those metrics that overlap the
range; `bump_generation()` makes every existing key unreachable. Both record the time of the
invalidation; a put whose piece was fetched before that (allowing `skew_ms` of clock skew
between proxies) is dropped, so a piece fetched before an invalidation never survives it.

Integrity (issue 26). Values are authenticated frames (frame.py: an HMAC keyed by the shared
cache secret, over the storage key, the canonical key and the payload) whose payloads are
bounded before they are decoded (bound.py, `limits`): a forged, foreign or oversized value is
a miss (`promaccel_cache_corrupt_entries_total{reason}`) and is deleted, never served and
never an error. A piece over the bounds is not stored either (`puts_total{result="too_large"}`).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from ..observe.metrics import METRICS
from .bound import PayloadLimits, check_payload
from .frame import DEFAULT_KEY, CorruptValue, decode_value
from .keys import CacheItem, CacheKey, Payload

__all__ = ["ANY_METRIC", "LeaseTable", "PieceStore", "RateLimitedLog", "Tagged", "describe"]

log = logging.getLogger("promaccel.cache")

# Index name for pieces whose metric names are unknown: every invalidation matches them.
ANY_METRIC = "*"


class LeaseTable(Protocol):
    """Fetch leases shared by the processes using one store (`leases.RedisLeases` for Redis;
    `pipeline/leases.py` drives them). Every call answers None (release: False) when the store
    failed: the caller then fetches by itself."""

    # Leases found without a TTL or with too long a one, and deleted (issue 26).
    ignored: int

    async def acquire(self, keys: Sequence[CacheKey], tokens: Sequence[str],
                      ttl_ms: int) -> tuple[list[bool], list[Payload | None]] | None:
        """Take each key's lease, then read the pieces: (taken, payloads already stored)."""

    async def renew(self, digests: Sequence[str], tokens: Sequence[str], ttl_ms: int) -> list[bool] | None:
        """Extend the leases still held with these tokens."""

    async def release(self, digests: Sequence[str], tokens: Sequence[str]) -> bool:
        """Delete the leases still held with these tokens."""

    async def poll(self, keys: Sequence[CacheKey],
                   max_ttl_ms: int | None = None) -> tuple[list[bool], list[Payload | None]] | None:
        """Which leases are held, then the pieces (payloads of sound frames)."""


class Tagged(NamedTuple):
    """One entry read by `PieceStore.get_tagged`:

    payload and tag   read now: the payload of a sound frame and that frame's tag (its MAC,
                      frame.frame_mac; None from a store without MACs)
    payload None, tag the entry is still the frame of the tag the reader gave (`same`): its
                      payload was not read
    both None         a miss
    """

    payload: Payload | None
    tag: bytes | None = None

    @property
    def same(self) -> bool:
        return self.payload is None and self.tag is not None


class RateLimitedLog:
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


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PieceStore(ABC):
    """Where finished pieces live. Reads and writes never raise; admin calls may."""

    kind: str
    verify_mac = True
    # The MAC key of frames (frame.frame_key of the shared secret; None: no MAC, the
    # in-process store) and the bounds of payloads (None: not checked, tests' raw bytes).
    mac_key: bytes | None = DEFAULT_KEY
    limits: PayloadLimits | None = None
    # Fetch leases shared by every process using the store (Redis); None: this store is
    # private to one process, whose own coalescing is all there is.
    leases: LeaseTable | None = None

    def __init__(self, log_interval_s: float = 30.0) -> None:
        self._log = RateLimitedLog(log_interval_s)
        self._n: dict[str, int] = {
            "hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0, "stored": 0,
            "not_cached": 0, "too_large": 0, "raced": 0, "corrupt": 0, "invalidated": 0,
            "errors": 0, "bypassed": 0,
        }

    @abstractmethod
    async def get_many(self, keys: Sequence[CacheKey]) -> list[Payload | None]:
        """Payloads in key order, None for misses. One round trip for all keys."""

    async def get_tagged(self, keys: Sequence[CacheKey], known: Sequence[bytes | None]) -> list[Tagged]:
        """Like `get_many`, for a reader that keeps some entries decoded: `known[i]` is the tag
        of the frame the reader keeps for `keys[i]` (None: none). An entry that still is that
        frame reads as `Tagged(None, tag)` without its payload being read or checked again;
        every other one as `get_many` reads it, with its tag. This store tags nothing (its
        payloads are not authenticated: the reader tells them apart by their bytes)."""
        return [Tagged(p) for p in await self.get_many(keys)]

    async def unchanged(self, keys: Sequence[CacheKey], tags: Sequence[bytes]) -> bool:
        """Whether every entry of `keys` still is the frame of its tag (`get_tagged`); a store
        that watches its entries may answer without reading them (RedisStore.get_tagged)."""
        reads = await self.get_tagged(keys, tags)
        return len(reads) == len(tags) and all(t.payload is None and t.tag == tag for t, tag in zip(reads, tags))

    @abstractmethod
    async def put_many(self, items: Sequence[CacheItem]) -> Mapping[str, bytes] | None:
        """Store pieces (pipelined). Never raises: meant to run as a background task. A store
        that tags frames says which it stored, with their tags (by key digest)."""

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

    async def health(self) -> dict[str, Any]:
        """For the operator page: whether the store answers (in process: always)."""
        return {"kind": self.kind, "reachable": True, "errors": self._n["errors"]}

    # Shared bookkeeping ----------------------------------------------------------------

    def _decode_all(
        self, keys: Sequence[CacheKey], skeys: Sequence[str], values: Sequence[bytes | None]
    ) -> tuple[list[Payload | None], list[str]]:
        """Verify raw values: payloads (None for misses) and the storage keys to delete."""
        out, bad = self.verify(keys, skeys, values)
        self._count_payloads(out)
        return out, bad

    def _count_payloads(self, payloads: Sequence[Payload | None]) -> None:
        hits = sum(1 for p in payloads if p is not None)
        self._count_lookups(hits, len(payloads) - hits, sum(len(p) for p in payloads if p is not None))

    def verify(
        self, keys: Sequence[CacheKey], skeys: Sequence[str], values: Sequence[bytes | None]
    ) -> tuple[list[Payload | None], list[str]]:
        """Payloads of sound frames (None for misses and corrupt values), and the storage
        keys of the corrupt ones (to delete). Counts corrupt values, not lookups."""
        out: list[Payload | None] = []
        bad: list[str] = []
        for key, skey, value in zip(keys, skeys, values):
            if value is None:
                out.append(None)
                continue
            try:
                payload = decode_value(key, value, verify_mac=self.verify_mac, mac_key=self.mac_key or DEFAULT_KEY,
                                       skey=skey)
                if self.limits is not None:
                    check_payload(key, payload, self.limits)
            except CorruptValue as exc:
                METRICS.cache_corrupt.labels(self.kind, exc.reason).inc()
                self._n["corrupt"] += 1
                self._log.warning("corrupt", f"cache entry {skey} is corrupt ({exc.reason}): deleting it")
                bad.append(skey)
                out.append(None)
                continue
            out.append(payload)
        return out, bad

    def _fits(self, item: CacheItem) -> bool:
        """Whether a piece is within the bounds its readers hold it to (a piece they would
        refuse is not stored)."""
        if self.limits is None:
            return True
        try:
            check_payload(item.key, item.payload, self.limits)
        except CorruptValue:
            return False
        return True

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
