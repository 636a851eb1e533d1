"""Retries and throttling of one backend call, within its deadline.

Connection errors and 502/503/504 are retried up to `backends[].retries` times with
exponential backoff and full jitter (never a 4xx/422, never a timeout). AMP's throttling
answers (429, and 503) are retried on their own budget (`throttle_retries`) after
Retry-After plus jittered backoff, never past the call's deadline; when the budget or the
deadline runs out, the 429/503 is returned for the caller to relay. A redirect is an error
naming the backend, never its URL: a backend's 301 for a path with `..` once led a relay to
/debug/pprof.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable

from ..config import BackendConfig
from ..errors import PromError
from ..metrics import METRICS
from .protocol import RETRY_STATUSES, THROTTLE_STATUSES, BackendReply, broken_answer, retry_after_s

THROTTLE_BACKOFF_S = 0.1
THROTTLE_BACKOFF_CAP_S = 5.0
RETRY_BUDGET_CAP = 50.0


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

# One try of the call, given the timeout of that try (None: the backend's own).
Attempt = Callable[[float | None], Awaitable[BackendReply]]
# What is wrong with a 200's body (None: it is sound). A broken body is retried like a 502.
Check = Callable[[BackendReply], str | None]


async def with_retries(attempt_once: Attempt, cfg: BackendConfig, endpoint: str,
                       timeout_s: float | None, budget: RetryBudget | None = None,
                       check: Check | None = None) -> BackendReply:
    """Run `attempt_once` until it gives an answer worth returning (module docstring);
    `budget`: the backend's retry budget (a retry it denies is not taken); `check`: a 200
    whose body it finds broken (cut short, garbled) is retried, then a 502 naming the backend."""
    name = cfg.name
    if budget is not None:
        budget.earn()
    throttle = cfg.kind == "amp"
    budget_s = timeout_s if timeout_s is not None else cfg.timeout / 1000
    deadline = time.monotonic() + budget_s
    attempt = 0
    throttled = 0
    call_timeout = timeout_s
    while True:
        try:
            reply = await attempt_once(call_timeout)
        except PromError as exc:
            if exc.kind == "timeout" or attempt >= cfg.retries or not _may_retry(budget, name):
                raise
        else:
            if 300 <= reply.status < 400:
                raise PromError(
                    "unavailable", f"backend {name!r} answered {endpoint} with a redirect (HTTP "
                    f"{reply.status}); promaccel does not follow backend redirects", status=502)
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
                call_timeout = max(0.001, deadline - time.monotonic())
                continue
            broken = check(reply) if check is not None and reply.ok else None
            if broken is not None:
                METRICS.backend_errors.labels(name, "BrokenAnswer").inc()
                if attempt >= cfg.retries or time.monotonic() >= deadline or not _may_retry(budget, name):
                    raise broken_answer(name, endpoint, broken)
            elif reply.status not in RETRY_STATUSES or attempt >= cfg.retries or not _may_retry(budget, name):
                return reply
            METRICS.backend_retries.labels(name).inc()
        attempt += 1
        # Exponential backoff with full jitter: 50 ms, 100 ms, 200 ms ...
        await asyncio.sleep(random.uniform(0, 0.05 * (2 ** (attempt - 1))))


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
