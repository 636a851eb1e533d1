"""OpenTelemetry tracing (proxy/observe/tracing.py): the span tree of a query, and nothing when off.

In process, over the real test Prometheus, into the SDK's in-memory exporter: a sharded, time
split range query gives a request span, under it one span per pipeline stage in the order
path.py builds them, and under FanOut one span per backend call; attributes carry the query
id, pieces, cache hits and backend status, and no secret, header value or backend URL. With
tracing off (a fresh interpreter) nothing of OpenTelemetry is even imported.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from proxy.api.app import create_app
from proxy.config import build_config
from proxy.observe import tracing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRETS = ("s3cret-backend-pw-777", "client-bearer-token-555", "tenant-orgid-999")
CHAIN = ["POST /api/v1/query_range", "Admit", "Recall", "Plan", "Reserve", "Route", "Forward", "Fallback", "Merge", "Lookup", "Coalesce",
         "FanOut", "backend /api/v1/query_range"]


def _run(prom: Any, exporter: Any, form: dict[str, str], times: int) -> list[httpx.Response]:
    config = build_config({
        "backends": [{"name": "local", "url": prom.url,
                      "basic_auth": {"username": "promaccel", "password": SECRETS[0]}}],
        "planner": {"split_interval": "1h", "shards": 2},
        # The warm ask runs the stages (an answer kept whole would be sent from Lookup).
        "cache": {"answer_memo_bytes": 0},
    })

    async def run() -> list[httpx.Response]:
        app = create_app(config, trace_exporter=exporter)
        out = []
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://promaccel") as c:
                for _ in range(times):
                    out.append(await c.post("/api/v1/query_range", data=form, headers={
                        "Authorization": f"Bearer {SECRETS[1]}", "X-Scope-OrgID": SECRETS[2],
                        "X-Dashboard-Uid": "gpu-fleet", "X-Panel-Id": "7"}))
        return out

    try:
        return asyncio.run(run())
    finally:
        tracing.shutdown()


@pytest.mark.prom
def test_a_query_gives_the_span_tree_of_its_stages_and_backend_calls(prom: Any) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    form = {"query": "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.end_s - 7200),
            "end": str(prom.end_s - 60), "step": "60"}
    cold, warm = _run(prom, exporter, form, times=2)
    assert cold.status_code == warm.status_code == 200, cold.text
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    roots = [s for s in spans if s.parent is None]
    assert [r.name for r in roots] == ["POST /api/v1/query_range"] * 2
    assert len({s.context.trace_id for s in spans}) == 2  # one trace per request

    def chain(s: Any) -> list[str]:
        names = [s.name]
        while s.parent is not None:
            s = by_id[s.parent.span_id]
            names.append(s.name)
        return names[::-1]

    def under(root: Any) -> list[Any]:
        return [s for s in spans if s.context.trace_id == root.context.trace_id]

    cold_root, warm_root = sorted(roots, key=lambda s: s.start_time)
    assert cold_root.attributes["promaccel.query_id"] == cold.headers["X-Promaccel-Query-Id"]
    assert cold_root.attributes["http.response.status_code"] == 200
    assert cold_root.attributes["grafana.dashboard_uid"] == "gpu-fleet" and cold_root.attributes["grafana.panel_id"] == "7"
    assert cold_root.attributes["promaccel.pieces"] == int(cold.headers["X-Promaccel-Pieces"]) == 4  # 2 h x 2 shards
    assert cold_root.attributes["promaccel.cache"] == "MISS" and warm_root.attributes["promaccel.cache"] == "HIT"

    # Cold: every stage in path.py's order, the backend calls under FanOut.
    calls = [s for s in under(cold_root) if s.name == "backend /api/v1/query_range"]
    assert calls and all(chain(s) == CHAIN for s in calls), [chain(s) for s in calls]
    assert cold_root.attributes["promaccel.backend_calls"] == len(calls)
    assert all(s.attributes["promaccel.backend"] == "local" and s.attributes["http.response.status_code"] == 200
               for s in calls)
    stage = {s.name: s for s in under(cold_root)}
    assert stage["Plan"].attributes["promaccel.path"] == "/api/v1/query_range"
    assert stage["Coalesce"].attributes["promaccel.pieces"] == 4 and stage["Coalesce"].attributes["promaccel.cache_hits"] == 0
    assert stage["FanOut"].attributes["promaccel.backend_calls"] == len(calls)
    assert stage["Lookup"].attributes["promaccel.cache"] == "MISS"
    # Warm: the same stages, every piece a cache hit, no backend call.
    warm = {s.name: s for s in under(warm_root)}
    assert not [s for s in under(warm_root) if s.name.startswith("backend /api/v1/query")]
    assert warm["Coalesce"].attributes["promaccel.cache_hits"] == 4 and warm["Lookup"].attributes["promaccel.cache"] == "HIT"

    # No secret, client header or backend URL in any span.
    text = repr([(s.name, dict(s.attributes or {}), dict(s.resource.attributes)) for s in spans])
    for secret in (*SECRETS, prom.url, "Bearer"):
        assert secret not in text, secret
    assert spans[0].resource.attributes["service.name"] == "promaccel"


def test_tracing_off_imports_and_creates_nothing() -> None:
    """No tracing config, no OTEL endpoint: promaccel creates no tracer provider and no span
    wrapper (the pipeline's stages call each other directly), and never imports the tracing SDK
    or an exporter; a request still answers. (FastAPI imports opentelemetry's API for its own
    no-op instrumentation and redis-py probes the metrics SDK: not promaccel's doing.)"""
    code = """
import asyncio, sys, httpx
from proxy.observe import tracing
from proxy.api.app import create_app
from proxy.config import build_config

app = create_app(build_config({"backends": [{"name": "b", "url": "http://127.0.0.1:9"}]}))
async def run():
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
            assert (await c.get("/-/healthy")).status_code == 200
            r = await c.post("/api/v1/query", data={"query": "up", "time": "0"})
            assert r.status_code in (502, 503), r.status_code
asyncio.run(run())
run = app.state.executor.run
assert type(run).__name__ == "Admit" and type(run.next).__name__ == "Recall", (run, run.next)
assert type(run.next.next).__name__ == "Plan", run.next.next
assert not tracing.enabled() and tracing._state == {"tracer": None, "provider": None}
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter")))
assert not loaded, loaded
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FASTAPI_OTEL"))}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_only_proxy_tracing_imports_opentelemetry_and_only_lazily() -> None:
    """The product's one door to OpenTelemetry is proxy/observe/tracing.py (and access_log.py's status
    helper, called only with a live span), each import inside a function."""
    import ast
    from pathlib import Path

    allowed = {"proxy/observe/tracing.py", "proxy/api/access_log.py"}
    for path in sorted(Path(ROOT, "proxy").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.startswith("opentelemetry") for n in names):
                assert rel in allowed, rel
                assert id(node) not in top, f"{rel}: a module-level opentelemetry import"


def test_when_tracing_is_wanted() -> None:
    assert tracing.wanted(None, {}) is None
    assert tracing.wanted("http://127.0.0.1:4318/v1/traces", {}) == "config"
    assert tracing.wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == "env"
    assert tracing.wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == "env"
    assert tracing.wanted("http://x:4318", {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}) is None


def test_configured_tracing_without_the_sdk_stops_start_up() -> None:
    """tracing.otlp_endpoint set, OpenTelemetry's SDK not importable: start-up stops naming the
    extra to install; asked only by the environment, promaccel runs without tracing."""
    code = """
import sys
sys.modules["opentelemetry.sdk"] = None  # as if the `tracing` extra were not installed
from proxy.observe import tracing
try:
    tracing.configure("http://127.0.0.1:4318/v1/traces", None, None)
except tracing.TracingUnavailable as exc:
    assert "promaccel[tracing]" in str(exc), exc
else:
    raise SystemExit("no error")
import os
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:4318"
assert tracing.configure(None, None, None) is False and not tracing.enabled()
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_tracing_config_refuses_credentials_in_the_endpoint() -> None:
    from proxy.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="user:pass"):
        build_config({"backends": [{"name": "b", "url": "http://127.0.0.1:9"}],
                      "tracing": {"otlp_endpoint": "http://u:p@127.0.0.1:4318/v1/traces"}})
