"""A process-wide budget of answer bytes being materialised (`limits.max_inflight_answer_bytes`).

A heavy query's answer lives in memory several times over while it is made (the backends'
JSON, decoded pieces, the merged answer) and until its last byte is sent. Twenty of them at
once would each hold theirs: memory grows with concurrency, not with the largest answer.
So each query reserves its answer's estimated size (`shardplanner/answer_size.py`) before it
fetches anything and waits, first come first served, while the budget is taken; the
reservation is set to the real size once the answer is known and given back when the
response's last byte has been handed to the connection (or the client went away).

- A query larger than the whole budget runs when nothing else holds any of it (alone), so
  nothing waits forever.
- The wait is bounded by `limits.queue_timeout` and the query's own deadline; then 429 with
  Retry-After and Prometheus's error JSON, like admission.
- Waiters are served in order: a large query at the head is not overtaken by small ones
  (they would starve it).
- The pieces a query fetched stay in memory after its answer is sent, until their put to the
  cache lands (the landing zone serves them meanwhile): the reservation is held until then
  too (`RequestContext.held`, `Reservation.hold`). Released at the answer alone, 20 heavy queries let in
  one after another while the earlier ones' pieces still waited for Redis, and a budget of
  16 MiB peaked as high as one of 64 (issue 15).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from dataclasses import replace

from ..errors import PromError
from ..observe.metrics import METRICS
from ..runtime.memory import give_back_soon
from .planning import Planner
from .stage import Stage
from .values import Answer, Query

# No estimate (a selector whose nodes are not known, an unparsed query): this many series of
# the query's points, corrected once the answer is known.
FALLBACK_SERIES = 256
# A query that held this many bytes gives freed memory back to the system when done.
GIVE_BACK_ABOVE = 8 << 20


class Reservation:
    """Bytes one query holds of the budget until its answer is sent (`release`, idempotent)
    and the puts of the pieces it fetched have landed (`hold`)."""

    __slots__ = ("budget", "size", "_pending", "_sent", "__weakref__")

    def __init__(self, budget: AnswerBytes, size: int) -> None:
        self.budget: AnswerBytes | None = budget
        self.size = size
        self._pending = 0
        self._sent = False

    def hold(self, task: asyncio.Future[object]) -> None:
        """Keep the bytes until `task` (a put of pieces this query fetched) is done."""
        if self.budget is None or task.done():
            return
        self._pending += 1
        task.add_done_callback(self._landed)

    def _landed(self, _task: object) -> None:
        self._pending -= 1
        self._free()

    def resize(self, size: int) -> None:
        """The answer's real size (growing never waits: the memory is already taken)."""
        if self.budget is None:
            return
        self.budget.used += size - self.size
        self.size = size
        self.budget.wake()

    def release(self) -> None:
        """The answer was sent (or will never be): given back once the puts have landed."""
        self._sent = True
        self._free()

    def _free(self) -> None:
        if not self._sent or self._pending > 0:
            return
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.used -= self.size
            budget.running -= 1
            budget.wake()
            if self.size >= GIVE_BACK_ABOVE:
                give_back_soon()


