"""The circuit breaker per backend and hedged reads.

Fast in-process tests of the breaker's state machine, the latency window and the config keys;
then real promaccel processes in front of the fault-injecting backend (tests/faulty.py) in
front of the real test Prometheus: the breaker opens after failed calls in a row, fails fast
with Prometheus's error JSON naming the backend (no call reaches the backend), half-opens
after its cooldown to let one probe through, and closes on the probe's answer; a hedge is sent
only once a call has gone unanswered past `hedge_after`, the answer is Prometheus's own, and
nothing is hedged by default or beyond `limits.max_backend_calls`.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from proxy.backends.circuit import CLOSED, HALF_OPEN, OPEN, BackendBreaker, LatencyWindow
from proxy.config import BackendConfig
from proxy.errors import PromError
from tests import faulty
from tests.servers import Promaccel

# --------------------------------------------------------------------------- in-process


def test_breaker_opens_after_failures_in_a_row_then_probes_once() -> None:
    now = [100.0]
    b = BackendBreaker("amp", failures=3, cooldown_ms=10_000, clock=lambda: now[0])
    for _ in range(2):
        assert b.admit() is False
        b.failure("HTTP 503", False)
    b.success(False)  # an answer in between: the count starts again
    for _ in range(2):
        b.failure("HTTP 503", b.admit())
    assert b.state == CLOSED
    b.failure("backend 'amp' is unreachable (ClientConnectorError)", b.admit())
    assert b.state == OPEN
    with pytest.raises(PromError) as err:
        b.admit()
    assert err.value.status == 503 and err.value.kind == "unavailable"
    body = orjson.loads(err.value.body())
    assert body["status"] == "error" and body["errorType"] == "unavailable"
    assert "'amp'" in body["error"] and "circuit breaker" in body["error"] and "unreachable" in body["error"]
    now[0] += 9.9
    with pytest.raises(PromError):
        b.admit()
    now[0] += 0.2  # cooldown over: one probe, the others still fail fast
    assert b.admit() is True and b.state == HALF_OPEN
    with pytest.raises(PromError):
        b.admit()
    b.failure("HTTP 502", True)  # the probe failed: open for another cooldown
    assert b.state == OPEN
    with pytest.raises(PromError):
        b.admit()
    now[0] += 10.1
    probe = b.admit()
    b.release(probe)  # cancelled: no outcome, another call may probe
    assert b.state == HALF_OPEN
    probe = b.admit()
    assert probe is True
    b.success(probe)
    assert b.state == CLOSED and b.admit() is False


def test_breaker_with_zero_failures_never_opens() -> None:
    b = BackendBreaker("x", failures=0, cooldown_ms=1000)
    for _ in range(100):
        b.failure("HTTP 503", b.admit())
    assert b.state == CLOSED and b.admit() is False


def test_a_breaker_error_only_makes_a_backends_data_missing_in_a_hybrid_overlap() -> None:
    """The hybrid path answers without a backend whose failure is `unavailable` (with a warning
    naming it): the breaker's fail-fast error is one."""
    from proxy.pipeline.hybrid.warnings import unavailable

    b = BackendBreaker("amp", failures=1, cooldown_ms=1000)
    b.failure("HTTP 503", b.admit())
    with pytest.raises(PromError) as err:
        b.admit()
    assert unavailable(err.value) == "unavailable"


def test_latency_window_p95() -> None:
    w = LatencyWindow(size=100, min_samples=20)
    for _ in range(19):
        w.add(0.01)
    assert w.p95() is None  # no basis yet
    for i in range(81):
        w.add(0.01 if i < 75 else 1.0)  # 6 slow of 100
    assert w.p95() == 1.0
    for _ in range(100):
        w.add(0.02)  # the window moves on
    assert w.p95() == 0.02


@pytest.mark.parametrize(("given", "want"), [(None, None), ("off", None), (0, None), ("0s", None), (False, None),
                                             ("p95", "p95"), ("250ms", 250), (2, 2000)])
