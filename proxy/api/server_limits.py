"""Limits of the HTTP server (uvicorn with httptools): header size, read deadlines, concurrency,
open sockets.

uvicorn bounds neither the size of a request's headers nor the time a client may take to
send them or its body: a 64 MB header was accepted (+108 MB RSS), and connections sending a
byte now and then (or nothing) stayed open indefinitely. `LimitedHttpToolsProtocol` adds, per
connection (`listen:` in the config):

- `max_header_bytes`: the bytes received for a request line and its headers; over it: 431
  and the connection is closed. Counted per received chunk (no per-byte Python work); the
  exact size is only computed when the chunks say the limit may be passed. A request that
  starts inside a chunk with the end of the previous one (pipelining) is counted from the
  next chunk, so the bound may be passed by at most one read (256 KiB).
- `first_byte_timeout`: a new connection that sends nothing this long is closed silently
  (issue 26: 1,030 connections that never sent a byte held every slot for header_timeout).
- `header_timeout`: the headers must be complete this long after the connection opened or
  the request's first byte arrived; else 408 (when any byte came; silently when none did)
  and close. An idle connection between requests is uvicorn's keep-alive timeout
  (`keep_alive_timeout`).
- `body_timeout`: the body must be complete this long after the headers; else 408 when the
  app has not answered yet, and close. The app's `receive` then reports a disconnect, which
  it answers as a client that went away (proxy/api/forms.py: 499, no traceback).
- `send_timeout`: a client that takes nothing of its answer for this long while there is more
  to send (the transport's write buffer over its high-water mark, so uvicorn's `send` waits)
  is cut off: the connection is aborted, dropping what was buffered, and the app's
  streaming response stops (it sees a disconnect). Without it a client that never reads
  kept its answer in memory for as long as it kept the connection.
- `max_concurrency`: requests running at once (uvicorn's `limit_concurrency` counted open
  connections too, so idle sockets filled it: issue 26); over it a request gets
  Prometheus-style 503 JSON -- except `/-/healthy` and `/-/ready`, which are always answered.
- `max_connections`: open client sockets. A connection over it closes the connection that has
  waited longest for a request (a new one sending nothing yet, or one idle between requests);
  only when every connection has a request in progress is the new one closed instead. So idle
  sockets cannot keep a health probe or a query out while any connection is idle. The
  process's soft limit of open files is raised to its hard limit at start, and the cap is kept
  below it (`effective_max_connections`) so that accepting never fails for want of a file.

The hot path pays a few attribute checks per received chunk, one overridden callback per
request, and a timer only when a request's headers or body do not arrive in one read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..config import ListenConfig

# Phases of the request being read on a connection.
_IDLE = 0  # between requests (and before a connection's first byte, with the head timer armed)
_HEAD = 1  # request line and headers
_BODY = 2  # body


# Files kept for everything but client sockets (backend and Redis pools, logs, the listening
# socket): the socket cap stays this far below the open-files limit.
_FILES_RESERVE = 512
# Connections waiting for a request (a new one before its first request, or one idle between
# requests), oldest first: the first to close when the socket cap is reached.
_waiting: dict["LimitedHttpToolsProtocol", None] = {}
_HEALTH_PATHS = (b"/-/healthy", b"/-/ready")
_log = logging.getLogger("promaccel.server")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request already answered and closed."""


