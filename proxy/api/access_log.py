"""Per-request metrics and the access log: each request timed, counted by endpoint, and
logged with the headers Grafana sends and the tenant's name (never auth headers)."""

from __future__ import annotations

import logging
import time
import uuid

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backends.redaction import redact, redact_fields
from ..observe import tracing
from ..observe.activity import ACTIVITY
from ..observe.metrics import METRICS

# The request state's name of the record this middleware makes for a query (the operator page):
# handed down explicitly from there (tenants.record_of, the query's RequestContext).
RECORD_STATE = "promaccel_record"

access_log = logging.getLogger("promaccel.access")

GRAFANA_HEADERS = ("x-dashboard-uid", "x-panel-id", "x-grafana-org-id", "x-query-group-id", "x-datasource-uid")

# Endpoint labels come from this fixed vocabulary, never from a request's path.
_KNOWN = {
    "/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels", "/api/v1/metadata",
    "/api/v1/query_exemplars", "/api/v1/format_query", "/api/v1/rules", "/api/v1/alerts",
    "/api/v1/explain", "/-/healthy", "/-/ready", "/metrics", "/api/v1/status/buildinfo",
    "/api/v1/admin/cache/invalidate", "/api/v1/admin/cache/generation", "/api/v1/admin/cache/stats",
    "/ui", "/ui/data.json",
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
    """Times each request, counts it by endpoint, gives it a query id (X-Promaccel-Query-Id)
    and `X-Content-Type-Options: nosniff`, and logs one line for it: method, path, status,
    duration, bytes sent, Grafana's headers, and for queries their text (redacted), plan
    shape, pieces, cache status, backend calls and samples (`log_format: json`: as fields of
    one JSON object). A query slower than `slow_query_log` is logged again at WARNING."""

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
        path = scope.get("path", "")
        # Queries are recorded for the operator page (proxy/observe/activity.py): in flight, then
        # finished, with their error's message when they fail.
        record = ACTIVITY.begin(query_id, scope.get("method", ""), path) if path in _QUERY_ENDPOINTS else None
        if record is not None:  # handed down explicitly (tenants.record_of, RequestContext)
            scope.setdefault("state", {})[RECORD_STATE] = record
        error_body = bytearray()
        encoded = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, sent, encoded
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                sniffing = True
                for k, v in headers:
                    encoded = encoded or k.lower() == b"content-encoding"
                    sniffing = sniffing and k.lower() != b"x-content-type-options"
                    name = _ANSWER_FIELDS.get(k.lower())
                    if name is not None:
                        text = v.decode("latin-1")
                        answer[name] = int(text) if text.isdigit() else text
                headers.append((b"x-promaccel-query-id", query_id.encode()))
                if sniffing:  # every answer is served as its own type only (issue 26)
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                sent += len(body)
                if record is not None and status >= 400 and len(error_body) < _ERROR_BODY_MAX:
                    error_body.extend(body[:_ERROR_BODY_MAX - len(error_body)])
            await send(message)

        span = tracing.span(f"{scope.get('method', '')} {endpoint_label(path)}",
                            {"http.request.method": scope.get("method", ""), "http.route": endpoint_label(path),
                             "promaccel.query_id": query_id})
        try:
            with span as s:
                try:
                    await self.app(scope, receive, send_wrapper)
                finally:
                    if s is not None:
                        _span_attrs(s, scope, status, answer)
        finally:
            elapsed = time.perf_counter() - t0
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
            if record is not None:
                grafana = {h.removeprefix("x-").replace("-", "_"): v.decode("latin-1")
                           for h, v in ((k.decode("latin-1").lower(), v) for k, v in scope.get("headers", []))
                           if h in GRAFANA_HEADERS}
                ACTIVITY.finish(record, status, elapsed,
                                {**grafana, **(scope.get("state", {}).get("promaccel_query") or {}), **answer,
                                 "bytes": sent},
                                None if status < 400 else error_text(bytes(error_body), encoded))


def _span_attrs(s: object, scope: Scope, status: int, answer: dict[str, object]) -> None:
    """The request span's attributes once it is answered: status, Grafana's ids, the query
    (redacted, as logged), its plan, cache status and backend calls. No header value else."""
    state = scope.get("state", {})
    query = state.get("promaccel_query") or {}
    hdrs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    attrs: dict[str, tracing.AttrValue | None] = {
        "http.response.status_code": status,
        "promaccel.tenant": state.get("promaccel_tenant"),
        "grafana.dashboard_uid": hdrs.get("x-dashboard-uid"), "grafana.panel_id": hdrs.get("x-panel-id"),
        "promaccel.query": redact(str(query["query"]))[:500] if "query" in query else None,
        "promaccel.range": query.get("range") if isinstance(query.get("range"), bool) else None,
    }
    for name in ("pieces", "cache", "backend_calls", "samples_processed"):
        value = answer.get(name)
        attrs[f"promaccel.{name}"] = value if isinstance(value, (str, int)) else None
    tracing.set_attrs(s, attrs)
    if status >= 500:
        from opentelemetry.trace import Status, StatusCode  # tracing is on: s is a real span

        s.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))  # type: ignore[attr-defined]


_QUERY_ENDPOINTS = frozenset({"/api/v1/query", "/api/v1/query_range"})
_ERROR_BODY_MAX = 4096
slow_log = logging.getLogger("promaccel.slow")


def error_text(body: bytes, encoded: bool) -> str:
    """The message of an error answer (Prometheus's `error` field, else the body's start) for
    the operator page, redacted as log lines are (a relayed AWS error may echo a signature)."""
    if encoded:
        return "(compressed error body)"
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return redact(body[:200].decode("utf-8", "replace").strip()) or "(no body)"
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        kind = parsed.get("errorType")
        return redact(f"{kind}: {parsed['error']}" if isinstance(kind, str) else parsed["error"])
    return redact(body[:200].decode("utf-8", "replace"))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the record's `fields`,
    each text value redacted as the text lines and /ui are (a query's text once went out as
    written, issue 26), whatever filters the handler has."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(redact_fields(fields))
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:  # pre-formatted (and redacted) by redaction.redact_record
            out["exception"] = redact(record.exc_text)
        return orjson.dumps(out, default=str).decode()
