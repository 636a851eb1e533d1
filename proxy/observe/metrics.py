"""promaccel's own metrics (exposed at /metrics), in one registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.cache_finer_step = Counter(
            "promaccel_cache_finer_step_hits_total",
            "Range pieces answered by subsampling a cached piece at a finer step",
            registry=r,
        )
        self.cache_day_cells = Counter(
            "promaccel_cache_day_cells_assembled_total",
            "Day cells made from their cached hour cells (no backend call)",
            registry=r,
        )
        self.cache_day_cells_skipped = Counter(
            "promaccel_cache_day_cells_skipped_total",
            "Partly asked-for days not assembled: too large to copy beside the query's answer",
            registry=r,
        )
        # AMP bills by samples processed (`stats=all` on every planned AMP call).
        self.samples_processed = Counter(
            "promaccel_backend_samples_processed_total",
            "Samples processed by backends, as they report them (AMP)",
            ["backend"],
            registry=r,
        )
        # Overlap answers given without one backend (a warning names it; never cached).
        self.backend_missing = Counter(
            "promaccel_backend_missing_total",
            "Overlap pieces answered without a backend that failed",
            ["backend"],
            registry=r,
        )
        # Requests refused for missing or wrong credentials (auth): reason missing | invalid.
        self.auth_failures = Counter(
            "promaccel_auth_failures_total", "Requests refused with 401 (auth)", ["reason"], registry=r
        )
        self.backend_retries = Counter(
            "promaccel_backend_retries_total", "Backend calls retried", ["backend"], registry=r
        )
        self.backend_retries_denied = Counter(
            "promaccel_backend_retries_denied_total", "Retries not taken: the backend's retry budget was spent",
            ["backend"], registry=r,
        )
        # AMP throttling (429/503): `outcome` is retried or gave_up (budget or deadline spent).
        self.backend_throttled = Counter(
            "promaccel_backend_throttled_total",
            "Throttled answers (429/503) from AMP backends, by what promaccel did next",
            ["backend", "code", "outcome"],
            registry=r,
        )
        self.backend_throttle_wait = Counter(
            "promaccel_backend_throttle_wait_seconds_total",
            "Time spent waiting (Retry-After plus backoff) before retrying throttled calls",
            ["backend"],
            registry=r,
        )
        # Circuit breaker per backend (backends[].breaker): 0 closed, 1 open, 2 half-open.
        self.backend_breaker_state = Gauge(
            "promaccel_backend_breaker_state", "Circuit breaker of a backend: 0 closed, 1 open, 2 half-open",
            ["backend"], registry=r,
        )
        self.backend_breaker_transitions = Counter(
            "promaccel_backend_breaker_transitions_total", "Circuit breaker state changes, by the state entered",
            ["backend", "state"], registry=r,
        )
        self.backend_breaker_rejected = Counter(
            "promaccel_backend_breaker_rejected_total", "Backend calls failed fast while the breaker was open",
            ["backend"], registry=r,
        )
        # Hedged reads (backends[].hedge_after): outcome sent | won (the hedge answered first)
        # | denied (the retry budget or limits.max_backend_calls said no).
        self.backend_hedges = Counter(
            "promaccel_backend_hedges_total", "Hedged backend calls, by outcome", ["backend", "outcome"], registry=r,
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
        self.cache_skipped = Counter(
            "promaccel_cache_skipped_total", "Fetched pieces not stored, by reason", ["reason"], registry=r
        )
        # Piece store (proxy/cache/) and request coalescing (proxy/primitives/singleflight.py).
        # `store` is "memory" or "redis"; cache_errors' `op` is get, put, delete,
        # generation, invalidate, bump or lease.
        self.cache_pieces = Counter(
            "promaccel_cache_piece_lookups_total",
            "Piece lookups in the piece store by result (hit, miss)",
            ["store", "result"],
            registry=r,
        )
        self.cache_read_bytes = Counter(
            "promaccel_cache_read_bytes_total", "Bytes of cached pieces served", ["store"], registry=r
        )
        self.cache_written_bytes = Counter(
            "promaccel_cache_written_bytes_total", "Bytes of pieces written to the store", ["store"], registry=r
        )
        self.cache_puts = Counter(
            "promaccel_cache_puts_total",
            "Pieces offered to the store by outcome (stored, not_cached, too_large, raced)",
            ["store", "result"],
            registry=r,
        )
        self.cache_evictions = Counter(
            "promaccel_cache_evictions_total",
            "Entries the in-process store dropped (size: LRU byte bound; expired: TTL)",
            ["reason"],
            registry=r,
        )
        self.cache_corrupt = Counter(
            "promaccel_cache_corrupt_entries_total",
            "Stored values that failed verification, served as misses and deleted",
            ["store", "reason"],
            registry=r,
        )
        self.cache_invalidated = Counter(
            "promaccel_cache_invalidated_entries_total",
            "Entries dropped by invalidation",
            ["store"],
            registry=r,
        )
        self.cache_bypassed = Counter(
            "promaccel_cache_bypassed_total",
            "Cache calls skipped while the Redis circuit breaker was open",
            ["op"],
            registry=r,
        )
        self.cache_breaker_open = Gauge(
            "promaccel_cache_breaker_open", "1 while the Redis circuit breaker skips Redis", registry=r
        )
        self.cache_memory_bytes = Gauge(
            "promaccel_cache_memory_bytes", "Bytes held by the in-process piece store", registry=r
        )
        self.cache_memory_entries = Gauge(
            "promaccel_cache_memory_entries", "Entries held by the in-process piece store", registry=r
        )
        # The warm path's kept bytes (cache.json_memo_bytes): cells' samples as encoded JSON
        # (codec/json_splice.py) and their steady runs deflated (codec/deflate.py); whole
        # answers (cache.answer_memo_bytes, pipeline/answer_memo.py).
        self.warm_memo_bytes = Gauge(
            "promaccel_warm_memo_bytes",
            "Bytes kept for warm answers: cells' encoded JSON (json), their runs deflated for gzip (deflate), "
            "whole answers (answer)",
            ["memo"], registry=r,
        )
        # Cached cells checked to be unchanged (a kept cell found by a lookup, an answer kept
        # whole recalled), one per cell: trusted (Redis's invalidations said nothing: no round
        # trip, cache/tracking.py) or asked (its 32 tag bytes read).
        self.cache_tag_checks = Counter(
            "promaccel_cache_tag_checks_total",
            "Cached cells checked to be unchanged, per cell: trusted (no round trip) or asked (their tag read)",
            ["how"], registry=r,
        )
        # Whole answers kept (pipeline/answer_memo.py): kept (an answer's bytes stored), hit (a
        # request answered with them after its lookup), recalled (before planning: its cells'
        # tags unchanged in the store).
        self.answer_memo = Counter(
            "promaccel_answer_memo_total",
            "Whole answers kept (kept) and requests answered with one after their lookup (hit) or before planning (recalled)",
            ["result"], registry=r,
        )
        # Fetch leases (proxy/pipeline/leases.py), per piece: won (this process fetches it),
        # landed (another process fetched it; read from Redis), released (its lease went
        # without a stored piece: fetched here), timeout (waited half the query's deadline:
        # fetched here), error (Redis failed or skipped: fetched without a lease).
        self.cache_leases = Counter(
            "promaccel_cache_leases_total",
            "Pieces missing from the cache by how their fetch lease went",
            ["result"],
            registry=r,
        )
        self.coalesced = Counter(
            "promaccel_coalesced_calls_total",
            "Calls that joined an identical call already in flight instead of making their own",
            ["flight"],
            registry=r,
        )
        self.answer_bytes_waits = Counter(
            "promaccel_answer_bytes_waits_total",
            "Queries that waited for room in limits.max_inflight_answer_bytes", registry=r,
        )
        self.answer_bytes_reserved = Gauge(
            "promaccel_answer_bytes_reserved",
            "Bytes of answers being materialised, as reserved (limits.max_inflight_answer_bytes)", registry=r,
        )
        self.cells_packed = Counter(
            "promaccel_cells_packed_total",
            "Cells kept packed in memory as their cache payloads (cache.pack_min_samples), by how they came: "
            "fetched or read from the cache", ["how"], registry=r,
        )


METRICS = _Metrics()
