"""A circuit breaker per backend (`backends[].breaker`), and the latency window hedging reads.

The breaker counts *calls*, each with its retries (`retries.py`) already spent: a call fails
when it ends in a connection error, a timeout, a 502/503/504 or a body that never decoded. After
`failures` such calls in a row (none answered in between) it opens: calls fail at once with a
503 and Prometheus's error JSON naming the backend, for `cooldown`. Then it half-opens: one
call goes through as a probe (the others still fail fast); its answer closes the breaker, its
failure opens it for another cooldown. Any answer from the backend (a 200, a 4xx, a 422)
counts as success and resets the count. A call cancelled before it ended (its query was
cancelled, a hedge lost) counts neither way. Counting whole calls rather than tries keeps a
backend that fails one try in five -- retried to a good answer -- from ever tripping it.

Only faults the backend caused count (issue 26: five queries with `timeout=5ms` opened the
breaker, and every other client got 503 "circuit breaker is open"). A call that ran out of
its *caller's* time is the query's outcome, not the backend's: a call whose deadline was
shorter than the backend's own call timeout (`backends[].timeout`) -- the query's `timeout`
parameter or `limits.query_timeout` -- ends in a `ClientDeadline`, and a backend's 503 with
errorType "timeout" (its query timed out: Prometheus honours the `timeout` passed along) is an
answer about that query. Both count neither way, like a cancellation. A call that ran past the
backend's own call timeout still counts (set `backends[].timeout` below `limits.query_timeout`
for a hung backend to open the breaker before queries give up on it).

One breaker per backend, shared by every tenant: what it counts now (connection errors,
502/503/504 other than a query's timeout, the backend's own timeout) is the backend's health,
the same for every tenant; a breaker per tenant would make each tenant learn a dead backend
on its own (`failures` failed calls each) and send its own probes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import orjson

from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, State
from .protocol import RETRY_STATUSES, BackendReply

__all__ = ["BackendBreaker", "ClientDeadline", "LatencyWindow", "backend_fault", "deadline_answer",
           "CLOSED", "OPEN", "HALF_OPEN"]

_GAUGE = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}
# A backend's error JSON is small; a larger 503 body is not read for its errorType.
_DEADLINE_BODY_MAX = 4096


class ClientDeadline(PromError):
    """A backend call's timeout that was its caller's deadline (shorter than the backend's own
    call timeout): answered like any timeout (503, errorType "timeout", the same message), not
    counted by the breaker."""

    def __init__(self, exc: PromError) -> None:
        super().__init__(exc.kind, exc.message, status=exc.status, headers=exc.headers)


def backend_fault(exc: PromError) -> bool:
    """Did the backend cause the error a call ended in? Connection errors, broken answers, a
    redirect and the backend's own timeout did; the caller's deadline and anything else did not."""
    return exc.kind in ("unavailable", "timeout") and not isinstance(exc, ClientDeadline)


def deadline_answer(reply: BackendReply) -> bool:
    """A backend's 503 saying the query timed out (Prometheus: errorType "timeout", for its
    `-query.timeout` or the `timeout` parameter passed along): an answer about the query, not a
    failure of the backend, and asking again gets the same answer."""
    if reply.status != 503 or not reply.body or len(reply.body) > _DEADLINE_BODY_MAX:
        return False
    try:
        body = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and body.get("errorType") == "timeout"


class BackendBreaker:
    """A backend's breaker: the product's one state machine (`proxy/primitives/breaker.py`,
    with a fixed cooldown) plus what is a backend's own -- the fail-fast 503 naming it, which
    errors count (`settle_error`, `settle_reply`), and its gauges."""

    def __init__(self, backend: str, failures: int, cooldown_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.machine = CircuitBreaker(failures, cooldown_ms, cooldown_ms, clock=clock, on_change=self._changed)
        self.last_failure = ""
        METRICS.backend_breaker_state.labels(backend).set(0)

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def threshold(self) -> int:
        return self.machine.threshold

    @property
    def failures(self) -> int:
        return self.machine.failures

    def _changed(self, state: State) -> None:
        METRICS.backend_breaker_state.labels(self.backend).set(_GAUGE[state])
        METRICS.backend_breaker_transitions.labels(self.backend, state).inc()

    def admit(self) -> bool:
        """Let a call through, or raise the fail-fast 503. True: this call is the half-open
        probe (its outcome decides)."""
        probe = self.machine.admit()
        if probe is not None:
            return probe
        METRICS.backend_breaker_rejected.labels(self.backend).inc()
        raise PromError(
            "unavailable",
            f"backend {self.backend!r} is failing: its circuit breaker is open after {self.threshold} failed "
            f"calls in a row (last: {self.last_failure or 'unknown'}); calls fail fast for "
            f"{self.machine.remaining_s():.1f}s more, then one probe call is let through",
            status=503)

    def success(self, probe: bool) -> None:
        self.machine.success(probe)

    def failure(self, why: str, probe: bool) -> None:
        self.last_failure = why[:200]
        self.machine.failure(probe)

    def release(self, probe: bool) -> None:
        """The call ended without an outcome (cancelled): another call may probe."""
        self.machine.release(probe)

    def settle_error(self, exc: PromError, probe: bool) -> None:
        """A call ended in `exc`: a failure only when the backend caused it (`backend_fault`)."""
        if backend_fault(exc):
            self.failure(exc.message, probe)
        else:
            self.release(probe)

    def settle_reply(self, reply: BackendReply, endpoint: str, probe: bool) -> None:
        """A call was answered: 502/503/504 fail (except a query's own timeout, no outcome),
        any other answer succeeds."""
        if deadline_answer(reply):
            self.release(probe)
        elif reply.status in RETRY_STATUSES:
            self.failure(f"HTTP {reply.status} ({endpoint})", probe)
        else:
            self.success(probe)


class LatencyWindow:
    """The durations of a backend's last `size` answered calls, for `hedge_after: p95`.
    No quantile until `min_samples` calls answered (a hedge needs a basis)."""

    def __init__(self, size: int = 256, min_samples: int = 20) -> None:
        self._d: deque[float] = deque(maxlen=size)
        self.min_samples = min_samples

    def add(self, seconds: float) -> None:
        self._d.append(seconds)

    def p95(self) -> float | None:
        if len(self._d) < self.min_samples:
            return None
        values = sorted(self._d)  # 256 floats: ~20 us, once per hedgeable try
        return values[min(len(values) - 1, int(0.95 * len(values)))]