class AnswerBytes:
    """The budget: at most `limit` bytes reserved at once (0: no limit), except that one
    query always runs when nobody else holds anything."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit, self.timeout_s = limit, timeout_s
        self.used = 0
        self.running = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return not self.limit or self.running == 0 or self.used + size <= self.limit

    def _take(self, size: int) -> Reservation:
        self.used += size
        self.running += 1
        METRICS.answer_bytes_reserved.set(self.used)
        return Reservation(self, size)

    async def reserve(self, size: int, timeout_s: float) -> Reservation:
        if not self._waiting and self._fits(size):
            return self._take(size)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, fut)
        self._waiting.append(entry)
        METRICS.answer_bytes_waits.inc()
        t0 = time.monotonic()
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as
            # the answer is let in (admission.py does the same).
            async with asyncio.timeout(min(timeout_s, self.timeout_s)):
                await asyncio.shield(fut)
        except TimeoutError:
            if fut.done() and not fut.cancelled():  # let in just as the wait ran out: keep it
                return Reservation(self, size)
            if entry in self._waiting:
                self._waiting.remove(entry)
            self.wake()  # a large head that gave up may have held back smaller ones
            raise self._refusal(size, time.monotonic() - t0) from None
        except BaseException:
            if entry in self._waiting:
                self._waiting.remove(entry)
                self.wake()
            elif fut.done() and not fut.cancelled():
                Reservation(self, size).release()  # let in, but the client went away
            raise
        return Reservation(self, size)

    def wake(self) -> None:
        """Let in waiters, in order, while the head fits."""
        self._waking()
        METRICS.answer_bytes_reserved.set(self.used)

    def _waking(self) -> None:
        while self._waiting:
            size, fut = self._waiting[0]
            if fut.done():
                self._waiting.popleft()
                continue
            if not self._fits(size):
                return
            self._waiting.popleft()
            self._take(size)
            fut.set_result(None)

    def _refusal(self, size: int, waited_s: float) -> PromError:
        return PromError("unavailable", f"too many large answers in flight (this one needs about {size / 2**20:.1f} "
                         f"MiB, {self.used / 2**20:.1f} MiB of limits.max_inflight_answer_bytes "
                         f"{self.limit / 2**20:.1f} MiB taken; waited {waited_s:.1f}s): retry shortly",
                         status=429, headers={"Retry-After": "1"})


def answer_size(answer: Answer) -> int:
    """The bytes an answer holds: a relayed or kept body, or a decoded result (16 a sample +
    labels)."""
    if answer.reply is not None:
        return len(answer.reply.body)
    if answer.encoded is not None:
        return len(answer.encoded.body)
    r = answer.result
    if r is None:
        return 0
    return 16 * r.n_samples + sum(map(len, r.canonical_keys()))


def _release_soon(loop: asyncio.AbstractEventLoop, held: Reservation) -> None:
    try:
        loop.call_soon_threadsafe(held.release)  # on the loop's thread, whoever dropped it
    except RuntimeError:
        pass  # the loop is closed: nobody is left waiting


class Reserve:
    """Stage: reserve the answer's estimated bytes before anything is fetched (waiting while
    the budget is taken), correct it to the real size, and hand the reservation to the
    response (released once the body is sent)."""

    def __init__(self, budget: AnswerBytes, planner: Planner, next: Stage[Query, Answer]) -> None:
        self.budget = budget
        self.planner = planner
        self.next = next

    async def __call__(self, q: Query) -> Answer:
        if not self.budget.limit or q.ctx.explain is not None:  # explain holds no answer
            return await self.next(q)
        assert q.plan is not None
        size = await self.planner.answer_bytes(q.plan, q.ctx.caller.tenant)
        if size is None:
            size = FALLBACK_SERIES * (16 * q.req.span.points + 256)
        t0 = time.monotonic()
        held = await self.budget.reserve(size, q.timeout_s)
        waited = time.monotonic() - t0
        if waited > 0.001:  # one deadline for the whole query: the wait counts
            q = replace(q, timeout_s=max(q.timeout_s - waited, 0.001))
        # Carried on the context: the cache writer makes it wait for the puts of the pieces
        # the query fetched, the fan-out sizes a large query's calls by it.
        q = replace(q, ctx=replace(q.ctx, held=held))
        try:
            answer = await self.next(q)
        except BaseException:
            held.release()
            raise
        held.resize(answer_size(answer))
        answer.release = held.release
        # An answer never sent (an in-process caller) gives its share back when its memory goes.
        kept = answer.result if answer.result is not None else answer.reply
        if kept is not None:
            weakref.finalize(kept, _release_soon, asyncio.get_running_loop(), held)
        return answer
