"""promaccel's own metrics (exposed at /metrics), in one registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "promaccel_http_requests_total", "HTTP requests served", ["endpoint", "code"], registry=r
        )
        self.request_latency = Histogram(
            "promaccel_http_request_duration_seconds",
            "HTTP request latency by endpoint",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_calls = Counter(
            "promaccel_backend_requests_total",
            "Calls to backends",
            ["backend", "endpoint", "code"],
            registry=r,
        )
        self.backend_errors = Counter(
            "promaccel_backend_errors_total",
            "Backend calls that failed without an HTTP answer",
            ["backend", "error"],
            registry=r,
        )
        self.backend_retries = Counter(
            "promaccel_backend_retries_total", "Backend calls retried", ["backend"], registry=r
        )
        self.backend_latency = Histogram(
            "promaccel_backend_request_duration_seconds",
            "Backend call latency",
            ["backend", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pieces = Histogram(
            "promaccel_query_pieces",
            "Pieces per planned query",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.planned = Counter(
            "promaccel_queries_planned_total",
            "Queries by how they were planned",
            ["mode", "reason"],
            registry=r,
        )
        self.cache = Counter(
            "promaccel_cache_lookups_total", "Cache lookups by result", ["result"], registry=r
        )
        self.cache_errors = Counter(
            "promaccel_cache_errors_total", "Cache operations that failed (bypassed)", ["op"], registry=r
        )


METRICS = _Metrics()
