"""Dashboard replay benchmark: promaccel against direct Prometheus, side by side, one run.

    python -m loadtests.bench                      # bench dataset (256 nodes x 8 GPUs x 24 h),
                                                   # (b)'s 7d window on the long one (32 x 8 x 168 h)
    python -m loadtests.bench --small              # 16 x 4 x 6 h, a minute or two (no long dataset)
    python -m loadtests.bench --scenario dashboard --window 7d --refreshes 3   # the long dataset only
    python -m loadtests.bench --scenario dashboard --window 24h --refreshes 20
    python -m loadtests.bench --promaccel-args "--split-interval 1h --shards 4"

It builds (once; cached under .cache/bench/) a generated GPU fleet TSDB, starts Prometheus,
Redis and promaccel on free loopback ports, and runs the scenarios of issue 7:

  cold       (a) one heavy 24 h range query, promaccel's cache cold (a fresh instance per rep)
  dashboard  (b) the GPU fleet dashboard refreshed with the window sliding 30 s, per --window
  tiny       (c) `vector(1)` and one-series queries, sequential: the proxy's own added ms
  users      (d) --users users refreshing one dashboard at once: backend calls vs one user's
  heavy      (e) --heavy distinct heavy queries at once: promaccel's peak RSS and failures
  codec      (f) loadtests/codec_bench.py's output, when that file exists
  workers    (g) the --users users' dashboard through 1 vs --workers worker processes vs
             --processes separate promaccel processes (users spread over them), all sharing
             Redis: round wall time, backend calls (counted by Prometheus), answers compared

Virtual users behave like Grafana's server-side Prometheus data source: POST form bodies,
steps and step-aligned windows from `loadtests.dashboard.panel_requests`, all panels of a
refresh at once behind a limit of 6 requests in flight per user (a browser's HTTP/1.1
connection limit per host). Time is virtual: the data ends at a fixed past instant, "now" is
that instant (minus a small phase so windows are not pre-aligned), and refresh i of n sees
now - (n-1-i) * slide, run back to back instead of sleeping.

Two datasets: a dashboard window (b) longer than the main dataset covers (7d on the 24 h
bench dataset) runs on a second, longer one (--long-nodes x --long-gpus-per-node x
--long-hours, default 32 x 8 x 168 h: about as many samples as the main one, so a direct 7 d
refresh stays well inside Prometheus's 2-minute query timeout). It is built (once, cached)
before anything is measured, served by its own Prometheus (started for those windows, stopped
after them) with a fresh promaccel in front, sharing Redis, the bounds and the request budget.
It ends where the main one does, so virtual now is the same; the report says which dataset
each window ran on. Every other scenario uses the main dataset. --no-long (and --small, unless
a --long-* option is given) skips such windows instead.

Direct and promaccel requests alternate refresh by refresh (and swap order each time) so noise
hits both, and every promaccel answer is compared with the direct answer to the same request:
a speed-up of wrong answers is not a speed-up.

Bounds: each scenario stops starting refreshes after --duration-limit seconds; the whole run
sends at most --max-requests requests; users <= 200; all targets are 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import gc
import importlib
import importlib.util
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from .compare import diff_answers
from .dashboard import (
    DEFAULT_DASHBOARD,
    PanelRequest,
    align_ns,
    load_dashboard,
    panel_requests,
    parse_grafana_duration_ns,
)
from .report import (
    Progress,
    Samples,
    backend_calls,
    cache_lookups,
    counter_delta,
    git_info,
    layout_name,
    machine_info,
    parse_metrics,
    prometheus_query_traffic,
    write_report,
)
from .services import (
    Promaccel,
    RedisServer,
    RssSampler,
    assert_loopback,
    cpu_seconds,
    free_port,
    http_get,
    http_post_form,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CACHE_DIR = ROOT / ".cache" / "bench"

SCENARIOS = ("cold", "dashboard", "tiny", "users", "heavy", "codec", "workers")
_ALIASES = {"a": "cold", "b": "dashboard", "c": "tiny", "d": "users", "e": "heavy", "f": "codec", "g": "workers"}
GRAFANA_CONCURRENCY = 6  # requests in flight per user (browser HTTP/1.1 limit per host)
MAX_USERS = 200
# "now" sits this far before the data's end: a real clock is never on a step boundary, and a
# window that is exactly aligned would hide alignment bugs.
PHASE_S = 12.345
_NS = 1_000_000_000

# The long dataset (--long-nodes, --long-gpus-per-node, --long-hours): 7 days of a fleet an
# eighth the size of the bench dataset, about as many samples (77.1 M against 89.2 M), so a
# direct 7 d refresh (Grafana steps 5-20 min, but every sample of the week is decoded) takes
# about what a 24 h one takes on the main dataset: measured 8-23 s a refresh, the slowest
# panel 19 s, on the shared 2 cores; far from Prometheus's 2-minute query timeout and its
# 50 M samples limit. Same as loadtests.load's "bench-long" dataset.
LONG_DEFAULTS = (32, 8, 168.0)

HEAVY_QUERY = "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)"
HEAVY_STEP_S = 60
# Distinct heavy queries for scenario (e); cycled with the end moved back a step per cycle so
# no two requests are identical (a cache or request coalescing must not hide the load).
HEAVY_EXPRS = (
    "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "sum by (Hostname) (DCGM_FI_DEV_FB_USED)",
    "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)",
    "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
    "sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]))",
    "sum by (instance) (rate(node_network_receive_bytes_total[5m]))",
    "topk(10, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    "DCGM_FI_DEV_GPU_UTIL",
)
ONE_SERIES = 'up{job="node-exporter",instance="gpu-node-0000:9100"}'


class BudgetExhausted(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Virtual time and requests (pure)
# ---------------------------------------------------------------------------------------------


def parse_duration_s(text: str) -> float:
    return parse_grafana_duration_ns(text) / _NS


def sliding_windows(now_s: float, window_s: float, slide_s: float, refreshes: int) -> list[tuple[float, float]]:
    """(start, end) of each refresh of a "last window_s" dashboard: the last one ends at now_s,
    each earlier one slide_s before the next."""
    if refreshes < 1 or window_s <= 0 or slide_s < 0:
        raise ValueError("need refreshes >= 1, window > 0, slide >= 0")
    ends = [now_s - (refreshes - 1 - i) * slide_s for i in range(refreshes)]
    return [(e - window_s, e) for e in ends]


def range_request(title: str, expr: str, start_s: float, end_s: float, step_s: float) -> PanelRequest:
    """A range query with start and end rounded down to the step, as Grafana aligns them."""
    step_ns = int(round(step_s * _NS))
    start_ns = align_ns(int(round(start_s * _NS)), step_ns)
    end_ns = align_ns(int(round(end_s * _NS)), step_ns)
    return PanelRequest(title=title, expr=expr, start=start_ns / _NS, end=end_ns / _NS, step=step_ns / _NS,
                        start_ns=start_ns, end_ns=end_ns, step_ns=step_ns)


def instant_request(title: str, expr: str, t_s: float) -> PanelRequest:
    t_ns = int(round(t_s * _NS))
    return PanelRequest(title=title, expr=expr, start=t_ns / _NS, end=t_ns / _NS, step=0.0,
                        start_ns=t_ns, end_ns=t_ns, instant=True)


def panel_key(req: PanelRequest) -> str:
    key = req.title or req.expr
    if req.ref_id not in ("A", ""):
        key += f" [{req.ref_id}]"
    return key


def heavy_requests(n: int, now_s: float, range_s: float, step_s: float = HEAVY_STEP_S) -> list[PanelRequest]:
    out = []
    for i in range(n):
        expr = HEAVY_EXPRS[i % len(HEAVY_EXPRS)]
        shift = (i // len(HEAVY_EXPRS)) * step_s
        out.append(range_request(f"heavy {i}", expr, now_s - shift - range_s, now_s - shift, step_s))
    return out


class Budget:
    """A hard cap on requests sent in the whole run."""

    def __init__(self, max_requests: int) -> None:
        self.max_requests = max_requests
        self.sent = 0

    def take(self, n: int = 1) -> None:
        if self.sent + n > self.max_requests:
            raise BudgetExhausted(f"request budget of {self.max_requests} exhausted")
        self.sent += n


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() - self.t0 >= self.seconds


# ---------------------------------------------------------------------------------------------
# HTTP client (a Grafana-like data source)
# ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    latency_s: float
    pieces: str | None = None
    error: str | None = None
    retries: int = 0

    @property
    def failed(self) -> bool:
        return self.error is not None or self.status >= 500


class Client:
    """POSTs PanelRequests to one base URL over a pooled keep-alive session (aiohttp: the
    load generator must cost less than what it measures)."""

    def __init__(self, base_url: str, budget: Budget, timeout_s: float) -> None:
        assert_loopback(base_url)
        self.base_url = base_url.rstrip("/")
        self.budget = budget
        self.timeout_s = timeout_s
        self.done = 0
        self._session: Any = None

    async def __aenter__(self) -> "Client":
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def send(self, req: PanelRequest) -> Answer:
        import aiohttp

        self.budget.take()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept-Encoding": "gzip",
            "User-Agent": "Grafana/11 (promaccel bench)",
            "X-Panel-Id": str(req.panel_id or ""),
        }
        t0 = time.perf_counter()
        data = req.body().encode()
        retries = 0
        try:
            while True:
                try:
                    async with self._session.post(self.base_url + req.path, data=data, headers=headers) as r:
                        body = await r.read()
                        return Answer(r.status, body, time.perf_counter() - t0, r.headers.get("X-Promaccel-Pieces"),
                                      retries=retries)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    # A pooled keep-alive connection the server closed meanwhile (an idle
                    # timeout race). Go's http.Transport (Grafana) resends when nothing was
                    # written on the reused connection; queries are read-only, so resend once
                    # here in any case, and count it: the report shows how often it happened.
                    if retries or not _stale_connection(exc):
                        raise
                    retries += 1
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return Answer(0, b"", time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}", retries)
        finally:
            self.done += 1


def _stale_connection(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "ServerDisconnectedError" or "Can not write request body" in text \
        or "Connection reset" in text or "Broken pipe" in text


@dataclass
class RefreshRun:
    wall_s: float
    answers: list[Answer]


async def user_refresh(client: Client, reqs: Sequence[PanelRequest], limit: int = GRAFANA_CONCURRENCY) -> RefreshRun:
    """One user's dashboard refresh: every panel at once, at most `limit` in flight."""
    sem = asyncio.Semaphore(limit)

    async def one(r: PanelRequest) -> Answer:
        async with sem:
            return await client.send(r)

    t0 = time.perf_counter()
    answers = await asyncio.gather(*(one(r) for r in reqs))
    return RefreshRun(time.perf_counter() - t0, list(answers))


