"""The circuit breaker that makes the cache skip a failing Redis for a back-off."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..metrics import METRICS

__all__ = ["CircuitBreaker"]


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
        self._threshold = max(1, failures)
        self._base_s = backoff_ms / 1000
        self._max_s = max(max_backoff_ms, backoff_ms) / 1000
        self._clock = clock
        self._failures = 0
        self._backoff_s = self._base_s
        self._open_until: float | None = None
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        if self._open_until is None:
            return True
        if self._clock() < self._open_until or self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        self._failures = 0
        self._backoff_s = self._base_s
        self._open_until = None
        self._probing = False
        METRICS.cache_breaker_open.set(0)

    def failure(self) -> None:
        self._failures += 1
        if self._probing or (self._open_until is None and self._failures >= self._threshold):
            self._probing = False
            self._open_until = self._clock() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._max_s)
            METRICS.cache_breaker_open.set(1)

    def release(self) -> None:
        """The probe ended without an answer either way (cancelled)."""
        self._probing = False
