"""(c) Small answers, one request at a time: what the proxy adds per request.

Then each query's last request is asked again one at a time, with and without gzip (sizes.py):
the tiny end of the bytes-per-second table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

from ..client import Client, Deadline
from ..dashboard import PanelRequest
from ..timeline import instant_request, range_request
from .env import Env
from .result import ScenarioResult
from .sizes import PanelSize, probe_sizes

ONE_SERIES = 'up{job="node-exporter",instance="gpu-node-0000:9100"}'


@dataclass
class TinyQuery:
    query: str
    range: bool
    direct_s: list[float] = field(default_factory=list)
    promaccel_s: list[float] = field(default_factory=list)


@dataclass(kw_only=True)
class TinyResult(ScenarioResult):
    name: ClassVar[str] = "tiny"
    requests_per_query: int = 0
    queries: list[TinyQuery] = field(default_factory=list)
    sizes: list[PanelSize] = field(default_factory=list)  # warm answers with and without gzip


async def run(env: Env) -> TinyResult:
    a = env.args
    s = TinyResult(requests_per_query=a.tiny_requests)
    kinds: list[tuple[str, bool, Callable[[int], PanelRequest]]] = [
        ("vector(1)", False, lambda i: instant_request("vector(1)", "vector(1)", env.now_s - i)),
        (ONE_SERIES, False, lambda i: instant_request("one series", ONE_SERIES, env.now_s - i)),
        (ONE_SERIES, True, lambda i: range_request("one series 1h", ONE_SERIES, env.now_s - 3600 - 30 * i,
                                                   env.now_s - 30 * i, 30)),
    ]
    pa = env.fresh_promaccel()
    deadline = Deadline(a.duration_limit)
    last: list[tuple[str, PanelRequest]] = []
    async with Client(env.prom_url, env.budget, a.timeout) as direct, \
            Client(pa.url, env.budget, a.timeout) as proxied:
        for expr, ranged, make in kinds:
            q = TinyQuery(expr, ranged)
            s.queries.append(q)
            # one untimed pair: connection set-up and first-touch costs are not overhead
            await direct.send(make(-1))
            await proxied.send(make(-1))
            req = make(-1)
            for i in range(a.tiny_requests):
                if deadline.expired():
                    s.notes.append(f"duration limit reached during `{expr}` after {i} pairs")
                    break
                req = make(i)
                if i % 2 == 0:
                    d = await direct.send(req)
                    p = await proxied.send(req)
                else:
                    p = await proxied.send(req)
                    d = await direct.send(req)
                s.tally.check(f"{expr} #{i}", d, p)
                q.direct_s.append(d.latency_s)
                q.promaccel_s.append(p.latency_s)
                if i % 20 == 0:
                    env.progress.update(f"(c) tiny `{expr[:40]}` {i}/{a.tiny_requests}")
            last.append((f"`{expr}`" + (" (range)" if ranged else ""), req))
    if a.size_reps > 0:
        env.progress.update("(c) tiny answers again, with and without gzip", force=True)
        s.sizes = await probe_sizes(pa.url, last, env.budget, a.timeout, a.size_reps)
    env.stop_promaccel()
    return s
