"""promaccel's configuration: YAML validated with pydantic; CLI flags override the file.

Unknown keys and wrong types are rejected with a message naming the key (`ConfigError`).
Durations are Prometheus durations ("30s", "1h30m") or numbers of seconds.

    base.py     ConfigError, durations, the strict model every section derives from
    cache.py    the `cache:` section and the secrets it reads (frame HMAC key, Redis password)
    here        every other section, the whole Config, loading and CLI overrides
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from shardplanner.holdings import ALL_METRICS, BackendHolding, resolve_window
from shardplanner.regex import RegexError
from shardplanner.regex import matcher as regex_matcher

from .auth import AuthConfig, sha256_hex
from .base import ConfigError, DurationMs, OptDurationMs, StrictModel, to_ms
from .cache import CacheConfig

_AMP_HOST = re.compile(r"^https?://aps-workspaces(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?::\d+)?(?:/|$)", re.I)


class HoldsConfig(StrictModel):
    """What a backend holds: metrics whose names fully match one of `metrics`
    (anchored regexes; "*" for every metric) over a time window: `last` (a duration back
    from now) or `since`, optionally `until` (RFC 3339, a date, unix seconds, `now-6h`).
    Resolved to absolute times by shardplanner.holdings.resolve_window."""

    metrics: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    since: str | int | float | datetime | date | None = None
    until: str | int | float | datetime | date | None = None
    last: str | None = None

    @model_validator(mode="after")
    def _window(self) -> "HoldsConfig":
        for pattern in self.metrics:
            if pattern == "*":
                continue
            try:
                regex_matcher(pattern)
            except RegexError as exc:
                raise ValueError(f"metrics pattern {pattern!r} is not a valid regex: {exc}") from None
        resolve_window(self.window_spec(), int(time.time() * 1000))  # ValueError: a clear message
        return self

    def window_spec(self) -> dict[str, Any]:
        return {k: v for k, v in (("since", self.since), ("until", self.until), ("last", self.last))
                if v is not None}


class BasicAuthConfig(StrictModel):
    """HTTP basic auth to a backend: `username` and either `password` or `password_file`
    (a file whose content, trailing newline stripped, is the password; read when the backend
    is set up, so a mounted Kubernetes secret works). The password is a `SecretStr`: the
    config's repr, errors and logs show `**********`."""

    username: str = Field(min_length=1)
    password: SecretStr | None = None
    password_file: str | None = None

    @model_validator(mode="after")
    def _one_password(self) -> "BasicAuthConfig":
        if (self.password is None) == (self.password_file is None):
            raise ValueError("give exactly one of password and password_file")
        if ":" in self.username:
            raise ValueError("username must not contain ':' (basic auth separates it from the password)")
        if self.password_file is not None:
            self.read_password()  # a clear error now rather than on the first query
        return self

    def read_password(self) -> str:
        if self.password is not None:
            return self.password.get_secret_value()
        assert self.password_file is not None
        try:
            return Path(self.password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ValueError(f"cannot read password_file {self.password_file!r}: {exc.strerror}") from None


def url_fingerprint(url: str, extra: str = "") -> str:
    """A short stable hash of a credential-free backend URL (plus `extra`, e.g. the basic-auth
    user): part of cache keys, so a changed URL changes keys without writing the URL."""
    return hashlib.sha256(f"{url}\0{extra}".encode()).hexdigest()[:12]


class BreakerConfig(StrictModel):
    """A backend's circuit breaker (proxy/backends/circuit.py): open after `failures` failed
    calls in a row (0: never), fail fast for `cooldown`, then one probe call."""

    failures: int = Field(default=5, ge=0)
    cooldown: DurationMs = Field(default=10_000, ge=1)


def _hedge_after(value: Any) -> Any:
    """hedge_after: "p95" (the backend's recent p95 latency), a duration, or off (0, "off", null, false)."""
    if value is None or value is False or value == "off" or value == 0:
        return None
    if value == "p95":
        return "p95"
    return to_ms(value) or None


class BackendConfig(StrictModel):
    """One backend. `url` must not hold credentials (`http://user:pass@host` is refused with
    a ConfigError pointing at `basic_auth`): the URL goes into the start-up banner and, as a
    hash, into cache keys, and neither may carry a password."""

    name: str = "default"
    kind: Literal["prometheus", "amp"] = "prometheus"
    url: str
    timeout: DurationMs = Field(default=120_000, description="per backend call")
    connect_timeout: DurationMs = 5_000
    max_connections: int = Field(default=64, ge=1)
    max_keepalive: int = Field(default=32, ge=0)
    max_parallel: int = Field(default=4, ge=1, description="concurrent pieces per backend")
    retries: int = Field(default=3, ge=0, le=10)  # 3: docs/BENCHMARKS.md, "Backend faults"
    # Retries this backend may take beyond each call's own: every call earns retry_ratio of a
    # retry, every retry spends one (at most 50 saved) and retry_floor per second are always
    # allowed -- a sick backend gets ~retry_ratio more calls, not (retries + 1) times as many.
    retry_ratio: float = Field(default=0.2, ge=0, le=100)
    retry_floor: float = Field(default=10.0, ge=0)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    # Hedged reads: a try unanswered after this long gets an identical second call (first good
    # answer wins); "p95": the backend's p95 over its last 256 answered calls; None: off.
    hedge_after: Annotated[int | Literal["p95"] | None, BeforeValidator(_hedge_after)] = None
    transport: Literal["aiohttp", "httpx"] = "aiohttp"
    # Largest body promaccel reads from this backend (queries and relays alike), counted as it
    # streams in: past it the read stops and the call fails (502 naming the backend, not
    # retried). The heaviest legitimate answers measured are ~15 MB (6 h of 2,048 GPUs).
    max_body_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    # AMP only. Requests are SigV4-signed for `service` in `region` (taken from an
    # aps-workspaces.<region>.amazonaws.com URL when not given) with credentials from
    # botocore's default chain, in shared-config `profile` when set (None: $AWS_PROFILE or
    # the default). Secrets never go in this file.
    region: str | None = None
    service: str = Field(default="aps", min_length=1)
    profile: str | None = None
    throttle_retries: int = Field(default=5, ge=0, le=20, description="429/503 retries per call (AMP)")
    # Hybrid fleets: what this backend holds (one window, or a list unioned);
    # absent: every metric, all the time. Where several backends hold the same data the
    # `primary` one's values win, then higher `priority`, then the order of this list.
    holds: HoldsConfig | list[HoldsConfig] | None = None
    primary: bool = False
    priority: int = 0
    # Prometheus-compatible backends behind basic auth (Mimir, Cortex, Thanos behind a
    # gateway); sent as an Authorization header on every call. Not for kind amp (SigV4).
    basic_auth: BasicAuthConfig | None = None

    @property
    def ident(self) -> str:
        """The backend in cache keys and route ids: name and a hash of the URL (and the
        basic-auth user, whose view may differ), never the URL or a credential."""
        user = self.basic_auth.username if self.basic_auth is not None else ""
        return f"{self.name}#{url_fingerprint(self.url, user)}"

    @property
    def display_url(self) -> str:
        """The URL for banners and messages: scheme, host, port and path only."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))

    def holdings(self, now_ms: int) -> list[BackendHolding]:
        specs = self.holds if isinstance(self.holds, list) else [self.holds]
        out = []
        for h in specs:
            since_ms, until_ms = resolve_window(h.window_spec(), now_ms) if h else (None, None)
            metrics = tuple(h.metrics) if h else (ALL_METRICS,)
            out.append(BackendHolding(self.name, metrics, since_ms, until_ms, self.primary, self.priority))
        return out

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not (v.startswith("http://") or v.startswith("https://")):
            shown = v.rpartition("@")[2] if "@" in v else v
            raise ValueError(f"backend url must start with http:// or https://, got {shown!r}")
        if "@" in urlsplit(v).netloc:
            raise ValueError(
                "backend url must not hold credentials (user:password@): give them as "
                "basic_auth: {username: ..., password_file: ...} (or password)"
            )
        return v.rstrip("/")

    @model_validator(mode="after")
    def _auth_kind(self) -> "BackendConfig":
        if self.basic_auth is not None and self.kind == "amp":
            raise ValueError("basic_auth is not for kind amp: AMP requests are SigV4-signed")
        return self

    @model_validator(mode="before")
    @classmethod
    def _amp_region(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "amp" and not data.get("region") \
                and isinstance(data.get("url"), str):
            m = _AMP_HOST.match(data["url"])
            if not m:
                raise ValueError(
                    "region is required for kind amp unless the url is an AMP workspace URL "
                    "(https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>)"
                )
            data = {**data, "region": m.group(1)}
        return data


class PlannerConfig(StrictModel):
    split_interval: OptDurationMs = None
    shards: int | Literal["auto"] = 1
    shard_labels: dict[str, str] = Field(
        default_factory=lambda: {"DCGM_.*": "Hostname", "node_.*": "instance"}
    )
    min_range_to_split: DurationMs = 0
    max_pieces: int = Field(default=2_000, ge=1)
    # The most shards `shards: auto` gives a query.
    max_parallel: int = Field(default=8, ge=1)
    # How long discovered shard-label values and series counts are used before they are
    # refreshed (in the background; proxy/pipeline/discovery.py).
    shard_values_ttl: DurationMs = 300_000
    # shards: auto -> ceil(estimated samples of the largest piece / this), at most
    # max_parallel, 1 (not sharded) below 2. 10 M: a fifth of Prometheus's default
    # --query.max-samples (50 M), so no piece comes near it.
    max_samples_per_piece: int = Field(default=10_000_000, ge=1)
    # Samples estimate (shards: auto, limits.max_samples): a metric's series are its real
    # series count, asked of the primary (`count({__name__="m"})`, proxy/pipeline/
    # series_counts.py) and shared over the shard-label values a selector lets through;
    # series_per_node is the fallback for a metric whose count is not known (nodes x
    # series_per_node; 8: one per GPU of an 8-GPU node). scrape_interval: samples per window.
    series_per_node: int = Field(default=8, ge=1)
    scrape_interval: DurationMs = Field(default=30_000, gt=0)
    # Instant max/min/sum/count_over_time(x[7d]) cut into sub-windows at split_interval.
    split_instant_windows: bool = True
    # The backend's range windows: "closed" [t-r, t] (Prometheus 2.x), "left_open" (t-r, t]
    # (Prometheus 3.x); sum/count sub-windows are made disjoint accordingly.
    range_windows: Literal["closed", "left_open"] = "closed"
    # A piece the backend refuses for size (too many samples) or time (its own timeout) is cut
    # finer -- max_parallel node shards first, then halves of its time range -- and asked
    # again, up to this many levels (0: never; proxy/pipeline/refusals.py). What worked is
    # remembered per metric for refusal_memory, so later queries start cut.
    refusal_split_depth: int = Field(default=6, ge=0)
    refusal_memory: DurationMs = Field(default=3_600_000, ge=0)

    @field_validator("shards")
    @classmethod
    def _shards(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("shards must be >= 1 or 'auto'")
        return v


class LimitsConfig(StrictModel):
    max_points: int = Field(default=11_000, ge=1)
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    query_timeout: DurationMs = 120_000
    # Longest range a query_range may span (0: no limit); longer ones get a 422 saying so.
    max_query_range: DurationMs = 0
    # Most samples a query may touch, estimated by the planner (series x points: real series
    # counts, else nodes x planner.series_per_node); over it: 422 saying so. 0: no limit (the
    # estimate is a heuristic: opt in).
    max_samples: int = Field(default=0, ge=0)
    # Most backend calls one query may make, after coalescing (a join across stores, a
    # query too wide for one call...); over it: 422 naming the limit. AMP bills each call's
    # samples. 0: no limit.
    max_backend_calls: int = Field(default=256, ge=0)
    # Most new cache entries one query may write: the rest of its pieces are answered but not
    # kept (a ten-year range would otherwise leave thousands of keys for cache.ttl). 0: no limit.
    max_new_cache_keys: int = Field(default=2_048, ge=0)
    # Most raw samples a query may gather for a range function whose window straddles two
    # stores (fetched from each and evaluated by promaccel); over it: 422 naming the limit.
    # 0: no limit.
    max_window_samples: int = Field(default=20_000_000, ge=0)
    # In-process evaluation (cross-store queries) runs in worker threads, under the query's
    # deadline. Its work (samples visited: series x steps x samples in a window for a range
    # function; input and output samples for an operator) is estimated before each node runs;
    # over max_eval_work: 422 naming the limit (~1-2.5 ns a unit on one core). A node giving
    # more than max_eval_series series (count_values over a wide expression): 422. 0: no limit.
    max_eval_work: int = Field(default=4_000_000_000, ge=0)
    max_eval_series: int = Field(default=200_000, ge=0)
    # Admission: queries (query, query_range) running at once, in all and per client (the
    # tenant's forwarded headers when tenancy.forward_headers is set, else the client's
    # address -- behind Grafana every viewer has Grafana's address, hence off by default);
    # beyond them a query waits in a queue of at most max_queued, at most queue_timeout,
    # then gets 429 with Retry-After and Prometheus's error body. 0: no limit.
    max_queries_in_flight: int = Field(default=256, ge=0)
    max_queries_per_client: int = Field(default=0, ge=0)
    max_queued: int = Field(default=1024, ge=0)
    queue_timeout: DurationMs = Field(default=30_000, ge=0)
    # Bytes of answers being materialised at once (decoded: 16 a sample + labels; a cold
    # answer's transient copies cost ~3x that in RSS): each query reserves its estimated
    # answer before fetching, waits (in order, at most queue_timeout and its deadline, then
    # 429) while the budget is taken, and gives it back once the response is sent. A query
    # larger than the budget runs alone. 0: no limit. 32 MiB (was 64): 20 heavy 24 h queries
    # at once (scenario (e)) peaked at +103-138 MiB over idle with 64 and +98-108 with 32,
    # no slower (docs/BENCHMARKS.md, seventh session); a 24 h raw panel of 2,048 GPUs
    # (~46 MiB reserved) now runs alone.
    max_inflight_answer_bytes: int = Field(default=32 * 1024 * 1024, ge=0)


# Headers promaccel sets itself or that describe the connection, never forwarded.
_NOT_FORWARDABLE = frozenset({
    "host", "content-length", "content-type", "content-encoding", "transfer-encoding", "connection",
    "keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "accept-encoding", "user-agent",
    "cookie", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256",
})


class TenancyConfig(StrictModel):
    """Client headers passed through to the backends (multi-tenant Cortex/Mimir/Thanos
    backends: `X-Scope-OrgID`; per-user auth at the backend: `Authorization`).

    Exactly these headers go to every `kind: prometheus` backend on every call made for the
    request (query, query_range and their planned pieces, series/labels/metadata relays,
    shard-value discovery) and key the cache and request coalescing (a keyed BLAKE2b hash of
    their values: two tenants never share a cache entry or a backend call). They are never
    sent to `kind: amp` backends (one AWS identity; Authorization is SigV4). Empty (the
    default): no client header reaches a backend and none is part of a cache key; everyone
    gets promaccel's own identity at the backend.

    `hash_key_file`: a file holding the key of that hash (any bytes; share it between
    promaccel instances that share a Redis cache). Without it a fixed key is used: fine for
    tenant ids, but give one when `Authorization` is forwarded, so that a Redis reader cannot
    test guessed passwords against the hashes in the keys."""

    forward_headers: list[str] = Field(default_factory=list)
    hash_key_file: str | None = None

    @field_validator("forward_headers")
    @classmethod
    def _headers(cls, v: list[str]) -> list[str]:
        out: list[str] = []
        for name in v:
            low = name.strip().lower()
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9a-z-]+", low):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if low in _NOT_FORWARDABLE:
                raise ValueError(f"header {name!r} cannot be forwarded (promaccel or the connection sets it)")
            if low not in out:
                out.append(low)
        return out

    @field_validator("hash_key_file")
    @classmethod
    def _key_file(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                data = Path(v).read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read hash_key_file {v!r}: {exc.strerror}") from None
            if len(data.strip()) < 16:
                raise ValueError(f"hash_key_file {v!r} must hold at least 16 bytes")
        return v

    def hash_key(self) -> bytes:
        if self.hash_key_file is None:
            return b"promaccel-tenancy-v2"
        return Path(self.hash_key_file).read_bytes().strip()[:64]


class ListenConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=9091, ge=0, le=65535)
    # Server limits (proxy/api/server_limits.py). A request's line and headers: at most max_header_bytes
    # (else 431 and close), complete within header_timeout of the connection opening or of the
    # request's first byte; its body complete within body_timeout of the headers (else 408 and
    # close). Idle keep-alive connections close after keep_alive_timeout (longer than Grafana's
    # Go client keeps them idle, 90 s, so promaccel never closes one about to be reused).
    # max_concurrency: requests running at once beyond which a request gets 503 (never
    # /-/healthy, /-/ready); idle sockets do not count (issue 26). first_byte_timeout: a new
    # connection that sends nothing this long is closed. max_connections: open client sockets;
    # beyond it the connection idle longest is closed (kept below the open-files limit).
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
    first_byte_timeout: DurationMs = Field(default=10_000, gt=0)
    header_timeout: DurationMs = Field(default=30_000, gt=0)
    body_timeout: DurationMs = Field(default=60_000, gt=0)
    keep_alive_timeout: DurationMs = Field(default=120_000, gt=0)
    max_concurrency: int = Field(default=1024, ge=1)
    max_connections: int = Field(default=4096, ge=16)
    # A client that takes none of its answer for this long while promaccel has more to send
    # (the socket's send buffer full) is cut off: a client that never reads holds neither
    # the answer nor its share of limits.max_inflight_answer_bytes longer than this.
    send_timeout: DurationMs = Field(default=60_000, gt=0)
    # On SIGTERM/SIGINT: stop accepting, let queries in flight finish for at most this long
    # (Kubernetes gives 30 s by default before SIGKILL), then close the pools.
    shutdown_timeout: DurationMs = Field(default=25_000, gt=0)


class UiConfig(StrictModel):
    """The operator page, GET /ui and /ui/data.json (proxy/api/ui.py): public like /metrics."""

    enabled: bool = True
    recent_queries: int = Field(default=100, ge=1, le=10_000)


class TracingConfig(StrictModel):
    """Optional OpenTelemetry tracing (proxy/observe/tracing.py; needs the `tracing` extra). Off unless
    otlp_endpoint is set or the environment names an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)."""

    otlp_endpoint: str | None = None  # OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces
    service_name: str | None = None  # null: $OTEL_SERVICE_NAME, else "promaccel"
    sample_ratio: float | None = Field(default=None, ge=0.0, le=1.0)  # null: $OTEL_TRACES_SAMPLER_ARG, else 1

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"otlp_endpoint must be an http(s) URL, got {v!r}")
        if parts.username or parts.password:
            raise ValueError("otlp_endpoint must not hold user:pass@ (use OTEL_EXPORTER_OTLP_HEADERS)")
        return v


class Config(StrictModel):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    backends: list[BackendConfig] = Field(default_factory=list)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # text: one line per request, human-readable; json: one JSON object per log record (the
    # access line carries query id, Grafana's headers, plan shape, pieces, cache, backend calls,
    # samples, bytes, duration).
    log_format: Literal["text", "json"] = "text"
    # A query that takes longer is logged again at WARNING with its plan (0: never).
    slow_query_log: DurationMs = 10_000

    @model_validator(mode="after")
    def _tenancy(self) -> "Config":
        if "authorization" in self.tenancy.forward_headers:
            clash = [b.name for b in self.backends if b.basic_auth is not None]
            if clash:
                raise ValueError(
                    "tenancy.forward_headers has authorization, but backend(s) "
                    f"{', '.join(map(repr, clash))} send their own basic_auth: one Authorization "
                    "header per request")
        return self

    @model_validator(mode="after")
    def _auth(self) -> "Config":
        if not self.auth.enabled:
            return self
        names = {b.name for b in self.backends}
        for t in self.auth.tenants:
            unknown = [n for n in t.backends or () if n not in names]
            if unknown and self.backends:  # no backends yet: load_config adds --backend ones
                raise ValueError(f"tenant {t.name!r} names unknown backend(s) {', '.join(map(repr, unknown))}")
            # Its pinned forwarded headers (auth.tenants[].forward_headers, proxy/config/auth.py).
            unlisted = [h for h in t.forward_headers if h not in self.tenancy.forward_headers]
            if unlisted:
                raise ValueError(f"tenant {t.name!r} pins forward_headers {', '.join(map(repr, unlisted))} "
                                 "that tenancy.forward_headers does not list")
        if "authorization" in self.tenancy.forward_headers:
            raise ValueError("tenancy.forward_headers has authorization, but auth is on: the client's "
                             "Authorization header holds its promaccel credential, never forwarded")
        admin = self.cache.admin_token or os.environ.get("PROMACCEL_ADMIN_TOKEN")
        if admin and any(sha256_hex(admin) in t.token_digests() for t in self.auth.tenants):
            raise ValueError("cache.admin_token is also a tenant's token: give admin its own")
        return self

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[BackendConfig]) -> list[BackendConfig]:
        names = [b.name for b in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"backend names must be unique, {', '.join(map(repr, dupes))} repeats")
        primaries = [b.name for b in v if b.primary]
        if len(primaries) > 1:
            raise ValueError(f"at most one backend may be primary, got {', '.join(primaries)}")
        return v


def _describe(err: ValidationError) -> str:
    lines: list[str] = []
    for e in err.errors():
        # Union members show up in the location ("function-after[...]", "list[...]"): drop them.
        key = ".".join(str(p) for p in e["loc"] if "[" not in str(p)) or "(top level)"
        if e["type"] == "extra_forbidden":
            line = f"unknown key {key!r}"
        elif e["type"] in ("model_type", "dict_type", "list_type") and len(err.errors()) > 1:
            continue  # the other union member's complaint says more
        else:
            line = f"{key}: {e['msg']}"
        if line not in lines:
            lines.append(line)
    return "invalid configuration: " + "; ".join(lines)


def build_config(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(p)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    return data


def load_config(
    path: str | None = None,
    *,
    backends: list[str] | None = None,
    redis_url: str | None = None,
    host: str | None = None,
    port: int | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """File (or $PROMACCEL_CONFIG), then flags on top."""
    path = path or os.environ.get("PROMACCEL_CONFIG") or None
    data: dict[str, Any] = load_file(path) if path else {}
    if backends:
        data["backends"] = [
            {"name": "default" if i == 0 else f"backend{i}", "url": url}
            for i, url in enumerate(backends)
        ]
    for section, values in (overrides or {}).items():
        if values:
            merged = dict(data.get(section) or {})
            merged.update(values)
            data[section] = merged
    if redis_url is not None:
        cache = dict(data.get("cache") or {})
        cache["redis_url"] = redis_url
        data["cache"] = cache
    if host is not None or port is not None:
        listen = dict(data.get("listen") or {})
        if host is not None:
            listen["host"] = host
        if port is not None:
            listen["port"] = port
        data["listen"] = listen
    cfg = build_config(data)
    if not cfg.backends:
        raise ConfigError("no backend configured: pass --backend URL or list backends in the config file")
    return cfg
