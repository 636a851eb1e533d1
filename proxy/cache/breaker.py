"""The circuit breaker that makes the cache skip a failing Redis for a back-off.

The state machine is the product's one breaker (`proxy/primitives/breaker.py`); this wrapper
gives the store its calls (`allow` / `success` / `failure` / `release`, no probe to carry: the
store's calls are not told apart, so a failure while the probe is out is the probe's) and the
`promaccel_cache_breaker_open` gauge.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..observe.metrics import METRICS
from ..primitives.breaker import CLOSED, State
from ..primitives.breaker import CircuitBreaker as Machine

__all__ = ["CircuitBreaker"]


def _gauge(state: State) -> None:
    METRICS.cache_breaker_open.set(0 if state == CLOSED else 1)


class CircuitBreaker:
    """Skips Redis for a back-off after `failures` consecutive failures, then lets one
    probe call through: success closes it, failure re-opens it with twice the back-off
    (up to `max_backoff_ms`)."""

    def __init__(
        self,
        failures: int = 3,
        backoff_ms: int = 1_000,
        max_backoff_ms: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # At least one failure opens it: Redis has no "never" setting.
        self.machine = Machine(max(1, failures), backoff_ms, max_backoff_ms, clock=clock, on_change=_gauge)

    @property
    def is_open(self) -> bool:
        """Open or half-open: Redis is being skipped (but for the probe)."""
        return self.machine.state != CLOSED

    def allow(self) -> bool:
        return self.machine.admit() is not None

    def success(self) -> None:
        self.machine.success()

    def failure(self) -> None:
        self.machine.failure(probe=self.machine.probing)

    def release(self) -> None:
        """The probe ended without an answer either way (cancelled)."""
        self.machine.release(probe=True)
