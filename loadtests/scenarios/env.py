"""The environment the bench's scenarios run in: the dataset's Prometheus, Redis, a fresh
promaccel per scenario (or per layout), the request budget and the meters around a call.

Processes are started through loadtests/services.py and loadtests/load.py (shared with the
test suite); this module decides when: `Env.fresh_promaccel` gives each scenario an empty cache,
`LongData` starts the long dataset's Prometheus for the windows that need it and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from ..client import Budget
from ..services import Promaccel, RedisServer, assert_loopback, cpu_seconds, free_port, http_get, http_post_form
from ..stats import (
    Progress,
    Samples,
    backend_calls,
    cache_lookups,
    counter_delta,
    parse_metrics,
    prometheus_query_traffic,
)
from ..timeline import PHASE_S, instant_request, range_request
from .result import LogFindings, Meters

ROOT = Path(__file__).resolve().parent.parent.parent
T = TypeVar("T")

_LOG_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback (most recent call last)")


def scan_log(path: Path, keep: int = 5) -> LogFindings:
    """Warnings and errors a promaccel wrote while the bench drove it (cache timeouts, backend
    errors): the numbers next to them read differently."""
    found = LogFindings()
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        if not any(level in line for level in _LOG_LEVELS):
            continue
        if " WARNING " in line:
            found.warnings += 1
        else:
            found.errors += 1
        if len(found.examples) < keep:
            found.examples.append(line[:300])
    return found


def merge_findings(findings: list[LogFindings]) -> LogFindings:
    return LogFindings(sum(x.warnings for x in findings), sum(x.errors for x in findings),
                       [e for x in findings for e in x.examples][:5])


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


def load_module() -> Any:
    """loadtests.load (Prometheus and the TSDB), imported when first needed: it pulls in the
    generator (numpy), which the pure parts of the bench do not need."""
    return importlib.import_module("loadtests.load")


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
            progress.update(f"starting Prometheus on the long dataset {self.data_dir}", force=True)
            self.prom = load_module().start_prometheus(str(self.data_dir), free_port(),
                                                       log_path=str(self.workdir / "prometheus-long.log"))
            assert_loopback(self.prom.url)
            settle_s = settle_prometheus(self.prom.url, self.prom.pid, self.data_dir, progress)
            if settle_s:
                notes.append(f"waited {settle_s:.0f} s for Prometheus to compact the long dataset's freshly built "
                             "blocks (once per dataset)")
        return self.prom.url, self.prom.pid

    def stop(self) -> None:
        if self.prom is not None:
            load_module().stop_prometheus(self.prom)
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
    log_findings: list[LogFindings] = field(default_factory=list)
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
    def delta(a: Snapshot, b: Snapshot) -> Meters:
        reqs, nbytes = prometheus_query_traffic(a.prom, b.prom)
        out = Meters(backend_requests=reqs, backend_bytes=nbytes, prometheus_cpu_s=b.prom_cpu_s - a.prom_cpu_s)
        if b.pa:
            out.backend_calls = backend_calls(a.pa, b.pa)
            out.cache = cache_lookups(a.pa, b.pa)
            out.cache_errors = counter_delta(a.pa, b.pa, "promaccel_cache_errors_total", by="op")
            out.promaccel_cpu_s = b.pa_cpu_s - a.pa_cpu_s
        return out


async def metered(env: Env, coro: Awaitable[T]) -> tuple[T, Meters]:
    """`coro`'s result and what it cost on both servers."""
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
