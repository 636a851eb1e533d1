"""The request path of /api/v1/query and /api/v1/query_range, built in one place, in order.

Each stage has one job and one `async __call__`; it derives the value it hands down
(`values.Query`, frozen) and returns its answer up:

    Admit      admission (in flight, a bounded wait), allowances (calls, cache keys), AMP samples
    Plan       parse once (cached by text), shard-label values, the plan, the cache context
    Route      hybrid fleets: who holds what; a join across stores branches to CrossStore
    Forward    a query left whole: its cached answer, or the backend's bytes untouched
    Fallback   a piece's backend error is the answer; shapes the merge cannot model go whole
    Merge      concat / re-aggregate in one order; a topk tie at the k-th place reruns unsharded
    Lookup     each piece's cache unit and cached answer (landing zone, store, finer steps)
    Coalesce   pieces in flight elsewhere are awaited; the rest grouped into backend calls
    FanOut     the calls in parallel under the query's one deadline

    CrossStore evaluates the operators above per-store subqueries, each run from Merge down.

Shared state lives with the component that owns it: `Landing` (landing zone, calls in
flight, recent calls), `CacheReader`/`CacheWriter` (the store), `Fetcher` (single-flight),
`Leases` (fetch leases shared with the other processes using the Redis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..backends import Backend
from ..cache import PieceStore
from ..config import Config
from .ask import Asker
from .budget import Admission, Admit
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .crossstore import CrossStore
from .daycells import DayCells
from .fetch import Fetcher
from .forward import Forward
from .hybrid_fetch import RouteAnswer
from .landing import Landing
from .leases import Leases
from .lookup import Coalesce, FanOut, Lookup
from .merging import Fallback, Merge
from .planning import Plan, Planner
from .raw_fetch import RawCache
from .routing import Route
from .slots import SlotMaker


@dataclass
class Parts:
    """The components the stages share (and the service's admin and explain use)."""

    planner: Planner
    slots: SlotMaker
    landing: Landing
    reader: CacheReader
    writer: CacheWriter
    leases: Leases
    fetcher: Fetcher
    cross_store: CrossStore


def build(config: Config, backends: Sequence[Backend], store: Callable[[], PieceStore],
          admission: Admission | None = None) -> tuple[Admit, Parts]:
    """The stages over `backends` (backends[0] the primary); `admission` shared with other
    pipelines (one per tenant) when given."""
    primary = backends[0]
    by_name = {b.name: b for b in backends}
    cache_on = config.cache.enabled
    planner = Planner(config, primary)
    slots = SlotMaker(config, planner.settings.split_interval_ms)
    landing = Landing()
    reader = CacheReader(config, store, landing, slots)
    writer = CacheWriter(config, store, landing)
    leases = writer.leases = Leases(config, store, reader)
    ask = Asker()
    fetcher = Fetcher(landing, writer, RouteAnswer(config, backends, ask), cache_on, leases)

    fan_out = FanOut(fetcher)
    coalesce = Coalesce(config, primary.cfg.max_parallel, landing, fan_out, planner.settings.split_interval_ms)
    lookup = Lookup(config, slots, reader, DayCells(slots, reader, writer, primary.cfg.max_parallel), coalesce)
    merge = Merge(planner, lookup)
    fallback = Fallback(by_name, primary, merge)
    forward = Forward(by_name, primary, slots, reader, writer, landing, fetcher.flight, ask, fallback, leases)
    window_bound = min((n for n in (config.limits.max_window_samples, config.limits.max_samples) if n), default=0)
    raw_cache = RawCache(config, store, writer) if cache_on else None
    cross_store = CrossStore(planner, backends, merge, window_bound, raw_cache)
    route = Route(backends, forward, cross_store)
    plan = Plan(planner, primary, cache_on, route)
    admit = Admit(config.limits, plan, admission)
    return admit, Parts(planner, slots, landing, reader, writer, leases, fetcher, cross_store)