# ---------------------------------------------------------------------------------------------
# Answer comparison
# ---------------------------------------------------------------------------------------------


def compare_answers(direct: Answer, proxied: Answer) -> list[str]:
    """Differences between the direct and the proxied answer ([] when equivalent)."""
    if direct.status == proxied.status and direct.body == proxied.body:
        return []
    import orjson

    enabled = gc.isenabled()
    gc.disable()  # millions of small lists: the collector would dominate (DESIGN.md)
    try:
        try:
            d, p = orjson.loads(direct.body), orjson.loads(proxied.body)
        except orjson.JSONDecodeError:
            return [f"HTTP {direct.status} vs {proxied.status}; a body is not JSON: {proxied.body[:120]!r}"]
        problems = diff_answers(d, p)
    finally:
        if enabled:
            gc.enable()
    if direct.status != proxied.status:
        problems.insert(0, f"HTTP status {direct.status} != {proxied.status}")
    return problems


@dataclass
class Tally:
    """Comparisons and failures of one scenario. A failure is no HTTP answer or a 5xx; direct
    failures (Prometheus overloaded or timing out) are counted apart from promaccel's."""

    compared: int = 0
    mismatches: int = 0
    failures: int = 0  # promaccel's
    direct_failures: int = 0
    retries: dict[str, int] = field(default_factory=lambda: {"direct": 0, "promaccel": 0})
    mismatch_examples: list[str] = field(default_factory=list)
    failure_examples: list[str] = field(default_factory=list)

    def note(self, label: str, mode: str, a: Answer) -> bool:
        """Records one answer's retries and failure; True when it failed."""
        self.retries[mode] += a.retries
        if not a.failed:
            return False
        if mode == "direct":
            self.direct_failures += 1
        else:
            self.failures += 1
        if len(self.failure_examples) < 10:
            self.failure_examples.append(f"{mode} {label}: HTTP {a.status} {a.error or a.body[:200]!r}")
        return True

    def check(self, label: str, direct: Answer, proxied: Answer, *, direct_noted: bool = False) -> bool:
        """Compares one pair; returns True when they are equivalent."""
        bad = direct.failed if direct_noted else self.note(label, "direct", direct)
        bad = self.note(label, "promaccel", proxied) or bad
        if bad:
            return False
        self.compared += 1
        problems = compare_answers(direct, proxied)
        if problems:
            self.mismatches += 1
            if len(self.mismatch_examples) < 10:
                self.mismatch_examples.append(f"{label}: " + "; ".join(problems[:3]))
            return False
        return True

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# The environment: data, Prometheus, Redis, promaccel, meters
# ---------------------------------------------------------------------------------------------


_LOG_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback (most recent call last)")


def scan_log(path: Path, keep: int = 5) -> dict[str, Any]:
    """Warnings and errors a promaccel wrote while the bench drove it (cache timeouts, backend
    errors): the numbers next to them read differently."""
    found: dict[str, Any] = {"warnings": 0, "errors": 0, "examples": []}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        if not any(level in line for level in _LOG_LEVELS):
            continue
        found["warnings" if " WARNING " in line else "errors"] += 1
        if len(found["examples"]) < keep:
            found["examples"].append(line[:300])
    return found


