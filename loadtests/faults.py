"""A fault-injecting backend: a small HTTP/1.1 server on 127.0.0.1 in front of a real
Prometheus, which answers some requests with a fault instead of Prometheus's answer.

Faults: `html502` (a load balancer's HTML page), `json503`, `trunc200` (a 200 whose JSON is
cut in half, Content-Length matching), `short` (a Content-Length longer than the body sent,
then the connection closes), `reset` (the connection closes without an answer), `stall`
(`stall_s`, 3 s by default, then the real answer).

Two ways to choose which requests get a fault:
- `set(fault, first=n)`: each distinct request (method, path, query, body) gets the fault on
  its first n tries, then the real answer; `first=None`: every time (the tests);
- `set_random(rate, faults, seed)`: each request, independently, gets one of `faults` (chosen
  uniformly) with probability `rate` (the chaos bench).
`calls` counts requests, `faults_sent` faults, `by_fault` faults by kind. `GET /-/faults`
(answered here, never forwarded) returns those counts as JSON; `POST /-/faults?rate=R` sets
the random mode's rate (0: healthy).

    python -m loadtests.faults --upstream http://127.0.0.1:9090 --port 9099 --rate 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
from collections import Counter

import httpx

from loadtests.load import free_port

FAULTS = ("html502", "json503", "trunc200", "short", "reset", "stall")


class FaultyBackend:
    def __init__(self, upstream: str, port: int | None = None, stall_s: float = 3.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stall_s = stall_s
        self.fault: str | None = None
        self.first: int | None = None
        self.rate = 0.0
        self.mix: tuple[str, ...] = ()
        self._rng = random.Random(0)
        self.seen: Counter[bytes] = Counter()
        self.calls = 0
        self.faults_sent = 0
        self.by_fault: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def set(self, fault: str | None, first: int | None = 1) -> None:
        assert fault is None or fault in FAULTS
        self.fault, self.first, self.rate = fault, first, 0.0
        self.seen.clear()
        self.faults_sent = 0

    def set_random(self, rate: float, faults: tuple[str, ...] = FAULTS, seed: int = 0) -> None:
        assert all(f in FAULTS for f in faults) and 0 <= rate <= 1
        self.fault, self.rate, self.mix = None, rate, tuple(faults)
        self._rng = random.Random(seed)
        self.faults_sent = 0
        self.by_fault.clear()

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

    def serve_forever(self) -> None:
        """Run in this thread (the command line)."""
        self._run()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64))
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

    def _choose(self, key: bytes) -> str | None:
        if self.rate:
            return self._rng.choice(self.mix) if self._rng.random() < self.rate else None
        self.seen[key] += 1
        return self.fault if self.fault and (self.first is None or self.seen[key] <= self.first) else None

    async def _answer(self, writer: asyncio.StreamWriter, method: str, target: str, headers: dict[str, str],
                      body: bytes) -> bool:
        """Answer one request; False when the connection must close."""
        if target.startswith("/-/faults"):
            if method == "POST" and "?rate=" in target:
                self.rate = float(target.partition("?rate=")[2])
            counts = {"calls": self.calls, "faults": self.faults_sent, "by_fault": dict(self.by_fault)}
            await _write(writer, 200, "application/json", json.dumps(counts).encode())
            return True
        self.calls += 1
        fault = self._choose(f"{method} {target}".encode() + b"\0" + body)
        if fault is not None:
            self.faults_sent += 1
            self.by_fault[fault] += 1
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
            await asyncio.sleep(self.stall_s)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rate", type=float, default=0.2, help="share of requests given a fault")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated kinds, chosen uniformly")
    ap.add_argument("--stall", type=float, default=3.0, help="seconds a stall lasts")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    b = FaultyBackend(args.upstream, args.port, args.stall)
    b.set_random(args.rate, tuple(f for f in args.faults.split(",") if f), args.seed)
    b.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
