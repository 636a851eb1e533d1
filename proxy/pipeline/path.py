"""The request path of /api/v1/query and /api/v1/query_range, built in one place, in order.

Each stage has one job and one `async __call__`; it derives the value it hands down
(`values.Query`, frozen) and returns its answer up:

    Admit      admission (in flight, a bounded wait), allowances (calls, cache keys), AMP samples
    Plan       parse once (cached by text), shard-label values, the plan, the cache context
    Reserve    the answer's estimated bytes from the process's budget (a bounded wait), given
               back once the response is sent
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
from .admission import Admission, Admit
from .answer_bytes import AnswerBytes, Reserve
from .ask import Asker
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .crossstore import CrossStore
from .daycells import DayCells
from .fetch import Fetcher
from .forward import Forward
from .hybrid.fetch import RouteAnswer
from .hybrid.route import Route
from .landing import Landing
from .leases import Leases
from .lookup import Coalesce, FanOut, Lookup
from .merging import Fallback, Merge
from .planning import Plan, Planner
from .raw_fetch import RawCache
from .refusals import RefusalSplitter
from .slots import SlotMaker
from .stage import Stage
from .traced import traced
from .values import Answer, Query


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
    answers: AnswerBytes
    admission: Admission  # shared by the pipelines of every tenant


def build(config: Config, backends: Sequence[Backend], store: Callable[[], PieceStore],
          admission: Admission | None = None, answers: AnswerBytes | None = None) -> tuple[Stage[Query, Answer], Parts]:
    """The stages over `backends` (backends[0] the primary); `admission` and the answer-bytes
    budget `answers` shared with other pipelines (one per tenant) when given."""
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
    pc = config.planner
    # Refused pieces cut finer (shards, then time) between the fetcher and the backends.
    splitter = RefusalSplitter(RouteAnswer(config, backends, ask), planner.settings, planner.shard_values_now,
                               max_depth=pc.refusal_split_depth, shards=pc.max_parallel,
                               memory_ttl_s=pc.refusal_memory / 1000)
    fetcher = Fetcher(landing, writer, splitter, cache_on, leases)

    # Each stage's next one inside its tracing span when tracing is on (traced.py).
    fan_out = FanOut(fetcher)
    coalesce = Coalesce(config, primary.cfg.max_parallel, landing, traced(fan_out), planner.settings.split_interval_ms)
    lookup = Lookup(config, slots, reader, DayCells(slots, reader, writer, primary.cfg.max_parallel,
                                                       config.cache.day_cells_edge_max_samples), traced(coalesce))
    merge = Merge(planner, traced(lookup))
    fallback = Fallback(by_name, primary, traced(merge))
    forward = Forward(by_name, primary, slots, reader, writer, landing, fetcher.flight, ask, traced(fallback), leases,
                      refusals=splitter if pc.refusal_split_depth > 0 else None)
    window_bound = min((n for n in (config.limits.max_window_samples, config.limits.max_samples) if n), default=0)
    raw_cache = RawCache(config, store, writer) if cache_on else None
    cross_store = CrossStore(planner, backends, traced(merge), window_bound, raw_cache)
    route = Route(backends, traced(forward), traced(cross_store))
    limits = config.limits
    answers = answers or AnswerBytes(limits.max_inflight_answer_bytes, limits.queue_timeout / 1000)
    reserve = Reserve(answers, planner, traced(route))
    plan = Plan(planner, primary, cache_on, traced(reserve))
    admit = Admit(limits, traced(plan), admission)
    return traced(admit), Parts(planner, slots, landing, reader, writer, leases, fetcher, cross_store, answers,
                                admit.admission)
