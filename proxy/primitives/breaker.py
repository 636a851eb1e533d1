"""The circuit breaker state machine, shared by the Redis store and every backend.

    closed --(`failures` failed calls in a row)--> open --(back-off over: the next call)-->
    half-open: that one call is the probe, the others are refused --> its success closes,
    its failure opens again for the next back-off

The back-off doubles at each re-opening up to `max_backoff_ms` and starts small again once
closed; with `max_backoff_ms` equal to `backoff_ms` it is a fixed cooldown (a backend's
`breaker.cooldown`). Any success closes the breaker (an answer is an answer, probe or not). A
call that ended with no outcome (cancelled, or the caller's own deadline) is `release`d: it
counts neither way, and if it was the probe another call may probe. `failures` 0: never opens.

The wrappers own what differs: `cache/breaker.py` (Redis: a refused call is a cache miss, one
gauge) and `backends/circuit.py` (a refused call is a 503 naming the backend; which errors are
the backend's fault; per-backend gauges). They see state changes through `on_change`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker", "State"]

State = Literal["closed", "open", "half_open"]
CLOSED: State = "closed"
OPEN: State = "open"
HALF_OPEN: State = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failures: int,
        backoff_ms: int,
        max_backoff_ms: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[State], None] | None = None,
    ) -> None:
        self.threshold = max(0, failures)  # 0: never opens
        self._base_s = backoff_ms / 1000
        self._max_s = max(max_backoff_ms if max_backoff_ms is not None else backoff_ms, backoff_ms) / 1000
        self._clock = clock
        self._on_change = on_change
        self.failures = 0  # failed calls since the last success
        self.state: State = CLOSED
        self._backoff_s = self._base_s
        self._open_until = 0.0
        self._probing = False

    @property
    def probing(self) -> bool:
        """A half-open probe is out (its outcome decides)."""
        return self._probing

    def remaining_s(self) -> float:
        """How long calls are still refused before a probe may go (0 when it may)."""
        return max(0.0, self._open_until - self._clock()) if self.state != CLOSED else 0.0

    def _set(self, state: State) -> None:
        if state != self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(state)

    def admit(self) -> bool | None:
        """May a call go? None: refused (open, or half-open with its probe out); True: it goes
        as the probe; False: it goes (closed)."""
        if self.state == CLOSED:
            return False
        if self.state == OPEN and self._clock() >= self._open_until:
            self._set(HALF_OPEN)
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return None

    def success(self, probe: bool = False) -> None:
        self.failures = 0
        self._probing = False
        self._backoff_s = self._base_s
        self._set(CLOSED)

    def failure(self, probe: bool = False) -> None:
        """A call failed. Opens the breaker when it was the probe, or when it makes `threshold`
        failures in a row while closed; a late failure of a call admitted before the breaker
        opened changes nothing else."""
        self.failures += 1
        if probe or (self.state == CLOSED and self.threshold and self.failures >= self.threshold):
            self._probing = False
            self._open_until = self._clock() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._max_s)
            self._set(OPEN)

    def release(self, probe: bool) -> None:
        """The call ended without an outcome: if it was the probe, another call may probe."""
        if probe:
            self._probing = False