def code_digest() -> str:
    """A digest of promaccel's source: each scenario starts a fresh promaccel from the working
    tree, so a change made while the bench runs would mix two versions in one report."""
    import hashlib

    h = hashlib.sha256()
    for pkg in ("proxy", "shardplanner"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


@dataclass
class Snapshot:
    prom: Samples
    prom_cpu_s: float
    pa: Samples
    pa_cpu_s: float


@dataclass
class LongData:
    """The long dataset: its Prometheus starts the first time a window needs it and stops when
    the dashboard scenario is done (an idle second Prometheus must not sit next to the other
    scenarios' measurements)."""

    spec: Any
    data_dir: Path
    workdir: Path
    info: dict[str, Any]
    prom: Any = None

    def start(self, progress: Progress, notes: list[str]) -> tuple[str, int]:
        if self.prom is None:
            load = _load_module()
            progress.update(f"starting Prometheus on the long dataset {self.data_dir}", force=True)
            self.prom = load.start_prometheus(str(self.data_dir), free_port(),
                                              log_path=str(self.workdir / "prometheus-long.log"))
            assert_loopback(self.prom.url)
            settle_s = settle_prometheus(self.prom.url, self.prom.pid, self.data_dir, progress)
            if settle_s:
                notes.append(f"waited {settle_s:.0f} s for Prometheus to compact the long dataset's freshly built "
                             "blocks (once per dataset)")
        return self.prom.url, self.prom.pid

    def stop(self) -> None:
        if self.prom is not None:
            _load_module().stop_prometheus(self.prom)
            self.prom = None


@dataclass
class Env:
    args: argparse.Namespace
    prom_url: str
    prom_pid: int | None
    data_start_s: float
    now_s: float
    workdir: Path
    promaccel_args: list[str]
    redis: RedisServer | None
    progress: Progress
    budget: Budget
    dashboard: dict[str, Any]
    promaccel: Promaccel | None = None
    # Further promaccel processes beside `promaccel` (scenario (g)'s separate processes).
    others: list[Promaccel] = field(default_factory=list)
    code_digests: list[str] = field(default_factory=list)
    log_findings: list[dict[str, Any]] = field(default_factory=list)
    dataset: str = "main"  # which dataset prom_url serves: "main" or "long"
    dataset_info: dict[str, Any] = field(default_factory=dict)
    long: LongData | None = None

    def on_long(self, notes: list[str]) -> "Env":
        """This environment on the long dataset: its Prometheus (started if need be), a
        promaccel in front of it (started by the scenario), the same Redis, budget, bounds,
        code digests and log findings. Same end time, so the same virtual now."""
        assert self.long is not None
        self.stop_promaccel()
        url, pid = self.long.start(self.progress, notes)
        return dataclasses.replace(self, prom_url=url, prom_pid=pid, data_start_s=float(self.long.spec.start),
                                   now_s=self.long.spec.end - PHASE_S, promaccel=None, dataset="long",
                                   dataset_info=self.long.info, long=None)

    @property
    def data_span_s(self) -> float:
        return self.now_s + PHASE_S - self.data_start_s

    def fresh_promaccel(self, workers: int = 1, processes: int = 1) -> Promaccel:
        """A new promaccel with an empty cache (Redis flushed), counters and RSS from zero;
        `processes` > 1: that many separate promaccel processes sharing the Redis (the first
        returned, the others in `others`)."""
        self.stop_promaccel()
        if self.redis is not None:
            self.redis.flush()
        self.code_digests.append(code_digest())
        args = [*self.promaccel_args, *(["--workers", str(workers)] if workers > 1 else [])]
        started = [Promaccel.start(self.prom_url, args, self.workdir, self.redis.url if self.redis else None)
                   for _ in range(max(1, processes))]
        self.promaccel, self.others = started[0], started[1:]
        for pa in started:
            self._warm_up(pa, workers)
        return self.promaccel

    def _warm_up(self, pa: Promaccel, workers: int = 1) -> None:
        """First requests of a new process pay for lazy imports and the backend connection:
        that is start-up, not cache coldness. Two requests outside the data's window (so no
        cache entry a scenario uses) take that cost before anything is measured; with several
        workers, a few rounds of them, each on a new connection (the kernel hands each to a
        worker), so that every worker most likely got some."""
        t = self.data_start_s - 7200
        for _ in range(1 if workers <= 1 else 4 * workers):
            for req in (instant_request("warm-up", "vector(1)", t), range_request("warm-up", "vector(1)", t - 3600, t, 60)):
                self.budget.take()
                status, body = http_post_form(pa.url + req.path, req.body())
                if status != 200:
                    raise RuntimeError(f"promaccel warm-up {req.path} answered {status}: {body[:300]!r}")

    def stop_promaccel(self) -> None:
        for pa in [*([self.promaccel] if self.promaccel is not None else []), *self.others]:
            pa.stop()
            self.log_findings.append(scan_log(pa.log))
        self.promaccel, self.others = None, []

    def snapshot(self) -> Snapshot:
        status, body = http_get(self.prom_url + "/metrics")
        prom = parse_metrics(body.decode()) if status == 200 else {}
        pa: Samples = {}
        pa_cpu = 0.0
        if self.promaccel is not None:
            pa = parse_metrics(self.promaccel.metrics_text())
            pa_cpu = sum(cpu_seconds(p.pid) for p in (self.promaccel, *self.others))
        return Snapshot(prom, cpu_seconds(self.prom_pid) if self.prom_pid else math.nan, pa, pa_cpu)

    @staticmethod
    def delta(a: Snapshot, b: Snapshot) -> dict[str, Any]:
        reqs, nbytes = prometheus_query_traffic(a.prom, b.prom)
        out: dict[str, Any] = {"backend_requests": reqs, "backend_bytes": nbytes,
                               "prometheus_cpu_s": b.prom_cpu_s - a.prom_cpu_s}
        if b.pa:
            out["backend_calls"] = backend_calls(a.pa, b.pa)
            out["cache"] = cache_lookups(a.pa, b.pa)
            out["cache_errors"] = counter_delta(a.pa, b.pa, "promaccel_cache_errors_total", by="op")
            out["promaccel_cpu_s"] = b.pa_cpu_s - a.pa_cpu_s
        return out


async def _metered(env: Env, coro: Awaitable[Any]) -> tuple[Any, dict[str, Any]]:
    before = env.snapshot()
    result = await coro
    return result, Env.delta(before, env.snapshot())


class Ticker:
    """Refreshes the progress line once a second while a long round runs."""

    def __init__(self, env: Env, text: Callable[[], str]) -> None:
        self.env, self.text = env, text
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.env.progress.update(self.text())
            await asyncio.sleep(1.0)

    async def __aenter__(self) -> "Ticker":
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


async def scenario_cold(env: Env) -> dict[str, Any]:
    """(a) One heavy range query with promaccel's cache cold: a fresh instance per repetition."""
    span = env.data_span_s
    range_s = min(86_400.0, span)
    req = range_request("cold heavy", HEAVY_QUERY, env.now_s - range_s, env.now_s, HEAVY_STEP_S)
    s: dict[str, Any] = {"name": "cold", "query": HEAVY_QUERY, "range": f"{range_s / 3600:g}h", "step": HEAVY_STEP_S,
                         "points_per_series": req.points, "reps": [], "notes": []}
    if range_s < 86_400:
        s["notes"].append(f"the dataset covers {span / 3600:.1f} h: the query spans {range_s / 3600:g} h, not 24 h")
    tally = Tally()
    deadline = Deadline(env.args.duration_limit)
    async with Client(env.prom_url, env.budget, env.args.timeout) as direct:
        warm = await direct.send(req)  # Prometheus's page cache: warm for both modes
        s["answer_bytes"] = len(warm.body)
        for rep in range(env.args.cold_reps):
            if deadline.expired():
                s["notes"].append(f"duration limit reached after {rep} repetitions")
                break
            pa = env.fresh_promaccel()
            async with Client(pa.url, env.budget, env.args.timeout) as proxied:
                first = "direct" if rep % 2 == 0 else "promaccel"
                if first == "direct":
                    d = await direct.send(req)
                p, meters = await _metered(env, proxied.send(req))
                if first == "promaccel":
                    d = await direct.send(req)
            tally.check(f"rep {rep}", d, p)
            s["reps"].append({"first": first, "direct_s": d.latency_s, "promaccel_s": p.latency_s,
                              "pieces": p.pieces, "status": [d.status, p.status], **meters})
            env.progress.update(f"(a) cold rep {rep + 1}/{env.args.cold_reps}: direct {d.latency_s * 1000:.0f} ms, "
                                f"promaccel {p.latency_s * 1000:.0f} ms")
    env.stop_promaccel()
    s.update(tally.as_dict())
    return s


async def scenario_dashboard(env: Env, window: str) -> dict[str, Any]:
    """(b) The dashboard refreshed with the window sliding: cold first refresh, then warm."""
    a = env.args
    window_s = parse_duration_s(window)
    span = env.data_span_s
    s: dict[str, Any] = {"name": "dashboard", "window": window, "slide_s": a.slide_s, "refreshes": [],
                         "notes": [], "concurrency": GRAFANA_CONCURRENCY, "dataset": env.dataset,
                         "dataset_info": env.dataset_info}
    if window_s > span + 1e-6:
        if not a.long_enabled:
            hint = "the long dataset is off (--no-long, or --small without a --long-* option)"
        elif env.dataset == "main" and window_s > a.long_hours * 3600 + 1e-6:
            hint = f"so does the long dataset ({a.long_hours:g} h; --long-hours)"
        else:
            hint = "build a longer one with --hours"
        s["notes"].append(f"skipped: the dataset covers {span / 3600:g} h, less than the {window} window; {hint}")
        s["skipped"] = True
        return s
    windows = sliding_windows(env.now_s, window_s, a.slide_s, a.refreshes)
    if windows[0][0] < env.data_start_s:
        s["notes"].append(f"the first refresh's window starts {env.data_start_s - windows[0][0]:.0f} s before the "
                          "data does (those steps are empty in both modes)")
    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid).start()
    cpu0 = cpu_seconds(pa.pid)
    tally = Tally()
    deadline = Deadline(a.duration_limit)
    try:
        async with Client(env.prom_url, env.budget, a.timeout) as direct, \
                Client(pa.url, env.budget, a.timeout) as proxied:
            # Untimed: brings the window's blocks into the page cache, so the first measured
            # refresh does not charge disk reads to whichever mode goes first.
            env.progress.update(f"(b) {window}: untimed direct refresh to warm Prometheus", force=True)
            warm = await user_refresh(direct, panel_requests(env.dashboard, *windows[0], a.width))
            s["warm_up_s"] = warm.wall_s
            for i, (start, end) in enumerate(windows):
                if deadline.expired() or env.budget.sent >= env.budget.max_requests:
                    s["notes"].append(f"duration or request limit reached after {i} refreshes")
                    break
                reqs = panel_requests(env.dashboard, start, end, a.width)
                s["panels"] = len(reqs)
                modes: dict[str, Any] = {}
                runs: dict[str, RefreshRun] = {}
                order = ("direct", "promaccel") if i % 2 == 0 else ("promaccel", "direct")
                for mode in order:
                    client = direct if mode == "direct" else proxied
                    run, meters = await _metered(env, user_refresh(client, reqs))
                    runs[mode] = run
                    modes[mode] = {
                        "wall_s": run.wall_s,
                        "panels": {panel_key(r): x.latency_s for r, x in zip(reqs, run.answers)},
                        "bytes": sum(len(x.body) for x in run.answers),
                        "pieces": [x.pieces for x in run.answers] if mode == "promaccel" else None,
                        **meters,
                    }
                for r, d, p in zip(reqs, runs["direct"].answers, runs["promaccel"].answers):
                    tally.check(f"{window} refresh {i} {panel_key(r)}", d, p)
                s["refreshes"].append({"index": i, "start": start, "end": end, "first": order[0], **modes})
                env.progress.update(
                    f"(b) {window} refresh {i + 1}/{len(windows)}: direct {runs['direct'].wall_s * 1000:,.0f} ms, "
                    f"promaccel {runs['promaccel'].wall_s * 1000:,.0f} ms, mismatches {tally.mismatches}")
                del runs
    finally:
        rss.stop()
        s["promaccel_peak_rss"] = rss.peak
        s["promaccel_cpu_s"] = cpu_seconds(pa.pid) - cpu0
        env.stop_promaccel()
    s.update(tally.as_dict())
    return s