def test_hedge_after_config(given: Any, want: Any) -> None:
    cfg = BackendConfig(url="http://127.0.0.1:9", hedge_after=given)
    assert cfg.hedge_after == want


def test_breaker_config_defaults_and_errors() -> None:
    cfg = BackendConfig(url="http://127.0.0.1:9")
    assert (cfg.breaker.failures, cfg.breaker.cooldown, cfg.hedge_after) == (5, 10_000, None)
    assert BackendConfig(url="http://127.0.0.1:9", breaker={"failures": 2, "cooldown": "30s"}).breaker.cooldown == 30_000
    with pytest.raises(ValueError, match="failures"):
        BackendConfig(url="http://127.0.0.1:9", breaker={"failures": -1})
    with pytest.raises(ValueError, match="hedge_after"):
        BackendConfig(url="http://127.0.0.1:9", hedge_after="p99")


def test_only_faults_the_backend_caused_count() -> None:
    """issue 26: the caller's deadline (ClientDeadline) and a backend's 503 errorType "timeout"
    (a query's own timeout) count neither way; a probe ending so lets another call probe."""
    from proxy.backends.circuit import ClientDeadline, backend_fault, deadline_answer
    from proxy.backends.protocol import BackendReply

    own = PromError("timeout", "backend 'amp' did not answer in time (/api/v1/query)")
    client = ClientDeadline(own)
    assert client.kind == "timeout" and client.status == 503 and client.body() == own.body()
    assert backend_fault(own) and not backend_fault(client)
    assert backend_fault(PromError("unavailable", "backend 'amp' is unreachable (ConnectError)"))
    assert not backend_fault(PromError("execution", "too many samples"))
    timed_out = BackendReply(503, b'{"status":"error","errorType":"timeout","error":"query timed out in query '
                                  b'execution"}', "application/json")
    assert deadline_answer(timed_out)
    assert not deadline_answer(BackendReply(503, b'{"message":"Service Unavailable"}', "application/json"))
    assert not deadline_answer(BackendReply(504, b'{"errorType":"timeout"}', "application/json"))
    assert not deadline_answer(BackendReply(503, b"<html>timeout</html>", "text/html"))

    now = [0.0]
    b = BackendBreaker("amp", failures=2, cooldown_ms=10_000, clock=lambda: now[0])
    for _ in range(10):
        b.settle_error(client, b.admit())
        b.settle_reply(timed_out, "/api/v1/query", b.admit())
    assert b.state == CLOSED and b.failures == 0
    b.settle_error(own, b.admit())
    b.settle_reply(BackendReply(502, b"<html/>", "text/html"), "/api/v1/query", b.admit())
    assert b.state == OPEN
    now[0] += 10.0  # cooldown over
    assert b.admit() is True
    b.settle_reply(timed_out, "/api/v1/query", True)  # the probe's query timed out: no outcome
    assert b.state == HALF_OPEN and b.admit() is True
    b.settle_reply(BackendReply(200, b"{}", "application/json"), "/api/v1/query", True)
    assert b.state == CLOSED


# --------------------------------------------------------------------------- real processes


def _serve(backend: faulty.FaultyBackend, tmp_path: Path, extra: str = "", limits: str = "") -> Promaccel:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text(f"cache:\n  enabled: false\nbackends:\n  - name: default\n    url: {backend.url}\n{extra}"
                   + (f"limits:\n{limits}" if limits else ""))
    server = Promaccel.start(None, ("--config", str(cfg), "--split-interval", "none"), tmp_path)
    # The planner discovers shard-label values on a first query (kept 5 min): done now, healthy,
    # so that each query below makes exactly its own backend call.
    was = (backend.fault, backend.first)
    backend.set(None)
    assert httpx.post(server.url + "/api/v1/query", data=_form_warm(), timeout=60).status_code == 200
    backend.set(*was)
    return server


def _form_warm() -> dict[str, str]:
    return {"query": "vector(1)", "time": "1793480000"}


def _form(prom: Any, i: int) -> dict[str, str]:
    """An instant query (one backend call), its text new per `i`."""
    return {"query": f"max(DCGM_FI_DEV_GPU_TEMP) + 0 * {i}", "time": str(prom.end_s - 600)}


