"""What one query may cost and when it may run: admission (queries in flight, in all and per
client, with a bounded wait), its backend calls and new cache entries, and the samples AMP
processed for it (shared by every task of the query through context variables)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque

from ..config import LimitsConfig
from ..errors import PromError
from .stage import Stage
from .values import Answer, Query


class Budget:
    """One query's allowance of backend calls (limits.max_backend_calls) and of new cache
    entries (limits.max_new_cache_keys); 0 means no limit."""

    def __init__(self, max_calls: int, max_keys: int) -> None:
        self.max_calls, self.max_keys = max_calls, max_keys
        self.calls = self.keys = 0

    def check(self, more: int) -> None:
        """422 if `more` calls would go over the limit (nothing is charged)."""
        if self.max_calls and self.calls + more > self.max_calls:
            raise PromError(
                "execution",
                f"this query needs more than {self.max_calls} backend calls "
                f"({self.calls} made, {more} more planned; limits.max_backend_calls): "
                "narrow the time range or simplify the query",
            )

    def charge(self) -> None:
        self.check(1)
        self.calls += 1

    def try_charge(self) -> bool:
        """One more call if the limit allows (a hedge: never a 422, just no hedge)."""
        if self.max_calls and self.calls + 1 > self.max_calls:
            return False
        self.calls += 1
        return True

    def new_key(self) -> bool:
        """Whether one more new cache entry may be written."""
        if self.max_keys and self.keys >= self.max_keys:
            return False
        self.keys += 1
        return True


BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("promaccel_budget", default=None)
# Samples processed by AMP for the current query (a one-element list per query).
SAMPLES_TALLY: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("samples_tally", default=None)


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
        if not self._waiting and self._fits(client):
            self._take(client)
            return
        if len(self._waiting) >= self.max_queued:
            raise self._refusal("the queue of waiting queries is full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (client, fut)
        self._waiting.append(entry)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except TimeoutError:
            if fut.done():  # admitted just as the wait ran out: keep the slot
                return
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
    """Stage: admission (queries in flight, a bounded wait), this query's allowances, and its
    tally of samples processed."""

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
            tally = [0]
            SAMPLES_TALLY.set(tally)
            BUDGET.set(Budget(self.limits.max_backend_calls, self.limits.max_new_cache_keys))
            budget = BUDGET.get()
            answer = await self.next(q)
        finally:
            self.admission.release(client)
        if tally[0]:
            answer.headers["X-Promaccel-Samples-Processed"] = str(tally[0])
        if budget is not None:
            answer.headers["X-Promaccel-Backend-Calls"] = str(budget.calls)
        return answer
