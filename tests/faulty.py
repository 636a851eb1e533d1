"""A fault-injecting backend: a small HTTP/1.1 server on 127.0.0.1 in front of a real
Prometheus, which answers some requests with a fault instead of Prometheus's answer.

Faults: `html502` (a load balancer's HTML page), `json503`, `trunc200` (a 200 whose JSON is
cut in half, Content-Length matching), `short` (a Content-Length longer than the body sent,
then the connection closes), `reset` (the connection closes without an answer), `stall`
(3 s, then the real answer).

`faulty.set(fault, first=n)`: each distinct request (method, path, query, body) gets the fault
on its first n tries, then the real answer; `first=None`: every time. `faulty.calls` counts
requests.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import httpx

from tests.servers import free_port

FAULTS = ("html502", "json503", "trunc200", "short", "reset", "stall")


class FaultyBackend:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fault: str | None = None
        self.first: int | None = None
        self.seen: Counter[bytes] = Counter()
        self.calls = 0
        self.faults_sent = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def set(self, fault: str | None, first: int | None = 1) -> None:
        assert fault is None or fault in FAULTS
        self.fault, self.first = fault, first
        self.seen.clear()
        self.faults_sent = 0

    def start(self) -> FaultyBackend:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(timeout=60)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if not await self._answer(writer, method, target, headers, body):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, method: str, target: str, headers: dict[str, str],
                      body: bytes) -> bool:
        """Answer one request; False when the connection must close."""
        self.calls += 1
        key = f"{method} {target}".encode() + b"\0" + body
        self.seen[key] += 1
        fault = self.fault if self.fault and (self.first is None or self.seen[key] <= self.first) else None
        if fault is not None:
            self.faults_sent += 1
        if fault == "reset":
            return False
        if fault == "html502":
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            await _write(writer, 502, "text/html", page)
            return True
        if fault == "json503":
            await _write(writer, 503, "application/json", b'{"message":"Service Unavailable"}')
            return True
        if fault == "stall":
            await asyncio.sleep(3)
        fwd = {k: v for k, v in headers.items() if k in ("content-type", "accept")}
        r = await self._client.request(method, self.upstream + target, content=body, headers=fwd)
        content = r.content
        if fault == "trunc200" and r.status_code == 200:
            await _write(writer, 200, "application/json", content[: len(content) // 2])
            return True
        if fault == "short" and r.status_code == 200:
            writer.write(_head(200, "application/json", len(content)) + content[: len(content) // 2])
            await writer.drain()
            return False
        await _write(writer, r.status_code, r.headers.get("content-type", "application/json"), content)
        return True


def _head(status: int, ctype: str, length: int) -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n"
            "Connection: keep-alive\r\n\r\n").encode()


async def _write(writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes) -> None:
    writer.write(_head(status, ctype, len(body)) + body)
    await writer.drain()


def start(upstream: str) -> FaultyBackend:
    return FaultyBackend(upstream).start()


__all__ = ["FAULTS", "FaultyBackend", "start"]
