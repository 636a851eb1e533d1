"""proxy/api/responses.py: a query's answer as an HTTP response. A merged result is
Prometheus JSON (streamed in chunks above STREAM_ABOVE_SAMPLES, the same document either
way) or an Arrow stream; a backend's reply is relayed with its status and body but always as
application/json with nosniff (a backend's text/html once came out of promaccel's origin,
issue 26); an error is Prometheus's error JSON with its kind's status. An answer's share of
the answer-bytes budget is given back exactly once, after the body went out or the client
went away, and also when the response could not be built.

The expected JSON is written here from the samples (values chosen so that Go's and Python's
float formatting agree: integers and halves, NaN, +Inf, -Inf)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Message

from proxy.api.responses import (
    ARROW_STREAM,
    JSON,
    RELAY_HEADERS,
    STREAM_ABOVE_SAMPLES,
    arrow_response,
    error,
    json_response,
    relay,
    releasing,
    response_of,
    unknown_path,
)
from proxy.backends import BackendReply
from proxy.errors import PromError
from proxy.pipeline.values import Answer
from proxy.result import QueryResult

T0_MS = 1_793_404_800_000


def _matrix(n_series: int, points: int, special: bool = False) -> QueryResult:
    labels = [{"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": f"node-{i:03d}"} for i in range(n_series)]
    t = np.tile(T0_MS + np.arange(points, dtype=np.int64) * 30_000, n_series)
    v = np.arange(n_series * points, dtype=np.float64) * 0.5
    if special:
        v[:3] = [math.nan, math.inf, -math.inf]
    return QueryResult("matrix", labels, np.arange(n_series + 1, dtype=np.int64) * points, t, v, ["w1"], [])


def _text(v: float) -> str:
    """Prometheus's text of a sample value (strconv.FormatFloat(v, 'f', -1, 64) for these)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v == int(v) else str(v)


