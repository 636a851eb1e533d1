"""The harness's HTTP client, a Grafana-like Prometheus data source, and answer comparison.

Used by the bench's scenarios (loadtests/scenarios/) and the soak (loadtests/soak.py): POST
form bodies of `loadtests.dashboard.PanelRequest`s over pooled keep-alive connections, a hard
cap on requests per run (`Budget`), one user's dashboard refresh behind the browser's limit of
requests in flight (`user_refresh`), and the comparison of a proxied answer with the direct one
(`compare_answers`, `Tally`): a speed-up of wrong answers is not a speed-up.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from .compare import diff_answers
from .dashboard import PanelRequest
from .services import assert_loopback

GRAFANA_CONCURRENCY = 6  # requests in flight per user (browser HTTP/1.1 limit per host)


class BudgetExhausted(RuntimeError):
    pass


class Budget:
    """A hard cap on requests sent in the whole run."""

    def __init__(self, max_requests: int) -> None:
        self.max_requests = max_requests
        self.sent = 0

    def take(self, n: int = 1) -> None:
        if self.sent + n > self.max_requests:
            raise BudgetExhausted(f"request budget of {self.max_requests} exhausted")
        self.sent += n


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() - self.t0 >= self.seconds


@dataclass
class Answer:
    status: int
    body: bytes
    latency_s: float
    pieces: str | None = None
    error: str | None = None
    retries: int = 0
    # Bytes on the wire (gzip-compressed when it was asked for and given); only measured by a
    # `Client(wire=True)`, None otherwise.
    wire_bytes: int | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None or self.status >= 500


class Client:
    """POSTs PanelRequests to one base URL over a pooled keep-alive session (aiohttp: the
    load generator must cost less than what it measures).

    `gzip`: ask for gzip as Grafana does (Accept-Encoding: gzip), else for the identity
    encoding. `wire`: take the body as sent (no decompression while reading) and record its
    size; the latency then ends with the last byte received, and the body is decompressed
    after the clock stopped (the default client decompresses while reading, inside the time)."""

    def __init__(self, base_url: str, budget: Budget, timeout_s: float, *, gzip: bool = True,
                 wire: bool = False) -> None:
        assert_loopback(base_url)
        self.base_url = base_url.rstrip("/")
        self.budget = budget
        self.timeout_s = timeout_s
        self.gzip = gzip
        self.wire = wire
        self.done = 0
        self._session: Any = None

    async def __aenter__(self) -> "Client":
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            auto_decompress=not self.wire,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def send(self, req: PanelRequest) -> Answer:
        import aiohttp

        self.budget.take()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept-Encoding": "gzip" if self.gzip else "identity",
            "User-Agent": "Grafana/11 (promaccel bench)",
            "X-Panel-Id": str(req.panel_id or ""),
        }
        t0 = time.perf_counter()
        data = req.body().encode()
        retries = 0
        try:
            while True:
                try:
                    async with self._session.post(self.base_url + req.path, data=data, headers=headers) as r:
                        body = await r.read()
                        latency = time.perf_counter() - t0
                        wire = None
                        if self.wire:
                            wire = len(body)
                            if r.headers.get("Content-Encoding", "").lower() == "gzip":
                                body = gzip.decompress(body)  # a stream of several members too
                        return Answer(r.status, body, latency, r.headers.get("X-Promaccel-Pieces"),
                                      retries=retries, wire_bytes=wire)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    # A pooled keep-alive connection the server closed meanwhile (an idle
                    # timeout race). Go's http.Transport (Grafana) resends when nothing was
                    # written on the reused connection; queries are read-only, so resend once
                    # here in any case, and count it: the report shows how often it happened.
                    if retries or not _stale_connection(exc):
                        raise
                    retries += 1
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return Answer(0, b"", time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}", retries)
        finally:
            self.done += 1


def _stale_connection(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "ServerDisconnectedError" or "Can not write request body" in text \
        or "Connection reset" in text or "Broken pipe" in text


@dataclass
class RefreshRun:
    wall_s: float
    answers: list[Answer]


async def user_refresh(client: Client, reqs: Sequence[PanelRequest], limit: int = GRAFANA_CONCURRENCY) -> RefreshRun:
    """One user's dashboard refresh: every panel at once, at most `limit` in flight."""
    sem = asyncio.Semaphore(limit)

    async def one(r: PanelRequest) -> Answer:
        async with sem:
            return await client.send(r)

    t0 = time.perf_counter()
    answers = await asyncio.gather(*(one(r) for r in reqs))
    return RefreshRun(time.perf_counter() - t0, list(answers))


def compare_answers(direct: Answer, proxied: Answer) -> list[str]:
    """Differences between the direct and the proxied answer ([] when equivalent)."""
    if direct.status == proxied.status and direct.body == proxied.body:
        return []
    import orjson

    enabled = gc.isenabled()
    gc.disable()  # millions of small lists: the collector would dominate (DESIGN.md)
    try:
        try:
            d, p = orjson.loads(direct.body), orjson.loads(proxied.body)
        except orjson.JSONDecodeError:
            return [f"HTTP {direct.status} vs {proxied.status}; a body is not JSON: {proxied.body[:120]!r}"]
        problems = diff_answers(d, p)
    finally:
        if enabled:
            gc.enable()
    if direct.status != proxied.status:
        problems.insert(0, f"HTTP status {direct.status} != {proxied.status}")
    return problems


@dataclass
class Tally:
    """Comparisons and failures of one scenario. A failure is no HTTP answer or a 5xx; direct
    failures (Prometheus overloaded or timing out) are counted apart from promaccel's."""

    compared: int = 0
    mismatches: int = 0
    failures: int = 0  # promaccel's
    direct_failures: int = 0
    retries: dict[str, int] = field(default_factory=lambda: {"direct": 0, "promaccel": 0})
    mismatch_examples: list[str] = field(default_factory=list)
    failure_examples: list[str] = field(default_factory=list)

    def note(self, label: str, mode: str, a: Answer) -> bool:
        """Records one answer's retries and failure; True when it failed."""
        self.retries[mode] += a.retries
        if not a.failed:
            return False
        if mode == "direct":
            self.direct_failures += 1
        else:
            self.failures += 1
        if len(self.failure_examples) < 10:
            self.failure_examples.append(f"{mode} {label}: HTTP {a.status} {a.error or a.body[:200]!r}")
        return True

    def check(self, label: str, direct: Answer, proxied: Answer, *, direct_noted: bool = False) -> bool:
        """Compares one pair; returns True when they are equivalent."""
        bad = direct.failed if direct_noted else self.note(label, "direct", direct)
        bad = self.note(label, "promaccel", proxied) or bad
        if bad:
            return False
        self.compared += 1
        problems = compare_answers(direct, proxied)
        if problems:
            self.mismatches += 1
            if len(self.mismatch_examples) < 10:
                self.mismatch_examples.append(f"{label}: " + "; ".join(problems[:3]))
            return False
        return True
