"""The Redis (or Redis Cluster) piece store, shared by every proxy and worker.

A failing, slow or down Redis reads as misses and drops writes
(`promaccel_cache_errors_total{op}`), the circuit breaker then skips Redis for a short
back-off, and the store recovers by itself. Concurrent lookups of the same keys share one
read (`promaccel_coalesced_calls_total{flight="cache_read"}`), from a bounded blocking
connection pool, under deadlines that count the event loop's idle time (`deadline.py`).

Invalidation indexes: one sorted set per metric and generation, members
`<start_ms>:<end_ms>:<sha>` scored by expiry and trimmed on every write. The generation is
`INCR promaccel:generation`, which every proxy re-reads at most every
`generation_refresh_ms`; the invalidation marker is `promaccel:invalidated_at`. A put that
sees the marker move while it writes deletes what it wrote.

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
from .frame import DEFAULT_KEY, encode_value
from .keys import KEY_PREFIX, CacheItem, CacheKey, Payload
from .leases import RedisLeases
from .redis_client import connect, redact_url
from .store import ANY_METRIC, PieceStore, describe

__all__ = ["GENERATION_KEY", "INVALIDATED_AT_KEY", "RedisStore"]

log = logging.getLogger("promaccel.cache")

GENERATION_KEY = "promaccel:generation"
INVALIDATED_AT_KEY = "promaccel:invalidated_at"

_T = TypeVar("_T")
_FAILED: Any = object()


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
        # Reads in flight, per key digest: a lookup for a key that another lookup is reading
        # right now waits for that read (50 users on one dashboard: one MGET, not 50).
        self._reads: dict[str, asyncio.Future[Payload | None]] = {}
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
        self._ping: tuple[float, dict[str, Any]] | None = None  # (monotonic, health's ping result)
        self._last_error: dict[str, Any] | None = None
        self.leases = RedisLeases(self)

    # What the lease commands use (leases.LeaseHost) -------------------------------------

    def pipeline(self, atomic: bool = False) -> Any:
        """A command pipeline: one transaction when `atomic` and the server is one (a cluster
        spreads keys over nodes, where MULTI cannot span them)."""
        return self._client.pipeline(transaction=atomic and not self.cluster)

    async def generation(self) -> int:
        """The current generation (re-read at most every `generation_refresh_ms`)."""
        return await self._current_generation()

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

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Payload | None]:
        """Keys another lookup is reading right now are awaited from that read; the rest
        are read with one MGET (per node for a cluster) in a task of their own, so a caller
        that gives up does not fail the lookups that joined its read."""
        if not keys:
            return []
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Payload | None]] = []
        mine: dict[str, tuple[CacheKey, asyncio.Future[Payload | None]]] = {}
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

    async def _read(self, keys: list[CacheKey], futs: list[asyncio.Future[Payload | None]]) -> None:
        """One batched read; resolves every future (None on any failure), never raises."""
        out: list[Payload | None] = [None] * len(keys)
        try:
            deadline_s = self._timeout_s + self._per_key_s * len(keys)
            fetched = await self._guarded("get", deadline_s, lambda: self._mget(keys), idle_deadline=True)
            if fetched is not _FAILED:
                skeys, values = fetched
                out, bad = self.verify(keys, skeys, values)
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
        fit = [it for it in keep if self._fits(it)]
        self._count_put("too_large", len(keep) - len(fit))
        keep = fit
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
            value = encode_value(it.key, it.payload, mac_key=self.mac_key, skey=skey)
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

    async def health(self) -> dict[str, Any]:
        """A PING within the admin timeout, past the breaker (probes every 2 s at most), the
        breaker's state and the last failure: for the operator page. The address without
        credentials or query parameters."""
        now = time.monotonic()
        if self._ping is None or now - self._ping[0] >= 2.0:
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(self._admin_timeout_s):
                    await self._client.ping()
                ping: dict[str, Any] = {"reachable": True, "ping_ms": round((time.perf_counter() - t0) * 1000, 1)}
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- reported, never raised
                ping = {"reachable": False, "ping_error": type(exc).__name__}
            self._ping = (now, ping)
        parts = urlsplit(self.url)
        return {"kind": self.kind, "address": f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}",
                "cluster": self.cluster, **self._ping[1], "breaker_open": self.breaker.is_open,
                "errors": self._n["errors"], "bypassed": self._n["bypassed"], "last_error": self._last_error}

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "url": redact_url(self.url),
            "cluster": self.cluster,
            "generation": self._generation,
            "breaker_open": self.breaker.is_open,
        }
