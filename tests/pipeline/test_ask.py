"""Backend asks (proxy/pipeline/ask.py): the path and form of a piece's call -- fixed API paths,
exact times, the client's query text only ever a form value -- and the protocol quirks the
asker absorbs: AMP's `stats=all` and its refusal of long instant queries, an error page turned
into a Prometheus-style error naming the backend."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from proxy.backends import Backend, BackendReply
from proxy.config import build_config
from proxy.observe.metrics import METRICS
from proxy.pipeline.ask import Asker, instant_of, needs_range_form, query_call, seconds
from proxy.pipeline.context import RequestContext
from proxy.pipeline.values import Pairs, PieceFailed
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.recording import recording_backend

T = 1_700_000_000_000
HOSTILE = 'up{job="/../../admin?x=1#"} or vector(1) # http://127.0.0.2/steal'


def test_seconds_are_exact() -> None:
    # Prometheus reads times as decimal seconds: each must mean the very millisecond meant (a
    # float's repr could read 1700000000.0009999).
    for ms in (T, T + 1, T + 999, T + 500, 0, 1, -1, -1_500, 1_753_999_999_999):
        assert Decimal(seconds(ms)) * 1000 == ms, ms
    assert seconds(T) == "1700000000" and seconds(-1000) == "-1"


def test_a_call_has_a_fixed_path_and_the_query_only_in_the_form() -> None:
    path, form = query_call(HOSTILE, Span.range(T, T + 3_600_000, 60_000), [("timeout", "10s")])
    assert path == "/api/v1/query_range"
    assert form == [("query", HOSTILE), ("start", "1700000000"), ("end", "1700003600"), ("step", "60"),
                    ("timeout", "10s")]
    path, form = query_call(HOSTILE, Span.instant(T + 250))
    assert (path, form) == ("/api/v1/query", [("query", HOSTILE), ("time", "1700000000.250")])


def ask(asker: Asker, backend: Any, path: str, form: Pairs, ctx: RequestContext | None = None) -> QueryResult:
    async def go() -> QueryResult:
        try:
            return await asker(cast(Backend, backend), path, form, 5.0, ctx or RequestContext())
        finally:
            if isinstance(backend, Backend):
                await backend.aclose()

    return asyncio.run(go())


def test_on_the_wire_the_path_is_the_backends_and_the_query_a_form_value() -> None:
    with recording_backend(None) as rec:
        cfg = build_config({"backends": [{"name": "prom", "url": rec.url + "/prefix"}]}).backends[0]
        path, form = query_call(HOSTILE, Span.range(T, T + 600_000, 60_000))
        got = ask(Asker(), Backend(cfg), path, form)
        (seen,) = rec.snapshot()
    assert (seen.method, seen.path) == ("POST", "/prefix/api/v1/query_range")
    assert dict(seen.form)["query"] == HOSTILE and got.result_type == "vector"  # EMPTY_VECTOR


class Scripted:
    """A backend (as the asker sees one) answering each call with the next reply."""

    def __init__(self, kind: str, *replies: BackendReply) -> None:
        self.cfg = SimpleNamespace(kind=kind)
        self.name = "amp-test"
        self.replies = list(replies)
        self.calls: list[tuple[str, Pairs]] = []

    async def request(self, method: str, path: str, *, form: Pairs, check: Any = None, **kw: Any) -> BackendReply:
        self.calls.append((path, list(form)))
        reply = self.replies.pop(0)
        if reply.ok and check is not None:
            assert check(reply) is None  # the asker's own soundness check decodes the body
        return reply


def ok(data: dict[str, Any], samples: int | None = None) -> BackendReply:
    body: dict[str, Any] = {"status": "success", "data": data}
    if samples is not None:
        body["data"]["stats"] = {"samples": {"totalQueryableSamples": samples}}
    return BackendReply(200, orjson.dumps(body), "application/json")


MATRIX = {"resultType": "matrix", "result": [{"metric": {"job": "a"}, "values": [[T / 1000, "2"]]}]}
RANGE_ONLY = BackendReply(422, b'{"status":"error","errorType":"bad_data","error":"instant queries with a range of '
                               b'32 days or more are only supported for range type queries"}', "application/json")


def samples_processed(name: str) -> float:
    return METRICS.samples_processed.labels(name)._value.get()  # type: ignore[no-any-return]


def test_amp_is_asked_for_stats_and_its_samples_counted() -> None:
    backend = Scripted("amp", ok(MATRIX, samples=1234))
    before = samples_processed("amp-test")
    ctx = RequestContext()
    ask(Asker(), backend, *query_call("sum(up)", Span.range(T, T, 60_000)), ctx)
    assert ("stats", "all") in backend.calls[0][1]
    # Per backend in /metrics, per answer in its context (X-Promaccel-Samples-Processed).
    assert samples_processed("amp-test") - before == ctx.samples.samples == 1234
    prom = Scripted("prometheus", ok(MATRIX))
    ask(Asker(), prom, *query_call("sum(up)", Span.range(T, T, 60_000)))
    assert all(k != "stats" for k, _ in prom.calls[0][1])  # only AMP bills by samples


def test_amps_refusal_of_a_long_instant_query_is_asked_as_one_step_of_a_range_query() -> None:
    backend = Scripted("amp", RANGE_ONLY, ok(MATRIX))
    ctx = RequestContext()
    got = ask(Asker(), backend, *query_call("max_over_time(up[40d])", Span.instant(T)), ctx)
    assert ctx.budget.calls == 2  # each call is charged to the query's budget
    (p1, _), (p2, form) = backend.calls
    assert (p1, p2) == ("/api/v1/query", "/api/v1/query_range")
    assert [(k, v) for k, v in form if k in ("start", "end")] == [("start", "1700000000"), ("end", "1700000000")]
    # The range answer's one step is the instant answer: a vector at T.
    assert got.result_type == "vector" and got.to_pylist() == [({"job": "a"}, [T], [2.0])]
    assert needs_range_form(cast(Backend, backend), "/api/v1/query", RANGE_ONLY)
    assert not needs_range_form(cast(Backend, Scripted("prometheus")), "/api/v1/query", RANGE_ONLY)
    assert not needs_range_form(cast(Backend, backend), "/api/v1/query_range", RANGE_ONLY)


def test_a_scalar_querys_one_step_is_a_scalar() -> None:
    one = QueryResult.from_series("matrix", [({}, [T], [3.5])])
    got = instant_of(one, "scalar(sum(up))", T)
    assert got.result_type == "scalar" and list(got.value) == [3.5]


def test_an_error_page_becomes_a_prometheus_error_naming_the_backend() -> None:
    page = BackendReply(502, b"<html><body>Bad Gateway</body></html>", "text/html")
    with pytest.raises(PieceFailed) as failed:
        ask(Asker(), Scripted("prometheus", page), *query_call("sum(up)", Span.instant(T)))
    body = orjson.loads(failed.value.reply.body)
    assert failed.value.reply.status == 502 and body["status"] == "error"
    assert "amp-test" in body["error"] and "<html>" not in body["error"]
