"""The request path of /api/v1/query and /api/v1/query_range, built in one place, in order.

Each stage has one job and one `async __call__`; it derives the value it hands down
(`values.Query`, frozen, carrying the request's `RequestContext`: context.py) and returns its
answer up. `build` makes the components once, then the stages in one list each, outermost
first, each made with the stage after it (`chain`): nothing is patched in afterwards.

    Admit      admission (in flight, a bounded wait); the answer says what the query cost
    Recall     a request answered before with bytes kept whole, every cell it was made of
               unchanged in the store (one read of their tags): those bytes
    Plan       parse once (cached by text), shard-label values, the plan, the cache context
    Reserve    the answer's estimated bytes from the process's budget (a bounded wait), given
               back once the response is sent
    Route      hybrid fleets: who holds what; a join across stores branches to CrossStore
    Forward    a query left whole goes to Relay (the leaf: its cached answer, or the backend's
               bytes untouched); a whole query refused for size or time, to the planned path
    Fallback   a piece's backend error is the answer; shapes the merge cannot model go to Relay
    -- the planned path --
    Merge      concat / re-aggregate in one order; a topk tie at the k-th place reruns unsharded
    Lookup     each piece's cache unit and cached answer (landing zone, store, finer steps);
               every piece found as the same cells as before: the answer kept whole then
    Coalesce   pieces in flight elsewhere are awaited; the rest grouped into backend calls
    FanOut     the calls in parallel under the query's one deadline (the planned path's leaf)

    CrossStore evaluates the operators above per-store subqueries, each run through the
               planned path.

/api/v1/explain runs the same path with an `Explanation` on the context (explain.py): the
stages note what they decide and the leaf fetches nothing.

Shared state lives with the component that owns it: `Landing` (landing zone, calls in
flight, recent calls), `CacheReader`/`CacheWriter` (the store), `Fetcher` (single-flight),
`Leases` (fetch leases shared with the other processes using the Redis), `Revalidator`
(baseline digests of stored pieces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import Backend
from ..cache import PieceStore
from ..config import Config
from .admission import Admission, Admit
from .answer_bytes import AnswerBytes, Reserve
from .answer_memo import AnswerMemo, Recall
from .ask import Asker
from .cache_read import CacheReader
from .cache_write import CacheWriter
from .crossstore import CrossStore
from .daycells import DayCells
from .fetch import Fetcher
from .forward import Forward, Relay
from .hybrid.fetch import RouteAnswer
from .hybrid.route import Route
from .landing import Landing
from .leases import Leases
from .lookup import Coalesce, FanOut, Lookup
from .merging import Fallback, Merge
from .planning import Plan, Planner
from .raw_fetch import RawCache
from .refusals import RefusalSplitter
from .revalidate import Invalidate, Revalidator
from .slots import SlotMaker
from .stage import Stage
from .traced import traced
from .values import Answer, Query


@dataclass(frozen=True)
class Parts:
    """The components the stages share (and the service's administration uses)."""

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
    memo: AnswerMemo  # answers kept whole, shared too
    revalidator: Revalidator | None  # cache.revalidate_interval: started with the service


Make = Callable[[Stage[Any, Any]], Stage[Any, Any]]


def chain(*stages: Make, leaf: Stage[Any, Any]) -> Stage[Any, Any]:
    """`stages` (each made with the stage after it), outermost first, down to `leaf`; each
    one inside its tracing span when tracing is on (traced.py)."""
    stage = leaf
    for make in reversed(stages):
        stage = traced(make(stage))
    return stage


def build(config: Config, backends: Sequence[Backend], store: Callable[[], PieceStore],
          admission: Admission | None = None, answers: AnswerBytes | None = None,
          invalidate: Invalidate | None = None, memo: AnswerMemo | None = None) -> tuple[Stage[Query, Answer], Parts]:
    """The stages over `backends` (backends[0] the primary); `admission`, the answer-bytes
    budget `answers` and the kept answers `memo` shared with other pipelines (one per tenant)
    when given; `invalidate`
    (the service's) for revalidation, which runs only when it is configured and given."""
    primary = backends[0]
    by_name = {b.name: b for b in backends}
    cc, pc, limits = config.cache, config.planner, config.limits
    cache_on = cc.enabled

    # The components, each made once with what it needs.
    planner = Planner(config, primary)
    slots = SlotMaker(config, planner.settings.split_interval_ms)
    landing = Landing()
    reader = CacheReader(config, store, landing, slots)
    leases = Leases(config, store, reader)
    revalidator = Revalidator(
        primary, invalidate, interval_ms=cc.revalidate_interval, max_age_ms=cc.revalidate_max_age,
        max_entries=cc.revalidate_max_entries, backends=by_name,
    ) if cache_on and cc.revalidate_interval > 0 and invalidate is not None else None
    writer = CacheWriter(config, store, landing, leases, revalidator)
    ask = Asker()
    # Refused pieces cut finer (shards, then time) between the fetcher and the backends.
    splitter = RefusalSplitter(RouteAnswer(config, backends, ask), planner.settings, planner.shard_values_now,
                               max_depth=pc.refusal_split_depth, shards=pc.max_parallel,
                               memory_ttl_s=pc.refusal_memory / 1000)
    fetcher = Fetcher(landing, writer, splitter, cache_on, leases)
    answers = answers or AnswerBytes(limits.max_inflight_answer_bytes, limits.queue_timeout / 1000)
    admission = admission or Admission(limits.max_queries_in_flight, limits.max_queries_per_client,
                                       limits.max_queued, limits.queue_timeout / 1000)
    window_bound = min((n for n in (limits.max_window_samples, limits.max_samples) if n), default=0)
    raw_cache = RawCache(config, store, writer) if cache_on else None
    memo = memo or AnswerMemo(cc.answer_memo_bytes if cache_on else 0)
    # Hybrid fleets route by time and holdings: their answers are recalled only through Lookup.
    recall = cache_on and len(backends) == 1 and primary.cfg.holds is None

    # The planned path: a query's pieces (or a cross-store query's subquery's), merged.
    planned = chain(
        lambda next: Merge(planner, next),
        lambda next: Lookup(config, slots, reader, DayCells(slots, reader, writer, primary.cfg.max_parallel,
                                                            cc.day_cells_edge_max_samples), next, memo),
        lambda next: Coalesce(config, primary.cfg.max_parallel, landing, next, planner.settings.split_interval_ms),
        leaf=traced(FanOut(fetcher)),
    )
    # The leaf that relays a query asked whole of one backend (Forward, Fallback, CrossStore).
    relay = traced(Relay(by_name, primary, slots, reader, writer, landing, fetcher.flight, ask, leases))
    cross_store = CrossStore(planner, backends, planned, window_bound, raw_cache, relay=relay)
    # The request path, as a query flows.
    path = chain(
        lambda next: Admit(limits, next, admission),
        *([lambda next: Recall(memo, store, primary.cfg.ident, next, reader.tagged)] if recall else []),
        lambda next: Plan(planner, primary, cache_on, next),
        lambda next: Reserve(answers, planner, next),
        lambda next: Route(backends, next, traced(cross_store)),
        lambda next: Forward(relay, next, refusals=splitter if pc.refusal_split_depth > 0 else None),
        lambda next: Fallback(relay, next),
        leaf=planned,
    )
    return path, Parts(planner, slots, landing, reader, writer, leases, fetcher, cross_store, answers, admission,
                       memo, revalidator)
