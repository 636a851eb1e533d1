"""proxy/api/compress.py: `compressor` (codec/deflate.py) writes a streaming gzip member, and
`FastGZipMiddleware` gzips answers of MINIMUM_SIZE bytes or more for clients that ask, and
nothing else (whole bodies: tests/codec/test_deflate.py).

Every body is checked by decompressing it with Python's own gzip/zlib (what any client uses),
never against bytes written by the module itself."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.api import compress
from proxy.api.compress import MINIMUM_SIZE, FastGZipMiddleware, compressor

from ..codec.test_deflate import json_like, one_member


def test_streaming_compressor_writes_one_member_from_chunks() -> None:
    data = json_like(300_000)
    c = compressor()
    body = b"".join(c.compress(data[i:i + 70_001]) for i in range(0, len(data), 70_001)) + c.flush()
    assert one_member(body) == data
    # A fresh object each call: two streams never share state.
    a, b = compressor(), compressor()
    assert a is not b
    assert one_member(a.compress(b"x" * 100) + a.flush()) == b"x" * 100
    assert one_member(b.compress(b"y" * 100) + b.flush()) == b"y" * 100


# --- the middleware -----------------------------------------------------------------------------

BIG = json_like(200_000, seed=3)


def _app() -> Starlette:
    def stream(_: Request) -> StreamingResponse:
        return StreamingResponse(iter([BIG[:1000], BIG[1000:150_000], BIG[150_000:]]), media_type="application/json")

    app = Starlette(routes=[
        Route("/big", lambda _: Response(BIG, media_type="application/json")),
        Route("/stream", stream),
        Route("/under", lambda _: Response(BIG[:MINIMUM_SIZE - 1], media_type="application/json")),
        Route("/at", lambda _: Response(BIG[:MINIMUM_SIZE], media_type="application/json")),
        Route("/events", lambda _: Response(BIG, media_type="text/event-stream")),
        Route("/error", lambda _: Response(BIG, status_code=422, media_type="application/json")),
    ])
    app.add_middleware(FastGZipMiddleware, minimum_size=MINIMUM_SIZE)
    return app


def _get(path: str, accept: str) -> httpx.Response:
    async def run() -> httpx.Response:
        headers = {"accept-encoding": accept}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as c:
            r = await c.get(path, headers=headers)
            await r.aread()
            return r
    return asyncio.run(run())


@pytest.mark.parametrize("path", ["/big", "/stream", "/error"])
def test_middleware_gzips_for_a_client_that_asks(path: str) -> None:
    r = _get(path, "gzip, deflate")
    assert r.headers["content-encoding"] == "gzip" and "accept-encoding" in r.headers["vary"].lower()
    assert r.content == BIG  # httpx decoded it
    assert r.num_bytes_downloaded < len(BIG) / 2  # what went over the wire was compressed
    if path == "/error":
        assert r.status_code == 422  # the status is the app's


def test_middleware_threshold_is_inclusive_of_minimum_size() -> None:
    under, at = _get("/under", "gzip"), _get("/at", "gzip")
    assert "content-encoding" not in under.headers and under.content == BIG[:MINIMUM_SIZE - 1]
    assert at.headers.get("content-encoding") == "gzip" and at.content == BIG[:MINIMUM_SIZE]


@pytest.mark.parametrize("accept", ["identity", "br, deflate"])
def test_middleware_sends_plain_bytes_to_a_client_that_does_not_ask(accept: str) -> None:
    r = _get("/big", accept)
    assert "content-encoding" not in r.headers
    assert r.content == BIG and int(r.headers["content-length"]) == len(BIG)


def test_middleware_leaves_excluded_types_alone() -> None:
    r = _get("/events", "gzip")  # Starlette's exclusions apply: an event stream is never buffered
    assert "content-encoding" not in r.headers and r.content == BIG


def test_middleware_uses_the_modules_compressor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The middleware's compressor is compress.compressor (ISA-L at LEVEL), not Starlette's
    zlib at level 9."""
    made: list[object] = []
    real = compress.compressor

    def counting() -> object:
        made.append(1)
        return real()

    monkeypatch.setattr(compress, "compressor", counting)
    r = _get("/stream", "gzip")
    assert r.content == BIG and made == [1]


def test_middleware_passes_other_scopes_through() -> None:
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    asyncio.run(FastGZipMiddleware(inner)({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
    assert seen == ["lifespan"]
