"""In-process request coalescing: concurrent callers with the same key share one call.

    flight = SingleFlight[CacheKey, bytes]("piece")
    payload = await flight.do(key, lambda: fetch_piece(piece))

- The first caller starts `fn()` as a task; callers arriving while it runs await the same
  task (`on_shared()` is called for each: the pipeline counts them in
  `promaccel_coalesced_calls_total{flight}`). Once it finishes the key is
  forgotten: results are not cached here, that is the piece store's job.
- An exception from `fn` reaches every waiter.
- A waiter that is cancelled (client gone, query deadline) leaves without cancelling the
  shared call: the others still get their answer. When every waiter has left, the call
  still runs to completion, so a refresh that arrives meanwhile joins it instead of
  starting over; its result or exception is then dropped (`cancel_all` stops such calls at
  shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self, name: str = "piece", on_shared: Callable[[], None] | None = None) -> None:
        self.name = name
        self.on_shared = on_shared
        self._calls: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        """Calls in flight."""
        return len(self._calls)

    def __contains__(self, key: object) -> bool:
        """Whether a call for `key` is in flight."""
        return key in self._calls

    async def do(self, key: K, fn: Callable[[], Awaitable[V]]) -> V:
        task = self._calls.get(key)
        if task is None:
            task = asyncio.ensure_future(fn())
            self._calls[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        elif self.on_shared is not None:
            self.on_shared()
        # shield: cancelling this waiter cancels only its wait, not the shared call.
        return await asyncio.shield(task)

    def _done(self, key: K, task: asyncio.Task[V]) -> None:
        if self._calls.get(key) is task:
            del self._calls[key]
        # Mark the outcome as retrieved: with every waiter gone nobody else will.
        if not task.cancelled():
            task.exception()

    def cancel_all(self) -> None:
        for task in list(self._calls.values()):
            task.cancel()
