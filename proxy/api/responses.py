"""Answers as Starlette responses: query results, relayed backend replies, errors.

The query service answers with plain values (`pipeline.Answer`: a result or a backend's
reply); this is the only place they become HTTP responses. Large results are encoded in
chunks as they are sent: a 20 MB answer then costs ~4 MB of encoder memory instead of ~50 MB.
An answer's share of limits.max_inflight_answer_bytes (`Answer.release`) is given back when
its response has been sent, or the client went away.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..backends import BackendReply
from ..codec.arrow import encode_arrow_stream
from ..codec.deflate import gzip_bytes, gzip_spliced
from ..codec.json_encode import encode_prometheus_json, iter_prometheus_json
from ..codec.json_splice import splice_prometheus_json, spliceable, spliced_runs
from ..errors import PromError
from ..pipeline.values import Answer, Keeps
from ..result import QueryResult
from .compress import MINIMUM_SIZE

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Answers above this many samples are streamed in chunks (loadtests/codec_bench.py).
STREAM_ABOVE_SAMPLES = 200_000
# An answer written without splicing (a cold one, its cells from the landing zone) is kept
# whole only below this many bytes of JSON: it is gzipped here, on the event loop, where the
# middleware gzips bodies this large in a worker thread (Starlette's thread_minimum_size).
# A larger one is kept at its next ask, spliced.
KEEP_UNSPLICED_BELOW = 128 << 10


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


def _held(response: _Body | _Stream, release: Callable[[], None] | None) -> Response:
    response.release = release
    return response


def _spliced_body(result: QueryResult, gzip_ok: bool) -> tuple[bytes, bool] | None:
    """A warm answer written from its cells' encoded samples (codec/json_splice.py), gzipped
    here when the client takes gzip (from the spliced bytes, in a reused buffer, and the kept
    deflate fragments of their runs: codec/deflate.py; the middleware passes an encoded body
    through): (body, whether gzipped), or None if the result is not made of cells the cache
    reader keeps."""
    if not gzip_ok:
        body = splice_prometheus_json(result)
        return None if body is None else (body, False)
    with spliced_runs(result) as sp:
        if sp is None:
            return None
        if len(sp.body) >= MINIMUM_SIZE:
            return gzip_spliced(sp), True
        return sp.body.tobytes(), False


def json_response(result: QueryResult, headers: dict[str, str], release: Callable[[], None] | None = None,
                  gzip_ok: bool = False, ticket: Keeps | None = None) -> Response:
    """A result as Prometheus JSON, streamed when large. `gzip_ok`: the client takes gzip;
    `ticket`: a spliced body is kept under it for the same window asked again (answer_memo.py).
    Written here and now, so that the result goes before the body is sent: deferred to the
    send (in a worker thread), answers of 20 heavy queries at once stayed alive across the
    wait and scenario (e)'s peak went from +95 to +125-140 MiB over idle (bound: +116)."""
    if result.n_samples > STREAM_ABOVE_SAMPLES:
        return _held(_Stream(iter_prometheus_json(result), media_type=JSON, headers=headers), release)
    written = _spliced_body(result, gzip_ok) if spliceable(result) else None
    if written is None:
        body = encode_prometheus_json(result)
        if ticket is None or len(body) >= KEEP_UNSPLICED_BELOW:
            return _held(_Body(body, media_type=JSON, headers=headers), release)
        # Kept (its cells not spliced yet: read from the landing zone): gzipped here, as the
        # middleware would, so that the bytes kept are the bytes sent.
        written = (gzip_bytes(body), True) if gzip_ok and len(body) >= MINIMUM_SIZE else (body, False)
    body, gzipped = written
    if ticket is not None:
        ticket.keep(body, gzipped)
    return encoded_response(body, gzipped, headers, release)


def encoded_response(body: bytes, gzipped: bool, headers: dict[str, str],
                     release: Callable[[], None] | None = None) -> Response:
    """An answer's JSON written already (gzip when `gzipped`)."""
    if gzipped:
        headers = {**headers, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
    return _held(_Body(body, media_type=JSON, headers=headers), release)


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
        if answer.encoded is not None:
            body, gzipped = answer.encoded.body, answer.encoded.gzipped
            if gzipped and not gzip_ok:  # kept for a client that takes gzip; not this one
                body, gzipped = gzip.decompress(body), False
            return encoded_response(body, gzipped, answer.headers, answer.release)
        assert answer.result is not None
        if answer.arrow:
            return arrow_response(answer.result, answer.headers, answer.release)
        return json_response(answer.result, answer.headers, answer.release, gzip_ok, answer.ticket)
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
