"""Server limits (proxy/api/server_limits.py, `listen:`), against a real promaccel served by uvicorn on a
loopback port with 1 s deadlines: slow or unfinished headers, slow bodies, idle connections
and oversized headers are cut off; a client that leaves mid-body costs no 500 and no traceback;
more running requests than max_concurrency get a Prometheus-style 503 (idle sockets take no
slot, health is always answered); idle sockets close at first_byte_timeout and over
max_connections."""

from __future__ import annotations

import concurrent.futures
import contextlib
import resource
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.rawhttp import connect, raw_request, read_until_closed
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

LIMITS = """\
listen:
  header_timeout: 1s
  body_timeout: 1s
  keep_alive_timeout: 1s
  max_header_bytes: 16384
"""
# Every cut-off must come well before this (the deadlines are 1 s; the machine may be busy).
CUT_OFF_S = 4.0
HEAD = b"POST /api/v1/query HTTP/1.1\r\nHost: promaccel\r\nContent-Type: application/x-www-form-urlencoded\r\n"


@pytest.fixture(scope="module")
def limited(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    work = tmp_path_factory.mktemp("limits")
    config = work / "limits.yaml"
    config.write_text(LIMITS)
    p = Promaccel.start(prom.url, ("--split-interval", "none", "--shards", "1"), work, config=config)
    try:
        yield p
    finally:
        p.stop()


def _status_and_body(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(body)


def _log_is_clean(p: Promaccel) -> None:
    text = p.log.read_text(errors="replace")
    assert "Traceback" not in text and "Exception in ASGI" not in text and "internal error" not in text, text[-3000:]


def _requests(p: Promaccel, code: str) -> float:
    """promaccel's count of /api/v1/query requests answered with `code`."""
    metrics = raw_request(p.url, "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("promaccel_http_requests_total{") and 'endpoint="/api/v1/query"' in line
               and f'code="{code}"' in line)


def test_normal_requests_still_work(limited: Promaccel) -> None:
    ans = raw_request(limited.url, "/api/v1/query?query=vector(1)&time=1000")
    assert ans.status == 200 and orjson.loads(ans.body)["status"] == "success"
    # A body sent in pieces, all within body_timeout.
    with connect(limited.url) as sock:
        body = b"query=vector(2)&time=1000"
        sock.sendall(HEAD + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for i in range(0, len(body), 9):
            time.sleep(0.1)
            sock.sendall(body[i:i + 9])
        raw, _ = read_until_closed(sock, CUT_OFF_S)
    status, answer = _status_and_body(raw)
    assert status == 200 and answer["data"]["result"][0]["value"][1] == "2", raw
    # Headers just under the limit are fine.
    ans = raw_request(limited.url, "/api/v1/query?query=vector(1)&time=1000", headers={"X-Pad": "p" * 15000})
    assert ans.status == 200


def test_unfinished_headers_get_408_and_close(limited: Promaccel) -> None:
    with connect(limited.url) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /api/v1/query?query=up HTTP/1.1\r\nHost: promaccel\r\n")
        raw, _ = read_until_closed(sock, CUT_OFF_S + 2)
        took = time.monotonic() - t0
    assert 0.8 <= took < CUT_OFF_S, took
    status, body = _status_and_body(raw)
    assert status == 408 and body["status"] == "error" and body["errorType"] == "timeout", raw
    assert "listen.header_timeout" in body["error"]


def test_dribbled_headers_are_cut_off_at_the_deadline(limited: Promaccel) -> None:
    """The deadline is for the whole head, not between bytes: a byte every 0.1 s is cut off."""
    request = b"GET /api/v1/query?query=up HTTP/1.1\r\nHost: promaccel\r\nX-Slow: " + b"s" * 100
    with connect(limited.url) as sock:
        t0 = time.monotonic()
        raw = b""
        for i in range(len(request)):  # 100+ bytes at 0.1 s: 10+ s unless cut off
            try:
                sock.send(request[i:i + 1])
            except OSError:
                break
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                raw, _ = read_until_closed(sock, CUT_OFF_S)
                break
        took = time.monotonic() - t0
    assert took < CUT_OFF_S, took
    assert raw.startswith(b"HTTP/1.1 408 "), raw


def test_slow_body_gets_408_and_close(limited: Promaccel) -> None:
    before = _requests(limited, "499")
    with connect(limited.url) as sock:
        sock.sendall(HEAD + b"Content-Length: 1000000\r\n\r\nquery=up&x")  # 10 of 1,000,000 bytes
        t0 = time.monotonic()
        raw, _ = read_until_closed(sock, CUT_OFF_S + 2)
        took = time.monotonic() - t0
    assert 0.8 <= took < CUT_OFF_S, took
    status, body = _status_and_body(raw)
    assert status == 408 and body["errorType"] == "timeout" and "listen.body_timeout" in body["error"], raw
    _wait_for(lambda: _requests(limited, "499") > before)  # the app saw the request end
    _log_is_clean(limited)


def test_idle_connection_is_closed(limited: Promaccel) -> None:
    with connect(limited.url) as sock:
        raw, took = read_until_closed(sock, CUT_OFF_S + 2)
    assert raw == b"" and took < CUT_OFF_S, (raw, took)


def test_idle_keep_alive_connection_is_closed(limited: Promaccel) -> None:
    with connect(limited.url) as sock:
        for _ in range(2):  # kept alive between requests
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: promaccel\r\n\r\n")
            got = b""
            while b"Healthy" not in got:
                chunk = sock.recv(4096)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ")
        raw, took = read_until_closed(sock, CUT_OFF_S + 2)
    assert raw == b"" and 0.5 <= took < CUT_OFF_S, took


def test_oversized_header_gets_431_and_close(limited: Promaccel) -> None:
    ans = raw_request(limited.url, "/api/v1/query?query=up", headers={"X-Big": "b" * 20000})
    assert ans.status == 431, ans
    body = orjson.loads(ans.body)
    assert body["status"] == "error" and body["errorType"] == "bad_data" and "listen.max_header_bytes" in body["error"]
    # Many small headers count too.
    ans = raw_request(limited.url, "/api/v1/query?query=up", headers={f"X-H{i}": "v" * 100 for i in range(200)})
    assert ans.status == 431
    # A 64 MB header is not read to its end: the server answers and closes early.
    with connect(limited.url) as sock:
        sock.sendall(b"GET /api/v1/query?query=up HTTP/1.1\r\nHost: promaccel\r\nX-Huge: ")
        sent, chunk = 0, b"h" * 65536
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset or broken pipe: closed by the server
            pass
        raw, _ = read_until_closed(sock, CUT_OFF_S)
    assert sent < 64 * 1024 * 1024, sent
    assert raw == b"" or raw.startswith(b"HTTP/1.1 431 "), raw[:200]
    _log_is_clean(limited)


def test_disconnect_mid_body_is_no_500_and_no_traceback(limited: Promaccel) -> None:
    before = _requests(limited, "499")
    for _ in range(3):
        with connect(limited.url) as sock:
            sock.sendall(HEAD + b"Content-Length: 1000\r\n\r\nquery=up&")
            time.sleep(0.1)
        # closed mid-body
    _wait_for(lambda: _requests(limited, "499") >= before + 3)
    assert _requests(limited, "500") == 0
    _log_is_clean(limited)


def test_concurrency_limit_counts_running_requests_not_sockets(prom: Any, backend: Any,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """issue 26: idle sockets filled max_concurrency. Now 10 idle connections take no slot;
    two requests running (the backend stalls 3 s) fill max_concurrency: 2, and a third gets
    Prometheus-style 503 JSON, while /-/healthy and /-/ready are still answered."""
    work = tmp_path_factory.mktemp("concurrency")
    config = work / "concurrency.yaml"
    config.write_text("listen:\n  max_concurrency: 2\n")
    p = Promaccel.start(backend.url, ("--split-interval", "none", "--shards", "1"), work, config=config)
    idle = []
    try:
        backend.set(None)
        idle = [connect(p.url) for _ in range(10)]
        time.sleep(0.3)  # all accepted
        assert raw_request(p.url, "/api/v1/query?query=vector(1)&time=1000").status == 200
        backend.set("stall", first=None)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = [pool.submit(raw_request, p.url, f"/api/v1/query?query=vector({i})&time=1000")
                       for i in (2, 3)]
            time.sleep(0.8)  # both on their way to the backend
            ans = raw_request(p.url, "/api/v1/query?query=vector(4)&time=1000")
            assert ans.status == 503, ans
            body = orjson.loads(ans.body)
            assert body["errorType"] == "unavailable" and "listen.max_concurrency" in body["error"]
            t0 = time.monotonic()
            healthy = raw_request(p.url, "/-/healthy")
            assert healthy.status == 200 and time.monotonic() - t0 < 0.5, healthy
            ready = raw_request(p.url, "/-/ready")  # asks the (stalling) backend: answered either way
            assert b"max_concurrency" not in ready.body, ready
            assert [f.result().status for f in running] == [200, 200]
        backend.set(None)
        assert raw_request(p.url, "/api/v1/query?query=vector(5)&time=1000").status == 200
    finally:
        backend.set(None)
        for sock in idle:
            sock.close()
        p.stop()


@contextlib.contextmanager
def _open_files(at_least: int) -> Iterator[None]:
    """This test process's soft limit of open files raised to `at_least` (within the hard
    limit), restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = at_least if hard == resource.RLIM_INFINITY else min(at_least, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False  # still open, nothing sent
    except ConnectionResetError:
        return True


def test_idle_sockets_neither_block_requests_nor_stay(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """issue 26: 1,030 idle TCP connections filled max_concurrency (1,024) and every request,
    /-/healthy included, got 503 for header_timeout (30 s). With the default limits, 1,100
    connections that never send a byte: /-/healthy answers within 100 ms, a query answers 200,
    and the idle sockets are closed at first_byte_timeout (2 s here), not header_timeout."""
    work = tmp_path_factory.mktemp("idle-sockets")
    config = work / "idle.yaml"
    config.write_text("listen:\n  first_byte_timeout: 2s\n")
    p = Promaccel.start(prom.url, ("--split-interval", "none", "--shards", "1"), work, config=config)
    idle: list[socket.socket] = []
    try:
        with _open_files(4096):
            t_open = time.monotonic()
            idle = [connect(p.url) for _ in range(1100)]
            time.sleep(0.3)  # accepted
            took = []
            for _ in range(5):
                t0 = time.monotonic()
                ans = raw_request(p.url, "/-/healthy")
                took.append(time.monotonic() - t0)
                assert ans.status == 200, ans
            assert sorted(took)[2] < 0.1, took
            ans = raw_request(p.url, "/api/v1/query?query=vector(1)&time=1000")
            assert ans.status == 200 and orjson.loads(ans.body)["status"] == "success", ans
            assert not any(_closed_by_server(s) for s in idle[-100:])  # younger than 2 s: open
            while time.monotonic() - t_open < 2.0 + CUT_OFF_S and not all(_closed_by_server(s) for s in idle):
                time.sleep(0.2)
            assert all(_closed_by_server(s) for s in idle), sum(not _closed_by_server(s) for s in idle)
            assert time.monotonic() - t_open < 2.0 + CUT_OFF_S
            assert raw_request(p.url, "/-/healthy").status == 200
    finally:
        for sock in idle:
            sock.close()
        p.stop()


def test_socket_cap_closes_the_connection_idle_longest(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """listen.max_connections: 20. Thirty idle connections (the first-byte timeout is long):
    each one over the cap closes the one idle longest, and a health probe and a query still
    get in (each closing one more idle connection); the youngest idle ones stay open."""
    work = tmp_path_factory.mktemp("socket-cap")
    config = work / "cap.yaml"
    config.write_text("listen:\n  max_connections: 20\n  first_byte_timeout: 60s\n  header_timeout: 60s\n")
    p = Promaccel.start(prom.url, ("--split-interval", "none", "--shards", "1"), work, config=config)
    idle: list[socket.socket] = []
    try:
        for _ in range(30):
            idle.append(connect(p.url))
            time.sleep(0.02)  # accepted in this order
        time.sleep(0.3)
        assert raw_request(p.url, "/-/healthy").status == 200
        assert raw_request(p.url, "/api/v1/query?query=vector(1)&time=1000").status == 200
        time.sleep(0.3)
        closed = [_closed_by_server(s) for s in idle]
        assert all(closed[:10]) and not any(closed[-15:]), closed
        assert "listen.max_connections" in p.log.read_text(errors="replace")
    finally:
        for sock in idle:
            sock.close()
        p.stop()


def _wait_for(condition: Any, limit_s: float = 10) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
