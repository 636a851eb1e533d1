"""Concurrent lookups of the same cache keys share one read.

50 users on one dashboard look up the same pieces at once: one batched read (one MGET), not 50.
A key another lookup is reading right now is awaited from that read; the rest are read in one
batch, in a task of its own, so a caller that gives up (cancelled, timed out) does not fail the
lookups that joined its read. Counted as `promaccel_coalesced_calls_total{flight="cache_read"}`.

Used by `redis_store.RedisStore`, which supplies the batched read itself (deadline, breaker and
frame checks are its business); this module knows nothing of Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from ..observe.metrics import METRICS
from .keys import CacheKey, Payload

__all__ = ["BatchRead", "SharedReads"]

K = TypeVar("K")
V = TypeVar("V")

# One batched read: a payload (None: a miss) per key, in order. It should not raise; if it
# does, every key of the batch reads as a miss.
BatchRead = Callable[[list[CacheKey]], Awaitable[list[Payload | None]]]


def by_digest(key: Any) -> str:
    return str(key.digest)


class SharedReads(Generic[K, V]):
    """Reads in flight, per flight name (a key's digest; the Redis store's tagged reads name
    the tag too), and the tasks that run them. `read` answers a value per key (`miss` for
    every key of a batch that failed)."""

    def __init__(self, read: Callable[[list[K]], Awaitable[list[V]]],
                 flight: Callable[[K], str] = by_digest, miss: Any = None) -> None:
        self._read = read
        self._flight = flight
        self._miss: V = miss
        self._inflight: dict[str, asyncio.Future[V]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def get_many(self, keys: Sequence[K]) -> list[V]:
        """A value per key, in order: joined reads in flight, one new batch for the rest."""
        if not keys:
            return []
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[V]] = []
        mine: dict[str, tuple[K, asyncio.Future[V]]] = {}
        joined = 0
        for k in keys:
            name = self._flight(k)
            fut = self._inflight.get(name)
            if fut is None:
                fut = self._inflight[name] = loop.create_future()
                mine[name] = (k, fut)
            else:
                joined += 1
            futs.append(fut)
        if joined:
            METRICS.coalesced.labels("cache_read").inc(joined)
        if mine:
            batch_keys, batch_futs = [k for k, _ in mine.values()], [f for _, f in mine.values()]
            task = self.spawn(self._batch(batch_keys, batch_futs))
            # A task cancelled before it ran (shutdown) never reaches _batch's `finally`.
            task.add_done_callback(lambda _: self._settle(batch_keys, batch_futs, [self._miss] * len(batch_keys)))
        # asyncio.wait, not gather: a caller cancelled here must not cancel shared reads.
        await asyncio.wait(set(futs))
        return [f.result() for f in futs]

    async def _batch(self, keys: list[K], futs: list[asyncio.Future[V]]) -> None:
        """One batched read; resolves every future (`miss` on any failure), never raises."""
        out: list[V] = [self._miss] * len(keys)
        try:
            out = await self._read(keys)
        except BaseException:  # noqa: BLE001 -- cancelled at shutdown: the waiters read misses
            pass
        finally:
            self._settle(keys, futs, out)

    def _settle(self, keys: list[K], futs: list[asyncio.Future[V]], out: Sequence[V]) -> None:
        for k, fut, payload in zip(keys, futs, out):
            name = self._flight(k)
            if self._inflight.get(name) is fut:
                del self._inflight[name]
            if not fut.done():
                fut.set_result(payload)

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run `coro` in a task of its own, kept until done and cancelled by `cancel`."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def forget(self) -> None:
        """Lookups from now on read afresh instead of joining the reads in flight (after an
        invalidation; the reads in flight still resolve their own waiters)."""
        self._inflight.clear()

    def cancel(self) -> None:
        """Cancel every read and task in flight (shutdown): their waiters read misses."""
        for task in list(self._tasks):
            task.cancel()
