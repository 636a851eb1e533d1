"""Fetch leases: a piece missing from the cache costs one backend call across every process
(uvicorn workers, replicas behind a Service) sharing a Redis, not one per process.

Each process's own coalescing (single-flight, calls in flight, the landing zone) stays in
front, so a process asks for at most one lease per piece at a time. A fetch (`Fetcher`) asks
for the leases of its storable units before it calls the backend, and reads them once more
(one SET NX PX and one GET per unit, in one transaction):

- found: another process's fetch landed since this one's lookup: used as is;
- won: this process fetches the unit; the lease is renewed every third of
  `cache.fetch_lease` while it fetches and stores, and deleted (only while still its own)
  once the put has landed, or at once when the unit will not be stored (warnings, the query's
  allowance of new keys, a dropped put) or the fetch failed;
- lost: another process is fetching it. This one polls Redis (the lease and the piece in one
  round trip, every 5 ms doubling to 50 ms) until the piece lands, and fetches it itself when
  the lease went without a piece (its owner failed, stored nothing, or died and the lease
  expired), after half the query's deadline or twice `cache.fetch_lease`, whichever comes
  first, or when Redis fails or its breaker is open. Waiting never lasts past that, and an
  answer is never anything but a backend's.

A lease key without a TTL, or with a TTL longer than `cache.fetch_lease`, is ignored (issue
26: one planted by hand stalled queries for half their deadline and stayed forever): taking
the lease deletes it (`promaccel_cache_leases_total{result="ignored"}`), and a waiter reads it
as gone and fetches for itself.

Units that are not stored (the live edge newer than `cache.max_freshness`) get no lease:
there would be nothing to wait for, so every process fetches them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..cache import LeaseTable, PieceStore
from ..config import Config
from ..observe.metrics import METRICS
from ..result import QueryResult
from .cache_read import CacheReader
from .units import Unit

POLL_FIRST_S = 0.005
POLL_MAX_S = 0.05


@dataclass(frozen=True)
class Claim:
    """What taking the leases of some units found: the key digests whose leases this process
    holds (it fetches them), and the units already stored (by digest; nobody fetches them).
    The rest another process is fetching."""

    won: set[str]
    found: dict[str, QueryResult]


class Leases:
    def __init__(self, config: Config, store: Callable[[], PieceStore], reader: CacheReader) -> None:
        self.ttl_ms = config.cache.fetch_lease if config.cache.enabled else 0
        # A lease is never renewed for longer than a query may run (a leak would otherwise
        # make other processes wait half their deadline for nothing).
        self.max_hold_s = (config.limits.query_timeout + self.ttl_ms) / 1000
        self.store = store
        self.reader = reader
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._seq = itertools.count()
        # digest -> (token, monotonic time taken): the leases this process holds.
        self.held: dict[str, tuple[str, float]] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def table(self) -> LeaseTable | None:
        """The shared lease table, None when leases are off or the store is this process's."""
        return self.store().leases if self.ttl_ms > 0 else None

    async def acquire(self, units: Sequence[Unit]) -> Claim | None:
        """Take the leases of `units` (storable) and read them once more: the ones whose
        leases this process now holds, and the ones stored since the caller's lookup (their
        leases let go again). None when there are no leases to take (off, a private store,
        Redis failed): fetch them all."""
        table = self.table()
        if table is None or not units:
            return None
        keys = [u.key for u in units if u.key is not None]
        tokens = [f"{self.owner}:{next(self._seq)}" for _ in keys]
        ignored = table.ignored
        got = await table.acquire(keys, tokens, self.ttl_ms)
        if table.ignored > ignored:
            METRICS.cache_leases.labels("ignored").inc(table.ignored - ignored)
        if got is None:
            METRICS.cache_leases.labels("error").inc(len(keys))
            return None
        ok, payloads = got
        ranged = {u.key.digest: u.is_range for u in units if u.key is not None}
        found = {d: r for d, r in (await self.reader.decode(keys, payloads)).items()
                 if r.result_type == "matrix" or not ranged[d]}
        now = time.monotonic()
        won: set[str] = set()
        for k, t, mine in zip(keys, tokens, ok):
            if mine:
                self.held[k.digest] = (t, now)
                won.add(k.digest)
        if found:
            METRICS.cache_leases.labels("landed").inc(len(found))
            self.release(won & set(found))
            won -= set(found)
        if won:
            METRICS.cache_leases.labels("won").inc(len(won))
            self._renew_soon()
        return Claim(won, found)

    def release(self, digests: Iterable[str]) -> None:
        """Let go of the leases of these digests this process holds (others are ignored)."""
        pairs = [(d, self.held.pop(d)[0]) for d in digests if d in self.held]
        table = self.table()
        if pairs and table is not None:
            self._spawn(table.release([d for d, _ in pairs], [t for _, t in pairs]))

    async def wait(self, units: Sequence[Unit], timeout_s: float) -> tuple[dict[str, QueryResult], list[Unit]]:
        """Wait for units another process holds the leases of. Returns the ones that landed
        (by key digest) and the ones to fetch here. Never longer than half `timeout_s`, nor
        than twice the lease time (a lease renewed forever by a stuck owner, or planted)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(timeout_s / 2, 2 * self.ttl_ms / 1000)
        pending = {u.key.digest: u for u in units if u.key is not None}
        landed: dict[str, QueryResult] = {}
        here: list[Unit] = []
        delay = POLL_FIRST_S
        while pending:
            table = self.table()
            items = list(pending.items())
            polled = (await table.poll([u.key for _, u in items if u.key is not None], self.ttl_ms)
                      if table is not None else None)
            if polled is None:
                METRICS.cache_leases.labels("error").inc(len(pending))
                break
            held, payloads = polled
            cells = await self.reader.decode([u.key for _, u in items if u.key is not None], payloads)
            for (d, u), h in zip(items, held):
                r = cells.get(d)
                if r is not None and (r.result_type == "matrix" or not u.is_range):
                    landed[d] = r
                    del pending[d]
                    METRICS.cache_leases.labels("landed").inc()
                elif not h:  # checked before the read: its owner stored nothing
                    here.append(u)
                    del pending[d]
                    METRICS.cache_leases.labels("released").inc()
            if not pending:
                break
            if loop.time() + delay > give_up:
                METRICS.cache_leases.labels("timeout").inc(len(pending))
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)
        return landed, here + list(pending.values())

    def _renew_soon(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while self.held:
            await asyncio.sleep(self.ttl_ms / 3000)
            table = self.table()
            if table is None:
                self.held.clear()
                return
            now = time.monotonic()
            for d in [d for d, (_, since) in self.held.items() if now - since > self.max_hold_s]:
                del self.held[d]  # a leak: let it expire
            items = list(self.held.items())
            if not items:
                return
            got = await table.renew([d for d, _ in items], [t for _, (t, _) in items], self.ttl_ms)
            for (d, (t, _)), ok in zip(items, got or ()):
                if not ok and d in self.held and self.held[d][0] == t:
                    del self.held[d]  # expired (and maybe taken by another): not ours any more

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Shutdown: stop renewing and let go of what this process holds."""
        if self._renewer is not None:
            self._renewer.cancel()
        self.release(list(self.held))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