def _ask(server: Promaccel, form: dict[str, str]) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(server.url + "/api/v1/query", data=form, timeout=60)
    return r, time.monotonic() - t0


def _exact(prom: Any, form: dict[str, str], r: httpx.Response) -> bool:
    direct = httpx.post(prom.url + "/api/v1/query", data=form, timeout=60)
    return r.status_code == 200 and diff_answers(direct.json(), r.json()) == []


def _metric(server: Promaccel, name: str, labels: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _is_breaker_error(r: httpx.Response) -> bool:
    body = orjson.loads(r.content)
    return (r.status_code == 503 and r.headers["content-type"].startswith("application/json")
            and body["errorType"] == "unavailable" and "'default'" in body["error"]
            and "circuit breaker is open" in body["error"])


@pytest.mark.prom
def test_breaker_opens_fails_fast_half_opens_and_closes(prom: Any, backend: faulty.FaultyBackend,
                                                        tmp_path: Path) -> None:
    server = _serve(backend, tmp_path, "    breaker: {failures: 3, cooldown: 2s}\n")
    try:
        backend.set("json503", first=None)
        for i in range(3):  # three calls, each with its retries, fail: the breaker opens
            r, _ = _ask(server, _form(prom, i))
            assert r.status_code == 503 and not _is_breaker_error(r), r.text
        assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 1
        backend.set(None)  # healthy again, but the breaker does not know yet
        before = backend.calls
        r, took = _ask(server, _form(prom, 3))
        assert _is_breaker_error(r), r.text
        assert backend.calls == before and took < 1.0  # failed fast: no call reached the backend
        assert _metric(server, "promaccel_backend_breaker_rejected_total", 'backend="default"') == 1

        # Half-open: one probe goes through; while it waits (a 3 s stall), others fail fast.
        time.sleep(2.1)
        backend.set("stall", first=None)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            probe = pool.submit(_ask, server, _form(prom, 4))
            time.sleep(0.5)
            other, took = _ask(server, _form(prom, 5))
            assert _is_breaker_error(other) and took < 1.0, other.text
            assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 2
            r, took = probe.result()
        backend.set(None)
        assert _exact(prom, _form(prom, 4), r) and took >= 2.9  # the probe's answer is Prometheus's
        assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 0
        r, _ = _ask(server, _form(prom, 6))  # closed: queries run again
        assert _exact(prom, _form(prom, 6), r)

        # A failed probe opens it again for another cooldown.
        backend.set("reset", first=None)
        for i in range(3):
            _ask(server, _form(prom, 10 + i))
        assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 1
        time.sleep(2.1)
        before = backend.calls
        r, _ = _ask(server, _form(prom, 13))  # the probe: its tries reach the backend, and fail
        assert r.status_code == 503 and not _is_breaker_error(r) and backend.calls > before
        assert "'default'" in r.json()["error"]
        before = backend.calls
        r, _ = _ask(server, _form(prom, 14))
        assert _is_breaker_error(r) and backend.calls == before
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'promaccel_backend_breaker_transitions_total{backend="default",state="half_open"} 2.0' in text
        assert 'promaccel_backend_breaker_transitions_total{backend="default",state="open"} 3.0' in text
        ui = httpx.get(server.url + "/ui/data.json", timeout=10).json()["data"]
        assert [b["breaker"] for b in ui["backends"]] == ["open"]
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_breaker_off_with_zero_failures(prom: Any, backend: faulty.FaultyBackend, tmp_path: Path) -> None:
    server = _serve(backend, tmp_path, "    breaker: {failures: 0}\n    retries: 0\n")
    try:
        backend.set("json503", first=None)
        before = backend.calls
        for i in range(8):
            r, _ = _ask(server, _form(prom, 100 + i))
            assert r.status_code == 503 and not _is_breaker_error(r)
        assert backend.calls - before == 8  # every call reached the backend
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_a_slow_call_is_hedged_after_the_threshold_and_the_answer_is_exact(
        prom: Any, backend: faulty.FaultyBackend, tmp_path: Path) -> None:
    """hedge_after: 1s; the first try of the query stalls 3 s, its hedge (the same request, a
    second time) is answered at once: the answer comes after 1 s, well before 3 s, and is
    Prometheus's. A query answered fast is not hedged."""
    server = _serve(backend, tmp_path, "    hedge_after: 1s\n")
    try:
        backend.set(None)
        before = backend.calls
        r, _ = _ask(server, _form(prom, 200))
        assert _exact(prom, _form(prom, 200), r) and backend.calls - before == 1
        backend.set("stall", first=1)
        before = backend.calls
        r, took = _ask(server, _form(prom, 201))
        assert backend.calls - before == 2 and 1.0 <= took < 2.8, took
        backend.set(None)
        assert _exact(prom, _form(prom, 201), r)
        assert _metric(server, "promaccel_backend_hedges_total", 'backend="default",outcome="sent"') == 1
        assert _metric(server, "promaccel_backend_hedges_total", 'backend="default",outcome="won"') == 1
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_hedge_after_p95_uses_the_backends_recent_latency(prom: Any, backend: faulty.FaultyBackend,
                                                          tmp_path: Path) -> None:
    server = _serve(backend, tmp_path, "    hedge_after: p95\n")
    try:
        backend.set("stall", first=1)  # no basis yet (fewer than 20 answered calls): no hedge
        r, took = _ask(server, _form(prom, 300))
        assert r.status_code == 200 and took >= 2.9
        backend.set(None)
        for i in range(25):
            assert _ask(server, _form(prom, 301 + i))[0].status_code == 200
        backend.set("stall", first=1)
        before = backend.calls
        r, took = _ask(server, _form(prom, 400))
        assert backend.calls - before == 2 and took < 2.5, took  # hedged after the p95 (~ms)
        backend.set(None)
        assert _exact(prom, _form(prom, 400), r)
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_no_hedge_by_default_nor_beyond_max_backend_calls(prom: Any, backend: faulty.FaultyBackend,
                                                          tmp_path: Path) -> None:
    servers = {"default": _serve(backend, tmp_path / "default"),
               "limited": _serve(backend, tmp_path / "limited", "    hedge_after: 300ms\n",
                                 "  max_backend_calls: 1\n")}
    try:
        for n, (name, server) in enumerate(servers.items()):
            backend.set("stall", first=1)
            before = backend.calls
            r, took = _ask(server, _form(prom, 500 + n))
            assert backend.calls - before == 1 and took >= 2.9, (name, took)
            backend.set(None)
            assert _exact(prom, _form(prom, 500 + n), r)
            assert _metric(server, "promaccel_backend_hedges_total", 'backend="default",outcome="sent"') == 0
        assert _metric(servers["limited"], "promaccel_backend_hedges_total",
                       'backend="default",outcome="denied"') == 1
    finally:
        backend.set(None)
        for s in servers.values():
            s.stop()


# --------------------------------------------------------------------------- issue 26: whose fault


def _heavy(prom: Any, i: int, timeout: str) -> dict[str, str]:
    """A range query over the whole data set at a 15 s step (~100 ms at Prometheus): with
    `timeout=5ms` it cannot finish in time, at promaccel or at the backend (the parameter is
    passed along)."""
    return {"query": f"sum by (Hostname) (rate(DCGM_FI_DEV_GPU_UTIL[5m])) + 0 * {i}", "start": str(prom.start_s),
            "end": str(prom.end_s), "step": "15", "timeout": timeout}


@pytest.mark.prom
def test_client_deadlines_do_not_open_the_breaker_for_other_clients(prom: Any, backend: faulty.FaultyBackend,
                                                                    tmp_path: Path) -> None:
    """issue 26: five queries with timeout=5ms opened the shared breaker, and other clients got
    503 "circuit breaker is open". A client's deadline (promaccel's timer, or the backend
    answering 503 errorType "timeout" to the `timeout` passed along) is not a backend fault."""
    server = _serve(backend, tmp_path, "    breaker: {failures: 2, cooldown: 30s}\n")
    try:
        backend.set(None)
        for i in range(8):
            r = httpx.post(server.url + "/api/v1/query_range", data=_heavy(prom, i, "5ms"), timeout=60)
            assert r.status_code == 503 and r.json()["errorType"] == "timeout", r.text
        assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 0
        with httpx.Client(timeout=60) as other:  # another client
            for i in range(5):
                form = _form(prom, 600 + i)
                r = other.post(server.url + "/api/v1/query", data=form)
                assert _exact(prom, form, r), r.text
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'promaccel_backend_breaker_transitions_total{backend="default",state="open"}' not in text
    finally:
        backend.set(None)
        server.stop()


class _TimingOut:
    """A fake backend on a loopback port answering every query with Prometheus's 503 for a
    query that timed out (what it answers to a `timeout` passed along); label values and
    `vector(1)` (promaccel's warm-up) are answered."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from tests.servers import free_port

        outer = self
        self.queries = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: bytes) -> None:
                if "/label/" in self.path:
                    self._send(200, b'{"status":"success","data":[]}')
                elif b"DCGM" in body or b"DCGM" in self.path.encode():
                    outer.queries += 1
                    self._send(503, b'{"status":"error","errorType":"timeout",'
                                    b'"error":"query timed out in query execution"}')
                else:
                    self._send(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(b"")

            def do_POST(self) -> None:  # noqa: N802
                self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.prom
def test_a_backends_query_timeout_answer_is_relayed_not_retried_nor_counted(prom: Any, tmp_path: Path) -> None:
    """Prometheus answers 503 errorType "timeout" when the `timeout` a client passed along (or
    its own -query.timeout) runs out: that is the query's outcome. It is relayed once (asking
    again gets the same), and the breaker stays closed."""
    fake = _TimingOut()
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text(f"cache:\n  enabled: false\nbackends:\n  - name: default\n    url: {fake.url}\n"
                   "    breaker: {failures: 2, cooldown: 30s}\n")
    server = Promaccel.start(None, ("--config", str(cfg), "--split-interval", "none"), tmp_path)
    try:
        for i in range(6):
            r, _ = _ask(server, {**_form(prom, 700 + i), "timeout": "30s"})
            assert r.status_code == 503 and r.json()["errorType"] == "timeout", r.text
            assert "circuit breaker" not in r.text
        assert fake.queries == 6  # one call each: not retried
        assert _metric(server, "promaccel_backend_breaker_state", 'backend="default"') == 0
    finally:
        server.stop()
        fake.stop()


@pytest.mark.prom
def test_the_backends_own_timeout_still_opens_the_breaker(prom: Any, backend: faulty.FaultyBackend,
                                                          tmp_path: Path) -> None:
    """A backend that stalls (3 s) past its own call timeout (backends[].timeout: 1s) fails the
    call: two such calls open the breaker. The same stall under a client's shorter deadline
    (timeout=500ms, the backend's timeout 60 s) does not."""
    own = _serve(backend, tmp_path / "own", "    timeout: 1s\n    breaker: {failures: 2, cooldown: 30s}\n")
    callers = _serve(backend, tmp_path / "callers", "    timeout: 60s\n    breaker: {failures: 2, cooldown: 30s}\n")
    try:
        backend.set("stall", first=None)
        for i in range(3):
            r, took = _ask(callers, {**_form(prom, 800 + i), "timeout": "500ms"})
            assert r.status_code == 503 and r.json()["errorType"] == "timeout" and took < 2.5, r.text
        assert _metric(callers, "promaccel_backend_breaker_state", 'backend="default"') == 0
        for i in range(2):
            r, _ = _ask(own, _form(prom, 810 + i))
            assert r.status_code == 503 and not _is_breaker_error(r), r.text
        assert _metric(own, "promaccel_backend_breaker_state", 'backend="default"') == 1
        r, took = _ask(own, _form(prom, 812))
        assert _is_breaker_error(r) and took < 1.0, r.text
        assert "did not answer in time" in r.json()["error"]
    finally:
        backend.set(None)
        own.stop()
        callers.stop()
