"""proxy/api/compress.py: `gzip_bytes` writes one standard gzip member (in two halves at once
from PARALLEL_ABOVE bytes up), `compressor` a streaming one, and `FastGZipMiddleware` gzips
answers of MINIMUM_SIZE bytes or more for clients that ask, and nothing else.

Every body is checked by decompressing it with Python's own gzip/zlib (what any client uses),
never against bytes written by the module itself."""

from __future__ import annotations

import asyncio
import gzip
import random
import struct
import zlib

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.api import compress
from proxy.api.compress import MINIMUM_SIZE, PARALLEL_ABOVE, FastGZipMiddleware, compressor, gzip_bytes


def _json_like(n: int, seed: int = 1) -> bytes:
    """`n` bytes shaped like a matrix answer (compressible, but not trivially)."""
    rng = random.Random(seed)
    out = bytearray(b'{"status":"success","data":{"resultType":"matrix","result":[')
    while len(out) < n:
        out += b'[%d,"%.3f"],' % (1_793_404_800 + rng.randrange(10_000) * 30, rng.random() * 100)
    return bytes(out[:n])


def _one_member(body: bytes) -> bytes:
    """The data of `body`, which must be exactly one gzip member (nothing after it)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = d.decompress(body) + d.flush()
    assert d.eof and d.unused_data == b"", "not exactly one gzip member"
    return data


# --- gzip_bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MINIMUM_SIZE, PARALLEL_ABOVE - 1, PARALLEL_ABOVE, PARALLEL_ABOVE + 1,
                                  3 * PARALLEL_ABOVE + 7])
def test_gzip_bytes_is_one_member_of_the_data_on_both_sides_of_the_parallel_threshold(size: int) -> None:
    data = _json_like(size)
    body = gzip_bytes(data)
    assert body[:3] == b"\x1f\x8b\x08"  # gzip magic, deflate (RFC 1952)
    assert _one_member(body) == data
    assert gzip.decompress(body) == data
    # The trailer: CRC-32 and size mod 2**32 of the whole input, whichever path wrote it.
    crc, isize = struct.unpack("<II", body[-8:])
    assert crc == zlib.crc32(data) and isize == size
    if size >= MINIMUM_SIZE:
        assert len(body) < size / 2  # compressed, not stored


def test_gzip_bytes_takes_memoryviews_of_any_shape() -> None:
    """The splice path hands a memoryview of a reused buffer (responses.py): a view of a
    typed buffer is compressed as its bytes."""
    data = _json_like(PARALLEL_ABOVE + 4096)
    words = memoryview(bytearray(data)).cast("B").cast("I", (len(data) // 4,))
    assert _one_member(gzip_bytes(words)) == data[: len(data) // 4 * 4]
    assert _one_member(gzip_bytes(memoryview(data[:5000]))) == data[:5000]


def test_incompressible_data_survives_both_paths() -> None:
    rng = random.Random(7)
    for size in (5000, PARALLEL_ABOVE + 3):
        data = rng.randbytes(size)
        assert _one_member(gzip_bytes(data)) == data


def test_streaming_compressor_writes_one_member_from_chunks() -> None:
    data = _json_like(300_000)
    c = compressor()
    body = b"".join(c.compress(data[i:i + 70_001]) for i in range(0, len(data), 70_001)) + c.flush()
    assert _one_member(body) == data
    # A fresh object each call: two streams never share state.
    a, b = compressor(), compressor()
    assert a is not b
    assert _one_member(a.compress(b"x" * 100) + a.flush()) == b"x" * 100
    assert _one_member(b.compress(b"y" * 100) + b.flush()) == b"y" * 100


# --- the middleware -----------------------------------------------------------------------------

BIG = _json_like(200_000, seed=3)


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
