"""Storing fetched pieces: landed in memory at once, written to the store in the background
(bounded, a few megabytes at a time, encoded off the event loop when large), with their
revalidation digests; a query's allowance of new cache entries is respected."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from shardplanner.footprint import digest_query

from ..backends.tenancy import Caller
from ..cache import CacheItem, PieceMeta, PieceStore
from ..codec import arrow
from ..config import Config
from ..observe.metrics import METRICS
from ..result import QueryResult
from .context import RequestContext
from .landing import Landing
from .revalidate import Revalidator
from .units import Unit

if TYPE_CHECKING:
    from .leases import Leases

log = logging.getLogger("promaccel.cache")

# Pieces to store above this many samples are encoded to Arrow IPC in a worker thread.
ENCODE_IN_THREAD_SAMPLES = 20_000
# Pieces of at most this many samples (~80 KB of columns) are stored without compression.
COMPRESS_ABOVE_SAMPLES = 4_096
# Pieces are stored in groups of at most this many samples (~4 MB of columns) at a time.
PUT_GROUP_SAMPLES = 262_144
_E = TypeVar("_E", bound=tuple[Any, ...])


class CacheWriter:
    def __init__(self, config: Config, store: Callable[[], PieceStore], landing: Landing,
                 leases: Leases | None = None, revalidator: Revalidator | None = None) -> None:
        self.config = config
        self.store = store
        self.landing = landing
        self.leases = leases  # let go once the puts of their units land
        self.revalidator = revalidator  # records each stored piece's baseline digest
        self.tasks: set[asyncio.Task[Any]] = set()

    async def aclose(self) -> None:
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            # Let puts in flight finish briefly: a shutdown should not waste fetched pieces.
            await asyncio.wait(pending, timeout=2.0)
            for t in pending:
                t.cancel()

    def spawn(self, coro: Any, ctx: RequestContext | None = None) -> bool:
        """Run `coro` in the background (referenced, bounded); False if too many are pending.
        With `ctx`, its query's answer-bytes reservation is held until `coro` is done."""
        if len(self.tasks) >= self.config.cache.max_pending_puts:
            coro.close()
            return False
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        held = ctx.held if ctx is not None else None
        if held is not None:  # the pieces stay in memory (landing zone) until the put lands
            held.hold(task)
        return True

    def keep(self, units: Sequence[Unit], results: Sequence[QueryResult], fetched_at_ms: int,
             baselines: Mapping[tuple[str, int], bytes], ctx: RequestContext,
             leased: Collection[str] = ()) -> set[str]:
        """Land fetched units and store them in the background, within the allowance of new
        cache entries of `ctx`, the query they were fetched for. Returns the key digests
        being stored; of those, the fetch leases named in `leased` are let go once the put
        has landed (or failed), so that other processes waiting for them read them."""
        if fetched_at_ms < self.landing.invalidated_at_ms:
            return set()  # fetched before an invalidation through this process
        entries: list[tuple[Unit, QueryResult, bytes | None]] = []
        budget = ctx.budget
        for u, r in zip(units, results):
            if not u.storable or u.key is None or u.footprint is None or r.warnings:
                continue
            if not budget.new_key():
                METRICS.cache_skipped.labels("max_new_cache_keys").inc()
                continue
            baseline = None
            if self.revalidator is not None and digest_backend(u) is not None:
                dq = digest_query(u.footprint)
                if dq is not None:
                    baseline = baselines.get((dq, u.footprint.end_ms))
                    if baseline is None:
                        continue  # cannot be revalidated: not cached
            entries.append((u, r, baseline))
        if not entries:
            return set()
        kind = self.store().kind
        digests = {u.key.digest for u, _, _ in entries if u.key is not None}
        if not self.spawn(self._put(entries, fetched_at_ms, ctx.caller, [d for d in digests if d in leased]), ctx):
            METRICS.cache_puts.labels(kind, "dropped").inc(len(entries))
            return set()
        for u, r, _ in entries:
            assert u.key is not None
            self.landing.land(u.key.digest, r, fetched_at_ms)
        return digests

    async def _put(self, entries: list[tuple[Unit, QueryResult, bytes | None]], fetched_at_ms: int,
                   caller: Caller, leased: Sequence[str] = ()) -> None:
        try:
            compression = self.config.cache.compression
            # Encoded and written a few megabytes at a time: a 3 M-sample answer's pieces
            # written at once held every payload, its framed copy and the socket buffer's
            # copy at the same moment (~100 MB at the peak of 20 heavy queries).
            for group in groups_by_samples(entries, PUT_GROUP_SAMPLES):
                if sum(r.n_samples for _, r, _ in group) > ENCODE_IN_THREAD_SAMPLES:
                    items = await asyncio.to_thread(encode_items, group, fetched_at_ms, compression)
                else:  # a thread hop costs more than encoding a few thousand samples
                    items = encode_items(group, fetched_at_ms, compression)
                stored = await self.store().put_many(items)
                del items
                for u, r, _ in group:
                    tag = stored.get(u.key.digest) if stored and u.key is not None else None
                    if u.key is not None and tag is not None:
                        self.landing.stored(u.key.digest, tag, r)
            if self.revalidator is not None:
                for u, _, baseline in entries:
                    fp = u.footprint
                    assert fp is not None
                    dq = digest_query(fp)
                    if baseline is not None and dq is not None:
                        self.revalidator.record(dq, fp.end_ms, baseline, fp.metrics, fp.start_ms, fp.end_ms,
                                                digest_backend(u) or "", caller.tenant)
        except Exception:  # noqa: BLE001 -- the cache never fails a query
            METRICS.cache_errors.labels("put").inc()
            log.exception("storing fetched pieces failed")
        finally:
            if leased and self.leases is not None:
                self.leases.release(leased)
            landed = [(u.key.digest, r) for u, r, _ in entries if u.key is not None]
            self.landing.unland_later(landed)

    async def baselines(self, units: Sequence[Unit], timeout_s: float, caller: Caller) -> dict[tuple[str, int], bytes]:
        """Revalidation digests of the storable units, taken before their fetch (for `caller`)."""
        if self.revalidator is None:
            return {}
        wanted = []
        backend = ""
        for u in units:
            who = digest_backend(u)
            if u.storable and u.footprint is not None and who is not None:
                dq = digest_query(u.footprint)
                if dq is not None:
                    wanted.append((dq, u.footprint.end_ms))
                    backend = who  # one fetch, one route
        if not wanted:
            return {}
        return await self.revalidator.baselines(wanted, timeout_s, backend, caller)

    def keep_whole(self, result: QueryResult, unit: Unit, fetched_at_ms: int,
                   baselines: Mapping[tuple[str, int], bytes], ctx: RequestContext,
                   leased: Collection[str] = ()) -> set[str]:
        """Keep a forwarded answer (decoded when it was checked before being relayed)."""
        if unit.is_range and result.result_type != "matrix":
            return set()
        return self.keep([unit], [result], fetched_at_ms, baselines, ctx, leased)