async def scenario_tiny(env: Env) -> dict[str, Any]:
    """(c) Small answers, one request at a time: what the proxy adds per request."""
    a = env.args
    s: dict[str, Any] = {"name": "tiny", "requests_per_query": a.tiny_requests, "queries": [], "notes": []}
    kinds: list[tuple[str, bool, Callable[[int], PanelRequest]]] = [
        ("vector(1)", False, lambda i: instant_request("vector(1)", "vector(1)", env.now_s - i)),
        (ONE_SERIES, False, lambda i: instant_request("one series", ONE_SERIES, env.now_s - i)),
        (ONE_SERIES, True, lambda i: range_request("one series 1h", ONE_SERIES, env.now_s - 3600 - 30 * i,
                                                   env.now_s - 30 * i, 30)),
    ]
    pa = env.fresh_promaccel()
    tally = Tally()
    deadline = Deadline(a.duration_limit)
    async with Client(env.prom_url, env.budget, a.timeout) as direct, \
            Client(pa.url, env.budget, a.timeout) as proxied:
        for expr, ranged, make in kinds:
            q: dict[str, Any] = {"query": expr, "range": ranged, "direct_s": [], "promaccel_s": []}
            s["queries"].append(q)
            # one untimed pair: connection set-up and first-touch costs are not overhead
            await direct.send(make(-1))
            await proxied.send(make(-1))
            for i in range(a.tiny_requests):
                if deadline.expired():
                    s["notes"].append(f"duration limit reached during `{expr}` after {i} pairs")
                    break
                req = make(i)
                if i % 2 == 0:
                    d = await direct.send(req)
                    p = await proxied.send(req)
                else:
                    p = await proxied.send(req)
                    d = await direct.send(req)
                tally.check(f"{expr} #{i}", d, p)
                q["direct_s"].append(d.latency_s)
                q["promaccel_s"].append(p.latency_s)
                if i % 20 == 0:
                    env.progress.update(f"(c) tiny `{expr[:40]}` {i}/{a.tiny_requests}")
    env.stop_promaccel()
    s.update(tally.as_dict())
    return s


