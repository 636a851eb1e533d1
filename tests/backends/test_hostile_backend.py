"""A hostile backend cannot exhaust promaccel's memory or stall it (issue 26, items 7 and 10).

A small real HTTP server on 127.0.0.1 (`Hostile`) answers, per path, with what a hostile or
broken backend might send: a body far over `backends[].max_body_bytes` (streamed, chunked, or
announced by its Content-Length), a gzip bomb with `Content-Encoding: gzip` although promaccel
asked for identity, a relay answer served as text/html with a `<script>`, slow answers to count
how many calls promaccel lets through at once. In front of it:

- `Backend` in-process (real HTTP, both transports): the call fails with a 502 naming the
  backend and the cause, the read stops near the cap (the server sees the connection go), no
  retry, nothing inflated;
- a real promaccel (json logs): queries and relays answer with Prometheus's error JSON, RSS
  stays bounded (the peak, VmHWM, reset before and read after), `/-/healthy` answers within
  100 ms throughout; relays are `application/json` with `X-Content-Type-Options: nosniff`,
  run under admission and the answer-bytes budget; the JSON access log redacts query texts.
"""

from __future__ import annotations

import asyncio
import http.client
import statistics
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

import orjson
import pytest

from proxy.backends import Backend
from proxy.config import BackendConfig, BreakerConfig
from proxy.errors import PromError
from tests.rawhttp import Answer, raw_request
from tests.servers import Promaccel, free_port

CAP = 4 * 1024 * 1024  # backends[].max_body_bytes of these tests
HUGE = 64 * 1024 * 1024  # what the hostile backend tries to send
BOMB_INFLATED = 256 * 1024 * 1024  # what its gzip body inflates to
# Growth of promaccel's peak RSS allowed while it is served hostile answers (a few cap-sized
# reads and their buffers); the old code held each whole 64 MiB body, or inflated 256 MiB.
RSS_GROWTH = 48 * 1024 * 1024
HEALTHY_S = 0.1
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
HTML_JSON = b'{"status":"success","data":["<script>alert(document.cookie)</script>"]}'


