"""The Redis (or Redis Cluster) piece store, shared by every proxy and worker.

A failing, slow or down Redis reads as misses and drops writes
(`promaccel_cache_errors_total{op}`), the circuit breaker then skips Redis for a short
back-off, and the store recovers by itself. Concurrent lookups of the same keys share one
read (`promaccel_coalesced_calls_total{flight="cache_read"}`), from a bounded blocking
connection pool, under deadlines that count the event loop's idle time (`deadline.py`).

The generation, the invalidation indexes (one sorted set per metric and generation) and the
invalidation marker are `redis_invalidation.RedisInvalidation`'s; the sharing of reads in
flight is `shared_reads.SharedReads`'s. A put that sees the marker move while it writes
deletes what it wrote.

Fetch leases (`leases.py`, `store.leases`): of the processes sharing the Redis, one fetches a
piece missing from the cache while the others wait for it. The lease commands run through this
store's public `pipeline`, `generation`, `verify` and `guarded` (`leases.LeaseHost`).

Recommended server setting: `maxmemory-policy volatile-lru` -- every entry has a TTL and
the generation key has none, so Redis evicts entries but never the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from .bound import PayloadLimits
from .breaker import CircuitBreaker
from .deadline import idle_timeout
from .frame import DEFAULT_KEY, MAC_SIZE, frame_mac
from .keys import CacheItem, CacheKey, Payload
from .leases import RedisLeases
from .redis_client import connect, ping_report, raw_connection, redact_url
from .redis_invalidation import RedisInvalidation
from .redis_reads import Probe, fetch_probes, flight_of
from .redis_writes import queue_frames
from .shared_reads import SharedReads
from .store import PieceStore, Tagged, describe
from .tracking import TagWatch

__all__ = ["RedisStore"]

log = logging.getLogger("promaccel.cache")

_T = TypeVar("_T")
_FAILED: Any = object()
_MISS = Tagged(None)
# A read that failed (timeout, breaker open, a caller gone): a miss too, but not an absence
# that tracking may trust (an equal tuple, told apart by identity).
_UNREAD = Tagged(None)


class RedisStore(PieceStore):
    """Pieces in Redis or Redis Cluster (redis.asyncio, hiredis parser).

    timeout_ms            the deadline of a read (get_many) ...
    timeout_per_key_ms    ... plus this much per key: a batch of 50 pieces of 100 KB takes
                          15-30 ms on loopback (most of it client-side parsing), so a fixed
                          deadline would turn big batches into misses. The read deadline
                          counts only the time the event loop's thread was blocked waiting
                          for I/O (wall time minus its CPU time and its wait for a CPU,
                          `idle_timeout`): under load the loop runs other requests' work for
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
    mac_key               the MAC key of frames (frame.frame_key of the shared cache secret)
    limits                bounds of payloads, checked before they are decoded (bound.py);
                          None: not checked
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
        mac_key: bytes = DEFAULT_KEY,
        limits: PayloadLimits | None = None,
        password: str | None = None,
        tracking: bool = False,
    ) -> None:
        super().__init__(log_interval_s)
        self.url = url
        self.mac_key = mac_key
        self.limits = limits
        # Connect timeout: wall clock inside redis-py, so not the read deadline (a loop that
        # lags under load would fail healthy connects); reads and writes stay bounded by
        # their own deadlines, and a refused connection fails at once anyway.
        self._client, self.cluster = connect(url, max(max_wait_ms, timeout_ms) / 1000, max_connections,
                                             password=password)
        self._timeout_s = timeout_ms / 1000
        self._per_key_s = timeout_per_key_ms / 1000
        self._max_wait_s = max(max_wait_ms, timeout_ms) / 1000
        # A lookup for a key that another lookup is reading right now waits for that read.
        self._reads: SharedReads[Probe, Tagged] = SharedReads(self._read, flight_of, _UNREAD)
        self._put_timeout_s = put_timeout_ms / 1000
        self._admin_timeout_s = admin_timeout_ms / 1000
        self._index = RedisInvalidation(self._client, generation_refresh_ms=generation_refresh_ms,
                                        index_ttl_ms=index_ttl_ms, skew_ms=skew_ms, clock=clock,
                                        marked=self._reads.forget)
        self.breaker = CircuitBreaker(breaker_failures, breaker_backoff_ms, breaker_max_backoff_ms)
        self._ping: tuple[float, dict[str, Any]] | None = None  # (monotonic, health's ping result)
        self._last_error: dict[str, Any] | None = None
        self.leases = RedisLeases(self)
        # Tags Redis's invalidation messages keep trusted (`unchanged`; one server only).
        self._watch = (TagWatch(lambda: raw_connection(self._client), reset=self._index.stale)
                       if tracking and not self.cluster else None)

    # What the lease commands use (leases.LeaseHost) -------------------------------------

    def pipeline(self, atomic: bool = False) -> Any:
        """A command pipeline: one transaction when `atomic` and the server is one (a cluster
        spreads keys over nodes, where MULTI cannot span them)."""
        return self._client.pipeline(transaction=atomic and not self.cluster)

    async def generation(self) -> int:
        """The current generation (re-read at most every `generation_refresh_ms`)."""
        return await self._index.current()

    async def guarded(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T | None:
        """fn() within a small call's deadline in loop idle time, behind the breaker; None
        when it failed (counted and logged as `op`), timed out or the breaker skipped it."""
        out = await self._guarded(op, self._timeout_s + self._per_key_s, fn, idle_deadline=True)
        return None if out is _FAILED else out

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
                result = await idle_timeout(fn(), deadline_s, max_wall_s or self._max_wait_s)
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
        self._last_error = {"op": op, "error": type(exc).__name__, "at": round(time.time(), 3)}
        METRICS.cache_errors.labels(op).inc()
        self.breaker.failure()
        self._log.warning(op, f"redis cache {op} failed, bypassing the cache: {describe(exc)}")

    async def _admin(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        try:
            async with asyncio.timeout(self._admin_timeout_s):
                return await fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._n["errors"] += 1
            METRICS.cache_errors.labels(op).inc()
            log.warning("redis cache %s failed: %s", op, describe(exc))
            raise PromError("unavailable", f"cache {op} failed: {describe(exc)}") from exc

    # Reads ------------------------------------------------------------------------------

    def storage_key(self, key: CacheKey) -> str:
        return key.redis_key(self._index.known)

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Payload | None]:
        """Keys another lookup is reading right now are awaited from that read; the rest
        are read with one MGET (per node for a cluster) in a task of their own, so a caller
        that gives up does not fail the lookups that joined its read."""
        if not keys:
            return []
        out = [t.payload for t in await self._reads.get_many([Probe(k) for k in keys])]
        self._count_payloads(out)
        return out

    async def get_tagged(self, keys: Sequence[CacheKey], known: Sequence[bytes | None]) -> list[Tagged]:
        """`get_many` for a reader that keeps decoded frames (store.PieceStore.get_tagged):
        of a key with a known tag only the entry's 32 MAC bytes are read (GETRANGE), in
        the same round trip as the other keys' MGET; an entry whose MAC is the known tag
        is that frame (the MAC covers the storage key -- generation included --, the
        canonical key and the payload), an entry that is gone (invalidated, evicted,
        expired, another generation) reads an empty range, and one that changed (another
        process wrote it again) is read whole in a second round trip and checked as any.
        With tracking, a known tag that Redis's invalidations keep trusted (tracking.py) is
        not read at all, nor a key trusted absent; what a read found unchanged or absent is
        trusted from then on if no invalidation came meanwhile."""
        if not keys:
            return []
        watch = self._watch
        if watch is None:
            out = await self._reads.get_many([Probe(k, t) for k, t in zip(keys, known)])
        else:
            watch.start()
            gen = self._index.known
            out, ask = watch.answers([k.redis_key(gen).encode() for k in keys], known, _MISS)
            for i, t in zip(ask, await self._reads.get_many([Probe(keys[i], known[i]) for i in ask])):
                out[i] = t
        hits = sum(1 for t in out if t.payload is not None or t.same)
        self._count_lookups(hits, len(out) - hits, sum(len(t.payload) if t.payload is not None
                                                       else MAC_SIZE if t.same else 0 for t in out))
        return out

    async def _read(self, probes: list[Probe]) -> list[Tagged]:
        """One batched read, checked (`verify`); misses for every key on any failure. Bad
        entries are unlinked in the background. With tracking, what it found (a frame's tag,
        an absence) is trusted if no invalidation arrived between its send and its reply --
        by this read itself, so that a lookup that joined it later trusts nothing older."""
        deadline_s = self._timeout_s + self._per_key_s * len(probes)
        epoch = self._watch.epoch() if self._watch is not None else None
        fetched = await self._guarded("get", deadline_s, lambda: self._fetch(probes), idle_deadline=True)
        if fetched is _FAILED:
            return [_UNREAD] * len(probes)
        skeys, values, same = fetched
        payloads, bad = self.verify([p.key for p in probes], skeys, values)
        if bad:
            self._reads.spawn(self._guarded("delete", self._timeout_s, lambda: self._unlink(bad)))
        out = [Tagged(None, p.known) if unchanged else _MISS if payload is None or value is None
               else Tagged(payload, frame_mac(value))
               for p, unchanged, payload, value in zip(probes, same, payloads, values)]
        if self._watch is not None:
            self._watch.learn(epoch, skeys, out, _MISS)
        return out

    async def _fetch(self, probes: Sequence[Probe]) -> tuple[list[str], list[bytes | None], list[bool]]:
        gen = await self._index.current()
        return await fetch_probes(self._client, self.cluster, [p.key.redis_key(gen) for p in probes], probes)

    async def _unlink(self, skeys: Sequence[str]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for skey in skeys:
            # execute_command: a cluster pipeline's unlink() is a coroutine, not queued.
            pipe.execute_command("UNLINK", skey)
        await pipe.execute()

    # Writes -----------------------------------------------------------------------------

    async def put_many(self, items: Sequence[CacheItem]) -> dict[str, bytes]:
        """Stores `items`; answers the tags of the frames stored, by key digest (none of those
        unlinked again for racing an invalidation, none when the write failed)."""
        keep = [it for it in items if it.ttl_ms is not None and it.ttl_ms > 0]
        self._count_put("not_cached", len(items) - len(keep))
        fit = [it for it in keep if self._fits(it)]
        self._count_put("too_large", len(keep) - len(fit))
        keep = fit
        if not keep:
            return {}
        tags = await self._guarded("put", self._put_timeout_s, lambda: self._put(keep), idle_deadline=True,
                                   max_wall_s=max(self._max_wait_s, 5 * self._put_timeout_s))
        if tags is not _FAILED and tags and self._watch is not None:  # trusted before it is asked for (tracking.py)
            confirm = [Probe(it.key, tags[it.key.digest]) for it in keep if it.key.digest in tags]
            self._reads.spawn(self._watch.confirm_soon(lambda: self._reads.get_many(confirm)))
        return {} if tags is _FAILED else tags

    async def _put(self, items: list[CacheItem]) -> dict[str, bytes]:
        """One round trip: [GET marker, index updates, SETs, GET marker]; what raced an
        invalidation is unlinked again (`RedisInvalidation.raced`)."""
        gen = await self._index.current()
        pipe = self._client.pipeline(transaction=False)
        self._index.write_indexes(pipe, gen, items)
        queued = queue_frames(pipe, gen, items, self.mac_key)
        self._index.read_marker(pipe)
        replies = await pipe.execute()
        doomed = self._index.raced(replies[0], replies[-1], queued.skeys, items)
        if doomed:
            await self._unlink(doomed)
            self._count_put("raced", len(doomed))
        stored = len(items) - len(doomed)
        if stored:
            self._count_put("stored", stored, queued.nbytes * stored // len(items))
        gone = set(doomed)
        return {it.key.digest: queued.tags[s] for it, s in zip(items, queued.skeys) if s not in gone}

    # Admin ------------------------------------------------------------------------------

    async def invalidate(
        self,
        metric_names: Sequence[str] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> int:
        dropped = await self._admin("invalidate", lambda: self._index.invalidate(metric_names, start_ms, end_ms))
        self._n["invalidated"] += dropped
        METRICS.cache_invalidated.labels(self.kind).inc(dropped)
        return dropped

    async def bump_generation(self) -> int:
        return await self._admin("bump", self._index.bump)

    async def aclose(self) -> None:
        if self._watch is not None:
            await self._watch.aclose()
        self._reads.cancel()
        try:
            await self._client.aclose()
        except Exception as exc:  # closing a broken connection must not fail shutdown
            log.debug("closing the redis cache client: %s", exc)

    async def health(self) -> dict[str, Any]:
        """A PING within the admin timeout, past the breaker (probes every 2 s at most), the
        breaker's state and the last failure: for the operator page. The address without
        credentials or query parameters."""
        now = time.monotonic()
        if self._ping is None or now - self._ping[0] >= 2.0:
            self._ping = (now, await ping_report(self._client, self._admin_timeout_s))
        parts = urlsplit(self.url)
        return {"kind": self.kind, "address": f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}",
                "cluster": self.cluster, **self._ping[1], "breaker_open": self.breaker.is_open,
                "errors": self._n["errors"], "bypassed": self._n["bypassed"], "last_error": self._last_error}

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "url": redact_url(self.url),
            "cluster": self.cluster,
            "generation": self._index.known,
            "breaker_open": self.breaker.is_open,
        }
