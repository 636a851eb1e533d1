"""proxy/observe/metrics.py: promaccel's own metrics, in a registry of their own (what
/metrics serves): every metric passes `promtool check metrics` (Prometheus's own lint of
names, units, suffixes and help), none leaks into prometheus_client's global registry, and
what the code counts is what a scrape reads back."""

from __future__ import annotations

import subprocess

import prometheus_client
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.metrics import METRICS
from tests.servers import require


def _families() -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(METRICS.registry).decode())}


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return METRICS.registry.get_sample_value(name, labels or {}) or 0.0


def _touch_every_metric() -> None:
    """One sample of every labelled metric, so that the lint sees samples and not only HELP/TYPE."""
    m = METRICS
    m.requests.labels("/api/v1/query", "200").inc(0)
    m.request_latency.labels("/api/v1/query").observe(0)
    m.backend_calls.labels("local", "query", "200").inc(0)
    m.backend_errors.labels("local", "ConnectError").inc(0)
    m.samples_processed.labels("amp").inc(0)
    m.backend_missing.labels("amp").inc(0)
    m.auth_failures.labels("missing").inc(0)
    m.backend_retries.labels("local").inc(0)
    m.backend_retries_denied.labels("local").inc(0)
    m.backend_throttled.labels("amp", "429", "retried").inc(0)
    m.backend_throttle_wait.labels("amp").inc(0)
    m.backend_breaker_state.labels("local").set(0)
    m.backend_breaker_transitions.labels("local", "open").inc(0)
    m.backend_breaker_rejected.labels("local").inc(0)
    m.backend_hedges.labels("local", "sent").inc(0)
    m.backend_latency.labels("local", "query").observe(0)
    m.planned.labels("passthrough", "none").inc(0)
    m.cache.labels("hit").inc(0)
    m.cache_errors.labels("get").inc(0)
    m.cache_skipped.labels("fresh").inc(0)
    m.cache_pieces.labels("memory", "hit").inc(0)
    m.cache_read_bytes.labels("memory").inc(0)
    m.cache_written_bytes.labels("memory").inc(0)
    m.cache_puts.labels("memory", "stored").inc(0)
    m.cache_evictions.labels("size").inc(0)
    m.cache_corrupt.labels("redis", "checksum").inc(0)
    m.cache_invalidated.labels("memory").inc(0)
    m.cache_bypassed.labels("get").inc(0)
    m.cache_leases.labels("won").inc(0)
    m.coalesced.labels("piece").inc(0)
    m.cells_packed.labels("fetched").inc(0)


def test_every_metric_passes_promtools_lint() -> None:
    _touch_every_metric()
    exposition = generate_latest(METRICS.registry)
    out = subprocess.run([require("promtool"), "check", "metrics"], input=exposition, capture_output=True,
                         timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (out.stdout, out.stderr)
    families = _families()
    assert len(families) >= 40  # every metric of the module is exposed, samples or not
    assert all(name.startswith("promaccel_") for name in families)


def test_the_registry_is_promaccels_own() -> None:
    """A library that registers metrics in the global registry (or a second app in the
    process) never collides with promaccel's, and /metrics shows promaccel's alone."""
    assert METRICS.registry is not prometheus_client.REGISTRY
    global_names = {f.name for f in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("promaccel_") for name in global_names)


def test_what_is_counted_is_what_a_scrape_reads() -> None:
    labels = {"endpoint": "/api/v1/query_range", "code": "422"}
    before = _value("promaccel_http_requests_total", labels)
    METRICS.requests.labels("/api/v1/query_range", "422").inc()
    METRICS.requests.labels("/api/v1/query_range", "422").inc(2)
    assert _value("promaccel_http_requests_total", labels) == before + 3
    # Read back through the text format, as Prometheus would scrape it.
    fam = _families()["promaccel_http_requests"]
    (sample,) = [s for s in fam.samples if s.name == "promaccel_http_requests_total" and s.labels == labels]  # type: ignore[attr-defined]
    assert sample.value == before + 3


def test_latency_histogram_buckets_count_what_falls_in_them() -> None:
    h = METRICS.request_latency.labels("/api/v1/series")
    name = "promaccel_http_request_duration_seconds"

    def le(bound: str) -> float:
        return _value(name + "_bucket", {"endpoint": "/api/v1/series", "le": bound})

    before = {b: le(b) for b in ("0.005", "0.01", "0.025", "120.0", "+Inf")}
    count0 = _value(name + "_count", {"endpoint": "/api/v1/series"})
    for seconds in (0.004, 0.01, 0.02, 200.0):  # 0.01 is in the le="0.01" bucket: bounds are inclusive
        h.observe(seconds)
    assert le("0.005") - before["0.005"] == 1
    assert le("0.01") - before["0.01"] == 2
    assert le("0.025") - before["0.025"] == 3
    assert le("120.0") - before["120.0"] == 3  # over the last bound: in +Inf only
    assert le("+Inf") - before["+Inf"] == 4
    assert _value(name + "_count", {"endpoint": "/api/v1/series"}) - count0 == 4


def test_gauges_go_both_ways() -> None:
    METRICS.backend_breaker_state.labels("gauge-test").set(1)
    assert _value("promaccel_backend_breaker_state", {"backend": "gauge-test"}) == 1
    METRICS.backend_breaker_state.labels("gauge-test").set(2)
    assert _value("promaccel_backend_breaker_state", {"backend": "gauge-test"}) == 2
    METRICS.answer_bytes_reserved.inc(1000)
    now = _value("promaccel_answer_bytes_reserved")
    METRICS.answer_bytes_reserved.dec(1000)
    assert _value("promaccel_answer_bytes_reserved") == now - 1000