def _huge_chunks(total: int) -> Iterator[bytes]:
    """`total` bytes of a valid (if silly) Prometheus vector answer, in 64 KiB chunks."""
    head = b'{"status":"success","data":{"resultType":"vector","result":['
    item = b'{"metric":{},"value":[1,"1"]},'
    block = item * (65536 // len(item))
    yield head
    sent = len(head)
    while sent + len(block) < total:
        yield block
        sent += len(block)
    yield b'{"metric":{},"value":[1,"1"]}]}}'


_BOMB: list[bytes] = []


def gzip_bomb() -> bytes:
    """A gzip body (~256 KB) inflating to a valid answer padded with 256 MiB of spaces."""
    if not _BOMB:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        parts = [z.compress(EMPTY_VECTOR)]
        block = b" " * (1 << 20)
        parts += [z.compress(block) for _ in range(BOMB_INFLATED >> 20)]
        parts.append(z.flush())
        _BOMB.append(b"".join(parts))
    return _BOMB[0]


def _series_body(size: int) -> bytes:
    items = [b'{"__name__":"up","instance":"host-%07d:9100","job":"node"}' % i for i in range(size // 56)]
    return b'{"status":"success","data":[' + b",".join(items) + b"]}"


@dataclass
class Hostile:
    """The hostile backend: `modes` maps a path to how it is answered (default: a small,
    sound answer); `calls` counts requests by path, `sent` the body bytes written by path,
    `peak` the most requests of a path in flight at once."""

    url: str
    server: ThreadingHTTPServer
    modes: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls) -> Hostile:
        hostile: Hostile
        big_series = _series_body(2 * 1024 * 1024)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _head(self, status: int, ctype: str, length: int | None, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if length is None:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(length))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()

            def _write(self, path: str, data: bytes, chunked: bool) -> None:
                if chunked:
                    self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
                else:
                    self.wfile.write(data)
                with hostile.lock:
                    hostile.sent[path] = hostile.sent.get(path, 0) + len(data)

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.partition("?")[0]
                mode = hostile.modes.get(path, "ok")
                with hostile.lock:
                    hostile.calls[path] = hostile.calls.get(path, 0) + 1
                    hostile.running[path] = hostile.running.get(path, 0) + 1
                    hostile.peak[path] = max(hostile.peak.get(path, 0), hostile.running[path])
                try:
                    self._mode(path, mode)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    with hostile.lock:
                        hostile.running[path] -= 1

            def _mode(self, path: str, mode: str) -> None:
                if mode == "huge":  # streamed, chunked: no length to refuse it by
                    self._head(200, "application/json", None)
                    for chunk in _huge_chunks(HUGE):
                        self._write(path, chunk, True)
                    self.wfile.write(b"0\r\n\r\n")
                elif mode == "huge_length":  # announced by its Content-Length
                    self._head(200, "application/json", sum(map(len, _huge_chunks(HUGE))))
                    for chunk in _huge_chunks(HUGE):
                        self._write(path, chunk, False)
                elif mode == "gzip":
                    bomb = gzip_bomb()
                    self._head(200, "application/json", len(bomb), {"Content-Encoding": "gzip"})
                    self._write(path, bomb, False)
                elif mode == "html":
                    self._head(200, "text/html; charset=utf-8", len(HTML_JSON))
                    self._write(path, HTML_JSON, False)
                elif mode in ("slow", "big"):
                    time.sleep(0.4)
                    body = big_series if mode == "big" else b'{"status":"success","data":["job"]}'
                    self._head(200, "application/json", len(body))
                    self._write(path, body, False)
                elif mode == "identity":
                    self._head(200, "application/json", len(EMPTY_VECTOR), {"Content-Encoding": "identity"})
                    self._write(path, EMPTY_VECTOR, False)
                elif path.startswith("/api/v1/query"):
                    self._head(200, "application/json", len(EMPTY_VECTOR))
                    self._write(path, EMPTY_VECTOR, False)
                elif path.startswith("/api/v1/"):
                    body = b'{"status":"success","data":[]}'
                    self._head(200, "application/json", len(body))
                    self._write(path, body, False)
                else:
                    self._head(404, "text/plain", 9)
                    self._write(path, b"not found", False)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        port = free_port()
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        hostile = cls(f"http://127.0.0.1:{port}", server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return hostile

    def reset(self) -> None:
        with self.lock:
            self.modes.clear()
            self.calls.clear()
            self.sent.clear()
            self.peak.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    h = Hostile.start()
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(autouse=True)
def _fresh(hostile: Hostile) -> None:
    hostile.reset()


# --- the transports, in-process (real HTTP to the hostile backend) -------------------------------


Transport = Literal["aiohttp", "httpx"]


def _call(hostile: Hostile, transport: Transport, path: str = "/api/v1/query") -> PromError | bytes:
    async def go() -> PromError | bytes:
        b = Backend(BackendConfig(name="hostile", url=hostile.url, transport=transport, max_body_bytes=CAP,
                                  retries=3, retry_ratio=100, breaker=BreakerConfig(failures=0)))
        try:
            reply = await b.request("GET", path, params=[("query", "up")], endpoint="query", timeout_s=20)
            return bytes(reply.body)
        except PromError as exc:
            return exc
        finally:
            await b.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("mode", ["huge", "huge_length"])
def test_a_body_over_the_cap_stops_the_read(hostile: Hostile, transport: Transport, mode: str) -> None:
    hostile.modes["/api/v1/query"] = mode
    out = _call(hostile, transport)
    assert isinstance(out, PromError), out[:200] if isinstance(out, bytes) else out
    assert out.kind == "unavailable" and out.status == 502
    assert "'hostile'" in out.message and "max_body_bytes" in out.message and str(CAP) in out.message, out.message
    assert hostile.calls["/api/v1/query"] == 1  # the same body would come again: not retried
    # The read stopped near the cap (what the sockets' buffers took is all the server got out).
    time.sleep(0.2)
    assert hostile.sent["/api/v1/query"] < HUGE // 2, hostile.sent


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_an_unasked_content_encoding_is_refused_not_inflated(hostile: Hostile, transport: Transport) -> None:
    hostile.modes["/api/v1/query"] = "gzip"
    gzip_bomb()  # made (once) before the clock starts
    t0 = time.monotonic()
    out = _call(hostile, transport)
    assert isinstance(out, PromError), len(out) if isinstance(out, bytes) else out
    assert out.status == 502 and "Content-Encoding gzip that was not asked for" in out.message, out.message
    assert "'hostile'" in out.message
    assert hostile.calls["/api/v1/query"] == 1
    assert time.monotonic() - t0 < 2.0  # nothing inflated


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_sound_answers_under_the_cap_still_pass(hostile: Hostile, transport: Transport) -> None:
    assert _call(hostile, transport) == EMPTY_VECTOR
    hostile.modes["/api/v1/query"] = "identity"  # identity is what was asked for
    assert _call(hostile, transport) == EMPTY_VECTOR
    hostile.modes["/api/v1/series"] = "big"  # 2 MiB, under the 4 MiB cap
    body = _call(hostile, transport, "/api/v1/series")
    assert isinstance(body, bytes) and len(body) > 2_000_000 and orjson.loads(body)["status"] == "success"


# --- a real promaccel -----------------------------------------------------------------------------


def _config(hostile: Hostile) -> str:
    return f"""\
log_format: json
backends:
  - name: hostile
    url: {hostile.url}
    max_body_bytes: {CAP}
    breaker: {{failures: 0}}
limits:
  max_queries_in_flight: 2
  max_inflight_answer_bytes: {4 * 1024 * 1024}
"""


@pytest.fixture(scope="module")
def proxy(hostile: Hostile, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    work = tmp_path_factory.mktemp("hostile")
    config = work / "hostile.yaml"
    config.write_text(_config(hostile))
    p = Promaccel.start(None, ("--split-interval", "none", "--shards", "1", "--log-level", "info"), work,
                        config=config)
    try:
        yield p
    finally:
        p.stop()


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


class Watch:
    """While open: `/-/healthy` asked every 20 ms on one keep-alive connection (the slowest
    answer kept) and promaccel's RSS sampled; the peak RSS reset at the start (clear_refs)."""

    def __init__(self, p: Promaccel) -> None:
        self.p = p
        self.pid = p.proc.pid
        self.stop = threading.Event()
        self.slowest = 0.0
        self.times: list[float] = []
        self.failures: list[str] = []
        self.rss_peak = 0

    def __enter__(self) -> Watch:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            pass  # then the sampled peak alone
        self.rss_before = _status(self.pid)["VmRSS"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        host, port = self.p.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/-/healthy")
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    self.failures.append(f"HTTP {resp.status}")
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(repr(exc))
                conn.close()
            self.times.append(time.perf_counter() - t0)
            self.slowest = max(self.slowest, self.times[-1])
            self.rss_peak = max(self.rss_peak, _status(self.pid)["VmRSS"])
            time.sleep(0.02)
        conn.close()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.rss_peak = max(self.rss_peak, _status(self.pid)["VmHWM"])

    def check(self) -> None:
        assert not self.failures, self.failures[:5]
        # Within HEALTHY_S: the median far below, at most one answer in 50 over it (a scheduler
        # hiccup of a shared 2-core CI box), none a stall (the findings held it for seconds).
        late = [t for t in self.times if t >= HEALTHY_S]
        assert self.times and statistics.median(self.times) < HEALTHY_S / 2, sorted(self.times)[-5:]
        assert len(late) <= max(1, len(self.times) // 50), f"/-/healthy over {HEALTHY_S * 1000:.0f} ms: {late}"
        assert self.slowest < 3 * HEALTHY_S, f"/-/healthy took {self.slowest * 1000:.0f} ms"
        growth = self.rss_peak - self.rss_before
        assert growth < RSS_GROWTH, f"RSS grew by {growth / 2**20:.0f} MiB"


def _prom_error(ans: Answer, *needles: str) -> dict[str, object]:
    assert 500 <= ans.status < 600, (ans.status, ans.body[:300])
    body = orjson.loads(ans.body)
    assert body["status"] == "error" and body["errorType"] == "unavailable", body
    for n in needles:
        assert n in str(body["error"]), body
    return body  # type: ignore[no-any-return]


def test_promaccel_refuses_a_body_over_the_cap(proxy: Promaccel, hostile: Hostile) -> None:
    for path in ("/api/v1/query", "/api/v1/series", "/api/v1/labels", "/api/v1/label/job/values"):
        hostile.modes[path] = "huge"
    with Watch(proxy) as watch:
        for i in range(3):
            _prom_error(raw_request(proxy.url, f"/api/v1/query?query=up%2B{i}&time=1000"), "max_body_bytes",
                        "'hostile'")
            for path in ("/api/v1/series?match[]=up", "/api/v1/labels", "/api/v1/label/job/values"):
                _prom_error(raw_request(proxy.url, path), "max_body_bytes", "'hostile'")
    watch.check()
    time.sleep(0.2)
    # Each read stopped near the cap: what the server got out is the cap and the sockets' buffers.
    assert all(n / hostile.calls[p] < HUGE // 3 for p, n in hostile.sent.items()), (hostile.sent, hostile.calls)


def test_promaccel_never_inflates_a_gzip_bomb(proxy: Promaccel, hostile: Hostile) -> None:
    for path in ("/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"):
        hostile.modes[path] = "gzip"
    gzip_bomb()  # made before watching: the test's own CPU is not promaccel's
    with Watch(proxy) as watch:
        for i in range(3):
            _prom_error(raw_request(proxy.url, f"/api/v1/query?query=up%2B{i + 10}&time=1000"),
                        "Content-Encoding gzip that was not asked for")
            _prom_error(raw_request(proxy.url, f"/api/v1/query_range?query=up%2B{i}&start=0&end=600&step=60"),
                        "Content-Encoding gzip that was not asked for")
            _prom_error(raw_request(proxy.url, "/api/v1/series?match[]=up", "POST",
                                    body=b"match%5B%5D=up"), "Content-Encoding gzip that was not asked for")
            _prom_error(raw_request(proxy.url, "/api/v1/labels"), "Content-Encoding gzip that was not asked for")
    watch.check()


RELAYS = ["/api/v1/series?match[]=up", "/api/v1/labels", "/api/v1/label/job/values", "/api/v1/metadata",
          "/api/v1/rules", "/api/v1/targets", "/api/v1/status/config", "/api/v1/query_exemplars?query=up"]


def test_relays_are_json_and_never_sniffed(proxy: Promaccel, hostile: Hostile) -> None:
    for target in RELAYS:
        hostile.modes[target.partition("?")[0]] = "html"
    for target in RELAYS:
        ans = raw_request(proxy.url, target)
        assert ans.status == 200, (target, ans.status, ans.body[:200])
        assert ans.headers["content-type"] == "application/json", (target, ans.headers)
        assert ans.headers["x-content-type-options"] == "nosniff", (target, ans.headers)
    # Every API answer says nosniff, promaccel's own and its errors included.
    for target in ("/api/v1/query?query=up&time=1000", "/api/v1/query?query=up(", "/-/healthy", "/nope"):
        assert raw_request(proxy.url, target).headers.get("x-content-type-options") == "nosniff", target


def _together(proxy: Promaccel, target: str, n: int) -> list[Answer]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: raw_request(proxy.url, target, timeout=30), range(n)))


def test_relays_wait_for_admission(proxy: Promaccel, hostile: Hostile) -> None:
    hostile.modes["/api/v1/labels"] = "slow"
    answers = _together(proxy, "/api/v1/labels", 8)
    assert all(a.status == 200 for a in answers), [(a.status, a.body[:100]) for a in answers]
    assert hostile.calls["/api/v1/labels"] == 8
    assert hostile.peak["/api/v1/labels"] <= 2, hostile.peak  # limits.max_queries_in_flight


def test_relays_hold_the_answer_bytes_budget(proxy: Promaccel, hostile: Hostile) -> None:
    hostile.modes["/api/v1/series"] = "big"  # 2 MiB each; the budget is 4 MiB
    first = raw_request(proxy.url, "/api/v1/series?match[]=up")  # the endpoint's size is learnt
    assert first.status == 200 and len(first.body) > 2_000_000
    with Watch(proxy) as watch:
        answers = _together(proxy, "/api/v1/series?match[]=up", 6)
    assert all(a.status == 200 and a.body == first.body for a in answers), [a.status for a in answers]
    assert hostile.peak["/api/v1/series"] == 1, hostile.peak  # one 2 MiB answer (x3 held) at a time
    watch.check()


def test_the_json_log_redacts_query_texts(proxy: Promaccel, hostile: Hostile) -> None:
    secret = "hunter2-0f6c1d"
    ans = raw_request(proxy.url, f'/api/v1/query?query=up{{password="{secret}"}}&time=1000'.replace('"', "%22"))
    assert ans.status == 200, ans.body[:300]
    deadline = time.monotonic() + 5
    lines: list[dict[str, object]] = []
    while time.monotonic() < deadline and not lines:
        text = proxy.log.read_text(errors="replace")
        lines = [orjson.loads(line) for line in text.splitlines()
                 if line.startswith("{") and '"query"' in line and "password" in line]
        time.sleep(0.1)
    assert lines, "no access-log line with the query"
    assert secret not in proxy.log.read_text(errors="replace")
    assert all("<redacted>" in str(line["query"]) for line in lines), lines
