"""Retries and throttling of one backend call, within its deadline.

Connection errors and 502/503/504 are retried up to `backends[].retries` times with
exponential backoff and full jitter (never a 4xx/422, never a timeout, nor a 503 saying the
query timed out at the backend: asking again gets the same answer). AMP's throttling
answers (429, and 503) are retried on their own budget (`throttle_retries`) after
Retry-After plus jittered backoff, never past the call's deadline; when the budget or the
deadline runs out, the 429/503 is returned for the caller to relay. A try may be hedged
(`backends[].hedge_after`): a second identical call when the first is slow, first good answer
wins. A redirect is an error
naming the backend, never its URL: a backend's 301 for a path with `..` once led a relay to
/debug/pprof.

A try runs at most the backend's own call timeout (`backends[].timeout`), and within the
caller's deadline (the query's `timeout` parameter or `limits.query_timeout`). A try cut short
by the caller's deadline, shorter than the backend's own timeout, times out as a
`ClientDeadline` (circuit.py), which the breaker does not count (issue 26).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..config import BackendConfig
from ..errors import PromError
from ..observe.metrics import METRICS
from .circuit import ClientDeadline, deadline_answer
from .protocol import RETRY_STATUSES, THROTTLE_STATUSES, BackendReply, broken_answer, retry_after_s

THROTTLE_BACKOFF_S = 0.1
THROTTLE_BACKOFF_CAP_S = 5.0
RETRY_BUDGET_CAP = 50.0
# A reply body larger than this is checked (decoded) in a worker thread: a 15 MB answer of a
# heavy panel took ~40 ms to decode, and a cold 24 h query makes four such calls at once;
# the compiled scanner releases the GIL, so the event loop serves other requests meanwhile.
CHECK_IN_THREAD_BYTES = 1 << 20


class RetryBudget:
    """Retries one backend may take (`backends[].retry_ratio`, `retry_floor`): each call earns
    `ratio` of a retry, each retry spends one, at most RETRY_BUDGET_CAP saved, and `floor`
    retries per second are always allowed. When most calls fail, retries stay a fraction of
    the calls instead of multiplying them."""

    def __init__(self, ratio: float, floor: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ratio, self.floor, self._clock = ratio, floor, clock
        self.tokens = RETRY_BUDGET_CAP
        self._t = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.tokens = min(RETRY_BUDGET_CAP, self.tokens + (now - self._t) * self.floor)
        self._t = now

    def earn(self) -> None:
        """A call was made."""
        self.tokens = min(RETRY_BUDGET_CAP, self.tokens + self.ratio)

    def spend(self) -> bool:
        """May one more retry be made? (Spends it when so.)"""
        self._refill()
        if self.tokens >= 1.0 - 1e-9:  # float sums of ratio (0.2 x 10 = 1.9999...)
            self.tokens -= 1.0
            return True
        return False

# One try of the call, given the timeout of that try (None: the backend's own) and an event it
# sets once the request is on its way (after waiting for a max_parallel slot): the hedge timer
# starts there.
Attempt = Callable[[float | None, asyncio.Event | None], Awaitable[BackendReply]]
# What is wrong with a 200's body (None: it is sound). A broken body is retried like a 502.
Check = Callable[[BackendReply], str | None]


@dataclass
class Hedge:
    """Hedged reads (`backends[].hedge_after`): `delay_s()` is how long a try may go unanswered
    before an identical second call is sent (None: not for this try); `allow()` takes what a
    hedge costs (a retry-budget token, one of the query's backend calls), False when it may not."""

    delay_s: Callable[[], float | None]
    allow: Callable[[], bool]


@dataclass
class _Try:
    """How one try ended: a reply (with what `check` found wrong with it) or an error."""

    reply: BackendReply | None = None
    error: PromError | None = None
    broken: str | None = None


async def with_retries(attempt_once: Attempt, cfg: BackendConfig, endpoint: str,
                       timeout_s: float | None, budget: RetryBudget | None = None,
                       check: Check | None = None, hedge: Hedge | None = None) -> BackendReply:
    """Run `attempt_once` until it gives an answer worth returning (module docstring);
    `budget`: the backend's retry budget (a retry it denies is not taken); `check`: a 200
    whose body it finds broken (cut short, garbled) is retried, then a 502 naming the backend;
    `hedge`: each try may be hedged (`_hedged`)."""
    name = cfg.name
    if budget is not None:
        budget.earn()
    throttle = cfg.kind == "amp"
    own_s = cfg.timeout / 1000  # a try runs at most the backend's own call timeout
    budget_s = timeout_s if timeout_s is not None else own_s
    deadline = time.monotonic() + budget_s
    attempt = 0
    throttled = 0
    call_timeout = None if timeout_s is None else min(timeout_s, own_s)

    async def one(t: float | None, sent: asyncio.Event | None) -> _Try:
        try:
            reply = await attempt_once(t, sent)
        except PromError as exc:
            # A try cut short by its caller's deadline (shorter than the backend's own timeout).
            if (timeout_s is not None and t is not None and t < own_s and exc.kind == "timeout"
                    and not isinstance(exc, ClientDeadline)):
                client = ClientDeadline(exc)
                client.__cause__ = exc.__cause__
                return _Try(error=client)
            return _Try(error=exc)
        if check is None or not reply.ok:
            return _Try(reply)
        if len(reply.body) > CHECK_IN_THREAD_BYTES:  # decoding a heavy answer: not on the loop
            return _Try(reply, broken=await asyncio.to_thread(check, reply))
        return _Try(reply, broken=check(reply))

    def good(o: _Try) -> bool:
        """An answer to keep (a hedge race is won by it): not a failure a retry is for."""
        return (o.reply is not None and o.broken is None and o.reply.status not in RETRY_STATUSES
                and not (throttle and o.reply.status in THROTTLE_STATUSES))

    while True:
        delay = hedge.delay_s() if hedge is not None else None
        if delay is None or hedge is None:
            outcome = await one(call_timeout, None)
        else:
            outcome = await _hedged(one, good, call_timeout, deadline, delay, hedge, name)
        if outcome.error is not None:
            exc = outcome.error
            if exc.kind == "timeout" or attempt >= cfg.retries or not _may_retry(budget, name):
                raise exc
        else:
            reply = outcome.reply
            assert reply is not None
            if 300 <= reply.status < 400:
                raise PromError(
                    "unavailable", f"backend {name!r} answered {endpoint} with a redirect (HTTP "
                    f"{reply.status}); promaccel does not follow backend redirects", status=502)
            if deadline_answer(reply):
                return reply  # the query timed out at the backend: the same again if asked again
            if throttle and reply.status in THROTTLE_STATUSES:
                delay = throttle_delay(throttled, reply)
                left = deadline - time.monotonic()
                if throttled >= cfg.throttle_retries or delay >= left:
                    METRICS.backend_throttled.labels(name, str(reply.status), "gave_up").inc()
                    return reply
                throttled += 1
                METRICS.backend_throttled.labels(name, str(reply.status), "retried").inc()
                METRICS.backend_retries.labels(name).inc()
                METRICS.backend_throttle_wait.labels(name).inc(delay)
                await asyncio.sleep(delay)
                # The next try gets what is left of the deadline, not a fresh timeout.
                call_timeout = min(own_s, max(0.001, deadline - time.monotonic()))
                continue
            if outcome.broken is not None:
                METRICS.backend_errors.labels(name, "BrokenAnswer").inc()
                if attempt >= cfg.retries or time.monotonic() >= deadline or not _may_retry(budget, name):
                    raise broken_answer(name, endpoint, outcome.broken)
            elif reply.status not in RETRY_STATUSES or attempt >= cfg.retries or not _may_retry(budget, name):
                return reply
        METRICS.backend_retries.labels(name).inc()  # connection errors too (were not counted)
        attempt += 1
        # Exponential backoff with full jitter: 50 ms, 100 ms, 200 ms ...
        await asyncio.sleep(random.uniform(0, 0.05 * (2 ** (attempt - 1))))


async def _hedged(one: Callable[[float | None, asyncio.Event | None], Awaitable[_Try]],
                  good: Callable[[_Try], bool], call_timeout: float | None, deadline: float, delay: float,
                  hedge: Hedge, name: str) -> _Try:
    """One try, hedged: when the call has been on its way `delay` seconds without an answer
    (and `hedge.allow()`), an identical second call is sent; the first good answer wins and
    the other call is cancelled. Both bad: the first to end is the try's outcome."""
    sent = asyncio.Event()
    first = asyncio.ensure_future(one(call_timeout, sent))
    tasks = [first]
    try:
        on_its_way = asyncio.ensure_future(sent.wait())
        try:
            await asyncio.wait({first, on_its_way}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            on_its_way.cancel()
        if not first.done():
            await asyncio.wait({first}, timeout=delay)
        if first.done():
            return first.result()
        if not hedge.allow():
            METRICS.backend_hedges.labels(name, "denied").inc()
            return await first
        METRICS.backend_hedges.labels(name, "sent").inc()
        left = max(0.001, deadline - time.monotonic())
        second = asyncio.ensure_future(one(left if call_timeout is None else min(left, call_timeout), None))
        tasks.append(second)
        pending: set[asyncio.Future[_Try]] = {first, second}
        bad: _Try | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done:
                    o = t.result()
                    if good(o):
                        if t is second:
                            METRICS.backend_hedges.labels(name, "won").inc()
                        return o
                    bad = bad or o
        assert bad is not None
        return bad
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _may_retry(budget: RetryBudget | None, name: str) -> bool:
    if budget is None or budget.spend():
        return True
    METRICS.backend_retries_denied.labels(name).inc()
    return False


def throttle_delay(throttled: int, reply: BackendReply) -> float:
    """Retry-After (when given) plus full-jitter exponential backoff: the server's floor,
    spread so that pieces throttled together do not come back together."""
    backoff = random.uniform(0, min(THROTTLE_BACKOFF_CAP_S, THROTTLE_BACKOFF_S * 2 ** throttled))
    return (retry_after_s(reply.headers.get("retry-after")) or 0.0) + backoff
