"""The one circuit breaker state machine (proxy/primitives/breaker.py), which the Redis store
(tests/cache/test_cache.py) and each backend (tests/backends/test_circuit.py) wrap."""

from __future__ import annotations

from proxy.primitives.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, State


def make(failures: int = 2, backoff_ms: int = 1_000, max_backoff_ms: int | None = None
         ) -> tuple[CircuitBreaker, list[float], list[State]]:
    now = [0.0]
    seen: list[State] = []
    b = CircuitBreaker(failures, backoff_ms, max_backoff_ms, clock=lambda: now[0], on_change=seen.append)
    return b, now, seen


def test_opens_after_failures_in_a_row_and_a_success_resets_the_count() -> None:
    b, _, seen = make(failures=2)
    assert b.admit() is False
    b.failure()
    b.success()  # an answer in between
    b.failure()
    assert b.state == CLOSED and b.admit() is False
    b.failure()
    assert b.state == OPEN and b.admit() is None
    assert seen == [OPEN]


def test_one_probe_after_the_backoff_its_outcome_decides() -> None:
    b, now, seen = make(failures=1, backoff_ms=1_000)
    b.failure(b.admit() or False)
    now[0] = 0.999
    assert b.admit() is None and abs(b.remaining_s() - 0.001) < 1e-9
    now[0] = 1.0
    assert b.admit() is True and b.state == HALF_OPEN and b.probing
    assert b.admit() is None  # only one probe at a time
    b.release(probe=False)  # a call admitted before: its end frees nothing
    assert b.admit() is None
    b.release(probe=True)  # the probe was cancelled: another call may probe
    assert b.admit() is True
    b.success(probe=True)
    assert b.state == CLOSED and not b.probing and b.admit() is False
    assert seen == [OPEN, HALF_OPEN, CLOSED]


def test_backoff_doubles_up_to_the_cap_then_starts_small_again() -> None:
    b, now, _ = make(failures=1, backoff_ms=1_000, max_backoff_ms=3_000)
    b.failure()  # open until 1
    opened_for = []
    for _ in range(4):
        start = now[0]
        while b.admit() is None:
            now[0] = round(now[0] + 0.5, 3)
        opened_for.append(now[0] - start)
        b.failure(probe=True)
    assert opened_for == [1.0, 2.0, 3.0, 3.0]
    now[0] += 3.0
    assert b.admit() is True
    b.success(True)
    b.failure()
    now[0] += 1.0
    assert b.admit() is True  # the back-off is 1 s again


def test_fixed_cooldown_when_the_cap_is_the_backoff() -> None:
    b, now, _ = make(failures=1, backoff_ms=2_000)
    b.failure()
    for _ in range(3):
        now[0] += 1.9
        assert b.admit() is None
        now[0] += 0.1
        assert b.admit() is True
        b.failure(True)


def test_a_late_failure_while_open_does_not_extend_it_and_zero_never_opens() -> None:
    b, now, _ = make(failures=1, backoff_ms=1_000)
    b.failure()
    now[0] = 0.5
    b.failure()  # a call admitted before it opened, failing late
    now[0] = 1.0
    assert b.admit() is True
    never, _, seen = make(failures=0)
    for _ in range(50):
        never.failure(never.admit() or False)
    assert never.state == CLOSED and seen == []
