"""Backend faults: every answer exact, or Prometheus's error JSON naming the backend.

A real promaccel in front of a fault-injecting backend (tests/faulty.py) in front of the real
test Prometheus. Transient faults -- an HTML 502, a 503, a 200 whose JSON is cut short, a body
shorter than its Content-Length, a closed connection -- on a request's first try are retried
(reads are idempotent) and the answer is Prometheus's own; the same faults on every try give a
502/503 with Prometheus's error JSON naming the backend: never a 200 with a broken body, never
an HTML page. Nothing broken is cached: with the backend healthy again, answers are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from tests import faulty
from tests.servers import Promaccel

TRANSIENT = ("html502", "json503", "trunc200", "short", "reset")
pytestmark = pytest.mark.prom


@pytest.fixture(scope="module")
def servers(backend: faulty.FaultyBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Promaccel]]:
    work = tmp_path_factory.mktemp("faults")
    # A retry budget that never runs out: these tests are about what is retried, not how often
    # (test_a_sick_backend_is_not_hammered_with_retries is), and no circuit breaker: a lasting
    # fault would open it, and these tests ask again right after the fault ends
    # (tests/backends/test_circuit.py is about the breaker).
    cfg = work / "promaccel.yaml"
    cfg.write_text(f"backends:\n  - name: default\n    url: {backend.url}\n    retry_ratio: 100\n"
                   "    retry_floor: 100000\n    breaker: {failures: 0}\n")
    out = {
        "planned": Promaccel.start(None, ("--split-interval", "1h", "--shards", "2"), work / "planned", config=cfg),
        "whole": Promaccel.start(None, ("--split-interval", "none", "--shards", "1"), work / "whole", config=cfg),
    }
    try:
        yield out
    finally:
        for s in out.values():
            s.stop()


def _queries(prom: Any, salt: int) -> list[tuple[str, dict[str, str]]]:
    """The test's queries; `salt` makes their text (hence their cache keys) new per test, so
    each one reaches the backend."""
    end = prom.end_s - 600
    return [
        ("/api/v1/query_range", {"query": f"sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL) + 0 * {salt}",
                                 "start": str(end - 7200), "end": str(end), "step": "60"}),
        ("/api/v1/query", {"query": f"max(DCGM_FI_DEV_GPU_TEMP) + 0 * {salt}", "time": str(end)}),
        ("/api/v1/labels", {}),
        ("/api/v1/series", {"match[]": "DCGM_FI_DEV_GPU_TEMP", "start": str(end - 600), "end": str(end)}),
    ]


def _same(direct: dict[str, Any], proxied: dict[str, Any]) -> bool:
    if isinstance(direct.get("data"), list):  # labels, series: relayed as they are
        return direct == proxied
    return diff_answers(direct, proxied) == []


def _check_error(r: httpx.Response) -> None:
    assert r.status_code in (502, 503, 504), (r.status_code, r.text[:200])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = orjson.loads(r.content)
    assert body["status"] == "error" and body["errorType"] in ("unavailable", "timeout"), body
    assert "'default'" in body["error"] and "<html" not in r.text.lower(), body


@pytest.mark.parametrize("fault", TRANSIENT)
def test_a_transient_fault_is_retried_and_the_answer_is_exact(prom: Any, backend: faulty.FaultyBackend,
                                                             servers: dict[str, Promaccel], fault: str) -> None:
    for i, (name, server) in enumerate(servers.items()):
        for path, form in _queries(prom, salt=10 * TRANSIENT.index(fault) + i):
            backend.set(None)
            direct = httpx.post(prom.url + path, data=form, timeout=60)
            backend.set(fault, first=1)
            proxied = httpx.post(server.url + path, data=form, timeout=60)
            assert proxied.status_code == direct.status_code == 200, (name, path, proxied.text[:300])
            assert _same(direct.json(), proxied.json()), (name, path)
            assert backend.faults_sent >= 1  # the fault did happen
    backend.set(None)


@pytest.mark.parametrize("fault", TRANSIENT)
def test_a_lasting_fault_is_a_prometheus_error_naming_the_backend(prom: Any, backend: faulty.FaultyBackend,
                                                                 servers: dict[str, Promaccel], fault: str) -> None:
    salt = 100 + 10 * TRANSIENT.index(fault)
    try:
        for server in servers.values():
            for path, form in _queries(prom, salt):
                backend.set(fault, first=None)
                _check_error(httpx.post(server.url + path, data=form, timeout=60))
    finally:
        backend.set(None)
    # Nothing broken was kept: the same queries, backend healthy, are exact.
    for server in servers.values():
        for path, form in _queries(prom, salt):
            direct = httpx.post(prom.url + path, data=form, timeout=60)
            proxied = httpx.post(server.url + path, data=form, timeout=60)
            assert proxied.status_code == 200 and _same(direct.json(), proxied.json()), path


def test_a_backends_own_error_is_relayed_as_it_is(prom: Any, backend: faulty.FaultyBackend,
                                                  servers: dict[str, Promaccel]) -> None:
    backend.set(None)
    form = {"query": "sum(rate(x[5m])", "time": str(prom.end_s)}
    direct = httpx.post(prom.url + "/api/v1/query", data=form, timeout=60)
    for server in servers.values():
        proxied = httpx.post(server.url + "/api/v1/query", data=form, timeout=60)
        assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)


def test_faulty_backend_itself(tmp_path: Path, prom: Any, backend: faulty.FaultyBackend) -> None:
    """The fault injector does inject (so the tests above cannot pass by accident)."""
    form = {"query": "up", "time": str(prom.end_s)}
    backend.set("html502", first=None)
    r = httpx.post(backend.url + "/api/v1/query", data=form, timeout=30)
    assert r.status_code == 502 and b"<html>" in r.content
    backend.set("trunc200", first=None)
    r = httpx.post(backend.url + "/api/v1/query", data=form, timeout=30)
    assert r.status_code == 200
    with pytest.raises(ValueError):
        orjson.loads(r.content)
    backend.set("html502", first=1)
    assert httpx.post(backend.url + "/api/v1/query", data=form, timeout=30).status_code == 502
    assert httpx.post(backend.url + "/api/v1/query", data=form, timeout=30).status_code == 200
    backend.set(None)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_shutdown_lets_queries_in_flight_finish(prom: Any, backend: faulty.FaultyBackend, tmp_path: Path,
                                                sig: str) -> None:
    """SIGTERM while several queries (instant, range, series, labels) wait on a slow backend:
    each still gets its full, exact answer; a new connection is refused as soon as the signal
    is handled; the process exits within listen.shutdown_timeout, once they are answered."""
    import concurrent.futures
    import signal
    import time

    cfg = tmp_path / "promaccel.yaml"
    # One backend call per query, all at once (max_parallel): every query waits on the backend
    # when the signal comes.
    cfg.write_text(f"listen:\n  shutdown_timeout: 20s\ncache:\n  enabled: false\nbackends:\n  - name: default\n"
                   f"    url: {backend.url}\n    max_parallel: 16\n")
    server = Promaccel.start(None, ("--split-interval", "none"), tmp_path, config=cfg)
    # labels over the generated window only: Prometheus's own scrapes add label names as it runs
    window = {"start": str(prom.end_s - 3600), "end": str(prom.end_s)}
    queries = [(p, f if p != "/api/v1/labels" else window) for p, f in _queries(prom, salt=7777)]
    queries += _queries(prom, salt=7778)[:2]
    direct = [httpx.post(prom.url + path, data=form, timeout=60).json() for path, form in queries]
    # The planner's shard-label discovery (answer-size estimates) is done before the stall, so
    # that every query's own backend call is what waits.
    warm = httpx.post(server.url + "/api/v1/query", data={"query": "up", "time": str(prom.end_s)}, timeout=60)
    assert warm.status_code == 200, warm.text
    backend.set("stall", first=None)  # 3 s before the backend answers each call

    def ask(path: str, form: dict[str, str]) -> tuple[httpx.Response, float]:
        r = httpx.post(server.url + path, data=form, timeout=60)
        return r, time.monotonic()

    pool = concurrent.futures.ThreadPoolExecutor(len(queries))
    try:
        futures = [pool.submit(ask, path, form) for path, form in queries]

        def waiting(path: str, form: dict[str, str]) -> bool:  # a backend call of this query has arrived
            salt = next((w for w in form.get("query", "").split() if w.isdigit()), "")
            return any(k.startswith(f"POST {path}".encode() + b"\0") and salt.encode() in k for k in list(backend.seen))

        deadline = time.monotonic() + 10
        while not all(waiting(p, f) for p, f in queries) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(waiting(p, f) for p, f in queries), list(backend.seen)  # every query is in flight
        t0 = time.monotonic()
        server.proc.send_signal(getattr(signal, sig))
        time.sleep(0.5)
        for _ in range(3):  # no longer accepting: each new connection refused
            with pytest.raises(httpx.ConnectError):
                httpx.get(server.url + "/-/healthy", timeout=2)
        answers = [f.result(timeout=30) for f in futures]
        # uvicorn re-raises the signal once it has shut down: the exit is the signal's (or 0).
        assert server.proc.wait(30) in (0, -getattr(signal, sig))
        exited = time.monotonic()
        assert exited - t0 < 20, exited - t0  # listen.shutdown_timeout
    finally:
        backend.set(None)
        pool.shutdown(wait=False)
        if server.proc.poll() is None:
            server.stop()
    for (path, _), want, (got, answered) in zip(queries, direct, answers):
        assert answered > t0 + 1.0, path  # still in flight when the signal came
        assert got.status_code == 200 and _same(want, got.json()), (path, got.text[:300])


def test_shutdown_is_bounded_by_its_timeout(prom: Any, backend: faulty.FaultyBackend, tmp_path: Path) -> None:
    """A query that outlives listen.shutdown_timeout does not hold the process: it exits on time."""
    import signal
    import threading
    import time

    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("listen:\n  shutdown_timeout: 1s\ncache:\n  enabled: false\n")
    server = Promaccel.start(backend.url, ("--config", str(cfg)), tmp_path)
    form = {"query": "max(DCGM_FI_DEV_GPU_TEMP) + 0 * 8888", "time": str(prom.end_s - 600)}
    backend.set("stall", first=None)  # 3 s before the backend answers
    t = threading.Thread(target=lambda: httpx.post(server.url + "/api/v1/query", data=form, timeout=60), daemon=True)
    try:
        t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
        assert time.monotonic() - t0 < 2.5  # 1 s of grace, not the backend's 3 s
    finally:
        backend.set(None)
        if server.proc.poll() is None:
            server.stop()


def test_a_sick_backend_is_not_hammered_with_retries(prom: Any, backend: faulty.FaultyBackend,
                                                     tmp_path: Path) -> None:
    """Every call fails: 200 queries cost about 200 calls plus the budget's retries (50 saved,
    20% of the calls, 10 a second), not the 600 that 2 retries each would make; each answer
    is Prometheus's error JSON."""
    import time

    cfg = tmp_path / "promaccel.yaml"
    # No circuit breaker (it would stop the calls after 5 failures; this is about the budget).
    cfg.write_text(f"cache:\n  enabled: false\nbackends:\n  - name: default\n    url: {backend.url}\n"
                   "    breaker: {failures: 0}\n")
    server = Promaccel.start(None, ("--config", str(cfg), "--split-interval", "none"), tmp_path)
    try:
        backend.set("html502", first=None)
        before, t0 = backend.calls, time.monotonic()
        for i in range(200):
            _check_error(httpx.post(server.url + "/api/v1/query",
                                    data={"query": f"up + 0 * {i}", "time": str(prom.end_s)}, timeout=30))
        calls, took = backend.calls - before, time.monotonic() - t0
        assert calls <= 200 + 50 + 0.2 * 200 + 10 * took + 2, (calls, took)
        assert calls < 450, calls
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'promaccel_backend_retries_denied_total{backend="default"}' in text
    finally:
        backend.set(None)
        server.stop()


