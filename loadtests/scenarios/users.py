"""(d) Many users on one dashboard at the same virtual times: how many backend calls.

A baseline of one user runs the same refreshes on its own fresh promaccel; its direct answers
are the reference for every user later: all users of a round send the same requests, and the
direct side of the many-user round may fail (Prometheus times out under that load).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..client import Answer, Client, Deadline, RefreshRun, user_refresh
from ..dashboard import panel_requests
from ..services import RssSampler
from ..timeline import panel_key, parse_duration_s, sliding_windows
from .env import Env, Ticker, metered
from .result import Meters, ScenarioResult


def smallest_fitting_window(env: Env) -> str:
    """The shortest --window the dataset covers (1h when none does): the users' dashboard."""
    span = env.data_span_s
    fitting = [w for w in env.args.window if parse_duration_s(w) <= span + 1e-6] or ["1h"]
    return min(fitting, key=parse_duration_s)


@dataclass
class UsersMode:
    """One mode's round: every user's refresh at once."""

    wall_s: float
    user_s: list[float] = field(default_factory=list)  # each user's refresh
    failures: int = 0
    meters: Meters = field(default_factory=Meters)


@dataclass
class UsersRound:
    index: int
    direct: UsersMode
    promaccel: UsersMode

    @staticmethod
    def upgrade(data: dict[str, Any]) -> dict[str, Any]:
        """The form before the typed results: "<mode>_<key>" keys, promaccel's meters flat."""
        if "direct" in data:
            return data

        def mode(m: str, **meters: Any) -> dict[str, Any]:
            return {"wall_s": data.get(f"{m}_wall_s"), "user_s": data.get(f"{m}_user_s", []),
                    "failures": data.get(f"{m}_failures", 0),
                    "meters": {"backend_requests": data.get(f"{m}_backend_requests"),
                               "prometheus_cpu_s": data.get(f"{m}_prometheus_cpu_s"), **meters}}

        return {"index": data.get("index", 0), "direct": mode("direct"),
                "promaccel": mode("promaccel", **{k: data.get(k) for k in (
                    "backend_calls", "cache", "cache_errors", "promaccel_cpu_s")})}


@dataclass(kw_only=True)
class UsersResult(ScenarioResult):
    name: ClassVar[str] = "users"
    users: int = 0
    window: str = ""
    slide_s: float = 30.0
    single_calls: list[float] = field(default_factory=list)  # the 1-user baseline's backend calls per round
    rounds: list[UsersRound] = field(default_factory=list)
    promaccel_peak_rss: float = math.nan


def _round_text(client: Client, label: str, total: int) -> Callable[[], str]:
    return lambda: f"{label}: {client.done}/{total} requests"


async def run(env: Env) -> UsersResult:
    a = env.args
    window = smallest_fitting_window(env)
    windows = sliding_windows(env.now_s, parse_duration_s(window), a.slide_s, a.users_refreshes)
    s = UsersResult(users=a.users, window=window, slide_s=a.slide_s)
    deadline = Deadline(a.duration_limit)

    reference: list[list[Answer]] = []
    pa = env.fresh_promaccel()
    async with Client(env.prom_url, env.budget, a.timeout) as direct, \
            Client(pa.url, env.budget, a.timeout) as proxied:
        for i, (start, end) in enumerate(windows):
            reqs = panel_requests(env.dashboard, start, end, a.width)
            d = await user_refresh(direct, reqs)
            p, meters = await metered(env, user_refresh(proxied, reqs))
            s.single_calls.append(meters.backend_calls if meters.backend_calls is not None else math.nan)
            reference.append(d.answers)
            for r, x, y in zip(reqs, d.answers, p.answers):
                s.tally.check(f"1 user round {i} {panel_key(r)}", x, y)
            env.progress.update(f"(d) 1-user baseline {i + 1}/{len(windows)}")

    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid).start()
    try:
        async with Client(env.prom_url, env.budget, a.timeout) as direct, \
                Client(pa.url, env.budget, a.timeout) as proxied:
            for i, (start, end) in enumerate(windows):
                if deadline.expired():
                    s.notes.append(f"duration limit reached after {i} rounds")
                    break
                reqs = panel_requests(env.dashboard, start, end, a.width)
                if env.budget.sent + 2 * a.users * len(reqs) > env.budget.max_requests:
                    s.notes.append(f"request limit reached after {i} rounds")
                    break
                runs: dict[str, list[RefreshRun]] = {}
                modes: dict[str, UsersMode] = {}
                order = ("direct", "promaccel") if i % 2 == 0 else ("promaccel", "direct")
                for mode in order:
                    client = direct if mode == "direct" else proxied
                    total = a.users * len(reqs)
                    client.done = 0
                    t0 = time.perf_counter()
                    async with Ticker(env, _round_text(client, f"(d) round {i + 1}/{len(windows)} {mode}", total)):
                        user_runs, meters = await metered(
                            env, asyncio.gather(*(user_refresh(client, reqs) for _ in range(a.users))))
                    runs[mode] = list(user_runs)
                    modes[mode] = UsersMode(time.perf_counter() - t0, [u.wall_s for u in user_runs],
                                            sum(1 for u in user_runs for x in u.answers if x.failed), meters)
                for u, (dr, pr) in enumerate(zip(runs["direct"], runs["promaccel"])):
                    for r, x in zip(reqs, dr.answers):
                        s.tally.note(f"user {u} round {i} {panel_key(r)}", "direct", x)
                    for r, ref, y in zip(reqs, reference[i], pr.answers):
                        s.tally.check(f"user {u} round {i} {panel_key(r)}", ref, y, direct_noted=True)
                s.rounds.append(UsersRound(i, modes["direct"], modes["promaccel"]))
                del runs
    finally:
        rss.stop()
        s.promaccel_peak_rss = rss.peak
        env.stop_promaccel()
    return s
