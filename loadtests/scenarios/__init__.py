"""The bench's scenarios, one module each, each returning a typed result (a dataclass deriving
from `result.ScenarioResult`) that loadtests/report.py reads by attribute:

  cold       (a) cold.py       one heavy 24 h range query, promaccel's cache cold
  dashboard  (b) dashboard.py  the dashboard refreshed with the window sliding; warm panels by size
  tiny       (c) tiny.py       `vector(1)` and one-series queries: the proxy's own added ms
  users      (d) users.py      many users on one dashboard: backend calls vs one user's
  heavy      (e) heavy.py      distinct heavy queries at once: promaccel's peak RSS
  codec      (f) codec.py      loadtests/codec_bench.py's output
  workers    (g) workers.py    1 process vs N workers vs N processes sharing Redis

env.py is what they run in (servers, budget, meters); sizes.py the warm-by-size probe of (b)
and (c). The CLI that runs them is loadtests/bench.py.
"""

from __future__ import annotations

from typing import Any

from .codec import CodecResult
from .cold import ColdResult
from .dashboard import DashboardResult
from .heavy import HeavyResult
from .result import ScenarioResult
from .tiny import TinyResult
from .users import UsersResult
from .workers import WorkersResult

SCENARIOS = ("cold", "dashboard", "tiny", "users", "heavy", "codec", "workers")
ALIASES = {"a": "cold", "b": "dashboard", "c": "tiny", "d": "users", "e": "heavy", "f": "codec", "g": "workers"}
RESULT_TYPES: dict[str, type[ScenarioResult]] = {
    t.name: t for t in (ColdResult, DashboardResult, TinyResult, UsersResult, HeavyResult, CodecResult, WorkersResult)
}


def load_result(data: ScenarioResult | dict[str, Any]) -> ScenarioResult:
    """A typed result from its results.json form (a typed result is returned as it is)."""
    if isinstance(data, ScenarioResult):
        return data
    kind = RESULT_TYPES.get(str(data.get("name")))
    if kind is None:
        raise ValueError(f"unknown scenario {data.get('name')!r} in results")
    return kind.from_json(data)
