"""The pooled HTTP clients' own rules (proxy/backends/transports.py), in process: the headers
of every call, bodies refused before they are read (an encoding not asked for, a length over
the limit) or cut off as they stream in, and which failures are timeouts. Over real loopback
HTTP on both transports: tests/backends/test_backend.py and test_hostile_backend.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest

from proxy.backends.protocol import BackendFault
from proxy.backends.redaction import redact
from proxy.backends.transports import (
    KEEP_BYTEARRAY_BYTES,
    body_limit,
    default_headers,
    is_timeout,
    read_body,
    refuse_unasked,
    send_httpx,
)
from proxy.config import BackendConfig, BasicAuthConfig

CFG = BackendConfig(url="http://127.0.0.1:9090", name="b1", max_body_bytes=4096)


def test_every_call_asks_for_identity_and_sends_basic_auth() -> None:
    assert default_headers(CFG) == {"Accept-Encoding": "identity", "User-Agent": "promaccel"}
    cfg = BackendConfig(url="http://127.0.0.1:9090", basic_auth=BasicAuthConfig(username="grafana",
                                                                                password="s3cret-pass-word"))
    auth = default_headers(cfg)["Authorization"]
    assert auth == "Basic " + base64.b64encode(b"grafana:s3cret-pass-word").decode()  # RFC 7617
    # Both the password and the header value are now scrubbed from any log line.
    assert "s3cret-pass-word" not in redact("login with s3cret-pass-word")
    assert auth.split()[1] not in redact(f"sent {auth.split()[1]}")


@pytest.mark.parametrize("headers", [
    {"content-encoding": "gzip"}, {"content-encoding": " BR "}, {"content-encoding": "identity, gzip"},
    {"content-length": "4097"},
])
def test_refused_before_the_body_is_read(headers: dict[str, str]) -> None:
    with pytest.raises(BackendFault):
        refuse_unasked(headers, 4096)


def test_what_is_read() -> None:
    refuse_unasked({}, 4096)
    refuse_unasked({"content-encoding": "identity", "content-length": "4096"}, 4096)
    refuse_unasked({"content-length": "not a number"}, 4096)  # left to the streamed count
    # A hostile encoding name is shown short and printable.
    with pytest.raises(BackendFault) as err:
        refuse_unasked({"content-encoding": "x\n" * 100}, 4096)
    assert "\n" not in err.value.why and len(err.value.why) < 200


def test_the_limit_is_the_smaller_of_the_backends_and_the_calls() -> None:
    assert body_limit(CFG, None) == (4096, False)
    assert body_limit(CFG, 100) == (100, True)
    assert body_limit(CFG, 10_000) == (4096, False)
    with pytest.raises(BackendFault) as err:
        refuse_unasked({"content-length": "101"}, 100, per_call=True)
    assert "100 bytes promaccel reads of this answer" in err.value.why


class _Chunks(httpx.AsyncByteStream):
    """A body as a backend streams it (no Content-Length unless the headers give one)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


def _send(status: int, chunks: list[bytes], headers: dict[str, str] | None = None,
          max_body_bytes: int | None = None) -> tuple[object, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, headers=headers, stream=_Chunks(chunks))

    async def run() -> object:
        async with httpx.AsyncClient(base_url=CFG.url, transport=httpx.MockTransport(handler)) as client:
            try:
                return await send_httpx(client, CFG, "GET", "/api/v1/query", [("query", "up")], None, None, 1.0,
                                        max_body_bytes)
            except BackendFault as exc:
                return exc

    return asyncio.run(run()), seen


def test_send_httpx_reads_the_raw_body_and_keeps_retry_after() -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    reply, seen = _send(503, [body[:10], body[10:]], {"retry-after": "3", "x-other": "1",
                                                       "content-type": "application/json"})
    assert not isinstance(reply, BackendFault)
    assert reply.status == 503 and reply.body == body and reply.headers == {"retry-after": "3"}  # type: ignore[attr-defined]
    assert seen[0].url.params["query"] == "up"


def test_send_httpx_never_inflates_and_stops_at_the_limit() -> None:
    gz, _ = _send(200, [b"\x1f\x8b..."], {"content-encoding": "gzip"})
    assert isinstance(gz, BackendFault) and "gzip" in gz.why
    # No Content-Length (a stream): counted as it comes in.
    big, _ = _send(200, [b"x" * 3000, b"x" * 3000])
    assert isinstance(big, BackendFault) and "max_body_bytes (4096 bytes)" in big.why
    small, _ = _send(200, [b"x" * 60, b"x" * 60], max_body_bytes=100)
    assert isinstance(small, BackendFault) and "100 bytes" in small.why


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)


def test_read_body_into_one_buffer() -> None:
    async def read(chunks: list[bytes], limit: int) -> bytes | bytearray:
        return await read_body(_Response(chunks), limit)  # type: ignore[arg-type]

    small = asyncio.run(read([b"ab", b"cd"], 10))
    assert small == b"abcd" and type(small) is bytes
    half = KEEP_BYTEARRAY_BYTES // 2
    large = asyncio.run(read([b"x" * half, b"y" * half], KEEP_BYTEARRAY_BYTES))
    assert type(large) is bytearray and len(large) == KEEP_BYTEARRAY_BYTES  # handed on, not copied
    with pytest.raises(BackendFault):
        asyncio.run(read([b"x" * 6, b"x" * 5], 10))


class ConnectorTimeout(Exception):
    pass


def _caused(exc: BaseException, cause: BaseException | None) -> BaseException:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(("exc", "timeout"), [
    (TimeoutError(), True),
    (aiohttp.ServerTimeoutError(), True),
    (httpx.ReadTimeout("read"), True),
    (httpx.PoolTimeout("pool"), True),
    (httpx.ConnectTimeout("connect"), True),
    # httpx-aiohttp reports every aiohttp connection error as ConnectTimeout: a refusal is not one.
    (_caused(httpx.ConnectTimeout("x"), ConnectionRefusedError()), False),
    (_caused(httpx.ConnectTimeout("x"), ConnectorTimeout()), True),
    (httpx.ConnectError("refused"), False),
    (OSError("reset"), False),
])
def test_is_timeout(exc: BaseException, timeout: bool) -> None:
    assert is_timeout(exc) is timeout
