"""The HTTP surface: Prometheus's API, thin routes over the query service.

Routes only parse and validate (as Prometheus does) and hand a request to `QueryService`;
they never talk to a backend themselves except to relay the metadata endpoints.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
import urllib.parse
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardplanner.ast import Selector
from shardplanner.plan import QueryRequest
from shardplanner.promql import CannotParse, parse

from . import __version__
from .backend import Backend, BackendReply
from .compress import FastGZipMiddleware
from .config import Config
from .errors import PromError
from .forms import client_gone, first_values, read_pairs
from .memory import tune_malloc
from .metadata import fan_out, metric_names
from .metrics import METRICS
from .params import format_duration_ms, parse_instant, parse_optional_time, parse_range
from .pipeline import QueryService
from .responses import response_of
from .result.golang import go_quote
from .tenancy import Tenancy
from .tenancy import use as use_tenant

log = logging.getLogger("promaccel")
access_log = logging.getLogger("promaccel.access")

JSON = "application/json"
# Headers Grafana sends; kept for the access log (never auth headers).
GRAFANA_HEADERS = ("x-dashboard-uid", "x-panel-id", "x-grafana-org-id", "x-query-group-id", "x-datasource-uid")

PROMETHEUS_COMPAT_VERSION = "2.42.0"

# Relays never put client text into a backend path unchecked (a double-encoded `..%252F`
# once reached /debug/pprof through a backend's redirect): /api/v1/status/<what> relays only
# Prometheus 2.42's own pages (buildinfo has its own handler), and /api/v1/label/<name>/values
# only names Prometheus accepts (model.LabelNameRE), with the same 400 Prometheus gives.
STATUS_PAGES = frozenset({"config", "flags", "runtimeinfo", "tsdb", "walreplay"})
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _reply(reply: BackendReply, extra_headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=reply.body,
        status_code=reply.status,
        media_type=None,
        headers={"Content-Type": reply.content_type, **(extra_headers or {})},
    )


def _error(exc: PromError) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type=JSON)


class AccessLog:
    """Times each request, counts it by endpoint, and logs it with Grafana's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - t0
            endpoint = _endpoint_label(scope.get("path", ""))
            METRICS.requests.labels(endpoint, str(status)).inc()
            METRICS.request_latency.labels(endpoint).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                hdrs = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
                grafana = " ".join(f"{h}={hdrs[h]}" for h in GRAFANA_HEADERS if h in hdrs)
                access_log.info(
                    "%s %s %d %.1fms %s", scope.get("method"), scope.get("path"), status, elapsed * 1000, grafana
                )


_KNOWN = {
    "/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels", "/api/v1/metadata",
    "/api/v1/query_exemplars", "/api/v1/format_query", "/api/v1/rules", "/api/v1/alerts",
    "/api/v1/explain", "/-/healthy", "/-/ready", "/metrics", "/api/v1/status/buildinfo",
    "/api/v1/admin/cache/invalidate", "/api/v1/admin/cache/generation", "/api/v1/admin/cache/stats",
}


def _endpoint_label(path: str) -> str:
    if path in _KNOWN:
        return path
    if path.startswith("/api/v1/label/"):
        return "/api/v1/label/:name/values"
    if path.startswith("/api/v1/status/"):
        return "/api/v1/status/*"
    return "other"