def _error_response(status: int, error_type: str, message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = orjson.dumps({"status": "error", "errorType": error_type, "error": message})
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
             b"\r\nconnection: close\r\n\r\n", body]
    return b"".join(head)


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app of a request over max_concurrency."""
    body = orjson.dumps({"status": "error", "errorType": "unavailable",
                         "error": "promaccel is at its concurrency limit (listen.max_concurrency): retry later"})
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring."""

    # Set once per process by `configure` (the serving process, or each worker of
    # `serve --workers N`), before the first connection.
    max_header_bytes = 64 * 1024
    first_byte_timeout_s = 10.0
    header_timeout_s = 30.0
    body_timeout_s = 60.0
    send_timeout_s = 60.0
    max_connections = 4096  # effective: below the open-files limit
    _evicted = 0  # connections closed for the cap since the last warning
    _evicted_logged = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's limit_concurrency, checked in on_headers_complete against running requests
        # only (uvicorn's own check counts open connections too, and answers text/plain).
        self.max_concurrency, self.limit_concurrency = self.limit_concurrency, None
        self._phase = _IDLE
        self._head_bytes = 0
        self._head_t0 = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._first_byte = True  # nothing received on this connection yet

    # --- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            self._count_evicted()
            transport.close()  # every other connection has a request in progress
            return
        _waiting[self] = None
        # A connection that sends nothing is closed at first_byte_timeout.
        self._start_head()
        self._arm(self._head_t0 + min(self.first_byte_timeout_s, self.header_timeout_s))

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for a request; False: none waits."""
        while _waiting:
            oldest = next(iter(_waiting))
            del _waiting[oldest]
            if not oldest.transport.is_closing():
                oldest._disarm()
                oldest.transport.close()
                self._count_evicted()
                return True
        return False

    @classmethod
    def _count_evicted(cls) -> None:
        cls._evicted += 1
        now = time.monotonic()
        if now - cls._evicted_logged >= 10.0:
            _log.warning("%d connection(s) closed: %d sockets open (listen.max_connections)", cls._evicted,
                         cls.max_connections)
            cls._evicted, cls._evicted_logged = 0, now

    def connection_lost(self, exc: Exception | None) -> None:
        _waiting.pop(self, None)
        self._disarm()
        self._send_resumed()
        super().connection_lost(exc)

    # --- writing: a client that stops reading ----------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self.send_timeout_s, self._send_expired)

    def resume_writing(self) -> None:
        self._send_resumed()
        super().resume_writing()

    def _send_resumed(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_expired(self) -> None:
        self._send_deadline = None
        if self.transport.get_write_buffer_size():
            who = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
            self.logger.warning("client %s took none of its answer for %gs (listen.send_timeout): connection closed",
                                who, self.send_timeout_s)
            self.transport.abort()  # drops the buffered answer; connection_lost follows

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the phase bookkeeping around the parser.
        if self._phase != _BODY:
            if self._phase == _IDLE:
                self._start_head()
            elif self._first_byte and self._phase == _HEAD:
                # The first byte came: the first-byte deadline becomes the header deadline.
                self._first_byte = False
                self._disarm()
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refused:
                return  # answered and closed from a callback
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
                return  # the connection belongs to the WebSocket protocol now
            self._unsupported_upgrade_warning()  # served as plain HTTP: limits as usual
        if self._phase == _HEAD:
            if self._head_bytes > self.max_header_bytes:
                self._refuse_header_size()
            elif self._deadline is None:
                self._arm(self._head_t0 + self.header_timeout_s)
        elif self._phase == _BODY and self._deadline is None:
            self._arm(self.loop.time() + self.body_timeout_s)

    # --- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._phase == _IDLE:  # a request starting in the chunk that ended the previous one
            self._start_head()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._head_bytes > self.max_header_bytes and self._exact_head_bytes() > self.max_header_bytes:
            self._refuse_header_size()
            raise _Refused
        self._phase = _BODY
        self._first_byte = False
        self._disarm()
        _waiting.pop(self, None)  # a request in progress: not closed for the socket cap
        limit = self.max_concurrency
        if limit is not None and len(self.tasks) >= limit and not self._is_health():
            self.logger.warning("Exceeded concurrency limit (listen.max_concurrency).")
            app, self.app = self.app, _busy
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and self.cycle is not None \
                and self.cycle.keep_alive:
            _waiting[self] = None  # idle until its next request (or keep_alive_timeout)

    def _is_health(self) -> bool:
        """Is the request /-/healthy or /-/ready (never refused for concurrency)?"""
        try:
            return httptools.parse_url(self.url).path in _HEALTH_PATHS
        except httptools.HttpParserInvalidURLError:
            return False

    # --- limits ----------------------------------------------------------------------------

    def _start_head(self) -> None:
        self._phase = _HEAD
        self._head_bytes = 0
        self._head_t0 = self.loop.time()

    def _exact_head_bytes(self) -> int:
        """Request line and headers as received (give or take the spaces around colons)."""
        return len(self.url) + 16 + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def _arm(self, when: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_at(when, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, status: int, error_type: str, message: str) -> None:
        self._refused = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, error_type, message, self.server_state.default_headers))
            self.transport.close()

    def _refuse_header_size(self) -> None:
        self._refuse(431, "bad_data", f"request header fields too large: promaccel accepts at most "
                     f"{self.max_header_bytes} bytes of request line and headers (listen.max_header_bytes)")

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._phase == _HEAD:
            if cycle is not None and not cycle.response_complete:
                # A pipelined request's headers while the previous answer is still being made:
                # its deadline runs from that answer's end.
                self._head_t0 = self.loop.time()
                self._arm(self._head_t0 + self.header_timeout_s)
                return
            if self._head_bytes == 0:
                self.transport.close()  # nothing was asked: nothing to answer
                return
            self._refuse(408, "timeout", f"request headers not received within {self.header_timeout_s:g}s "
                         "(listen.header_timeout)")
        elif self._phase == _BODY:
            if cycle is None or cycle.response_started:
                self.transport.close()
                return
            self._refuse(408, "timeout", f"request body not received within {self.body_timeout_s:g}s "
                         "(listen.body_timeout)")
            # The app waiting for the body sees a disconnect (as it would once the close is
            # processed), and whatever it answers is dropped.
            cycle.disconnected = True
            cycle.message_event.set()


def configure(listen: ListenConfig) -> dict[str, Any]:
    """Apply `listen:`'s limits to this process's protocol class; uvicorn.run's arguments."""
    cls = LimitedHttpToolsProtocol
    cls.max_header_bytes = listen.max_header_bytes
    cls.first_byte_timeout_s = listen.first_byte_timeout / 1000
    cls.header_timeout_s = listen.header_timeout / 1000
    cls.body_timeout_s = listen.body_timeout / 1000
    cls.send_timeout_s = listen.send_timeout / 1000
    cls.max_connections = effective_max_connections(listen.max_connections)
    return {"http": cls, "timeout_keep_alive": listen.keep_alive_timeout / 1000,
            "limit_concurrency": listen.max_concurrency,
            "timeout_graceful_shutdown": listen.shutdown_timeout / 1000}


def effective_max_connections(configured: int) -> int:
    """`listen.max_connections`, kept below the open-files limit (raised to its hard limit
    first) by a reserve for everything else, so that accepting a connection never fails for
    want of a file (an accept that fails is retried by asyncio a second later, and meanwhile
    not even a health probe gets in)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        want = min(want, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            except (ValueError, OSError):
                pass
    except (ImportError, OSError, ValueError):  # not POSIX: the configured cap as it is
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(16, soft - _FILES_RESERVE)
    if room < configured:
        _log.warning("listen.max_connections %d is above what %d open files allow: %d client sockets at most",
                     configured, soft, room)
    return min(configured, room)