def test_admission_bounds_queries_in_flight_with_a_bounded_wait(prom: Any, backend: faulty.FaultyBackend,
                                                                 tmp_path: Path) -> None:
    """Two queries in flight at most, one waiting at most 0.5 s: of four slow queries at once, two
    are answered exactly and two get 429 with Retry-After and Prometheus's error body; /-/healthy
    is never held back; afterwards queries run again."""
    import concurrent.futures

    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("cache:\n  enabled: false\nlimits:\n  max_queries_in_flight: 2\n  max_queries_per_client: 0\n"
                   "  max_queued: 1\n  queue_timeout: 500ms\n")
    server = Promaccel.start(backend.url, ("--config", str(cfg), "--split-interval", "none"), tmp_path)
    forms = [{"query": f"max(DCGM_FI_DEV_GPU_TEMP) + 0 * {i}", "time": str(prom.end_s - 600)} for i in range(4)]
    try:
        backend.set("stall", first=None)  # 3 s each
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(httpx.post, server.url + "/api/v1/query", data=f, timeout=30) for f in forms]
            assert httpx.get(server.url + "/-/healthy", timeout=2).status_code == 200
            answers = [f.result() for f in futs]
        assert sorted(r.status_code for r in answers) == [200, 200, 429, 429], [r.text for r in answers]
        for r in answers:
            if r.status_code == 429:
                body = r.json()
                assert r.headers["retry-after"] == "1" and body["status"] == "error"
                assert "limits.max_queries_in_flight" in body["error"]
        backend.set(None)
        direct = httpx.post(prom.url + "/api/v1/query", data=forms[0], timeout=30)
        again = httpx.post(server.url + "/api/v1/query", data=forms[0], timeout=30)
        assert again.status_code == 200 and diff_answers(direct.json(), again.json()) == []
    finally:
        backend.set(None)
        server.stop()


