"""Per-request metrics and the access log: each request timed, counted by endpoint, and
logged with the headers Grafana sends (never auth headers)."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import METRICS

access_log = logging.getLogger("promaccel.access")

GRAFANA_HEADERS = ("x-dashboard-uid", "x-panel-id", "x-grafana-org-id", "x-query-group-id", "x-datasource-uid")

# Endpoint labels come from this fixed vocabulary, never from a request's path.
_KNOWN = {
    "/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels", "/api/v1/metadata",
    "/api/v1/query_exemplars", "/api/v1/format_query", "/api/v1/rules", "/api/v1/alerts",
    "/api/v1/explain", "/-/healthy", "/-/ready", "/metrics", "/api/v1/status/buildinfo",
    "/api/v1/admin/cache/invalidate", "/api/v1/admin/cache/generation", "/api/v1/admin/cache/stats",
}


def endpoint_label(path: str) -> str:
    if path in _KNOWN:
        return path
    if path.startswith("/api/v1/label/"):
        return "/api/v1/label/:name/values"
    if path.startswith("/api/v1/status/"):
        return "/api/v1/status/*"
    return "other"


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
            endpoint = endpoint_label(scope.get("path", ""))
            METRICS.requests.labels(endpoint, str(status)).inc()
            METRICS.request_latency.labels(endpoint).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                hdrs = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
                grafana = " ".join(f"{h}={hdrs[h]}" for h in GRAFANA_HEADERS if h in hdrs)
                access_log.info(
                    "%s %s %d %.1fms %s", scope.get("method"), scope.get("path"), status, elapsed * 1000, grafana
                )
