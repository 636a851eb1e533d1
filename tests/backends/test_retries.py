"""Retries, throttling and hedging of one backend call (proxy/backends/retries.py), in
process: a fake try stands for the backend, so what is retried, how often and what comes back
is seen directly (tests/backends/test_backend_faults.py drives the same through real servers)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from proxy.backends.circuit import ClientDeadline
from proxy.backends.protocol import BackendReply
from proxy.backends.retries import (
    CHECK_IN_THREAD_BYTES,
    RETRY_BUDGET_CAP,
    Attempt,
    Hedge,
    RetryBudget,
    throttle_delay,
    with_retries,
)
from proxy.config import BackendConfig
from proxy.errors import PromError

PROM = BackendConfig(url="http://127.0.0.1:9090", name="b1", retries=2)
AMP = BackendConfig(url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1", kind="amp", name="amp",
                    retries=2, throttle_retries=2)
TIMEOUT_BODY = b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}'


def _reply(status: int, body: bytes = b'{"status":"success","data":{}}', **headers: str) -> BackendReply:
    return BackendReply(status, body, "application/json", {k.replace("_", "-"): v for k, v in headers.items()})


class Script:
    """A fake backend: each try takes the next outcome (a reply, or a PromError to raise)."""

    def __init__(self, *outcomes: BackendReply | PromError, delays: tuple[float, ...] = ()) -> None:
        self.outcomes, self.delays = list(outcomes), list(delays)
        self.timeouts: list[float | None] = []

    async def __call__(self, timeout: float | None, sent: asyncio.Event | None) -> BackendReply:
        self.timeouts.append(timeout)
        i = len(self.timeouts) - 1
        if sent is not None:
            sent.set()
        if i < len(self.delays):
            await asyncio.sleep(self.delays[i])
        out = self.outcomes[min(i, len(self.outcomes) - 1)]
        if isinstance(out, PromError):
            raise out
        return out

    @property
    def tries(self) -> int:
        return len(self.timeouts)


def _run(attempt: Attempt, cfg: BackendConfig = PROM, timeout_s: float | None = 5.0, **kw: object) -> BackendReply:
    return asyncio.run(with_retries(attempt, cfg, "/api/v1/query", timeout_s, **kw))  # type: ignore[arg-type]


def test_retry_budget() -> None:
    now = [0.0]
    budget = RetryBudget(ratio=0.2, floor=5.0, clock=lambda: now[0])
    assert sum(budget.spend() for _ in range(1000)) == RETRY_BUDGET_CAP  # the saved retries, then none
    for _ in range(10):
        budget.earn()  # ten calls earn two retries
    assert [budget.spend() for _ in range(3)] == [True, True, False]
    now[0] += 1.0  # the floor: five a second
    assert sum(budget.spend() for _ in range(10)) == 5


def test_a_large_answer_is_checked_off_the_event_loop() -> None:
    """Decoding a heavy panel's 15 MB answer took ~40 ms: a body over CHECK_IN_THREAD_BYTES is
    checked in a worker thread while the event loop goes on; a small one on the loop."""
    loop_thread: list[int] = []
    checked_on: list[bool] = []

    def check(reply: BackendReply) -> str | None:
        checked_on.append(threading.get_ident() == loop_thread[0])
        time.sleep(0.2)  # a slow decode
        return None

    async def scenario(size: int) -> int:
        loop_thread[:] = [threading.get_ident()]
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async def attempt(t: float | None, sent: asyncio.Event | None) -> BackendReply:
            return BackendReply(status=200, body=b"x" * size, content_type="application/json", headers={})

        task = asyncio.create_task(ticker())
        reply = await with_retries(attempt, PROM, "/api/v1/query_range", 5.0,
                                   check=check)
        task.cancel()
        assert reply.status == 200 and len(reply.body) == size
        return ticks

    assert asyncio.run(scenario(CHECK_IN_THREAD_BYTES + 1)) >= 5  # the loop ticked meanwhile
    assert asyncio.run(scenario(1000)) <= 1  # checked on the loop: it stood still
    assert checked_on == [False, True]


def test_a_gateway_error_is_retried_then_the_answer_returned() -> None:
    script = Script(_reply(502, b"<html>"), _reply(503, b"<html>"), _reply(200))
    assert _run(script).status == 200 and script.tries == 3


def test_retries_end_with_the_last_answer() -> None:
    script = Script(_reply(504, b"<html>"))
    assert _run(script).status == 504 and script.tries == PROM.retries + 1


@pytest.mark.parametrize("status", [400, 404, 422, 429])  # 429 is the throttle's: only for AMP
def test_client_errors_are_never_retried(status: int) -> None:
    script = Script(_reply(status, b'{"status":"error","errorType":"bad_data","error":"x"}'), _reply(200))
    assert _run(script).status == status and script.tries == 1


def test_a_connection_error_is_retried_a_timeout_is_not() -> None:
    down = Script(PromError("unavailable", "connection refused"))
    with pytest.raises(PromError) as err:
        _run(down)
    assert err.value.kind == "unavailable" and down.tries == PROM.retries + 1
    slow = Script(PromError("timeout", "timed out"), _reply(200))
    with pytest.raises(PromError):
        _run(slow, timeout_s=None)
    assert slow.tries == 1


def test_a_timeout_within_the_callers_shorter_deadline_is_the_callers() -> None:
    # The backend's own call timeout is 120 s; a 1 s query timeout ending a try is the
    # client's deadline, which the breaker must not count against the backend.
    with pytest.raises(ClientDeadline) as err:
        _run(Script(PromError("timeout", "timed out")), timeout_s=1.0)
    assert err.value.status == 503
    with pytest.raises(PromError) as own:
        _run(Script(PromError("timeout", "timed out")), timeout_s=None)
    assert not isinstance(own.value, ClientDeadline)


def test_each_try_runs_within_the_deadline() -> None:
    script = Script(_reply(502), _reply(200))
    _run(script, timeout_s=3.0)
    assert script.timeouts == [3.0, 3.0]
    own = Script(_reply(200))
    _run(own, timeout_s=None)
    assert own.timeouts == [None]  # the client's own (the backend's timeout)


def test_a_redirect_is_an_error_naming_the_backend_not_its_url() -> None:
    script = Script(_reply(301, b"", location="http://127.0.0.1:9090/debug/pprof"))
    with pytest.raises(PromError) as err:
        _run(script)
    assert err.value.status == 502 and "'b1'" in err.value.message and "127.0.0.1" not in err.value.message
    assert script.tries == 1


def test_the_backends_own_query_timeout_is_an_answer() -> None:
    # Prometheus answers 503 errorType "timeout" when the query ran out of its
    # -query.timeout: asking again gets the same, so it is not retried.
    script = Script(_reply(503, TIMEOUT_BODY), _reply(200))
    assert _run(script).body == TIMEOUT_BODY and script.tries == 1


def test_a_broken_body_is_retried_then_a_502() -> None:
    cut = Script(_reply(200, b'{"status":"succ'), _reply(200))
    assert _run(cut, check=lambda r: None if r.body.endswith(b"}") else "cut short").status == 200
    assert cut.tries == 2
    always = Script(_reply(200, b'{"status":"succ'))
    with pytest.raises(PromError) as err:
        _run(always, check=lambda r: "cut short")
    assert err.value.status == 502 and "cut short" in err.value.message and always.tries == PROM.retries + 1


def test_an_empty_retry_budget_denies_the_retry() -> None:
    budget = RetryBudget(ratio=0.0, floor=0.0)
    budget.tokens = 0.0
    script = Script(_reply(502), _reply(200))
    assert _run(script, budget=budget).status == 502 and script.tries == 1


def test_amp_throttling_is_retried_on_its_own_budget() -> None:
    script = Script(_reply(429, retry_after="0"), _reply(503, b"<html>"), _reply(200))
    assert _run(script, AMP).status == 200 and script.tries == 3
    # Throttled on every try: after throttle_retries the 429 goes back for the caller to relay.
    always = Script(_reply(429, retry_after="0"))
    assert _run(always, AMP).status == 429 and always.tries == AMP.throttle_retries + 1
    # A Retry-After past the deadline is not waited for.
    later = Script(_reply(429, retry_after="30"), _reply(200))
    t0 = time.monotonic()
    assert _run(later, AMP, timeout_s=1.0).status == 429 and later.tries == 1
    assert time.monotonic() - t0 < 1.0


def test_throttle_delay_is_retry_after_plus_jitter() -> None:
    for throttled in range(6):
        d = throttle_delay(throttled, _reply(429, retry_after="2"))
        assert 2.0 <= d <= 2.0 + min(5.0, 0.1 * 2**throttled)
    assert 0.0 <= throttle_delay(0, _reply(429)) <= 0.1


def test_a_slow_try_is_hedged_and_the_first_good_answer_wins() -> None:
    script = Script(_reply(200, b'{"slow":1}'), _reply(200, b'{"fast":1}'), delays=(2.0, 0.0))
    allowed: list[bool] = []
    hedge = Hedge(delay_s=lambda: 0.05, allow=lambda: allowed.append(True) or True)
    t0 = time.monotonic()
    assert _run(script, hedge=hedge).body == b'{"fast":1}'
    assert time.monotonic() - t0 < 1.5 and script.tries == 2 and allowed == [True]
    # Not allowed (no budget token): the first try is awaited.
    denied = Script(_reply(200, b'{"slow":1}'), delays=(0.2,))
    assert _run(denied, hedge=Hedge(delay_s=lambda: 0.01, allow=lambda: False)).body == b'{"slow":1}'
    assert denied.tries == 1
