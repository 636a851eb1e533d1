"""loadtests/scenarios/sizes.py and the client's wire mode: warm answers asked with and without
gzip, their bytes on the wire and decoded, against a loopback server that compresses when asked."""

from __future__ import annotations

import asyncio
import gzip
import json

from loadtests.client import Budget, Client
from loadtests.scenarios.sizes import probe_sizes, size_class
from loadtests.timeline import instant_request

BODY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"instance": f"gpu-node-{i:04d}:9100"}, "value": [1, "1"]} for i in range(2000)]}}).encode()


async def _serve(seen: list[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        lines = head.split(b"\r\n")
        length = int(next(x.split(b":")[1] for x in lines if x.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        accept = next((x.split(b":", 1)[1].strip() for x in lines if x.lower().startswith(b"accept-encoding")), b"")
        seen.append(accept)
        # two gzip members: Grafana's (Go's) reader accepts a multi-member stream, so must the bench
        body = gzip.compress(BODY[:1000]) + gzip.compress(BODY[1000:]) if accept == b"gzip" else BODY
        extra = b"Content-Encoding: gzip\r\n" if accept == b"gzip" else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                     % (extra, len(body), body))
        await writer.drain()


def test_probe_sizes_measures_both_encodings_on_the_wire() -> None:
    seen: list[bytes] = []

    async def run() -> list:  # type: ignore[type-arg]
        server = await asyncio.start_server(lambda r, w: _serve(seen, r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        req = instant_request("t", "up", 1793491187.655)
        async with server:
            return await probe_sizes(f"http://127.0.0.1:{port}", [("panel", req)], Budget(100), 10, 3)

    (size,) = asyncio.run(run())
    assert sorted(seen) == [b"gzip"] * 3 + [b"identity"] * 3
    assert size.answer_bytes == len(BODY) and 0 < size.gzip_bytes < len(BODY) // 5
    assert len(size.gzip_s) == len(size.identity_s) == 3 and not size.differs and not size.failures
    assert size.size_class == size_class(len(BODY)) == "medium (50 KB – 1 MB)"


def test_the_default_client_decodes_and_records_no_wire_size() -> None:
    seen: list[bytes] = []

    async def run() -> tuple[int, bytes, int | None]:
        server = await asyncio.start_server(lambda r, w: _serve(seen, r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, Client(f"http://127.0.0.1:{port}", Budget(1), 10) as c:
            a = await c.send(instant_request("t", "up", 1793491187.655))
            return a.status, a.body, a.wire_bytes

    status, body, wire = asyncio.run(run())
    assert seen == [b"gzip"] and (status, body, wire) == (200, BODY, None)
