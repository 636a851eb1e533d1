"""Raw HTTP for the security tests: requests whose target goes out byte for byte (no client
library normalising `..` or re-encoding `%2F`), raw sockets for slow or broken clients, and a
recording fake backend on a loopback port."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.servers import free_port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(base_url: str, target: str, method: str = "GET", body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 15) -> Answer:
    """`target` is sent as is in the request line (http.client only refuses control bytes)."""
    parts = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        hdrs = dict(headers or {})
        if body is not None:
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
            hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def connect(base_url: str, timeout: float = 10) -> socket.socket:
    parts = urllib.parse.urlsplit(base_url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection (or until `limit_s`
    passes: then the bytes so far); and the seconds it took."""
    t0 = time.monotonic()
    chunks: list[bytes] = []
    while True:
        left = limit_s - (time.monotonic() - t0)
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - t0


@dataclass
class Recorder:
    """A fake backend on a loopback port: records the raw request target of every call and
    answers an empty Prometheus success (or, with `redirect`, a 301 to /debug/pprof/cmdline)."""

    url: str
    server: ThreadingHTTPServer
    seen: list[tuple[str, str]] = field(default_factory=list)
    redirect: bool = False

    @classmethod
    def start(cls) -> Recorder:
        recorder: Recorder

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                recorder.seen.append((self.command, self.path))  # the raw target, as received
                if recorder.redirect and not self.path.startswith("/debug/"):
                    self.send_response(301)
                    self.send_header("Location", f"{recorder.url}/debug/pprof/cmdline")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b'{"status":"success","data":[]}'
                if self.path.startswith("/debug/"):
                    body = b"prometheus\x00--config.file=SECRET"  # what must never come back
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        port = free_port()
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        recorder = cls(f"http://127.0.0.1:{port}", server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return recorder

    def paths(self) -> list[str]:
        return [target.partition("?")[0] for _, target in self.seen]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
