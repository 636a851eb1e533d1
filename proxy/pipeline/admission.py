"""When a query may run: admission (queries in flight, in all and per client, with a bounded
wait). What it may cost once running is its context's `Budget` (context.py)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from ..config import LimitsConfig
from ..errors import PromError
from .stage import Stage
from .values import Answer, Query


class Admission:
    """Queries running at once: at most `total`, and `per_client` for one client; beyond, a
    query waits (first come, first served; at most `max_queued` waiting, each at most
    `timeout_s`), then is refused with 429 and Retry-After. 0: no limit."""

    def __init__(self, total: int, per_client: int, max_queued: int, timeout_s: float) -> None:
        self.total, self.per_client, self.max_queued, self.timeout_s = total, per_client, max_queued, timeout_s
        self.running = 0
        self.by_client: dict[str, int] = {}
        self._waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    def _fits(self, client: str) -> bool:
        return (not self.total or self.running < self.total) and (
            not self.per_client or self.by_client.get(client, 0) < self.per_client)

    def _take(self, client: str) -> None:
        self.running += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1

    async def acquire(self, client: str) -> None:
        # Waiters are let in as soon as they fit (`release`): one still waiting when this
        # client fits is held back by its own client's limit, and is not passed over by it.
        if self._fits(client):
            self._take(client)
            return
        if len(self._waiting) >= self.max_queued:
            raise self._refusal("the queue of waiting queries is full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (client, fut)
        self._waiting.append(entry)
        t0 = time.monotonic()
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as
            # the query is let in, and a client gone away would run its query anyway.
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(fut)
        except TimeoutError:
            if fut.done() and not fut.cancelled():  # admitted just as the wait ran out: keep it
                return
            if entry in self._waiting:
                self._waiting.remove(entry)
            raise self._refusal(f"waited {time.monotonic() - t0:.1f}s") from None
        except BaseException:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif fut.done() and not fut.cancelled():
                self.release(client)  # admitted, but the client went away
            raise

    def release(self, client: str) -> None:
        self.running -= 1
        n = self.by_client.get(client, 0) - 1
        if n > 0:
            self.by_client[client] = n
        else:
            self.by_client.pop(client, None)
        # Admit waiters in order (a waiter whose client is at its own limit lets others pass).
        for entry in list(self._waiting):
            waiter, fut = entry
            if fut.done():
                self._waiting.remove(entry)
                continue
            if not self.total or self.running < self.total:
                if self._fits(waiter):
                    self._waiting.remove(entry)
                    self._take(waiter)
                    fut.set_result(None)
            else:
                break

    def _refusal(self, why: str) -> PromError:
        return PromError("unavailable", f"too many queries in flight ({why}; limits.max_queries_in_flight "
                         f"{self.total}, limits.max_queries_per_client {self.per_client}): retry shortly",
                         status=429, headers={"Retry-After": "1"})


class Admit:
    """Stage: admission (queries in flight, a bounded wait); the answer says what the query
    cost (its context's backend calls and AMP samples processed)."""

    def __init__(self, limits: LimitsConfig, next: Stage[Query, Answer], admission: Admission | None = None) -> None:
        self.limits = limits
        self.next = next
        # Shared by the pipelines of all tenants (auth): the limits are the process's.
        self.admission = admission or Admission(limits.max_queries_in_flight, limits.max_queries_per_client,
                                                limits.max_queued, limits.queue_timeout / 1000)

    async def __call__(self, q: Query) -> Answer:
        client = q.client or "-"
        await self.admission.acquire(client)
        try:
            answer = await self.next(q)
        finally:
            self.admission.release(client)
        if q.ctx.samples.samples:
            answer.headers["X-Promaccel-Samples-Processed"] = str(q.ctx.samples.samples)
        answer.headers["X-Promaccel-Backend-Calls"] = str(q.ctx.budget.calls)
        return answer
