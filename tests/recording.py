"""A recording backend for tests: an aiohttp server on 127.0.0.1 (in a thread of its own)
that records each request's method, path, form and headers, optionally requires basic auth
(401 otherwise), and forwards the request to a real Prometheus (or answers fixed JSON when
there is none)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from tests.servers import free_port

EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
# Without an upstream, each endpoint's empty answer in its own shape (metadata's are checked).
EMPTY_LIST = b'{"status":"success","data":[]}'
EMPTY_OBJECT = b'{"status":"success","data":{}}'


def empty_answer(path: str) -> bytes:
    """An empty answer of the shape `path` answers with."""
    if path in ("/api/v1/labels", "/api/v1/series") or (path.startswith("/api/v1/label/") and path.endswith("/values")):
        return EMPTY_LIST
    if path in ("/api/v1/metadata", "/api/v1/targets/metadata"):
        return EMPTY_OBJECT if path == "/api/v1/metadata" else EMPTY_LIST
    return EMPTY_VECTOR


@dataclass
class Seen:
    method: str
    path: str
    form: list[tuple[str, str]]
    headers: dict[str, str]  # lower-case names

    @property
    def query(self) -> str:
        return dict(self.form).get("query", "")


@dataclass
class Recorder:
    upstream: str | None
    basic_auth: tuple[str, str] | None = None
    delay_s: float = 0.0  # added to every answer (to make concurrent calls overlap)
    seen: list[Seen] = field(default_factory=list)
    rejected: int = 0
    url: str = ""
    client: aiohttp.ClientSession | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()
            self.rejected = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        form = parse_qsl(request.query_string, keep_blank_values=True)
        if request.method == "POST" and body:
            form += parse_qsl(body.decode(), keep_blank_values=True)
        seen = Seen(request.method, request.path, form, {k.lower(): v for k, v in request.headers.items()})
        if self.basic_auth is not None:
            want = "Basic " + base64.b64encode(":".join(self.basic_auth).encode()).decode()
            if request.headers.get("Authorization") != want:
                with self._lock:
                    self.rejected += 1
                return web.Response(status=401, content_type="application/json", text=(
                    '{"status":"error","errorType":"unauthorized","error":"authentication required"}'))
        with self._lock:
            self.seen.append(seen)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.upstream is None:
            return web.Response(body=empty_answer(request.path), content_type="application/json")
        headers = {"Content-Type": request.headers["Content-Type"]} if "Content-Type" in request.headers else {}
        assert self.client is not None
        async with self.client.request(request.method, self.upstream + request.path_qs, data=body or None,
                                                 headers=headers) as resp:
            return web.Response(body=await resp.read(), status=resp.status,
                                content_type=resp.content_type or "application/json")


@contextmanager
def recording_backend(upstream: str | None, basic_auth: tuple[str, str] | None = None,
                      delay_s: float = 0.0) -> Iterator[Recorder]:
    rec = Recorder(upstream.rstrip("/") if upstream else None, basic_auth, delay_s)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    port = free_port()

    async def main() -> None:
        app = web.Application()
        rec.client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        app.router.add_route("*", "/{tail:.*}", rec.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        started.set()
        try:
            await stop.wait()
        finally:
            await rec.client.close()
            await runner.cleanup()

    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported by the starting thread
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not started.wait(0.05):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"recording backend did not start: {failure[:1]!r}")
    rec.url = f"http://127.0.0.1:{port}"
    try:
        yield rec
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=15)