async def scenario_users(env: Env) -> dict[str, Any]:
    """(d) Many users on one dashboard at the same virtual times: how many backend calls."""
    a = env.args
    span = env.data_span_s
    fitting = [w for w in a.window if parse_duration_s(w) <= span + 1e-6] or ["1h"]
    window = min(fitting, key=parse_duration_s)
    windows = sliding_windows(env.now_s, parse_duration_s(window), a.slide_s, a.users_refreshes)
    s: dict[str, Any] = {"name": "users", "users": a.users, "window": window, "slide_s": a.slide_s,
                         "single_calls": [], "rounds": [], "notes": []}
    tally = Tally()
    deadline = Deadline(a.duration_limit)

    # Baseline: one user, its own fresh promaccel. Its direct answers are the reference for
    # every user later: all users of a round send the same requests, and the direct side of
    # the many-user round may fail (Prometheus times out under that load).
    reference: list[list[Answer]] = []
    pa = env.fresh_promaccel()
    async with Client(env.prom_url, env.budget, a.timeout) as direct, \
            Client(pa.url, env.budget, a.timeout) as proxied:
        for i, (start, end) in enumerate(windows):
            reqs = panel_requests(env.dashboard, start, end, a.width)
            d = await user_refresh(direct, reqs)
            p, meters = await _metered(env, user_refresh(proxied, reqs))
            s["single_calls"].append(meters.get("backend_calls", math.nan))
            reference.append(d.answers)
            for r, x, y in zip(reqs, d.answers, p.answers):
                tally.check(f"1 user round {i} {panel_key(r)}", x, y)
            env.progress.update(f"(d) 1-user baseline {i + 1}/{len(windows)}")

    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid).start()
    try:
        async with Client(env.prom_url, env.budget, a.timeout) as direct, \
                Client(pa.url, env.budget, a.timeout) as proxied:
            for i, (start, end) in enumerate(windows):
                if deadline.expired():
                    s["notes"].append(f"duration limit reached after {i} rounds")
                    break
                reqs = panel_requests(env.dashboard, start, end, a.width)
                if env.budget.sent + 2 * a.users * len(reqs) > env.budget.max_requests:
                    s["notes"].append(f"request limit reached after {i} rounds")
                    break
                rnd: dict[str, Any] = {"index": i}
                runs: dict[str, list[RefreshRun]] = {}
                order = ("direct", "promaccel") if i % 2 == 0 else ("promaccel", "direct")
                for mode in order:
                    client = direct if mode == "direct" else proxied
                    total = a.users * len(reqs)
                    client.done = 0
                    t0 = time.perf_counter()
                    async with Ticker(env, lambda c=client, m=mode, t=total, i=i: f"(d) round {i + 1}/{len(windows)} "
                                      f"{m}: {c.done}/{t} requests"):
                        user_runs, meters = await _metered(
                            env, asyncio.gather(*(user_refresh(client, reqs) for _ in range(a.users))))
                    runs[mode] = list(user_runs)
                    rnd[f"{mode}_wall_s"] = time.perf_counter() - t0
                    rnd[f"{mode}_user_s"] = [u.wall_s for u in user_runs]
                    if mode == "promaccel":
                        rnd["backend_calls"] = meters.get("backend_calls", math.nan)
                        rnd["cache"] = meters.get("cache")
                        rnd["cache_errors"] = meters.get("cache_errors")
                        rnd["promaccel_cpu_s"] = meters.get("promaccel_cpu_s")
                    rnd[f"{mode}_backend_requests"] = meters["backend_requests"]
                    rnd[f"{mode}_prometheus_cpu_s"] = meters["prometheus_cpu_s"]
                for u, (dr, pr) in enumerate(zip(runs["direct"], runs["promaccel"])):
                    for r, x in zip(reqs, dr.answers):
                        tally.note(f"user {u} round {i} {panel_key(r)}", "direct", x)
                    for r, ref, y in zip(reqs, reference[i], pr.answers):
                        tally.check(f"user {u} round {i} {panel_key(r)}", ref, y, direct_noted=True)
                rnd["direct_failures"] = sum(1 for u in runs["direct"] for x in u.answers if x.failed)
                rnd["promaccel_failures"] = sum(1 for u in runs["promaccel"] for x in u.answers if x.failed)
                s["rounds"].append(rnd)
                del runs
    finally:
        rss.stop()
        s["promaccel_peak_rss"] = rss.peak
        env.stop_promaccel()
    s.update(tally.as_dict())
    return s


