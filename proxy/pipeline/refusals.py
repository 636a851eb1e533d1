"""A piece the backend refuses for its size or its time is cut finer and asked again.

Why: the seed's pain is queries that are too big or too slow for the backend. The planner's
time pieces already bring most queries under Prometheus's `--query.max-samples` and
`--query.timeout`, but a single piece can still be refused (a wide selector at a fine step, a
dense hour, a busy backend), and then the whole answer was that error. Here, between the
fetcher and the backend(s) of its route (`Fetcher` -> `RefusalSplitter.answer` ->
`RouteAnswer.answer`), a refused call is cut and its parts asked, recursively:

    refused for size   422/400 "query processing would load too many samples into memory"
                       (Prometheus, AMP), Cortex/Mimir's "maximum number of samples / chunks /
                       series" wording
    refused for time   503 errorType "timeout" (the backend's own --query.timeout), AMP's 422
                       "query timed out", or the backend call's own timeout
                       (`backends[].timeout`) -- never the client's deadline (`ClientDeadline`)

    1. node shards first, when the piece is not a shard piece already and the planner can
       shard its query (`shardplanner.planner.plan` decides, with the same rules and shard
       label values as for any query: exhaustive and disjoint matchers); the shard answers are
       merged with the sub-plan's own `MergeRecipe` (sum of sums, avg as sum / count, ...), so
       the result is the piece's answer. A topk/bottomk tied at the k-th place cannot be
       merged exactly: then time is cut instead;
    2. then time: the piece's range is halved on its own step grid (each step of a range query
       is evaluated on its own, so the halves concatenated are the piece's answer), when the
       query does not depend on its own start/end/step (`rules.time_splittable`) and its route
       is not itself split in time;
    3. each part is asked; a part refused again is cut again, to at most
       `planner.refusal_split_depth` levels, within the query's deadline and its
       `limits.max_backend_calls` (a cut the budget cannot pay for is not made: the refusal is
       the answer, as before).

The answer is then what the fetcher would have got from an unrefused call: it is cut into the
piece's cache units and stored like any other. What worked is remembered per metric (the
metric names of the query's selectors, per tenant scope) for `planner.refusal_memory`: the
most shards and the longest time piece that were answered; a later call for that metric starts
split that way instead of being refused first. A query forwarded whole (`forward.py`) that is
refused is run through the planned path, which starts from the refusal (its context's
`refused`, context.py) instead
of asking the same call again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from shardplanner import rules
from shardplanner.ast import Expr, selectors
from shardplanner.plan import MergeRecipe, PlannerSettings, QueryRequest, Span
from shardplanner.planner import plan as make_plan
from shardplanner.promql import CannotParse, TooComplex, parse

from ..backends.circuit import ClientDeadline, deadline_answer
from ..backends.tenancy import Tenant
from ..errors import PromError
from ..observe.metrics import METRICS
from ..result import QueryResult
from ..result.merge import concat, merge
from ..result.ties import topk_ambiguous
from .ask import query_call
from .context import RequestContext
from .hybrid.router import Router
from .units import Fetch
from .values import PLANNED_PARAMS, Pairs, PieceFailed

log = logging.getLogger("promaccel.refusals")

# Phrases of a refusal for size (lower case; searched in the first bytes of the error body).
SIZE_PHRASES = (
    b"would load too many samples",  # Prometheus, AMP (and Cortex/Thanos: the same engine)
    b"maximum number of samples",  # Mimir / Cortex wording
    b"max number of samples",
    b"maximum number of chunks",
    b"max number of chunks",
    b"maximum number of series",
    b"max number of series",
    b"chunks size limit",
)
# Phrases of a refusal for time that does not come as Prometheus's 503 errorType "timeout".
TIME_PHRASES = (b"query timed out", b"timed out in expression evaluation", b'"errortype":"timeout"')
_BODY_SCAN = 4096
# Not cut again when less than this is left of the query's deadline.
MIN_LEFT_S = 0.05
# Most time pieces a remembered split may cut one call into (the budget bounds it anyway).
MAX_PRESPLIT = 64

def refusal(exc: BaseException) -> str | None:
    """"size" or "time" when `exc` is the backend refusing a query for its size or for its
    time; None for anything else (a bad query, the client's deadline, the backend down)."""
    if isinstance(exc, PieceFailed):
        reply = exc.reply
        if reply.status not in (400, 422, 503):
            return None
        body = bytes(reply.body[:_BODY_SCAN]).lower()
        if reply.status in (400, 422) and any(p in body for p in SIZE_PHRASES):
            return "size"
        if deadline_answer(reply) or (reply.status == 422 and any(p in body for p in TIME_PHRASES)):
            return "time"
        return None
    if isinstance(exc, PromError) and exc.kind == "timeout" and not isinstance(exc, ClientDeadline):
        return "time"  # the backend call's own timeout (backends[].timeout)
    return None


class Answerer(Protocol):
    """What answers one fetch from the backend(s) of its route (`RouteAnswer`)."""

    async def answer(self, f: Fetch, path: str, form: Pairs, timeout_s: float,
                     router: Router | None, ctx: RequestContext) -> QueryResult: ...


@dataclass
class Learned:
    """What worked for a metric: start with this many shards, time pieces no longer than
    `max_ms` (None: not cut in time), for calls at least as long as the shortest one refused,
    `refused_ms` (a shorter call is asked whole first)."""

    shards: int = 1
    max_ms: int | None = None
    until: float = 0.0
    refused_ms: int = 0


class Memory:
    """metric key -> `Learned`, each for `ttl_s` after it was last learned; at most
    `max_entries`, the least recently learned dropped first."""

    def __init__(self, ttl_s: float, max_entries: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._m: OrderedDict[tuple[str, str], Learned] = OrderedDict()

    def get(self, key: tuple[str, str]) -> Learned | None:
        got = self._m.get(key)
        if got is not None and got.until < self.clock():
            del self._m[key]
            return None
        return got

    def learn(self, key: tuple[str, str], shards: int, max_ms: int | None, refused_ms: int = 0) -> Learned:
        """Finer wins: more shards, a shorter time piece, a shorter refused call."""
        old = self.get(key)
        if old is not None:
            shards = max(shards, old.shards)
            if old.max_ms is not None:
                max_ms = old.max_ms if max_ms is None else min(max_ms, old.max_ms)
            refused_ms = min(refused_ms, old.refused_ms)
        entry = self._m[key] = Learned(shards, max_ms, self.clock() + self.ttl_s, refused_ms)
        self._m.move_to_end(key)
        while len(self._m) > self.max_entries:
            self._m.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._m)


@dataclass
class _Job:
    """One fetch being answered in parts."""

    f: Fetch
    extra: Pairs
    router: Router | None
    ctx: RequestContext
    deadline: float
    key: tuple[str, str] | None
    time_ok: bool  # the query may be cut in time (and its route is not split in time)
    shards: int = 1  # the most shards a part was cut into
    answered_ms: list[int] = field(default_factory=list)  # lengths of answered range parts
    refused_ms: list[int] = field(default_factory=list)  # lengths of refused range parts
    cut: bool = False

    def left(self) -> float:
        return self.deadline - time.monotonic()


@dataclass(frozen=True)
class _ShardCut:
    parts: tuple[tuple[str | None, str], ...]  # (role, query) per shard piece
    recipe: MergeRecipe
    time_ms: int | None
    count: int  # shards


class RefusalSplitter:
    """`answer(f, ...)`: `inner.answer(f, ...)`, with refusals cut finer (module docstring).
    `values()` gives the shard-label values (the planner's snapshot)."""

    def __init__(self, inner: Answerer, settings: PlannerSettings,
                 values: Callable[[Tenant], Awaitable[Mapping[str, Sequence[str]]]], *, max_depth: int = 6,
                 shards: int = 8, memory_ttl_s: float = 3600.0) -> None:
        self.inner = inner
        self.settings = replace(settings, split_interval_ms=None, split_instant_windows=False,
                                auto_shards=False, max_pieces=max(settings.max_pieces, 10_000))
        self.values = values
        self.max_depth = max_depth
        self.shards = shards
        self.memory = Memory(memory_ttl_s)

    async def answer(self, f: Fetch, path: str, form: Pairs, timeout_s: float,
                     router: Router | None, ctx: RequestContext) -> QueryResult:
        refused_whole = ctx.refused
        job = self._job(f, form, timeout_s, router, ctx) if self.max_depth > 0 else None
        if job is None:
            return await self.inner.answer(f, path, form, timeout_s, router, ctx)
        learned = self.memory.get(job.key) if job.key is not None else None
        if learned is not None:
            early = await self._presplit(job, learned)
            if early is not None:
                self._learn(job)
                return early
        if refused_whole is not None and refused_whole.query == f.query and refused_whole.span == f.span:
            refused: BaseException = refused_whole.error
        else:
            try:
                return await self.inner.answer(f, path, form, timeout_s, router, ctx)
            except (PieceFailed, PromError) as exc:
                if refusal(exc) is None:
                    raise
                refused = exc
        self._note_refused(job, f.span)
        result = await self._finer(job, f.query, f.span, f.shard_index >= 0, 0, refused)
        self._learn(job)
        return result

    def remembers(self, expr: Expr, span: Span, scope: str) -> bool:
        """Whether a cut is remembered for the metric(s) of `expr` over a span this long."""
        key = _metric_key(expr, scope) if self.max_depth > 0 else None
        learned = self.memory.get(key) if key is not None else None
        return learned is not None and span.end_ms - span.start_ms >= learned.refused_ms

    # --- the parts --------------------------------------------------------------------------

    def _job(self, f: Fetch, form: Pairs, timeout_s: float, router: Router | None,
             ctx: RequestContext) -> _Job | None:
        try:
            expr = parse(f.query)
        except (CannotParse, TooComplex):
            return None
        time_ok = rules.time_splittable(expr)
        if router is not None and f.route:
            route = f.routed
            if route is not None and route.kind == "split_time":
                time_ok = False  # its parts are fixed times: never asked for other bounds
        extra = [(k, v) for k, v in form if k not in PLANNED_PARAMS]
        return _Job(f, extra, router, ctx, time.monotonic() + timeout_s, _metric_key(expr, ctx.scope), time_ok)

    async def _solve(self, job: _Job, query: str, span: Span, sharded: bool, depth: int) -> QueryResult:
        """One part: asked; refused, cut finer."""
        try:
            result = await self._call(job, query, span)
        except (PieceFailed, PromError) as exc:
            if refusal(exc) is None:
                raise
            self._note_refused(job, span)
            return await self._finer(job, query, span, sharded, depth, exc)
        if span.is_range:
            job.answered_ms.append(span.end_ms - span.start_ms)
        return result

    async def _call(self, job: _Job, query: str, span: Span) -> QueryResult:
        left = job.left()
        if left <= 0:
            raise PromError("timeout", "query timed out while its refused pieces were cut finer")
        f = job.f
        part = Fetch(query, f.role, f.shard_index, span, (), f.route, instants=f.instants, routed=f.routed)
        path, form = query_call(query, span, job.extra)
        return await self.inner.answer(part, path, form, left, job.router, job.ctx)

    async def _finer(self, job: _Job, query: str, span: Span, sharded: bool, depth: int,
                     refused: BaseException) -> QueryResult:
        """`query` over `span`, refused with `refused`: cut into shards, else into halves of
        its time range, each part solved at `depth + 1`; else the refusal stands."""
        if depth >= self.max_depth or job.left() < MIN_LEFT_S:
            raise refused
        kind = refusal(refused) or "size"
        if not sharded:
            cut = await self._shard_cut(query, span, self.shards, job.ctx)
            if cut is not None and job.ctx.budget.affords(len(cut.parts)):
                METRICS.planned.labels("refusal_split", f"{kind}_shards").inc()
                job.cut = True
                job.shards = max(job.shards, cut.count)
                merged = await self._merged(job, cut, span, depth + 1)
                if merged is not None:
                    return merged
        halves = _halves(span) if job.time_ok else None
        if halves is not None and job.ctx.budget.affords(len(halves)):
            METRICS.planned.labels("refusal_split", f"{kind}_time").inc()
            job.cut = True
            return concat(await _all(self._solve(job, query, h, sharded, depth + 1) for h in halves))
        raise refused

    async def _merged(self, job: _Job, cut: _ShardCut, span: Span, depth: int) -> QueryResult | None:
        """The shard parts solved and merged with their recipe; None when a topk/bottomk is
        tied at the k-th place (the merge cannot pick Prometheus's series)."""
        results = await _all(self._solve(job, q, span, True, depth) for _, q in cut.parts)
        recipe = cut.recipe
        if recipe.kind == "aggregate" and recipe.op in ("topk", "bottomk") and topk_ambiguous(
                list(enumerate(results)), recipe):
            return None
        return merge([(role, r) for (role, _), r in zip(cut.parts, results)], recipe, time_ms=cut.time_ms)

    async def _shard_cut(self, query: str, span: Span, n: int, ctx: RequestContext) -> _ShardCut | None:
        """`query` over `span` planned in `n` node shards (and nothing else, over the shard-label
        values the tenant of `ctx` sees), or None when the planner does not shard it."""
        if n < 2:
            return None
        values = await self.values(ctx.caller.tenant)
        sub = make_plan(QueryRequest(query, span), replace(self.settings, shards=n), values)
        if not sub.sharded or len(sub.pieces) < 2:
            return None
        parts = tuple((p.role, p.query) for p in sub.pieces)
        count = max((p.shard.count for p in sub.pieces if p.shard is not None), default=1)
        return _ShardCut(parts, sub.merge, sub.request.time_ms, count)

    async def _presplit(self, job: _Job, learned: Learned) -> QueryResult | None:
        """The fetch cut as `learned` says from the start (None: nothing to cut, or more calls
        than the budget allows)."""
        f = job.f
        if f.span.end_ms - f.span.start_ms < learned.refused_ms:
            return None  # shorter than anything refused: asked whole first
        spans = [f.span]
        if learned.max_ms is not None and job.time_ok and f.span.is_range:
            spans = _cut_time(f.span, learned.max_ms)
        cut = None
        if learned.shards > 1 and f.shard_index < 0:
            cut = await self._shard_cut(f.query, f.span, learned.shards, job.ctx)
        calls = len(spans) * (len(cut.parts) if cut is not None else 1)
        if calls < 2 or not job.ctx.budget.affords(calls):
            return None
        METRICS.planned.labels("refusal_split", "remembered").inc()
        job.cut = True

        async def one(span: Span) -> QueryResult:
            if cut is None:
                return await self._solve(job, f.query, span, f.shard_index >= 0, 1)
            job.shards = max(job.shards, cut.count)
            shard_cut = cut if span == f.span else await self._shard_cut(f.query, span, learned.shards, job.ctx)
            assert shard_cut is not None
            merged = await self._merged(job, shard_cut, span, 1)
            if merged is None:  # tied topk: the part unsharded, cut in time if refused
                return await self._solve(job, f.query, span, True, 1)
            return merged

        results = await _all(one(s) for s in spans)
        return results[0] if len(results) == 1 else concat(results)

    # --- memory -----------------------------------------------------------------------------

    def _note_refused(self, job: _Job, span: Span) -> None:
        job.refused_ms.append(span.end_ms - span.start_ms)  # 0 for an instant

    def _learn(self, job: _Job) -> None:
        """After a cut answer: the most shards used and the longest time piece answered that
        is shorter than every refused one (None when no time cut was needed)."""
        if not job.cut or job.key is None:
            return
        max_ms = None
        if job.refused_ms and job.answered_ms:
            shortest_refused = min(job.refused_ms)
            shorter = [d for d in job.answered_ms if d < shortest_refused]
            max_ms = max(shorter) if shorter else None
        refused_ms = min(job.refused_ms) if job.refused_ms else job.f.span.end_ms - job.f.span.start_ms
        learned = self.memory.learn(job.key, job.shards, max_ms, refused_ms)
        log.info("refused pieces of %s answered cut finer: %d shards, time pieces up to %s ms "
                 "(remembered: %d shards, %s ms)", job.key[1], job.shards, max_ms, learned.shards,
                 learned.max_ms)


def _metric_key(expr: Expr, scope: str) -> tuple[str, str] | None:
    names = set()
    for sel in selectors(expr):
        name = sel.metric_name
        if name is None:
            return None
        names.add(name)
    return (scope, ",".join(sorted(names))) if names else None


def _halves(span: Span) -> list[Span] | None:
    """A range span halved on its own step grid (the first half one step longer when odd);
    None for an instant or a single step."""
    if not span.is_range or span.points < 2:
        return None
    first = (span.points + 1) // 2
    mid = span.start_ms + (first - 1) * span.step
    return [span.with_bounds(span.start_ms, mid), span.with_bounds(mid + span.step, span.end_ms)]


def _cut_time(span: Span, max_ms: int) -> list[Span]:
    """A range span cut on its grid into equal runs of steps, each spanning at most `max_ms`
    (at least one step each; at most MAX_PRESPLIT runs)."""
    per = max(1, max_ms // span.step + 1)  # points in a run of at most max_ms
    n = min(MAX_PRESPLIT, -(-span.points // per))
    size = -(-span.points // n)
    out = []
    for i in range(0, span.points, size):
        lo = span.start_ms + i * span.step
        hi = span.start_ms + min(span.points - 1, i + size - 1) * span.step
        out.append(span.with_bounds(lo, hi))
    return out


async def _all(coros: Any) -> list[QueryResult]:
    """The coroutines' results, in order; the first failure cancels the rest and is raised
    (unwrapped: a backend's verdict reads as it came)."""
    tasks: list[asyncio.Task[QueryResult]] = []
    try:
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tasks.append(tg.create_task(c))
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        raise next((e for e in leaves if isinstance(e, PieceFailed)), leaves[0]) from None
    return [t.result() for t in tasks]


def _leaves(group: BaseExceptionGroup[Any]) -> Any:
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e