def create_app(config: Config) -> FastAPI:
    tune_malloc()
    backends = [Backend(b) for b in config.backends]
    primary = backends[0]
    executor = QueryService(config, backends)
    max_body = config.limits.max_body_bytes
    tenancy = Tenancy(config.tenancy.forward_headers, config.tenancy.hash_key())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await executor.start()
        try:
            yield
        finally:
            await executor.aclose()
            for b in backends:
                await b.aclose()

    app = FastAPI(
        title="promaccel", version=__version__, lifespan=lifespan,
        docs_url=None, redoc_url=None, openapi_url=None,
    )
    app.state.executor = executor

    Handler = Callable[[Request], Awaitable[Response]]

    def route(path: str, methods: tuple[str, ...] = ("GET", "POST")) -> Callable[[Handler], Handler]:
        def deco(fn: Handler) -> Handler:
            async def wrapped(request: Request) -> Response:
                # tenancy.forward_headers of this request reach every backend call made for
                # it, and scope its cache keys (proxy/tenancy.py).
                with use_tenant(tenancy.of(request.headers)):
                    try:
                        return await fn(request)
                    except PromError as exc:
                        return _error(exc)
            app.add_api_route(path, wrapped, methods=list(methods), include_in_schema=False)
            return fn
        return deco

    @route("/api/v1/query")
    async def query(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        p = parse_instant(first_values(pairs), now_ms=int(time.time() * 1000))
        return response_of(await executor.instant(p, pairs, request.headers))

    @route("/api/v1/query_range")
    async def query_range(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        p = parse_range(first_values(pairs), config.limits.max_points)
        limit = config.limits.max_query_range
        if limit and p.end_ms - p.start_ms > limit:
            raise PromError(
                "execution",
                f"the query range of {format_duration_ms(p.end_ms - p.start_ms)} exceeds the limit of "
                f"{format_duration_ms(limit)} (limits.max_query_range): narrow the time range",
            )
        return response_of(await executor.range(p, pairs, request.headers))

    @route("/api/v1/explain")
    async def explain(request: Request) -> Response:
        pairs = await read_pairs(request, max_body)
        form = first_values(pairs)
        if "step" in form or "start" in form:
            rp = parse_range(form, config.limits.max_points)
            req = QueryRequest(query=rp.query, start_ms=rp.start_ms, end_ms=rp.end_ms, step_ms=rp.step_ms)
        else:
            ip = parse_instant(form, now_ms=int(time.time() * 1000))
            req = QueryRequest(query=ip.query, time_ms=ip.time_ms)
        data = await executor.explain(req, request.headers, pairs)
        return Response(orjson.dumps({"status": "success", "data": data}), media_type=JSON)

    # --- cache administration (token required) ---------------------------------------
    admin_token = config.cache.admin_token or os.environ.get("PROMACCEL_ADMIN_TOKEN") or None

    def check_admin(request: Request) -> None:
        if not admin_token:
            raise PromError("forbidden", "admin endpoints disabled: set cache.admin_token or "
                            "PROMACCEL_ADMIN_TOKEN", status=403)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise PromError("unauthorized", "admin endpoints need 'Authorization: Bearer <token>'", status=401)
        if not hmac.compare_digest(token.strip().encode(), admin_token.encode()):
            raise PromError("forbidden", "wrong admin token", status=403)

    @route("/api/v1/admin/cache/invalidate", ("POST",))
    async def cache_invalidate(request: Request) -> Response:
        check_admin(request)
        pairs = await read_pairs(request, max_body)
        matches = [v for k, v in pairs if k == "match[]"]
        if not matches:
            raise PromError("bad_data", "no match[] parameter provided (match[]={__name__=~\".+\"} drops "
                            "everything; so does POST /api/v1/admin/cache/generation)")
        names: set[str] | None = set()
        for m in matches:
            try:
                node = parse(m)
            except CannotParse as exc:
                raise PromError("bad_data", f'invalid parameter "match[]": {exc}') from None
            if not isinstance(node, Selector):
                raise PromError("bad_data", f'invalid parameter "match[]": {m!r} is not a series selector')
            if node.metric_name is None:
                names = None  # no plain metric name: every metric
            elif names is not None:
                names.add(node.metric_name)
        form = first_values(pairs)
        start_ms, end_ms = parse_optional_time(form, "start"), parse_optional_time(form, "end")
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise PromError("bad_data", "end timestamp must not be before start time")
        dropped = await executor.invalidate(None if names is None else sorted(names), start_ms, end_ms)
        return Response(orjson.dumps({"status": "success", "data": {
            "dropped": dropped, "metrics": None if names is None else sorted(names),
            "start_ms": start_ms, "end_ms": end_ms}}), media_type=JSON)

    @route("/api/v1/admin/cache/generation", ("POST",))
    async def cache_generation(request: Request) -> Response:
        check_admin(request)
        generation = await executor.bump_generation()
        return Response(orjson.dumps({"status": "success", "data": {"generation": generation}}), media_type=JSON)

    @route("/api/v1/admin/cache/stats", ("GET",))
    async def cache_stats(request: Request) -> Response:
        check_admin(request)
        return Response(orjson.dumps({"status": "success", "data": executor.cache_stats()}), media_type=JSON)

    async def relay(request: Request, path: str, kind: str | None = None) -> Response:
        pairs = await read_pairs(request, max_body)
        if kind is not None and executor.hybrid:
            form = first_values(pairs)
            start_ms, end_ms = parse_optional_time(form, "start"), parse_optional_time(form, "end")
            names: list[str | None] | None = (
                [form["metric"]] if kind == "metadata" and form.get("metric") else metric_names(pairs))
            return await fan_out(backends, request.method, path, pairs, kind, names,
                                 start_ms, end_ms, int(time.time() * 1000), _endpoint_label(path))
        if request.method == "POST":
            reply = await primary.request("POST", path, form=pairs, endpoint=_endpoint_label(path))
        else:
            reply = await primary.request("GET", path, params=pairs, endpoint=_endpoint_label(path))
        return _reply(reply)

    def relaying(p: str, kind: str | None) -> Handler:
        async def handler(request: Request) -> Response:
            return await relay(request, p, kind)
        return handler

    # Series, labels, label values and metadata fan out over a hybrid fleet (proxy/metadata.py).
    for path, methods, kind in (
        ("/api/v1/series", ("GET", "POST"), "series"),
        ("/api/v1/labels", ("GET", "POST"), "labels"),
        ("/api/v1/query_exemplars", ("GET", "POST"), None),
        ("/api/v1/format_query", ("GET", "POST"), None),
        ("/api/v1/metadata", ("GET",), "metadata"),
        ("/api/v1/rules", ("GET",), None),
        ("/api/v1/alerts", ("GET",), None),
        ("/api/v1/targets", ("GET",), None),
        ("/api/v1/targets/metadata", ("GET",), None),
        ("/api/v1/alertmanagers", ("GET",), None),
    ):
        route(path, methods)(relaying(path, kind))

    @route("/api/v1/label/{name}/values", ("GET",))
    async def label_values(request: Request) -> Response:
        name = request.path_params["name"]  # percent-decoded once, as Go's router does
        if not LABEL_NAME.fullmatch(name):
            raise PromError("bad_data", f"invalid label name: {go_quote(name)}")
        return await relay(request, f"/api/v1/label/{urllib.parse.quote(name, safe='')}/values", "values")

    @route("/api/v1/status/buildinfo", ("GET",))
    async def buildinfo(request: Request) -> Response:
        # AMP has no buildinfo (404); Grafana reads `version` to pick PromQL features, so
        # promaccel answers with the backend's if it has one, and its own otherwise.
        data: dict[str, Any] = {
            "version": PROMETHEUS_COMPAT_VERSION,
            "revision": f"promaccel-{__version__}",
            "branch": "promaccel",
            "buildUser": "promaccel",
            "buildDate": "",
            "goVersion": "promaccel (python)",
        }
        try:
            reply = await primary.request("GET", "/api/v1/status/buildinfo", endpoint="buildinfo", timeout_s=5)
            if reply.ok:
                backend_data = orjson.loads(reply.body).get("data") or {}
                if isinstance(backend_data, dict) and backend_data.get("version"):
                    data.update(backend_data)
        except (PromError, orjson.JSONDecodeError, AttributeError):
            pass
        data["promaccel"] = __version__
        return Response(orjson.dumps({"status": "success", "data": data}), media_type=JSON)

    @route("/api/v1/status/{what}", ("GET",))
    async def status(request: Request) -> Response:
        what = request.path_params["what"]
        if what not in STATUS_PAGES:
            return await not_found(request)
        return await relay(request, f"/api/v1/status/{urllib.parse.quote(what, safe='')}")

    @app.get("/-/healthy", include_in_schema=False)
    async def healthy() -> Response:
        return Response("promaccel is Healthy.\n", media_type="text/plain")

    @app.get("/-/ready", include_in_schema=False)
    async def ready() -> Response:
        for b in backends:
            if await executor.backend_ready(b):
                return Response("promaccel is Ready.\n", media_type="text/plain")
        return Response("promaccel is not ready: no backend answers.\n", status_code=503, media_type="text/plain")

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(METRICS.registry), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    async def not_found(request: Request) -> Response:
        return _error(PromError("not_found", f"unknown path {request.url.path!r}: promaccel serves the "
                                "Prometheus HTTP API under /api/v1/"))

    @app.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, exc: ClientDisconnect) -> Response:
        # A specific handler (unlike the catch-all below, after which Starlette re-raises for
        # uvicorn to log): a client that went away is not promaccel's error, nothing to log.
        return _error(client_gone())

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return _error(PromError("internal", f"internal error in promaccel: {type(exc).__name__}"))

    # Level 1 with ISA-L (proxy/compress.py): zlib's level 9 (Starlette's default) cost ~35 ms per
    # 340 KB answer, zlib's level 1 ~4 ms, ISA-L's ~1 ms.
    app.add_middleware(FastGZipMiddleware, minimum_size=1024)
    app.add_middleware(AccessLog)
    return app