def _expected(r: QueryResult) -> dict[str, Any]:
    result = []
    for i, labels in enumerate(r.labels):
        lo, hi = int(r.offsets[i]), int(r.offsets[i + 1])
        # Timestamps as float seconds; a whole second is written without a fraction.
        values = [[int(t) // 1000, _text(float(v))] for t, v in zip(r.t_ms[lo:hi], r.value[lo:hi])]
        result.append({"metric": labels, "values": values})
    out: dict[str, Any] = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    if r.warnings:
        out["warnings"] = r.warnings
    return out


class Sent:
    """An ASGI `send` that keeps what was sent; `fail_after` body messages, it raises (the
    client went away)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.messages: list[Message] = []
        self.fail_after = fail_after

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.body" and self.fail_after is not None:
            if sum(m["type"] == "http.response.body" for m in self.messages) >= self.fail_after:
                raise OSError("client went away")
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode().lower(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    @property
    def chunks(self) -> int:
        return sum(1 for m in self.messages[1:] if m.get("body"))


def _send(response: Response, sent: Sent) -> Sent:
    async def receive() -> Message:
        await asyncio.sleep(3600)  # the client never disconnects on its own here
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "asgi": {"spec_version": "2.4"}}
    asyncio.run(response(scope, receive, sent))
    return sent


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def test_json_response_is_prometheus_json_with_the_answers_headers() -> None:
    r = _matrix(3, 4, special=True)
    release = Counter()
    sent = _send(json_response(r, {"X-Cache": "MISS"}, release), Sent())
    assert sent.status == 200 and sent.headers["content-type"] == JSON and sent.headers["x-cache"] == "MISS"
    assert orjson.loads(sent.body) == _expected(r)
    assert release.n == 1


def test_a_large_answer_is_streamed_in_chunks_as_the_same_document() -> None:
    points = STREAM_ABOVE_SAMPLES // 4 + 1
    r = _matrix(4, points)
    assert r.n_samples > STREAM_ABOVE_SAMPLES
    release = Counter()
    sent = _send(json_response(r, {}, release), Sent())
    assert "content-length" not in sent.headers and sent.chunks > 1
    assert orjson.loads(sent.body) == _expected(r)
    assert release.n == 1
    # At the threshold itself: one body, with its length.
    small = _send(json_response(_matrix(4, STREAM_ABOVE_SAMPLES // 4), {}), Sent())
    assert int(small.headers["content-length"]) == len(small.body)


def test_release_runs_once_when_the_client_goes_away_mid_stream() -> None:
    r = _matrix(4, STREAM_ABOVE_SAMPLES // 4 + 1)
    release = Counter()
    with pytest.raises((OSError, ClientDisconnect)):  # Starlette reports it as the client gone
        _send(json_response(r, {}, release), Sent(fail_after=1))
    assert release.n == 1


def test_arrow_response_holds_the_samples_and_labels() -> None:
    r = _matrix(2, 3)
    sent = _send(arrow_response(r, {"X-Cache": "HIT"}), Sent())
    assert sent.headers["content-type"] == ARROW_STREAM and sent.headers["x-cache"] == "HIT"
    table = pa.ipc.open_stream(sent.body).read_all()
    assert table.column("value").to_pylist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [T0_MS, T0_MS + 30_000, T0_MS + 60_000] * 2
    assert [dict(m) for m in table.column("labels").to_pylist()][3] == r.labels[1]
    assert table.schema.metadata[b"promaccel.result_type"] == b"matrix"


def test_relay_keeps_status_and_body_but_never_the_backends_type() -> None:
    body = b'<script>alert(1)</script>'
    reply = BackendReply(502, bytearray(body), "text/html", {"Content-Type": "text/html"})
    sent = _send(relay(reply, {"X-Cache": "MISS", "Content-Type": "text/html"}), Sent())
    assert sent.status == 502 and sent.body == body
    assert sent.headers["content-type"] == JSON and sent.headers["x-content-type-options"] == "nosniff"
    assert sent.headers["x-cache"] == "MISS"
    assert RELAY_HEADERS == {"Content-Type": JSON, "X-Content-Type-Options": "nosniff"}


def test_releasing_calls_back_once_after_the_body_of_any_response() -> None:
    release = Counter()
    plain = Response(b'{"status":"success","data":[]}', status_code=200, media_type=JSON, headers={"X-A": "1"})
    out = releasing(plain, release)
    assert release.n == 0
    sent = _send(out, Sent())
    assert release.n == 1 and sent.body == plain.body and sent.headers["x-a"] == "1" and sent.status == 200
    # A relay already carrying no release takes this one, itself.
    reply_release = Counter()
    relayed = relay(BackendReply(200, b"{}", JSON))
    assert releasing(relayed, reply_release) is relayed
    _send(relayed, Sent())
    assert reply_release.n == 1


def test_response_of_a_reply_a_result_and_an_arrow_result() -> None:
    result = _matrix(1, 2)
    counters = [Counter() for _ in range(3)]
    reply = BackendReply(400, b'{"status":"error","errorType":"bad_data","error":"parse error"}', JSON)
    a = _send(response_of(Answer(reply=reply, headers={"X-Cache": "MISS"}, release=counters[0])), Sent())
    assert a.status == 400 and orjson.loads(a.body)["error"] == "parse error" and a.headers["x-cache"] == "MISS"
    b = _send(response_of(Answer(result=result, release=counters[1])), Sent())
    assert orjson.loads(b.body) == _expected(result)
    c = _send(response_of(Answer(result=result, arrow=True, release=counters[2])), Sent())
    assert c.headers["content-type"] == ARROW_STREAM
    assert [k.n for k in counters] == [1, 1, 1]


def test_response_of_gives_the_budget_back_when_it_cannot_build_a_response() -> None:
    release = Counter()
    with pytest.raises(AssertionError):
        response_of(Answer(release=release))  # neither a result nor a reply: a bug, but no leak
    assert release.n == 1


@pytest.mark.parametrize(("kind", "status"), [("bad_data", 400), ("execution", 422), ("unavailable", 503),
                                               ("too_large", 413), ("internal", 500)])
def test_error_is_prometheus_error_json_with_the_kinds_status(kind: str, status: int) -> None:
    sent = _send(error(PromError(kind, "what went wrong")), Sent())
    assert sent.status == status and sent.headers["content-type"] == JSON
    body = orjson.loads(sent.body)
    # Prometheus's fields; 413 has no errorType of its own in Prometheus: bad_data.
    assert body == {"status": "error", "errorType": "bad_data" if kind == "too_large" else kind,
                    "error": "what went wrong"}
    assert list(body) == ["status", "errorType", "error"]


def test_error_carries_its_headers_and_a_status_of_its_own() -> None:
    exc = PromError("unauthorized", "no credentials", status=401, headers={"WWW-Authenticate": 'Basic realm="p"'})
    sent = _send(error(exc), Sent())
    assert sent.status == 401 and sent.headers["www-authenticate"] == 'Basic realm="p"'


def test_unknown_path_is_a_404_naming_the_path() -> None:
    sent = _send(unknown_path("/api/v2/query"), Sent())
    body = orjson.loads(sent.body)
    assert sent.status == 404 and body["errorType"] == "not_found" and "'/api/v2/query'" in body["error"]