def test_admission_order_and_per_client_limit() -> None:
    import asyncio

    from proxy.errors import PromError
    from proxy.pipeline.admission import Admission

    async def scenario() -> list[str]:
        adm = Admission(total=2, per_client=1, max_queued=2, timeout_s=1.0)
        events: list[str] = []
        await adm.acquire("a")
        await adm.acquire("b")

        async def wait(client: str) -> None:
            await adm.acquire(client)
            events.append(f"in {client}")

        w1 = asyncio.create_task(wait("a"))  # a is at its own limit: waits
        w2 = asyncio.create_task(wait("c"))
        await asyncio.sleep(0.01)
        try:
            await adm.acquire("d")  # two already wait: refused at once
        except PromError as exc:
            events.append(f"refused d {exc.status}")
        adm.release("b")  # room for one: c (a is still at its limit) goes first
        await asyncio.sleep(0.01)
        adm.release("a")
        await asyncio.gather(w1, w2)
        return events

    assert asyncio.run(scenario()) == ["refused d 429", "in c", "in a"]


def test_json_access_log_describes_each_query(prom: Any, tmp_path: Path) -> None:
    """`log_format: json`: one JSON object per request, with the query id the client got, the
    query, Grafana's headers, the plan's shape, pieces, cache status, backend calls, bytes and
    duration; a query over `slow_query_log` is logged again at WARNING."""
    import time

    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("log_format: json\nslow_query_log: 1ms\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg), "--log-level", "info", "--split-interval", "1h",
                                        "--shards", "2"), tmp_path)
    try:
        form = {"query": "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.end_s - 7200),
                "end": str(prom.end_s - 600), "step": "60"}
        r = httpx.post(server.url + "/api/v1/query_range", data=form, timeout=60,
                       headers={"X-Dashboard-Uid": "gpu-fleet", "X-Panel-Id": "7", "Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        qid = r.headers["x-promaccel-query-id"]
        time.sleep(0.5)
    finally:
        server.stop()
    records = [orjson.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    access = [x for x in records if x.get("logger") == "promaccel.access" and x.get("query_id") == qid]
    assert len(access) == 1, records[-5:]
    a = access[0]
    assert a["path"] == "/api/v1/query_range" and a["status"] == 200 and a["query"] == form["query"]
    assert a["dashboard_uid"] == "gpu-fleet" and a["panel_id"] == "7"
    assert a["plan_pieces"] == a["pieces"] >= 2 and a["sharded"] is True and a["cache"] in ("MISS", "PARTIAL")
    assert a["backend_calls"] >= 1 and a["bytes"] > 100 and a["duration_ms"] > 0
    slow = [x for x in records if x.get("logger") == "promaccel.slow" and x.get("query_id") == qid]
    assert len(slow) == 1 and slow[0]["level"] == "warning"
    assert "s3cret" not in server.log.read_text()
