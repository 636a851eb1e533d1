"""Per-request metrics and the access log: each request timed, counted by endpoint, and
logged with the headers Grafana sends and the tenant's name (never auth headers)."""

from __future__ import annotations

import logging
import time
import uuid

import orjson
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


# Response headers that describe a query's execution, as access-log fields.
_ANSWER_FIELDS = {b"x-promaccel-pieces": "pieces", b"x-cache": "cache", b"x-promaccel-backend-calls": "backend_calls",
                  b"x-promaccel-samples-processed": "samples_processed"}


class AccessLog:
    """Times each request, counts it by endpoint, gives it a query id (X-Promaccel-Query-Id),
    and logs one line for it: method, path, status, duration, bytes sent, Grafana's headers,
    and for queries their text, plan shape, pieces, cache status, backend calls and samples
    (`log_format: json`: as fields of one JSON object). A query slower than
    `slow_query_log` is logged again at WARNING."""

    def __init__(self, app: ASGIApp, slow_query_s: float = 0.0) -> None:
        self.app = app
        self.slow_query_s = slow_query_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        sent = 0
        query_id = uuid.uuid4().hex[:16]
        answer: dict[str, object] = {}

        async def send_wrapper(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                for k, v in headers:
                    name = _ANSWER_FIELDS.get(k.lower())
                    if name is not None:
                        text = v.decode("latin-1")
                        answer[name] = int(text) if text.isdigit() else text
                headers.append((b"x-promaccel-query-id", query_id.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - t0
            path = scope.get("path", "")
            endpoint = endpoint_label(path)
            METRICS.requests.labels(endpoint, str(status)).inc()
            METRICS.request_latency.labels(endpoint).observe(elapsed)
            slow = bool(self.slow_query_s) and elapsed >= self.slow_query_s and endpoint in _QUERY_ENDPOINTS
            if slow or access_log.isEnabledFor(logging.INFO):
                hdrs = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
                state = scope.get("state", {})
                fields: dict[str, object] = {
                    "query_id": query_id, "method": scope.get("method"), "path": path, "status": status,
                    "duration_ms": round(elapsed * 1000, 1), "bytes": sent,
                    **({"tenant": state["promaccel_tenant"]} if "promaccel_tenant" in state else {}),
                    **{h.removeprefix("x-").replace("-", "_"): hdrs[h] for h in GRAFANA_HEADERS if h in hdrs},
                    **(state.get("promaccel_query") or {}), **answer,
                }
                text = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("method", "path", "status",
                                                                                 "duration_ms", "query"))
                if access_log.isEnabledFor(logging.INFO):
                    access_log.info("%s %s %d %.1fms %s", scope.get("method"), path, status, elapsed * 1000, text,
                                    extra={"fields": fields})
                if slow:
                    slow_log.warning("slow query %.1fs: %s", elapsed, fields.get("query", path),
                                     extra={"fields": fields})


_QUERY_ENDPOINTS = frozenset({"/api/v1/query", "/api/v1/query_range"})
slow_log = logging.getLogger("promaccel.slow")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()
