"""(e) Many distinct heavy queries at once through a cold promaccel: its peak RSS, failures.

The reference answers come from Prometheus one query at a time: sent all at once, Prometheus
on 2 cores runs into its 2-minute query timeout and there would be nothing to compare with.
--heavy-direct-at-once also times that, for the record.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from ..client import Answer, Client, Deadline
from ..dashboard import PanelRequest
from ..services import RssSampler
from ..timeline import range_request
from .env import Env, Ticker
from .result import ScenarioResult

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


def heavy_requests(n: int, now_s: float, range_s: float, step_s: float = HEAVY_STEP_S) -> list[PanelRequest]:
    out = []
    for i in range(n):
        expr = HEAVY_EXPRS[i % len(HEAVY_EXPRS)]
        shift = (i // len(HEAVY_EXPRS)) * step_s
        out.append(range_request(f"heavy {i}", expr, now_s - shift - range_s, now_s - shift, step_s))
    return out


@dataclass
class HeavyQuery:
    query: str
    end: float
    direct_s: float
    promaccel_s: float
    bytes: int
    status_direct: int
    status_promaccel: int


@dataclass(kw_only=True)
class HeavyResult(ScenarioResult):
    name: ClassVar[str] = "heavy"
    range: str = ""
    step: float = HEAVY_STEP_S
    sample_ms: int = 50
    direct_wall_s: float | None = None  # --heavy-direct-at-once only
    direct_at_once_failures: int | None = None
    direct_sequential_s: float = math.nan
    base_rss: float = math.nan
    peak_rss: float = math.nan
    promaccel_wall_s: float = math.nan
    rss_samples: list[tuple[float, int]] = field(default_factory=list)
    queries: list[HeavyQuery] = field(default_factory=list)
    largest_answer: float = math.nan
    total_answer_bytes: int = 0


async def run(env: Env) -> HeavyResult:
    a = env.args
    range_s = min(86_400.0, env.data_span_s)
    reqs = heavy_requests(a.heavy, env.now_s, range_s)
    s = HeavyResult(range=f"{range_s / 3600:g}h", step=HEAVY_STEP_S, sample_ms=50)
    deadline = Deadline(a.duration_limit)
    async with Client(env.prom_url, env.budget, a.timeout) as direct:
        if a.heavy_direct_at_once:
            t0 = time.perf_counter()
            async with Ticker(env, lambda: f"(e) {len(reqs)} heavy queries at once, direct: {direct.done} done"):
                at_once = await asyncio.gather(*(direct.send(r) for r in reqs))
            s.direct_wall_s = time.perf_counter() - t0
            s.direct_at_once_failures = sum(1 for x in at_once if x.failed)
            del at_once
        d_answers: list[Answer] = []
        t0 = time.perf_counter()
        for i, r in enumerate(reqs):
            if deadline.expired():
                s.notes.append(f"duration limit reached while fetching reference answers: {i} of {len(reqs)}")
                reqs = reqs[:i]
                break
            env.progress.update(f"(e) reference answers, direct one at a time: {i + 1}/{len(reqs)}")
            d_answers.append(await direct.send(r))
        s.direct_sequential_s = time.perf_counter() - t0
    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid, interval_s=0.05)
    s.base_rss = rss.rss()
    rss.start()
    try:
        async with Client(pa.url, env.budget, a.timeout) as proxied:
            t0 = time.perf_counter()
            async with Ticker(env, lambda: f"(e) {len(reqs)} heavy queries at once, promaccel: "
                              f"{proxied.done}/{len(reqs)} done, RSS {rss.peak / 2**20:,.0f} MiB"):
                p_answers = await asyncio.gather(*(proxied.send(r) for r in reqs))
            s.promaccel_wall_s = time.perf_counter() - t0
    finally:
        rss.stop()
        env.stop_promaccel()
    s.peak_rss = rss.peak
    s.rss_samples = rss.samples[:: max(1, len(rss.samples) // 2000)]
    for r, d, p in zip(reqs, d_answers, p_answers):
        s.tally.check(f"{r.title} `{r.expr}`", d, p)
        s.queries.append(HeavyQuery(r.expr, r.end, d.latency_s, p.latency_s, len(d.body), d.status, p.status))
    sizes = [len(d.body) for d in d_answers if not d.failed]
    s.largest_answer = max(sizes) if sizes else math.nan
    s.total_answer_bytes = sum(sizes)
    return s
