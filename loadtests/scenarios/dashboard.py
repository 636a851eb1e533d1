"""(b) The GPU fleet dashboard refreshed with the window sliding: cold first refresh, then warm.

Direct and promaccel refreshes alternate (and swap order each time) so noise hits both; every
promaccel answer is compared with the direct answer to the same request. After the refreshes,
the last refresh's panels are asked again one at a time, with and without gzip (sizes.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..client import GRAFANA_CONCURRENCY, Client, Deadline, RefreshRun, user_refresh
from ..dashboard import panel_requests
from ..services import RssSampler, cpu_seconds
from ..timeline import panel_key, parse_duration_s, sliding_windows
from .env import Env, metered
from .result import Meters, ScenarioResult, nest_meters
from .sizes import PanelSize, probe_sizes


@dataclass
class ModeRefresh:
    """One mode's (direct or promaccel) refresh of the whole dashboard."""

    wall_s: float
    panels: dict[str, float] = field(default_factory=dict)  # request latency per panel
    bytes: int = 0  # decoded JSON the client received
    pieces: list[str | None] | None = None  # X-Promaccel-Pieces per panel (promaccel only)
    meters: Meters = field(default_factory=Meters)

    upgrade = staticmethod(nest_meters)


@dataclass
class Refresh:
    index: int
    start: float
    end: float
    first: str  # which mode refreshed first
    direct: ModeRefresh
    promaccel: ModeRefresh


@dataclass(kw_only=True)
class DashboardResult(ScenarioResult):
    name: ClassVar[str] = "dashboard"
    window: str = ""
    slide_s: float = 30.0
    concurrency: int = GRAFANA_CONCURRENCY
    dataset: str = "main"
    dataset_info: dict[str, Any] = field(default_factory=dict)
    panels: int | None = None
    warm_up_s: float | None = None
    refreshes: list[Refresh] = field(default_factory=list)
    promaccel_peak_rss: float = math.nan
    promaccel_cpu_s: float = math.nan
    sizes: list[PanelSize] = field(default_factory=list)  # warm panels with and without gzip


def _skip_reason(env: Env, window: str, window_s: float) -> str | None:
    span = env.data_span_s
    if window_s <= span + 1e-6:
        return None
    a = env.args
    if not a.long_enabled:
        hint = "the long dataset is off (--no-long, or --small without a --long-* option)"
    elif env.dataset == "main" and window_s > a.long_hours * 3600 + 1e-6:
        hint = f"so does the long dataset ({a.long_hours:g} h; --long-hours)"
    else:
        hint = "build a longer one with --hours"
    return f"skipped: the dataset covers {span / 3600:g} h, less than the {window} window; {hint}"


async def run(env: Env, window: str) -> DashboardResult:
    a = env.args
    window_s = parse_duration_s(window)
    s = DashboardResult(window=window, slide_s=a.slide_s, dataset=env.dataset, dataset_info=env.dataset_info)
    reason = _skip_reason(env, window, window_s)
    if reason is not None:
        s.notes.append(reason)
        s.skipped = True
        return s
    windows = sliding_windows(env.now_s, window_s, a.slide_s, a.refreshes)
    if windows[0][0] < env.data_start_s:
        s.notes.append(f"the first refresh's window starts {env.data_start_s - windows[0][0]:.0f} s before the "
                       "data does (those steps are empty in both modes)")
    pa = env.fresh_promaccel()
    rss = RssSampler(pa.pid).start()
    cpu0 = cpu_seconds(pa.pid)
    deadline = Deadline(a.duration_limit)
    last = None
    try:
        async with Client(env.prom_url, env.budget, a.timeout) as direct, \
                Client(pa.url, env.budget, a.timeout) as proxied:
            # Untimed: brings the window's blocks into the page cache, so the first measured
            # refresh does not charge disk reads to whichever mode goes first.
            env.progress.update(f"(b) {window}: untimed direct refresh to warm Prometheus", force=True)
            warm = await user_refresh(direct, panel_requests(env.dashboard, *windows[0], a.width))
            s.warm_up_s = warm.wall_s
            for i, (start, end) in enumerate(windows):
                if deadline.expired() or env.budget.sent >= env.budget.max_requests:
                    s.notes.append(f"duration or request limit reached after {i} refreshes")
                    break
                reqs = panel_requests(env.dashboard, start, end, a.width)
                s.panels = len(reqs)
                runs: dict[str, RefreshRun] = {}
                modes: dict[str, ModeRefresh] = {}
                order = ("direct", "promaccel") if i % 2 == 0 else ("promaccel", "direct")
                for mode in order:
                    client = direct if mode == "direct" else proxied
                    run_, meters = await metered(env, user_refresh(client, reqs))
                    runs[mode] = run_
                    modes[mode] = ModeRefresh(
                        wall_s=run_.wall_s,
                        panels={panel_key(r): x.latency_s for r, x in zip(reqs, run_.answers)},
                        bytes=sum(len(x.body) for x in run_.answers),
                        pieces=[x.pieces for x in run_.answers] if mode == "promaccel" else None,
                        meters=meters,
                    )
                for r, d, p in zip(reqs, runs["direct"].answers, runs["promaccel"].answers):
                    s.tally.check(f"{window} refresh {i} {panel_key(r)}", d, p)
                s.refreshes.append(Refresh(i, start, end, order[0], modes["direct"], modes["promaccel"]))
                last = reqs
                env.progress.update(
                    f"(b) {window} refresh {i + 1}/{len(windows)}: direct {runs['direct'].wall_s * 1000:,.0f} ms, "
                    f"promaccel {runs['promaccel'].wall_s * 1000:,.0f} ms, mismatches {s.tally.mismatches}")
                del runs
        # The refreshes' RSS and CPU, before the size probe adds its own.
        rss.stop()
        s.promaccel_peak_rss, s.promaccel_cpu_s = rss.peak, cpu_seconds(pa.pid) - cpu0
        if last is not None and a.size_reps > 0:
            env.progress.update(f"(b) {window}: warm panels one at a time, with and without gzip", force=True)
            s.sizes = await probe_sizes(pa.url, [(panel_key(r), r) for r in last], env.budget, a.timeout,
                                        a.size_reps)
    finally:
        rss.stop()
        if math.isnan(s.promaccel_cpu_s):
            s.promaccel_peak_rss, s.promaccel_cpu_s = rss.peak, cpu_seconds(pa.pid) - cpu0
        env.stop_promaccel()
    return s
