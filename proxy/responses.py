"""Answers as HTTP responses: Prometheus JSON (streamed when large), an Arrow IPC stream, or a
backend's reply relayed as it came."""

from __future__ import annotations

from starlette.responses import Response, StreamingResponse

from .backend import BackendReply
from .codec.arrow import encode_arrow_stream
from .codec.json_encode import encode_prometheus_json, iter_prometheus_json
from .pipeline.values import ARROW_STREAM, Answer
from .result import QueryResult

JSON = "application/json"
# Answers above this many samples are encoded in chunks as they are sent: a 20 MB answer
# then costs ~4 MB of encoder memory instead of ~50 MB (loadtests/codec_bench.py).
STREAM_ABOVE_SAMPLES = 200_000


def json_response(result: QueryResult, headers: dict[str, str]) -> Response:
    if result.n_samples > STREAM_ABOVE_SAMPLES:
        return StreamingResponse(iter_prometheus_json(result), media_type=JSON, headers=headers)
    return Response(encode_prometheus_json(result), media_type=JSON, headers=headers)


def relay(reply: BackendReply, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=reply.body,
        status_code=reply.status,
        headers={"Content-Type": reply.content_type, **(headers or {})},
    )


def response_of(answer: Answer) -> Response:
    if answer.reply is not None:
        return relay(answer.reply, answer.headers)
    assert answer.result is not None
    if answer.arrow:
        return Response(encode_arrow_stream(answer.result), media_type=ARROW_STREAM, headers=answer.headers)
    return json_response(answer.result, answer.headers)
