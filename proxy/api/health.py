"""Health, readiness and promaccel's own metrics: /-/healthy, /-/ready, /metrics.

Ready when any backend answers. These routes carry no tenant and are not Prometheus API
routes, so they are added to the app directly rather than through `routing.Routes`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from ..backends import Backend
from ..observe.metrics import METRICS
from ..pipeline import QueryService


def add_health_routes(app: FastAPI, executor: QueryService, backends: Sequence[Backend]) -> None:
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