async def scenario_heavy(env: Env) -> dict[str, Any]:
    """(e) Many distinct heavy queries at once through a cold promaccel: peak RSS, failures.

    The reference answers come from Prometheus one query at a time: sent all at once,
    Prometheus on 2 cores runs into its 2-minute query timeout and there would be nothing to
    compare with. --heavy-direct-at-once also times that, for the record."""
    a = env.args
    range_s = min(86_400.0, env.data_span_s)
    reqs = heavy_requests(a.heavy, env.now_s, range_s)
    s: dict[str, Any] = {"name": "heavy", "range": f"{range_s / 3600:g}h", "step": HEAVY_STEP_S, "notes": [],
                         "sample_ms": 50}
    tally = Tally()
    deadline = Deadline(a.duration_limit)
    async with Client(env.prom_url, env.budget, a.timeout) as direct:
        if a.heavy_direct_at_once:
            t0 = time.perf_counter()
            async with Ticker(env, lambda: f"(e) {len(reqs)} heavy queries at once, direct: {direct.done} done"):
                at_once = await asyncio.gather(*(direct.send(r) for r in reqs))
            s["direct_wall_s"] = time.perf_counter() - t0
            s["direct_at_once_failures"] = sum(1 for x in at_once if x.failed)
            del at_once
        d_answers: list[Answer] = []
        t0 = time.perf_counter()
        for i, r in enumerate(reqs):
            if deadline.expired():
                s["notes"].append(f"duration limit reached while fetching reference answers: {i} of {len(reqs)}")
                reqs = reqs[:i]
                break
            env.progress.update(f"(e) reference answers, direct one at a time: {i + 1}/{len(reqs)}")
            d_answers.append(await direct.send(r))
        s["direct_sequential_s"] = time.perf_counter() - t0
    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid, interval_s=0.05)
    s["base_rss"] = rss.rss()
    rss.start()
    try:
        async with Client(pa.url, env.budget, a.timeout) as proxied:
            t0 = time.perf_counter()
            async with Ticker(env, lambda: f"(e) {len(reqs)} heavy queries at once, promaccel: "
                              f"{proxied.done}/{len(reqs)} done, RSS {rss.peak / 2**20:,.0f} MiB"):
                p_answers = await asyncio.gather(*(proxied.send(r) for r in reqs))
            s["promaccel_wall_s"] = time.perf_counter() - t0
    finally:
        rss.stop()
        env.stop_promaccel()
    s["peak_rss"] = rss.peak
    s["rss_samples"] = rss.samples[:: max(1, len(rss.samples) // 2000)]
    s["queries"] = []
    for r, d, p in zip(reqs, d_answers, p_answers):
        tally.check(f"{r.title} `{r.expr}`", d, p)
        s["queries"].append({"query": r.expr, "end": r.end, "direct_s": d.latency_s, "promaccel_s": p.latency_s,
                             "bytes": len(d.body), "status_direct": d.status, "status_promaccel": p.status})
    sizes = [len(d.body) for d in d_answers if not d.failed]
    s["largest_answer"] = max(sizes) if sizes else math.nan
    s["total_answer_bytes"] = sum(sizes)
    s.update(tally.as_dict())
    return s


async def scenario_workers(env: Env) -> dict[str, Any]:
    """(g) 1 process vs --workers worker processes vs --processes separate promaccel processes,
    all sharing one Redis, --users users on one dashboard (spread round-robin over separate
    processes, as a Service spreads them over replicas).

    Same refreshes as (d) (round 0 cold, then warm), each layout on its own fresh promaccel
    (Redis flushed), one after the other (alternating them round by round would share one warm
    cache). Backend calls are counted by Prometheus (each worker has its own /metrics); CPU and
    RSS are summed over promaccel's processes. Every answer is compared with one user's direct
    answers to the same refresh."""
    a = env.args
    span = env.data_span_s
    fitting = [w for w in a.window if parse_duration_s(w) <= span + 1e-6] or ["1h"]
    window = min(fitting, key=parse_duration_s)
    windows = sliding_windows(env.now_s, parse_duration_s(window), a.slide_s, a.users_refreshes)
    layouts = [(1, 1)] + ([(a.workers, 1)] if a.workers > 1 else []) + ([(1, a.processes)] if a.processes > 1 else [])
    s: dict[str, Any] = {"name": "workers", "users": a.users, "window": window, "slide_s": a.slide_s,
                         "workers": sorted({w for w, n in layouts if n == 1}),
                         "layouts": [{"workers": w, "processes": n} for w, n in layouts], "runs": [], "notes": []}
    tally = Tally()
    deadline = Deadline(a.duration_limit)
    reference: list[list[Answer]] = []
    async with Client(env.prom_url, env.budget, a.timeout) as direct:
        for i, (start, end) in enumerate(windows):
            reqs = panel_requests(env.dashboard, start, end, a.width)
            reference.append((await user_refresh(direct, reqs)).answers)
            for r, x in zip(reqs, reference[-1]):
                tally.note(f"reference round {i} {panel_key(r)}", "direct", x)
    for w, n in layouts:
        label = layout_name({"workers": w, "processes": n})
        if deadline.expired():
            s["notes"].append(f"duration limit reached before {label}")
            break
        first = env.fresh_promaccel(workers=w, processes=n)
        pas = [first, *env.others]
        samplers = [RssSampler(pa.pid).start() for pa in pas]
        run: dict[str, Any] = {"workers": w, "processes": n, "rounds": []}
        try:
            async with contextlib.AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(Client(pa.url, env.budget, a.timeout)) for pa in pas]
                for i, (start, end) in enumerate(windows):
                    reqs = panel_requests(env.dashboard, start, end, a.width)
                    if env.budget.sent + a.users * len(reqs) > env.budget.max_requests:
                        s["notes"].append(f"request limit reached after {i} rounds with {label}")
                        break
                    for c in clients:
                        c.done = 0
                    before = env.snapshot()
                    t0 = time.perf_counter()
                    async with Ticker(env, lambda cs=clients, lb=label, i=i, t=a.users * len(reqs):
                                      f"(g) {lb}, round {i + 1}/{len(windows)}: {sum(c.done for c in cs)}/{t} requests"):
                        user_runs = await asyncio.gather(*(user_refresh(clients[u % len(clients)], reqs)
                                                           for u in range(a.users)))
                    wall = time.perf_counter() - t0
                    after = env.snapshot()
                    reqs_, _ = prometheus_query_traffic(before.prom, after.prom)
                    run["rounds"].append({
                        "index": i, "wall_s": wall, "user_s": [u.wall_s for u in user_runs],
                        "backend_requests": reqs_, "promaccel_cpu_s": after.pa_cpu_s - before.pa_cpu_s,
                        "failures": sum(1 for u in user_runs for x in u.answers if x.failed),
                    })
                    for u, ur in enumerate(user_runs):
                        for r, ref, y in zip(reqs, reference[i], ur.answers):
                            tally.check(f"{label} user {u} round {i} {panel_key(r)}", ref, y, direct_noted=True)
                    del user_runs
        finally:
            for sampler in samplers:
                sampler.stop()
            run["peak_rss"] = sum(sampler.peak for sampler in samplers)  # each one's peak, summed
            env.stop_promaccel()
        s["runs"].append(run)
    s.update(tally.as_dict())
    return s


def scenario_codec(env: Env) -> dict[str, Any]:
    """(f) Decode + merge + encode throughput: loadtests/codec_bench.py, when it exists."""
    s: dict[str, Any] = {"name": "codec", "ran": False, "notes": []}
    if importlib.util.find_spec("loadtests.codec_bench") is None:
        s["note"] = "loadtests/codec_bench.py does not exist yet: not run."
        return s
    cmd = [sys.executable, "-m", "loadtests.codec_bench", *shlex.split(env.args.codec_args)]
    env.progress.update("(f) codec bench running", force=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(60, env.args.duration_limit))
        out, rc = proc.stdout + (("\n" + proc.stderr) if proc.returncode else ""), proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = f"timed out after {exc.timeout} s\n{exc.stdout or ''}", -1
    s.update(ran=True, command=shlex.join(["python", *cmd[1:]]), returncode=rc, output=out,
             elapsed_s=time.perf_counter() - t0)
    if rc != 0:
        s["failures"] = 1
    return s


# ---------------------------------------------------------------------------------------------
# Set-up and main
# ---------------------------------------------------------------------------------------------


def _load_module() -> Any:
    return importlib.import_module("loadtests.load")


def _fleet_spec(args: argparse.Namespace) -> Any:
    from .gen import BENCH_SPEC, CI_SPEC, FleetSpec

    base = CI_SPEC if args.small else BENCH_SPEC
    return FleetSpec(
        nodes=args.nodes or base.nodes,
        gpus_per_node=args.gpus_per_node or base.gpus_per_node,
        hours=args.hours or base.hours,
        scrape_interval=base.scrape_interval,
        end=base.end,
        seed=base.seed,
    )


def _long_fleet_spec(args: argparse.Namespace) -> Any:
    """The long dataset's FleetSpec, or None when it is off (--no-long; --small without any
    --long-* option). Same scrape interval, end and seed as the main dataset, so virtual now
    is the same on both."""
    from .gen import FleetSpec

    if not args.long_enabled:
        return None
    main = _fleet_spec(args)
    return FleetSpec(nodes=args.long_nodes, gpus_per_node=args.long_gpus_per_node, hours=args.long_hours,
                     scrape_interval=main.scrape_interval, end=main.end, seed=main.seed)


def dataset_dir(spec: Any) -> Path:
    """Where a dataset is cached by default: .cache/bench/<nodes>x<gpus>x<hours>h."""
    return CACHE_DIR / f"{spec.nodes}x{spec.gpus_per_node}x{spec.hours:g}h"


def window_dataset(window_s: float, main_span_s: float, long_span_s: float | None) -> str | None:
    """Which dataset a dashboard window runs on: "main" when the main dataset covers it, else
    "long" when the long dataset does (None: it is off), else None (the window is skipped)."""
    if window_s <= main_span_s + 1e-6:
        return "main"
    if long_span_s is not None and window_s <= long_span_s + 1e-6:
        return "long"
    return None


def window_plan(args: argparse.Namespace) -> dict[str, str | None]:
    """window_dataset() of every --window, for the datasets `args` asks for."""
    main = _fleet_spec(args)
    long = _long_fleet_spec(args)
    return {w: window_dataset(parse_duration_s(w), main.hours * 3600,
                              long.hours * 3600 if long is not None else None) for w in args.window}


def dataset_record(spec: Any, data_dir: Path, info: dict[str, Any], build_s: float) -> dict[str, Any]:
    """What the report says about a dataset: its shape, size, where it is, how long it took."""
    return {
        "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node, "gpus": spec.nodes * spec.gpus_per_node,
        "hours": spec.hours, "scrape_interval": spec.scrape_interval, "end": spec.end, "end_iso": _iso(spec.end),
        "data_dir": os.path.relpath(data_dir, ROOT) if data_dir.is_relative_to(ROOT) else str(data_dir),
        "build_s": round(build_s, 1), "samples": info.get("samples"),
        "series": info.get("series_summed_over_slices"),
        # the build that made the cached TSDB (build_s is ~0 when it was cached)
        "built_in_s": info.get("build_seconds"),
    }


def parse_scenarios(values: Sequence[str] | None) -> list[str]:
    if not values:
        return list(SCENARIOS)
    out: list[str] = []
    for v in values:
        for name in v.split(","):
            name = _ALIASES.get(name.strip().lower(), name.strip().lower())
            if name not in SCENARIOS:
                raise argparse.ArgumentTypeError(f"unknown scenario {name!r} (choose from {', '.join(SCENARIOS)})")
            if name not in out:
                out.append(name)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    g = p.add_argument_group("dataset")
    g.add_argument("--small", action="store_true", help="the CI dataset: 16 nodes x 4 GPUs x 6 h")
    g.add_argument("--nodes", type=int, help="nodes (default 256; 16 with --small)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node (default 8; 4 with --small)")
    g.add_argument("--hours", type=float, help="hours of data (default 24; 6 with --small)")
    g.add_argument("--data-dir", type=Path, help="TSDB directory (default .cache/bench/<size>)")
    g = p.add_argument_group(
        "long dataset", "dashboard windows (b) longer than the main dataset run on this second dataset, with "
        "its own Prometheus and promaccel (built once before anything is measured; cached)")
    g.add_argument("--long-nodes", type=int, help=f"nodes (default {LONG_DEFAULTS[0]})")
    g.add_argument("--long-gpus-per-node", type=int, help=f"GPUs per node (default {LONG_DEFAULTS[1]})")
    g.add_argument("--long-hours", type=float, help=f"hours of data (default {LONG_DEFAULTS[2]:g} = 7 d)")
    g.add_argument("--long-data-dir", type=Path, help="its TSDB directory (default .cache/bench/<size>)")
    g.add_argument("--no-long", action="store_true",
                   help="no long dataset: skip windows the main one does not cover (the default with --small, "
                        "unless a --long-* option is given)")
    g = p.add_argument_group("load")
    g.add_argument("--scenario", action="append", help=f"{', '.join(SCENARIOS)} or a..g; repeatable or "
                   "comma-separated (default: all)")
    g.add_argument("--window", action="append", help="dashboard time range for (b): 1h, 24h, 7d, ... (repeatable; "
                   "default 1h, 24h, 7d); one longer than the main dataset runs on the long dataset")
    g.add_argument("--refreshes", type=int, default=10, help="dashboard refreshes per window (default 10)")
    g.add_argument("--slide", default="30s", help="how far the window moves per refresh (default 30s)")
    g.add_argument("--users", type=int, default=50, help="concurrent users in (d) (default 50)")
    g.add_argument("--users-refreshes", type=int, default=3, help="refresh rounds in (d) (default 3)")
    g.add_argument("--cold-reps", type=int, default=3, help="repetitions of (a) (default 3)")
    g.add_argument("--tiny-requests", type=int, default=200, help="request pairs per query in (c) (default 200)")
    g.add_argument("--heavy", type=int, default=20, help="concurrent heavy queries in (e) (default 20)")
    g.add_argument("--heavy-direct-at-once", action="store_true",
                   help="in (e), also send the heavy queries to Prometheus all at once (slow; it times out)")
    g.add_argument("--width", type=int, default=1920, help="screen width in px the dashboard spans (default 1920)")
    g = p.add_argument_group("bounds")
    g.add_argument("--duration-limit", type=float, default=300.0,
                   help="seconds after which a scenario starts no new refresh/round (default 300)")
    g.add_argument("--max-requests", type=int, default=50_000, help="requests in the whole run (default 50000)")
    g.add_argument("--timeout", type=float, default=300.0, help="per-request timeout in seconds (default 300)")
    g = p.add_argument_group("promaccel")
    g.add_argument("--promaccel-args", default="", help='extra `promaccel serve` flags, e.g. "--split-interval 1h"')
    g.add_argument("--no-redis", action="store_true", help="use promaccel's in-process cache instead of Redis")
    g.add_argument("--workers", type=int, default=2,
                   help="worker processes compared with 1 in (g) (default 2)")
    g.add_argument("--processes", type=int, default=2,
                   help="separate promaccel processes sharing Redis compared with 1 in (g) (default 2; 1: none)")
    g.add_argument("--codec-args", default="", help="arguments for loadtests.codec_bench in (f)")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, help="run directory (default loadtests/results/<UTC time>/)")
    g.add_argument("--no-latest", action="store_true", help="do not update loadtests/results/latest.md")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        a.scenarios = parse_scenarios(a.scenario)
        a.window = a.window or ["1h", "24h", "7d"]
        for w in a.window:
            parse_duration_s(w)
        a.slide_s = parse_duration_s(a.slide)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        p.error(str(exc))
    if not 1 <= a.workers <= 16:
        p.error("--workers must be within 1..16")
    if not 1 <= a.processes <= 8:
        p.error("--processes must be within 1..8")
    if not 1 <= a.users <= MAX_USERS:
        p.error(f"--users must be within 1..{MAX_USERS}")
    for name in ("refreshes", "users_refreshes", "cold_reps", "tiny_requests", "heavy", "max_requests"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.refreshes > 1000 or a.tiny_requests > 100_000 or a.heavy > 200:
        p.error("refreshes <= 1000, tiny-requests <= 100000, heavy <= 200")
    explicit = [a.long_nodes, a.long_gpus_per_node, a.long_hours, a.long_data_dir]
    a.long_enabled = not a.no_long and (not a.small or any(x is not None for x in explicit))
    for name, default in zip(("long_nodes", "long_gpus_per_node", "long_hours"), LONG_DEFAULTS):
        if getattr(a, name) is None:
            setattr(a, name, default)
    if a.long_nodes < 1 or a.long_gpus_per_node < 1 or a.long_hours <= 0:
        p.error("--long-nodes, --long-gpus-per-node and --long-hours must be positive")
    try:
        _long_fleet_spec(a)
    except ValueError as exc:
        p.error(f"long dataset: {exc}")
    if a.long_enabled and a.data_dir is not None and a.long_data_dir is not None \
            and a.data_dir.resolve() == a.long_data_dir.resolve():
        p.error("--data-dir and --long-data-dir must differ (one Prometheus per TSDB directory)")
    return a


SETTLED_MARKER = "promaccel-bench-settled.json"


def _block_dirs(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if p.is_dir() and len(p.name) == 26 and (p / "meta.json").exists())


def settle_prometheus(url: str, pid: int, data_dir: Path, progress: Progress, timeout_s: float = 900.0) -> float:
    """Waits until Prometheus has compacted freshly built blocks; returns the seconds waited.

    promtool writes 2 h blocks; about a minute after start Prometheus merges them into bigger
    ones, busy for seconds to minutes, which would land in the middle of the first scenarios.
    Once done the merged blocks persist, so this waits only when the block set differs from
    the one recorded after the last settled start.
    """
    import json

    marker = data_dir / SETTLED_MARKER
    try:
        if json.loads(marker.read_text()).get("blocks") == _block_dirs(data_dir):
            return 0.0
    except (OSError, ValueError):
        pass
    t0 = time.monotonic()
    idle_since: float | None = None
    last_cpu = cpu_seconds(pid)
    while time.monotonic() - t0 < timeout_s:
        time.sleep(2.0)
        cpu = cpu_seconds(pid)
        busy = (cpu - last_cpu) / 2.0
        last_cpu = cpu
        status, body = http_get(url + "/metrics")
        samples = parse_metrics(body.decode()) if status == 200 else {}
        triggered = sum(v for (n, _), v in samples.items() if n == "prometheus_tsdb_compactions_triggered_total")
        done = sum(v for (n, _), v in samples.items() if n == "prometheus_tsdb_compactions_total")
        progress.update(f"waiting for Prometheus to compact the new blocks: cycles {triggered:.0f}, "
                        f"compactions {done:.0f}, CPU {busy * 100:.0f}%")
        if triggered >= 1 and busy < 0.05:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= 4.0:
                break
        else:
            idle_since = None
    marker.write_text(json.dumps({"blocks": _block_dirs(data_dir)}))
    return time.monotonic() - t0


def _iso(t: float) -> str:
    text = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (text[:-7] if float(t).is_integer() else text[:-3]) + "Z"


def _versions(prom_url: str) -> dict[str, str]:
    import proxy

    out = {"promaccel": getattr(proxy, "__version__", "?")}
    status, body = http_get(prom_url + "/api/v1/status/buildinfo")
    if status == 200:
        import orjson

        out["prometheus"] = orjson.loads(body).get("data", {}).get("version", "?")
    return out


async def _run_scenarios(env: Env, results: dict[str, Any]) -> None:
    for name in env.args.scenarios:
        env.progress.update(f"scenario {name} starting", force=True)
        t0 = time.monotonic()
        first_scenario, first_digest, first_log = len(results["scenarios"]), len(env.code_digests), len(env.log_findings)
        try:
            if name == "dashboard":
                plan = window_plan(env.args)
                try:
                    for w in env.args.window:
                        on = env.on_long(results["notes"]) if plan[w] == "long" and env.long is not None else env
                        results["scenarios"].append(await scenario_dashboard(on, w))
                finally:
                    if env.long is not None:
                        env.long.stop()
            elif name == "cold":
                results["scenarios"].append(await scenario_cold(env))
            elif name == "tiny":
                results["scenarios"].append(await scenario_tiny(env))
            elif name == "users":
                results["scenarios"].append(await scenario_users(env))
            elif name == "heavy":
                results["scenarios"].append(await scenario_heavy(env))
            elif name == "codec":
                results["scenarios"].append(scenario_codec(env))
            elif name == "workers":
                results["scenarios"].append(await scenario_workers(env))
        except BudgetExhausted as exc:
            results["notes"].append(f"scenario {name}: {exc}; later scenarios skipped")
            env.stop_promaccel()
            break
        finally:
            digests = list(dict.fromkeys(env.code_digests[first_digest:]))
            logs = env.log_findings[first_log:]
            merged = {"warnings": sum(x["warnings"] for x in logs), "errors": sum(x["errors"] for x in logs),
                      "examples": [e for x in logs for e in x["examples"]][:5]}
            for s in results["scenarios"][first_scenario:]:
                s["promaccel_code"] = digests
                s["promaccel_log"] = merged
        env.progress.update(f"scenario {name} done in {time.monotonic() - t0:.0f} s", force=True)


def command_line(argv: Sequence[str] | None) -> str:
    """The command as typed: the interpreter's own argv when `argv` came from it, else a
    `python -m loadtests.bench` equivalent."""
    orig = list(getattr(sys, "orig_argv", []))
    if argv is None or (orig and argv and list(argv) == orig[len(orig) - len(argv):]):
        return shlex.join(orig or sys.argv)
    return shlex.join(["python", "-m", "loadtests.bench", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    # Absolute: redis-server changes into its --dir before it opens its --logfile.
    out_dir = (args.out or RESULTS_DIR / started.strftime("%Y%m%d-%H%M%S")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    spec = _fleet_spec(args)
    data_dir = args.data_dir or dataset_dir(spec)
    long_spec = _long_fleet_spec(args)
    plan = window_plan(args)
    long_windows = [w for w in args.window if plan[w] == "long"] if "dashboard" in args.scenarios else []
    long_dir = (args.long_data_dir or dataset_dir(long_spec)) if long_windows else None
    if long_dir is not None and long_dir.resolve() == data_dir.resolve():
        raise SystemExit(f"the long dataset's directory {long_dir} is the main one's: give --long-data-dir")
    command = command_line(argv)
    results: dict[str, Any] = {
        "command": command,
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": machine_info(),
        "git": git_info(),
        "promaccel_args": shlex.split(args.promaccel_args),
        "redis": not args.no_redis,
        "phase_s": PHASE_S,
        "scenarios": [],
        "notes": [],
    }
    load = _load_module()
    progress.update(f"dataset {spec.nodes}x{spec.gpus_per_node} GPUs x {spec.hours:g} h in {data_dir} "
                    "(built once, may take minutes)", force=True)
    t0 = time.monotonic()
    build_info = load.build_tsdb(spec, str(data_dir), verbose=True)
    results["dataset"] = dataset_record(spec, data_dir, build_info, time.monotonic() - t0)
    workdir = out_dir / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    long: LongData | None = None
    if long_windows:
        assert long_spec is not None and long_dir is not None and long_spec.end == spec.end
        progress.update(f"long dataset for the {', '.join(long_windows)} window(s): {long_spec.nodes}x"
                        f"{long_spec.gpus_per_node} GPUs x {long_spec.hours:g} h in {long_dir} "
                        "(built once, may take minutes)", force=True)
        t0 = time.monotonic()
        long_info = load.build_tsdb(long_spec, str(long_dir), verbose=True)
        results["long_dataset"] = {**dataset_record(long_spec, long_dir, long_info, time.monotonic() - t0),
                                   "windows": long_windows}
        long = LongData(long_spec, long_dir, workdir, results["long_dataset"])
    prom = load.start_prometheus(str(data_dir), free_port(), log_path=str(workdir / "prometheus.log"))
    redis: RedisServer | None = None
    env: Env | None = None
    try:
        prom_url, prom_pid = prom.url, prom.pid
        assert_loopback(prom_url)
        settle_s = settle_prometheus(prom_url, prom_pid, data_dir, progress)
        if settle_s:
            results["notes"].append(f"waited {settle_s:.0f} s for Prometheus to compact the freshly built blocks "
                                    "(once per dataset)")
        if not args.no_redis:
            redis = RedisServer.start(workdir / "redis")
        env = Env(
            args=args, prom_url=prom_url, prom_pid=prom_pid, data_start_s=float(spec.start),
            now_s=spec.end - PHASE_S, workdir=workdir, promaccel_args=shlex.split(args.promaccel_args),
            redis=redis, progress=progress, budget=Budget(args.max_requests),
            dashboard=load_dashboard(DEFAULT_DASHBOARD), dataset_info=results["dataset"], long=long,
        )
        results["virtual_now_iso"] = _iso(env.now_s)
        results["versions"] = _versions(prom_url)
        asyncio.run(_run_scenarios(env, results))
    finally:
        if env is not None:
            env.stop_promaccel()
        if redis is not None:
            redis.stop()
        if long is not None:
            long.stop()
        load.stop_prometheus(prom)
    results["elapsed_s"] = time.monotonic() - t_start
    if env is not None and env.code_digests:
        results["promaccel_code"] = env.code_digests[0]
        if len(set(env.code_digests)) > 1:
            results["notes"].append(
                "promaccel's source (proxy/, shardplanner/) changed while the bench ran: scenarios ran different "
                f"versions ({' -> '.join(dict.fromkeys(env.code_digests))}); rerun on a quiet tree")
    results["requests_sent"] = env.budget.sent if env else 0
    summary = write_report(results, out_dir, None if args.no_latest else RESULTS_DIR / "latest.md")
    mismatches = sum(s.get("mismatches", 0) for s in results["scenarios"])
    failures = sum(s.get("failures", 0) for s in results["scenarios"])
    direct_failures = sum(s.get("direct_failures", 0) for s in results["scenarios"])
    progress.done(f"done in {results['elapsed_s']:.0f} s: {results['requests_sent']:,} requests, "
                  f"{mismatches} mismatches, {failures} promaccel failures ({direct_failures} direct); "
                  f"report {os.path.relpath(summary)}")
    return 1 if mismatches or failures else 0


if __name__ == "__main__":
    sys.exit(main())
