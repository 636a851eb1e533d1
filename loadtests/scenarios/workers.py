"""(g) 1 process vs --workers worker processes vs --processes separate promaccel processes,
all sharing one Redis, --users users on one dashboard (spread round-robin over separate
processes, as a Service spreads them over replicas).

Same refreshes as (d) (round 0 cold, then warm), each layout on its own fresh promaccel
(Redis flushed), one after the other (alternating them round by round would share one warm
cache). Backend calls are counted by Prometheus (each worker has its own /metrics); CPU and
RSS are summed over promaccel's processes. Every answer is compared with one user's direct
answers to the same refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from ..client import Answer, Client, Deadline, user_refresh
from ..dashboard import panel_requests
from ..services import RssSampler
from ..stats import prometheus_query_traffic
from ..timeline import panel_key, parse_duration_s, sliding_windows
from .env import Env, Ticker
from .result import ScenarioResult
from .users import smallest_fitting_window


def layout_name(workers: int, processes: int) -> str:
    """"1 process", "2 workers" (uvicorn workers of one promaccel), "2 processes" (separate)."""
    if processes > 1:
        return f"{processes} processes"
    return "1 process" if workers == 1 else f"{workers} workers"


@dataclass
class WorkersRound:
    index: int
    wall_s: float
    user_s: list[float] = field(default_factory=list)
    backend_requests: float = math.nan  # counted by Prometheus
    promaccel_cpu_s: float = math.nan  # summed over promaccel's processes
    failures: int = 0


@dataclass
class LayoutRun:
    workers: int = 1
    processes: int = 1
    rounds: list[WorkersRound] = field(default_factory=list)
    peak_rss: float = math.nan  # each process's peak, summed

    @property
    def label(self) -> str:
        return layout_name(self.workers, self.processes)


@dataclass(kw_only=True)
class WorkersResult(ScenarioResult):
    name: ClassVar[str] = "workers"
    users: int = 0
    window: str = ""
    slide_s: float = 30.0
    runs: list[LayoutRun] = field(default_factory=list)


def _round_text(clients: list[Client], label: str, total: int) -> Callable[[], str]:
    return lambda: f"{label}: {sum(c.done for c in clients)}/{total} requests"


async def run(env: Env) -> WorkersResult:
    a = env.args
    window = smallest_fitting_window(env)
    windows = sliding_windows(env.now_s, parse_duration_s(window), a.slide_s, a.users_refreshes)
    layouts = [(1, 1)] + ([(a.workers, 1)] if a.workers > 1 else []) + ([(1, a.processes)] if a.processes > 1 else [])
    s = WorkersResult(users=a.users, window=window, slide_s=a.slide_s)
    deadline = Deadline(a.duration_limit)
    reference: list[list[Answer]] = []
    async with Client(env.prom_url, env.budget, a.timeout) as direct:
        for i, (start, end) in enumerate(windows):
            reqs = panel_requests(env.dashboard, start, end, a.width)
            reference.append((await user_refresh(direct, reqs)).answers)
            for r, x in zip(reqs, reference[-1]):
                s.tally.note(f"reference round {i} {panel_key(r)}", "direct", x)
    for w, n in layouts:
        label = layout_name(w, n)
        if deadline.expired():
            s.notes.append(f"duration limit reached before {label}")
            break
        first = env.fresh_promaccel(workers=w, processes=n)
        pas = [first, *env.others]
        samplers = [RssSampler(pa.pid).start() for pa in pas]
        layout = LayoutRun(w, n)
        try:
            async with contextlib.AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(Client(pa.url, env.budget, a.timeout)) for pa in pas]
                for i, (start, end) in enumerate(windows):
                    reqs = panel_requests(env.dashboard, start, end, a.width)
                    if env.budget.sent + a.users * len(reqs) > env.budget.max_requests:
                        s.notes.append(f"request limit reached after {i} rounds with {label}")
                        break
                    for c in clients:
                        c.done = 0
                    before = env.snapshot()
                    t0 = time.perf_counter()
                    async with Ticker(env, _round_text(clients, f"(g) {label}, round {i + 1}/{len(windows)}",
                                                       a.users * len(reqs))):
                        user_runs = await asyncio.gather(*(user_refresh(clients[u % len(clients)], reqs)
                                                           for u in range(a.users)))
                    wall = time.perf_counter() - t0
                    after = env.snapshot()
                    backend_reqs, _ = prometheus_query_traffic(before.prom, after.prom)
                    layout.rounds.append(WorkersRound(
                        i, wall, [u.wall_s for u in user_runs], backend_reqs, after.pa_cpu_s - before.pa_cpu_s,
                        sum(1 for u in user_runs for x in u.answers if x.failed)))
                    for u, ur in enumerate(user_runs):
                        for r, ref, y in zip(reqs, reference[i], ur.answers):
                            s.tally.check(f"{label} user {u} round {i} {panel_key(r)}", ref, y, direct_noted=True)
                    del user_runs
        finally:
            for sampler in samplers:
                sampler.stop()
            layout.peak_rss = sum(sampler.peak for sampler in samplers)
            env.stop_promaccel()
        s.runs.append(layout)
    return s
