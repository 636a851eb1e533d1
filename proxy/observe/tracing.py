"""Optional OpenTelemetry tracing: a span per request, per pipeline stage and per backend call.

Off by default, and then nothing of OpenTelemetry is imported: `span()` returns one shared
no-op context manager and the pipeline is built without its tracing wrappers. On when
`tracing.otlp_endpoint` is set, or when the environment names an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true
keeps it off). It then needs the `tracing` extra (`pip install 'promaccel[tracing]'`:
opentelemetry-sdk and the OTLP/HTTP exporter): a config that asks for tracing without them
stops start-up with that message; an environment-only request is logged and ignored.

Spans carry what explains a query's time -- query id, endpoint, status, plan pieces, cache
status and hits, backend name and its status -- never a header value, credential or backend
URL; the query text only as the access log shows it (redacted, cut at 500 characters).
The exporter reads the standard OTEL_EXPORTER_OTLP_* variables (headers, timeout,
certificates) itself; promaccel never logs them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("promaccel")

_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_NOOP = contextlib.nullcontext(None)
_state: dict[str, Any] = {"tracer": None, "provider": None}

AttrValue = str | int | float | bool


class TracingUnavailable(RuntimeError):
    """Tracing was configured but the OpenTelemetry SDK is not installed."""


def wanted(otlp_endpoint: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """Why tracing is on ("config" or "env"), or None when it is off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if otlp_endpoint:
        return "config"
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    return "env" if any(env.get(k) for k in _ENDPOINT_ENV) else None


def configure(otlp_endpoint: str | None, service_name: str | None, sample_ratio: float | None,
              exporter: Any = None) -> bool:
    """Turn tracing on when wanted (or when a test hands an `exporter`); True when on.
    Spans are exported in batches in a background thread (a test's exporter: at once)."""
    shutdown()
    why = "test" if exporter is not None else wanted(otlp_endpoint)
    if why is None:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        message = ("tracing is configured but OpenTelemetry is not installed: pip install 'promaccel[tracing]' "
                   f"(opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http); {exc}")
        if why == "config":
            raise TracingUnavailable(message) from None
        log.warning("%s; OTEL_EXPORTER_OTLP_* is set in the environment: running without tracing", message)
        return False
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "promaccel"
    ratio = sample_ratio if sample_ratio is not None else _env_ratio()
    provider = TracerProvider(resource=Resource.create({"service.name": name}),
                              sampler=ParentBased(TraceIdRatioBased(ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        # endpoint None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT itself.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint or None)))
    _state["provider"], _state["tracer"] = provider, provider.get_tracer("promaccel")
    log.info("tracing on: service %s, sample ratio %g, OTLP/HTTP exporter%s", name, ratio,
             "" if exporter is None else " (in-memory)")
    return True


def _env_ratio() -> float:
    try:
        return min(1.0, max(0.0, float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1"))))
    except ValueError:
        return 1.0


def enabled() -> bool:
    return _state["tracer"] is not None


def span(name: str, attrs: Mapping[str, AttrValue | None] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span as a context manager (the current one while it is open); the no-op when off."""
    tracer = _state["tracer"]
    if tracer is None:
        return _NOOP
    return _span(tracer, name, attrs)


@contextlib.contextmanager
def _span(tracer: Any, name: str, attrs: Mapping[str, AttrValue | None] | None) -> Iterator[Any]:
    from opentelemetry.trace import Status, StatusCode

    with tracer.start_as_current_span(name, record_exception=False, set_status_on_exception=False) as s:
        set_attrs(s, attrs)
        try:
            yield s
        except BaseException as exc:
            s.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            s.set_attribute("error.type", type(exc).__name__)
            raise


def set_attrs(s: Any, attrs: Mapping[str, AttrValue | None] | None) -> None:
    """Attributes on a span (None: off, or a value that is None: skipped)."""
    if s is None or not attrs:
        return
    for k, v in attrs.items():
        if v is not None:
            s.set_attribute(k, v)


def shutdown() -> None:
    """Flush and stop the exporter (at shutdown; before reconfiguring)."""
    provider = _state["provider"]
    _state["provider"] = _state["tracer"] = None
    if provider is not None:
        provider.shutdown()
