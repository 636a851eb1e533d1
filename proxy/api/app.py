"""`create_app`: the FastAPI app serving Prometheus's API over the executor.

Routes only parse and validate (as Prometheus does) and hand a request to `QueryService`; they
never talk to a backend themselves except to relay (relays.py). The order in which route
groups are added matters: buildinfo before /api/v1/status/{what}, and the catch-all last.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .. import __version__
from ..backends import Backend
from ..backends.tenancy import Tenancy
from ..codec.deflate import FRAGMENT_SHARE, fragment_bytes, keep_fragments_at_most
from ..codec.json_splice import keep_at_most, memo_bytes
from ..config import Config
from ..errors import PromError
from ..observe import tracing
from ..observe.metrics import METRICS
from ..pipeline import QueryService
from ..runtime.memory import tune_malloc
from .access_log import AccessLog
from .admin import add_admin_routes
from .compress import FastGZipMiddleware
from .forms import client_gone
from .health import add_health_routes
from .queries import add_query_routes
from .relays import add_relay_routes
from .responses import error, unknown_path
from .routing import Routes
from .tenants import Views
from .ui import add_ui_routes

log = logging.getLogger("promaccel")


def create_app(config: Config, *, trace_exporter: Any = None) -> FastAPI:
    """`trace_exporter`: an OpenTelemetry span exporter to trace into (tests), tracing on
    whatever the config says."""
    tune_malloc()
    keep_at_most(config.cache.json_memo_bytes)  # a process-wide memo, as malloc's tuning
    keep_fragments_at_most(config.cache.json_memo_bytes // FRAGMENT_SHARE)
    METRICS.warm_memo_bytes.labels("json").set_function(memo_bytes)
    METRICS.warm_memo_bytes.labels("deflate").set_function(fragment_bytes)
    t = config.tracing
    # Before the pipeline is built: its stages are wrapped in spans only when tracing is on.
    tracing.configure(t.otlp_endpoint, t.service_name, t.sample_ratio, exporter=trace_exporter)
    backends = [Backend(b) for b in config.backends]
    executor = QueryService(config, backends)
    METRICS.warm_memo_bytes.labels("answer").set_function(lambda: executor.parts.memo.used)
    tenancy = Tenancy(config.tenancy.forward_headers, config.tenancy.hash_key(),
                      pins=config.auth.pins() if config.auth.enabled else None)  # auth on: tenants' own values
    views = Views(config, executor, backends)  # auth on: a service per tenant (tenants.py)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await executor.start()
        for service in views.services:
            await service.start()
        try:
            yield
        finally:
            for service in views.services:
                await service.aclose()
            await executor.aclose()
            for b in backends:
                await b.aclose()
            tracing.shutdown()  # the last spans exported

    app = FastAPI(
        title="promaccel", version=__version__, lifespan=lifespan,
        docs_url=None, redoc_url=None, openapi_url=None,
    )
    app.state.executor = executor

    route = Routes(app, tenancy, views)
    add_query_routes(route, config)
    add_admin_routes(route, executor, config)
    add_relay_routes(route, config.limits.max_body_bytes)
    add_health_routes(app, executor, backends)
    add_ui_routes(app, executor, backends, config)

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    async def not_found(request: Request) -> Response:
        return unknown_path(request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, exc: ClientDisconnect) -> Response:
        # A specific handler (unlike the catch-all below, after which Starlette re-raises for
        # uvicorn to log): a client that went away is not promaccel's error, nothing to log.
        return error(client_gone())

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return error(PromError("internal", f"internal error in promaccel: {type(exc).__name__}"))

    # Level 1 with ISA-L (compress.py): zlib's level 9 (Starlette's default) cost ~35 ms per
    # 340 KB answer, zlib's level 1 ~4 ms, ISA-L's ~1 ms.
    app.add_middleware(FastGZipMiddleware, minimum_size=1024)
    app.add_middleware(AccessLog, slow_query_s=config.slow_query_log / 1000)
    return app