def digest_backend(u: Unit) -> str | None:
    """The backend whose digests revalidate unit `u`: "" for the default backend, the name of
    a single-backend route; None for an overlap or a route split in time (several backends'
    data: cached without revalidation; invalidation and generations still apply)."""
    if not u.route:
        return ""
    if u.route.startswith(("overlap:", "split:")):
        return None
    return u.route.split("=", 1)[0]


def groups_by_samples(entries: list[_E], max_samples: int) -> list[list[_E]]:
    """Consecutive groups of entries (unit, result, ...) of at most `max_samples` samples
    each (a single larger entry is a group of its own)."""
    groups: list[list[_E]] = []
    size = 0
    for e in entries:
        n = e[1].n_samples
        if not groups or size + n > max_samples:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += n
    return groups


def encode_items(entries: Sequence[tuple[Unit, QueryResult, bytes | None]], fetched_at_ms: int,
                  compression: Literal["lz4", "zstd", "none"] = "lz4") -> list[CacheItem]:
    """Arrow IPC payloads (`cache.compression`) for the store; runs in a worker thread."""
    items = []
    for u, r, _ in entries:
        fp = u.footprint
        assert u.key is not None and fp is not None
        meta = PieceMeta(fp.metrics, fp.start_ms, fp.end_ms, fetched_at_ms)
        # Small pieces are stored uncompressed: nothing to gain, and compression's fixed cost
        # doubled the encoding and decoding time of a one-series answer.
        small = r.n_samples <= COMPRESS_ABOVE_SAMPLES
        items.append(CacheItem(u.key, arrow.to_ipc_view(r, None if compression == "none" or small else compression),
                               u.ttl_ms, meta))
    return items
