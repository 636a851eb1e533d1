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
from .protocol import RETRY_STATUSES, THROTTLE_STATUSES, BackendReply, retry_after_s

THROTTLE_BACKOFF_S = 0.1
THROTTLE_BACKOFF_CAP_S = 5.0

# One try of the call, given the timeout of that try (None: the backend's own).
Attempt = Callable[[float | None], Awaitable[BackendReply]]


async def with_retries(attempt_once: Attempt, cfg: BackendConfig, endpoint: str,
                       timeout_s: float | None) -> BackendReply:
    """Run `attempt_once` until it gives an answer worth returning (module docstring)."""
    name = cfg.name
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
            if exc.kind == "timeout" or attempt >= cfg.retries:
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
            if reply.status not in RETRY_STATUSES or attempt >= cfg.retries:
                return reply
            METRICS.backend_retries.labels(name).inc()
        attempt += 1
        # Exponential backoff with full jitter: 50 ms, 100 ms, 200 ms ...
        await asyncio.sleep(random.uniform(0, 0.05 * (2 ** (attempt - 1))))


def throttle_delay(throttled: int, reply: BackendReply) -> float:
    """Retry-After (when given) plus full-jitter exponential backoff: the server's floor,
    spread so that pieces throttled together do not come back together."""
    backoff = random.uniform(0, min(THROTTLE_BACKOFF_CAP_S, THROTTLE_BACKOFF_S * 2 ** throttled))
    return (retry_after_s(reply.headers.get("retry-after")) or 0.0) + backoff
