"""proxy/api/app.py: `create_app` puts the routes, handlers and middleware together.

Every path promaccel does not serve is Prometheus's 404 JSON, whatever the method; a bug in a
handler is a 500 with Prometheus's error JSON naming only the exception's type (and logged),
never a traceback to the client; a client gone mid-body is a 499; buildinfo is promaccel's own
route, not the status relay's; answers of 1 KiB or more are gzipped for clients that ask; the
access log middleware is outermost (every answer, a 404 or a 500 too, has a query id and is
counted on /metrics); the app starts and stops its pools with its lifespan.

In process (the app over httpx's ASGI transport) in front of a recording fake backend."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.types import Message

from proxy.api.app import create_app
from proxy.config import build_config
from tests.recording import Recorder, recording_backend

T = 1_700_000_000


@pytest.fixture(scope="module")
def backend() -> Iterator[Recorder]:
    with recording_backend(None) as rec:
        yield rec


def _app(backend: Recorder, **extra: Any) -> FastAPI:
    return create_app(build_config({"backends": [{"name": "local", "url": backend.url, "retries": 0}], **extra}))


def _serve(app: FastAPI, body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://p", timeout=30) as c:
                return await body(c)
    return asyncio.run(run())


UNKNOWN = ["/", "/api/v2/query", "/api/v1/querys", "/federate", "/debug/pprof/cmdline",
           "/api/v1/admin/tsdb/delete_series"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


def test_unknown_paths_are_prometheus_404s_whatever_the_method(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[tuple[str, httpx.Response]]:
        return [(path, await c.request(method, path)) for path in UNKNOWN for method in METHODS]

    backend.clear()
    answers = _serve(_app(backend), body)
    assert len(answers) == len(UNKNOWN) * len(METHODS)
    for path, r in answers:
        assert r.status_code == 404 and r.headers["content-type"] == "application/json", (path, r.request.method)
        assert r.json() == {"status": "error", "errorType": "not_found",
                            "error": f"unknown path {path!r}: promaccel serves the Prometheus HTTP API under /api/v1/"}
        assert re.fullmatch(r"[0-9a-f]{16}", r.headers["x-promaccel-query-id"])
    assert [s.path for s in backend.snapshot()] == []  # nothing unknown is forwarded


def test_a_handlers_bug_is_a_500_naming_only_its_type(backend: Recorder) -> None:
    app = _app(backend)

    async def broken(*args: Any, **kw: Any) -> Any:
        raise KeyError("internal detail /etc/secret")

    app.state.executor.explain = broken

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        return await c.get("/api/v1/explain", params={"query": "up", "time": str(T)}), await c.get("/metrics")

    # A handler of its own on promaccel's logger: caplog sees only what propagates to the root,
    # which another test of the same process may have configured otherwise (the CLI's logging).
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = seen.append  # type: ignore[method-assign]
    logger = logging.getLogger("promaccel")
    logger.addHandler(handler)
    try:
        r, metrics = _serve(app, body)
    finally:
        logger.removeHandler(handler)
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json() == {"status": "error", "errorType": "internal", "error": "internal error in promaccel: KeyError"}
    assert "secret" not in r.text and "Traceback" not in r.text
    # Its traceback: exc_info, or the redacted text the process's record factory made of it
    # (proxy/backends/redaction.py, installed once a server has started in this process).
    assert any("internal error on /api/v1/explain" in rec.getMessage()
               and (rec.exc_info or "KeyError" in (rec.exc_text or "")) for rec in seen)
    assert 'promaccel_http_requests_total{code="500",endpoint="/api/v1/explain"}' in metrics.text


def test_a_client_gone_mid_body_is_a_499(backend: Recorder) -> None:
    app = _app(backend)
    messages: list[Message] = [{"type": "http.request", "body": b"query=su", "more_body": True},
                               {"type": "http.disconnect"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/api/v1/query", "raw_path": b"/api/v1/query", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/x-www-form-urlencoded"), (b"host", b"p")],
             "client": ("127.0.0.1", 5000), "server": ("p", 80)}

    async def run() -> None:
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)

    asyncio.run(run())
    assert sent[0]["status"] == 499
    assert orjson.loads(b"".join(m.get("body", b"") for m in sent[1:]))["errorType"] == "canceled"


def test_buildinfo_is_promaccels_route_and_status_pages_are_relayed(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        return await c.get("/api/v1/status/buildinfo"), await c.get("/api/v1/status/flags")

    backend.clear()
    info, flags = _serve(_app(backend), body)
    assert "promaccel" in info.json()["data"]  # promaccel's handler, not the relay
    assert flags.status_code == 200 and "/api/v1/status/flags" in [s.path for s in backend.snapshot()]


def test_large_answers_are_gzipped_for_clients_that_ask(backend: Recorder) -> None:
    big = "up{" + ",".join(f'l{i}="{"v" * 20}"' for i in range(60)) + "}"  # explain echoes it: > 1 KiB

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = []
        for accept in ("gzip", "identity"):
            r = await c.get("/api/v1/explain", params={"query": big, "time": str(T)},
                            headers={"Accept-Encoding": accept})
            out.append(r)
        out.append(await c.get("/nope", headers={"Accept-Encoding": "gzip"}))  # small: as it is
        return out

    zipped, plain, small = _serve(_app(backend), body)
    assert zipped.status_code == plain.status_code == 200
    assert zipped.headers.get("content-encoding") == "gzip" and "content-encoding" not in plain.headers
    assert zipped.json() == plain.json() and len(plain.content) >= 1024
    assert zipped.num_bytes_downloaded < plain.num_bytes_downloaded
    assert "content-encoding" not in small.headers


def test_every_request_is_counted_on_metrics(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> str:
        await c.get("/api/v1/query", params={"query": "up", "time": str(T)})
        await c.get("/api/v1/query", params={"time": str(T)})  # 400
        await c.get("/made/up")
        return (await c.get("/metrics")).text

    def count(text: str, endpoint: str, code: str) -> float:
        m = re.search(rf'promaccel_http_requests_total{{code="{code}",endpoint="{re.escape(endpoint)}"}} (\S+)', text)
        return float(m.group(1)) if m else 0.0

    app = _app(backend)
    before = _serve(app, lambda c: c.get("/metrics")).text
    after = _serve(_app(backend), body)
    assert count(after, "/api/v1/query", "200") == count(before, "/api/v1/query", "200") + 1
    assert count(after, "/api/v1/query", "400") == count(before, "/api/v1/query", "400") + 1
    assert count(after, "other", "404") == count(before, "other", "404") + 1


def test_the_lifespan_starts_and_stops_its_pools(backend: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each app starts its query service when its lifespan begins, and closes it and every
    backend's pool when it ends (a second app in the same process is as good as the first)."""
    from proxy.backends import Backend
    from proxy.pipeline import QueryService

    events: list[str] = []
    for cls, name, what in ((QueryService, "start", "start"), (QueryService, "aclose", "close"),
                            (Backend, "aclose", "backend closed")):
        real = getattr(cls, name)

        def wrapped(self: Any, *a: Any, _real: Any = real, _what: str = what, **kw: Any) -> Any:
            events.append(_what)
            return _real(self, *a, **kw)

        monkeypatch.setattr(cls, name, wrapped)
    config = {"backends": [{"name": "a", "url": backend.url, "retries": 0},
                           {"name": "b", "url": backend.url, "retries": 0}]}
    for _ in range(2):
        events.clear()
        app = create_app(build_config(config))

        async def body(c: httpx.AsyncClient) -> int:
            events.append("request")
            return (await c.get("/api/v1/status/flags")).status_code

        assert _serve(app, body) == 200
        assert events == ["start", "request", "close", "backend closed", "backend closed"]


def test_the_ui_follows_its_setting(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[int]:
        return [(await c.get(p)).status_code for p in ("/ui", "/ui/data.json")]

    assert _serve(_app(backend), body) == [200, 200]
    assert _serve(_app(backend, ui={"enabled": False}), body) == [404, 404]
