"""The query routes: /api/v1/query, /api/v1/query_range and promaccel's /api/v1/explain.

Parameters are parsed and validated as Prometheus does (params.py) before the executor sees
them; `limits.max_query_range` refuses a range query over it with a 422.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from shardplanner.plan import QueryRequest

from ..backends.redaction import redact
from ..config import Config
from ..errors import PromError
from ..pipeline import Answer, QueryService
from ..pipeline.context import RequestContext
from .forms import Pairs, first_values, read_pairs
from .params import format_duration_ms, parse_instant, parse_range
from .responses import JSON, relay, response_of
from .routing import Routes
from .tenants import caller_of, record_of, view_of


def _client(request: Request) -> str:
    """The client's address (who counts against limits.max_queries_per_client)."""
    return request.client.host if request.client is not None else ""


def _note(request: Request, form: dict[str, str], is_range: bool) -> dict[str, str]:
    """The query's text for the operator page while it runs (proxy/observe/activity.py)."""
    record = record_of(request)
    if record is not None:
        record.note(range=is_range)
        if "query" in form:
            record.note(query=redact(form["query"]))  # as the access log line is
    return form


def _service(request: Request) -> QueryService:
    return view_of(request).service


def _answer(request: Request, req: QueryRequest, answer: Answer) -> Response:
    """The response, and what the access log says about the query (request.state)."""
    request.state.promaccel_query = {"query": req.query[:1000], "range": req.is_range, **answer.info}
    return response_of(answer, "gzip" in request.headers.get("accept-encoding", ""))


async def _expired(request: Request, path: str, pairs: Pairs) -> Response:
    """A `timeout` of zero or less (under 1 ms): Prometheus runs such a query on a deadline
    already past, so its answer is a 503 -- unless the query does not parse (400). The primary
    backend gives that verdict on the request as it came."""
    reply = await view_of(request).primary.request_sound("POST", path, form=pairs, endpoint=path,
                                                         caller=caller_of(request))
    return relay(reply)


def add_query_routes(route: Routes, config: Config) -> None:
    """The query routes; each request runs on its view's service (tenants.py)."""
    max_body = config.limits.max_body_bytes

    @route("/api/v1/query")
    async def query(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        p = parse_instant(_note(request, first_values(pairs), False), now_ms=int(time.time() * 1000))
        if p.timeout_ms is not None and p.timeout_ms <= 0:
            return await _expired(request, "/api/v1/query", pairs)
        req = QueryRequest.instant(p.query, p.time_ms)
        ctx = RequestContext.start(caller_of(request), config.limits, p.timeout_ms)
        return _answer(request, req, await _service(request).query(req, pairs, request.headers, ctx,
                                                          _client(request)))

    @route("/api/v1/query_range")
    async def query_range(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        p = parse_range(_note(request, first_values(pairs), True), config.limits.max_points)
        if p.timeout_ms is not None and p.timeout_ms <= 0:
            return await _expired(request, "/api/v1/query_range", pairs)
        limit = config.limits.max_query_range
        if limit and p.end_ms - p.start_ms > limit:
            raise PromError(
                "execution",
                f"the query range of {format_duration_ms(p.end_ms - p.start_ms)} exceeds the limit of "
                f"{format_duration_ms(limit)} (limits.max_query_range): narrow the time range",
            )
        req = QueryRequest.range(p.query, p.start_ms, p.end_ms, p.step_ms)
        ctx = RequestContext.start(caller_of(request), config.limits, p.timeout_ms)
        return _answer(request, req, await _service(request).query(req, pairs, request.headers, ctx,
                                                          _client(request)))

    @route("/api/v1/explain")
    async def explain(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        form = first_values(pairs)
        if "step" in form or "start" in form:
            rp = parse_range(form, config.limits.max_points)
            req = QueryRequest.range(rp.query, rp.start_ms, rp.end_ms, rp.step_ms)
        else:
            ip = parse_instant(form, now_ms=int(time.time() * 1000))
            req = QueryRequest.instant(ip.query, ip.time_ms)
        data = await _service(request).explain(req, request.headers, pairs, caller_of(request))
        return Response(orjson.dumps({"status": "success", "data": data}), media_type=JSON)
