"""(a) One heavy range query with promaccel's cache cold: a fresh instance per repetition."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..client import Client, Deadline
from ..timeline import range_request
from .env import Env, metered
from .heavy import HEAVY_QUERY, HEAVY_STEP_S
from .result import Meters, ScenarioResult, nest_meters


@dataclass
class ColdRep:
    first: str  # which mode asked first: "direct" or "promaccel"
    direct_s: float
    promaccel_s: float
    pieces: str | None = None
    status: tuple[int, int] = (0, 0)  # direct, promaccel
    meters: Meters = field(default_factory=Meters)

    upgrade = staticmethod(nest_meters)


@dataclass(kw_only=True)
class ColdResult(ScenarioResult):
    name: ClassVar[str] = "cold"
    query: str = HEAVY_QUERY
    range: str = ""
    step: float = HEAVY_STEP_S
    points_per_series: int = 0
    answer_bytes: float = math.nan
    reps: list[ColdRep] = field(default_factory=list)


async def run(env: Env) -> ColdResult:
    span = env.data_span_s
    range_s = min(86_400.0, span)
    req = range_request("cold heavy", HEAVY_QUERY, env.now_s - range_s, env.now_s, HEAVY_STEP_S)
    s = ColdResult(range=f"{range_s / 3600:g}h", points_per_series=req.points)
    if range_s < 86_400:
        s.notes.append(f"the dataset covers {span / 3600:.1f} h: the query spans {range_s / 3600:g} h, not 24 h")
    deadline = Deadline(env.args.duration_limit)
    async with Client(env.prom_url, env.budget, env.args.timeout) as direct:
        warm = await direct.send(req)  # Prometheus's page cache: warm for both modes
        s.answer_bytes = len(warm.body)
        for rep in range(env.args.cold_reps):
            if deadline.expired():
                s.notes.append(f"duration limit reached after {rep} repetitions")
                break
            pa = env.fresh_promaccel()
            async with Client(pa.url, env.budget, env.args.timeout) as proxied:
                first = "direct" if rep % 2 == 0 else "promaccel"
                if first == "direct":
                    d = await direct.send(req)
                p, meters = await metered(env, proxied.send(req))
                if first == "promaccel":
                    d = await direct.send(req)
            s.tally.check(f"rep {rep}", d, p)
            s.reps.append(ColdRep(first, d.latency_s, p.latency_s, p.pieces, (d.status, p.status), meters))
            env.progress.update(f"(a) cold rep {rep + 1}/{env.args.cold_reps}: direct {d.latency_s * 1000:.0f} ms, "
                                f"promaccel {p.latency_s * 1000:.0f} ms")
    env.stop_promaccel()
    return s
