"""Answers as Starlette responses: query results, relayed backend replies, errors.

The query service answers with plain values (`pipeline.Answer`: a result or a backend's
reply); this is the only place they become HTTP responses. Large results are encoded in
chunks as they are sent: a 20 MB answer then costs ~4 MB of encoder memory instead of ~50 MB.
An answer's share of limits.max_inflight_answer_bytes (`Answer.release`) is given back when
its response has been sent, or the client went away.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio.to_thread
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..backends import BackendReply
from ..codec.arrow import encode_arrow_stream
from ..codec.json_encode import encode_prometheus_json, iter_prometheus_json
from ..codec.json_splice import splice_prometheus_json, spliceable, spliced
from ..errors import PromError
from ..pipeline.values import Answer
from ..result import QueryResult
from .compress import MINIMUM_SIZE, gzip_bytes

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Answers above this many samples are streamed in chunks (loadtests/codec_bench.py), unless
# made of cached cells (written from their bytes: codec/json_splice.py).
STREAM_ABOVE_SAMPLES = 200_000
# Answers of this many samples or more are written (and gzipped) in a worker thread: ~1 MB
# of JSON, a few ms on the event loop otherwise.
WRITE_IN_THREAD_SAMPLES = 32_768


class _Releasing:
    """Calls `release` once the response has been sent (or failed to be: the client went away)."""

    release: Callable[[], None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # type: ignore[misc]
        finally:
            if self.release is not None:
                self.release()


class _Body(_Releasing, Response):
    pass


class _Stream(_Releasing, StreamingResponse):
    pass


def _held(response: _Body | _Stream | _WrittenHeld, release: Callable[[], None] | None) -> Response:
    response.release = release
    return response


class _Written(Response):
    """A result as Prometheus JSON written whole when it is sent: spliced from its cells'
    encoded samples when it is made of cached cells (codec/json_splice.py), and then gzipped
    here when the client takes gzip (in one pass from the spliced bytes; the middleware
    passes an encoded body through); else encoded, and gzipped by the middleware as before.
    Written in a worker thread when large, as the middleware compresses."""

    def __init__(self, result: QueryResult, headers: dict[str, str], gzip_ok: bool) -> None:
        super().__init__(None, media_type=JSON, headers=headers)
        self.result: QueryResult | None = result
        self.headers_given = headers
        self.gzip_ok = gzip_ok

    def splice(self) -> tuple[bytes, bool] | None:
        """(body, whether it is gzipped), or None if the result is not made of cells."""
        result = self.result
        assert result is not None
        if not self.gzip_ok:
            body = splice_prometheus_json(result)
            return None if body is None else (body, False)
        with spliced(result) as view:
            if view is None:
                return None
            if len(view) >= MINIMUM_SIZE:
                return gzip_bytes(view), True
            return bytes(view), False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        result = self.result
        if result is not None:
            if result.n_samples >= WRITE_IN_THREAD_SAMPLES:
                written = await anyio.to_thread.run_sync(self.splice)
            else:
                written = self.splice()
            # Encoded on the event loop's thread as before: the encoder keeps a scratch
            # buffer per thread.
            body, gzipped = written if written is not None else (encode_prometheus_json(result), False)
            self.result = None
            self.body = body
            headers = self.headers_given
            if gzipped:
                headers = {**headers, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
            self.init_headers(headers)
        await super().__call__(scope, receive, send)


class _WrittenHeld(_Releasing, _Written):
    pass


def json_response(result: QueryResult, headers: dict[str, str], release: Callable[[], None] | None = None,
                  gzip_ok: bool = False) -> Response:
    """A result as Prometheus JSON, streamed when large (unless spliced from its cells' bytes,
    up to json_splice.SPLICE_MAX_SAMPLES). `gzip_ok`: the client takes gzip."""
    if result.n_samples > STREAM_ABOVE_SAMPLES and not spliceable(result):
        return _held(_Stream(iter_prometheus_json(result), media_type=JSON, headers=headers), release)
    if result.result_type == "matrix":
        return _held(_WrittenHeld(result, headers, gzip_ok), release)
    return _held(_Body(encode_prometheus_json(result), media_type=JSON, headers=headers), release)


def arrow_response(result: QueryResult, headers: dict[str, str], release: Callable[[], None] | None = None) -> Response:
    """A result as an Arrow IPC stream, for clients that ask for it."""
    return _held(_Body(encode_arrow_stream(result), media_type=ARROW_STREAM, headers=headers), release)


# Every answer promaccel relays is Prometheus API JSON (a 200 only once its body parsed as JSON,
# an error as Prometheus's error JSON): it is served as that, never with the backend's own
# Content-Type -- a hostile backend's `<script>` was once served as text/html from promaccel's
# origin (issue 26) -- and browsers are told not to sniff it.
RELAY_HEADERS = {"Content-Type": JSON, "X-Content-Type-Options": "nosniff"}


def relay(reply: BackendReply, headers: dict[str, str] | None = None,
          release: Callable[[], None] | None = None) -> Response:
    """A backend's answer (status, body) as application/json, plus `headers`."""
    body = reply.body if isinstance(reply.body, bytes) else bytes(reply.body)
    return _held(_Body(content=body, status_code=reply.status, headers={**(headers or {}), **RELAY_HEADERS}),
                 release)


def releasing(response: Response, release: Callable[[], None]) -> Response:
    """`response` (a whole body, not a stream), calling `release` once it has been sent."""
    if isinstance(response, _Body) and response.release is None:
        response.release = release
        return response
    out = _Body(content=response.body, status_code=response.status_code, background=response.background)
    out.raw_headers = list(response.raw_headers)
    out.release = release
    return out


def response_of(answer: Answer, gzip_ok: bool = False) -> Response:
    """A query's answer: the backend's reply relayed, or the merged result encoded; its share
    of the answer-bytes budget given back once sent. `gzip_ok`: the client takes gzip."""
    try:
        if answer.reply is not None:
            return relay(answer.reply, answer.headers, answer.release)
        assert answer.result is not None
        if answer.arrow:
            return arrow_response(answer.result, answer.headers, answer.release)
        return json_response(answer.result, answer.headers, answer.release, gzip_ok)
    except BaseException:
        if answer.release is not None:
            answer.release()
        raise


def error(exc: PromError) -> Response:
    """Prometheus's error answer: its JSON body and the HTTP status of its kind."""
    return Response(exc.body(), status_code=exc.status, media_type=JSON, headers=exc.headers or None)


def unknown_path(path: str) -> Response:
    return error(PromError("not_found", f"unknown path {path!r}: promaccel serves the "
                           "Prometheus HTTP API under /api/v1/"))
