"""proxy/api/access_log.py: the middleware in front of every request. Each answer gets its
own query id and `nosniff`; each request is counted and timed under an endpoint label from a
fixed vocabulary (never the client's path); one log line says what happened (Grafana's ids,
the tenant, the plan's figures from the answer's headers, bytes sent; never a credential);
a slow query is logged again at WARNING; a query (only a query) is recorded for the operator
page, with the error's message when it failed. JsonFormatter writes one redacted JSON object
per record.

Driven in process: AccessLog around a small Starlette app whose routes answer as the query
routes do (headers X-Cache, X-Promaccel-*; request.state.promaccel_query)."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.api.access_log import AccessLog, JsonFormatter, endpoint_label, error_text
from proxy.observe.activity import ACTIVITY
from proxy.observe.metrics import METRICS

BAD = b'{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}'


async def _query(request: Request) -> Response:
    q = request.query_params.get("query", "")
    request.state.promaccel_query = {"query": q, "range": False, "plan_pieces": 3}
    if q == "bad":
        return Response(BAD, status_code=400, media_type="application/json")
    if q == "zipped-bad":
        return Response(gzip.compress(BAD), status_code=422, media_type="application/json",
                        headers={"Content-Encoding": "gzip"})
    if q == "boom":
        raise RuntimeError("a bug")
    if q == "slow":
        await asyncio.sleep(0.05)
    return Response(b'{"status":"success","data":{"resultType":"vector","result":[]}}', media_type="application/json",
                    headers={"X-Cache": "HIT", "X-Promaccel-Pieces": "3", "X-Promaccel-Backend-Calls": "0",
                             "X-Promaccel-Samples-Processed": "1200"})


async def _other(request: Request) -> Response:
    if request.query_params.get("tenant"):
        request.state.promaccel_tenant = request.query_params["tenant"]
    return Response(b"{}", media_type="application/json", headers={"X-Content-Type-Options": "nosniff"})


def _app(slow_query_s: float = 0.0) -> AccessLog:
    inner = Starlette(routes=[
        Route("/api/v1/query", _query, methods=["GET", "POST"]),
        Route("/api/v1/query_range", _query, methods=["GET", "POST"]),
        Route("/{rest:path}", _other, methods=["GET", "POST"]),
    ])
    return AccessLog(inner, slow_query_s=slow_query_s)


def _get(path: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None,
         slow_query_s: float = 0.0) -> httpx.Response:
    async def run() -> httpx.Response:
        # raise_app_exceptions off: a handler's exception is answered 500 as uvicorn would.
        transport = httpx.ASGITransport(app=_app(slow_query_s), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(path, params=params, headers=headers)
    return asyncio.run(run())


def _count(endpoint: str, code: str) -> float:
    return METRICS.registry.get_sample_value("promaccel_http_requests_total",
                                             {"endpoint": endpoint, "code": code}) or 0.0


def _recorded(query_id: str) -> dict[str, Any]:
    return next(r for r in ACTIVITY.snapshot()["recent"] if r["query_id"] == query_id)


# --- endpoint labels ----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "label"), [
    ("/api/v1/query", "/api/v1/query"),
    ("/api/v1/query_range", "/api/v1/query_range"),
    ("/api/v1/label/job/values", "/api/v1/label/:name/values"),
    ("/api/v1/label/%3Cscript%3E/values", "/api/v1/label/:name/values"),
    ("/api/v1/status/config", "/api/v1/status/*"),
    ("/api/v1/status/../../debug", "/api/v1/status/*"),
    ("/api/v1/query/", "other"),  # not the query endpoint: a label of its own would be the client's choice
    ("/random/path/12345", "other"),
    ("", "other"),
])
def test_endpoint_labels_come_from_a_fixed_vocabulary(path: str, label: str) -> None:
    assert endpoint_label(path) == label


def test_a_clients_paths_never_make_new_label_values() -> None:
    before = _count("other", "200")
    for i in range(5):
        _get(f"/made/up/{i}")
    assert _count("other", "200") == before + 5
    exposed = {s.labels["endpoint"] for m in METRICS.registry.collect() if m.name == "promaccel_http_requests"
               for s in m.samples}
    assert not any(e.startswith("/made/") for e in exposed)


# --- headers, metrics, log line -----------------------------------------------------------------


def test_every_answer_gets_its_own_query_id_and_nosniff_once() -> None:
    a, b = _get("/api/v1/query", {"query": "up"}), _get("/api/v1/query", {"query": "bad"})
    ids = [r.headers["x-promaccel-query-id"] for r in (a, b)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids) and ids[0] != ids[1]
    assert a.headers["x-content-type-options"] == b.headers["x-content-type-options"] == "nosniff"
    # A response that already says nosniff is not given a second header.
    c = _get("/api/v1/labels")
    assert c.headers.get_list("x-content-type-options") == ["nosniff"]


def test_requests_are_counted_by_endpoint_and_status_and_timed() -> None:
    ok0, bad0 = _count("/api/v1/query", "200"), _count("/api/v1/query", "400")
    n0 = METRICS.registry.get_sample_value("promaccel_http_request_duration_seconds_count",
                                           {"endpoint": "/api/v1/query"}) or 0.0
    _get("/api/v1/query", {"query": "up"})
    _get("/api/v1/query", {"query": "bad"})
    _get("/api/v1/query", {"query": "bad"})
    assert _count("/api/v1/query", "200") == ok0 + 1 and _count("/api/v1/query", "400") == bad0 + 2
    assert METRICS.registry.get_sample_value("promaccel_http_request_duration_seconds_count",
                                             {"endpoint": "/api/v1/query"}) == n0 + 3


def test_a_handlers_exception_is_counted_and_recorded_as_a_500() -> None:
    before = _count("/api/v1/query", "500")
    r = _get("/api/v1/query", {"query": "boom"})
    assert r.status_code == 500
    assert _count("/api/v1/query", "500") == before + 1


def test_the_log_line_says_what_happened_and_no_credential(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="promaccel.access")
    r = _get("/api/v1/query", {"query": "up"}, headers={
        "X-Dashboard-Uid": "gpu-fleet", "X-Panel-Id": "12", "Authorization": "Bearer sekrit-token-123",
        "X-Scope-OrgID": "team-a"})
    (record,) = [rec for rec in caplog.records if rec.name == "promaccel.access"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["query_id"] == r.headers["x-promaccel-query-id"] and fields["status"] == 200
    assert fields["method"] == "GET" and fields["path"] == "/api/v1/query"
    assert fields["dashboard_uid"] == "gpu-fleet" and fields["panel_id"] == "12"
    # The answer's headers, as numbers where they are numbers.
    assert fields["cache"] == "HIT" and fields["pieces"] == 3 and fields["samples_processed"] == 1200
    assert fields["backend_calls"] == 0
    assert fields["query"] == "up" and fields["plan_pieces"] == 3  # what the route noted
    assert fields["bytes"] == len(r.content) and fields["duration_ms"] >= 0
    line = record.getMessage()
    assert line.startswith("GET /api/v1/query 200 ") and "pieces=3" in line and "cache=HIT" in line
    assert "sekrit-token-123" not in line + orjson.dumps(fields, default=str).decode()
    assert "team-a" not in line  # only Grafana's headers are logged


def test_the_tenant_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="promaccel.access")
    _get("/api/v1/labels", {"tenant": "team-b"})
    (record,) = [rec for rec in caplog.records if rec.name == "promaccel.access"]
    assert record.fields["tenant"] == "team-b"  # type: ignore[attr-defined]


def test_a_slow_query_is_logged_again_at_warning_and_only_a_query(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="promaccel.slow")
    _get("/api/v1/query", {"query": "slow"}, slow_query_s=0.01)
    _get("/api/v1/labels", slow_query_s=0.000_001)  # not a query: never "slow"
    _get("/api/v1/query", {"query": "up"}, slow_query_s=30)  # a fast query
    slow = [rec for rec in caplog.records if rec.name == "promaccel.slow"]
    assert len(slow) == 1 and slow[0].levelno == logging.WARNING
    assert "slow query" in slow[0].getMessage() and slow[0].getMessage().endswith(": slow")
    assert not [rec for rec in caplog.records if rec.name == "promaccel.slow" and "labels" in rec.getMessage()]


def test_slow_query_logging_off_at_zero(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="promaccel.slow")
    _get("/api/v1/query", {"query": "slow"}, slow_query_s=0)
    assert not [rec for rec in caplog.records if rec.name == "promaccel.slow"]


# --- the operator page's records ----------------------------------------------------------------


def test_queries_are_recorded_with_their_outcome_and_other_paths_are_not() -> None:
    ok = _get("/api/v1/query", {"query": "up"}, headers={"X-Dashboard-Uid": "d1", "X-Panel-Id": "4"})
    bad = _get("/api/v1/query_range", {"query": "bad"})
    other = _get("/api/v1/labels")
    done = _recorded(ok.headers["x-promaccel-query-id"])
    assert done["status"] == 200 and done["error"] is None and done["path"] == "/api/v1/query"
    assert done["dashboard_uid"] == "d1" and done["panel_id"] == "4" and done["cache"] == "HIT"
    assert done["bytes"] == len(ok.content) and done["duration_ms"] >= 0
    failed = _recorded(bad.headers["x-promaccel-query-id"])
    assert failed["status"] == 400 and failed["error"] == "bad_data: 1:5: parse error: unexpected end of input"
    assert all(r["query_id"] != other.headers["x-promaccel-query-id"] for r in ACTIVITY.snapshot()["recent"])


def test_a_compressed_error_is_recorded_without_its_bytes() -> None:
    r = _get("/api/v1/query", {"query": "zipped-bad"}, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 422
    assert _recorded(r.headers["x-promaccel-query-id"])["error"] == "(compressed error body)"


def test_error_text_of_bodies_that_are_not_prometheus_errors() -> None:
    assert error_text(b"", False) == "(no body)"
    assert error_text(b"  upstream connect error  ", False) == "upstream connect error"
    assert error_text(b"x" * 1000, False) == "x" * 200  # cut: an HTML error page is not kept whole
    assert error_text(b'{"message":"Rate exceeded"}', False) == '{"message":"Rate exceeded"}'
    assert error_text(b'{"status":"error","error":"no type"}', False) == "no type"
    assert error_text(b"\xff\xfe", False) == "\ufffd\ufffd"


# --- JsonFormatter ------------------------------------------------------------------------------


def test_json_formatter_writes_one_redacted_object_per_record() -> None:
    rec = logging.LogRecord("promaccel.access", logging.INFO, __file__, 1, "GET %s password=%s", ("/q", "hunter22"),
                            None)
    rec.fields = {"status": 200, "query": 'up{a="b"} password=hunter22', "n": 3}  # type: ignore[attr-defined]
    out = orjson.loads(JsonFormatter().format(rec))
    assert out["level"] == "info" and out["logger"] == "promaccel.access"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", out["ts"])
    assert out["status"] == 200 and out["n"] == 3 and out["query"].startswith('up{a="b"}')
    assert "hunter22" not in orjson.dumps(out).decode()


def test_json_formatter_keeps_the_exception_redacted() -> None:
    try:
        raise ValueError("Authorization: Bearer abc.def.ghi-secret")
    except ValueError:
        import sys

        rec = logging.LogRecord("promaccel", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = orjson.loads(JsonFormatter().format(rec))
    assert "ValueError" in out["exception"] and "abc.def.ghi-secret" not in out["exception"]
    assert out["msg"] == "failed" and out["level"] == "error"
