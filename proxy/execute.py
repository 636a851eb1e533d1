"""Query execution: plan, look up cached pieces, fan out the rest, merge, answer.

    request -> planner (pure) -> cache lookup (one get_many for all pieces) -> fetch groups
    of the missing pieces (coalesced, single-flight, per-backend semaphore, one deadline)
    -> decode (Arrow/numpy) -> cut into cache units, store them in the background
    -> merge (cached + fresh pieces, one deterministic order) -> encode Prometheus JSON

- When the planner leaves a query whole, the client's parameters go to the backend
  unchanged and its answer (status and bytes) is relayed untouched; a cached copy of it is
  re-encoded (byte for byte what Prometheus writes).
- Fetch granularity is not plan granularity: contiguous missing time pieces of the same
  shard and role are coalesced into about as many backend calls as the backend runs well in
  parallel (`backends[].max_parallel`), because every call pays a fixed cost (series
  lookup), and never more than `limits.max_points` steps per call. A fetched answer is cut
  back into its pieces by timestamp (`proxy/pieces.py`), exact on the step grid.
- A piece that fails makes the whole answer fail (siblings cancelled): the backend's own
  error is relayed, or promaccel's timeout/unavailable error; never a partial answer.

Caching (issue 5; the store is `proxy/cache.py`):
- Unit of caching: a *cell* -- the grid points of the query's step grid (same step, same
  `start mod step`) inside one epoch-aligned split interval -- or, where a piece is not
  inside one cell (no split, a coarsened split, an instant piece), exactly the piece. Key:
  `CacheKey.for_piece` of the cell (or piece): piece PromQL (shard matcher and pinned `@`
  included), start/end/step, step offset, shard, lookback, route (backend name and a hash of
  its URL -- `BackendConfig.ident`, never the URL or a credential -- plus any extra client
  parameter other than `timeout`) and the tenant scope (`proxy/tenancy.py`: a keyed hash of
  the client headers in `tenancy.forward_headers`, the headers that reach the backend; ""
  when none is configured: client headers then change neither keys nor answers).
- The edge pieces of a sliding window cover only part of a cell. A partial piece looks up
  its cell (cropped to the piece on a hit) and its own exact range. When missing, a partial
  piece of an *old* cell (all it reads is older than `cache.max_freshness`) of a query that
  spans several cells is fetched for the whole cell (`cache.extend_partial`), so the next
  refresh of the window finds it; a recent partial piece is fetched exactly.
- What is stored: units whose answer carries no warning, whose call succeeded, with
  `ttl_for(end of the data the unit reads, now)`: the long `cache.ttl` for old data,
  `cache.recent_ttl` (default 0: not stored) inside the freshness window. "The data it
  reads" comes from `proxy/footprint.py` (ranges, lookback, offsets -- negative too -- and
  pinned `@`), so instant queries are cached too when everything they read is old.
- Puts run in the background (bounded by `cache.max_pending_puts`, tasks referenced).
  Until a put has landed (plus a short grace) its units are served from an in-process
  landing zone, so a refresh arriving meanwhile does not fetch them again.
- Request coalescing, three layers, so N clients refreshing one dashboard cost one client's
  backend calls: a unit some other request is fetching right now is awaited from that call
  (`_inflight`, keyed by the unit's cache key); identical backend calls (same path, form and
  tenant scope, with the cache on or off) share one call (`SingleFlight`); and a call over
  old data that finished moments ago answers an identical call for a few seconds
  (`_recent_calls`), which closes the gap between a request's lookup and its own call.
- Warnings, failures, timeouts: a unit whose answer carries a warning is never stored, nor
  one from a call that failed (the store's put is never reached); the store itself never
  raises, so a Redis outage costs hits, never answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from starlette.responses import Response, StreamingResponse

from shardplanner.explain import explain as explain_plan
from shardplanner.explain import reason_code
from shardplanner.plan import Piece, Plan, PlannerSettings, QueryRequest
from shardplanner.planner import _pin as pin_query
from shardplanner.planner import plan as make_plan
from shardplanner.promql import CannotParse, parse
from shardplanner.routing import Route, TimePart

from .arrowcodec import CodecError, QueryResult, Undecodable, decode_prometheus_json, encode_arrow_stream, encode_prometheus_json, iter_prometheus_json
from .backends import Backend, BackendReply
from .cache import CacheItem, CacheKey, PieceMeta, PieceStore, make_store, ttl_for, wall_ms
from .config import Config
from .errors import PromError
from .footprint import Footprint, digest_query, footprint
from .api.forms import Pairs
from .hybrid import Router, edge_ms, holdings_of, missing_warning
from .merge import concat, merge
from .metrics import METRICS
from .api.params import InstantParams, RangeParams
from .pieces import slice_time, split_time, subsample
from .revalidate import Revalidator
from .singleflight import SingleFlight
from .backends.tenancy import scope as tenant_scope
from .ties import topk_ambiguous

log = logging.getLogger("promaccel.execute")
# One DEBUG line per backend call (path, time range, units): which pieces were asked for.
fetch_log = logging.getLogger("promaccel.fetch")

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Parameters the plan sets per piece; everything else the client sent is passed along.
PLANNED_PARAMS = frozenset({"query", "start", "end", "step", "time"})
# Parameters whose effect on the answer the merge cannot reproduce: forward those whole.
UNMERGEABLE_PARAMS = frozenset({"stats"})
# Passed-along parameters that never change an answer: not part of a cache key.
UNKEYED_PARAMS = frozenset({"timeout"})
# How long fetched units stay in the landing zone after their put finished.
LANDING_GRACE_S = 2.0
# How long a finished backend call over old data answers identical calls: closes the gap
# between a request's cache lookup and its own call, when an identical call finished in
# between (its put may not have landed yet).
RECENT_CALL_S = 5.0


# Answers above this many samples are encoded in chunks as they are sent: a 20 MB answer
# then costs ~4 MB of encoder memory instead of ~50 MB (loadtests/codec_bench.py).
STREAM_ABOVE_SAMPLES = 200_000
# Cached payloads of one lookup above this many bytes are decoded in a worker thread.
DECODE_IN_THREAD_BYTES = 256 * 1024
# Pieces to store above this many samples are encoded to Arrow IPC in a worker thread.
ENCODE_IN_THREAD_SAMPLES = 20_000
# Pieces of at most this many samples (~80 KB of columns) are stored without compression.
COMPRESS_ABOVE_SAMPLES = 4_096
# Pieces are stored in groups of at most this many samples (~4 MB of columns) at a time.
PUT_GROUP_SAMPLES = 262_144
_E = TypeVar("_E", bound=tuple[Any, ...])


def json_response(result: QueryResult, headers: dict[str, str]) -> Response:
    if result.n_samples > STREAM_ABOVE_SAMPLES:
        return StreamingResponse(iter_prometheus_json(result), media_type=JSON, headers=headers)
    return Response(encode_prometheus_json(result), media_type=JSON, headers=headers)


def relay(reply: BackendReply, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=reply.body,
        status_code=reply.status,
        headers={"Content-Type": reply.content_type, **(headers or {})},
    )


def _seconds(ms: int) -> str:
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    whole, frac = divmod(ms, 1000)
    return f"{sign}{whole}.{frac:03d}" if frac else f"{sign}{whole}"


def cell_of(start_ms: int, step_ms: int, interval_ms: int) -> tuple[int, int]:
    """First and last point of `start_ms`'s step grid inside the epoch-aligned interval of
    length `interval_ms` that holds `start_ms` (the grid extends before `start_ms`)."""
    lo = (start_ms // interval_ms) * interval_ms
    first = lo + (start_ms - lo) % step_ms
    last = first + ((lo + interval_ms - 1 - first) // step_ms) * step_ms
    return first, last


@dataclass(frozen=True)
class Unit:
    """What one cache entry holds and one fetch covers at least: a cell or a whole piece.
    `key` None: not cacheable. `ttl_ms` None or 0: not stored (recent data)."""

    query: str
    role: str | None
    shard_index: int
    start_ms: int | None
    end_ms: int | None
    step_ms: int | None
    time_ms: int | None
    key: CacheKey | None = None
    ttl_ms: int | None = None
    footprint: Footprint | None = None
    # Hybrid fleets: the unit's route id (`proxy/hybrid.py` route_id); "" = the primary.
    route: str = ""

    @property
    def is_range(self) -> bool:
        return self.step_ms is not None

    @property
    def storable(self) -> bool:
        return self.key is not None and bool(self.ttl_ms)


@dataclass(eq=False)
class Slot:
    """One planned piece on its way through the cache: the unit fetched for it when it is
    missing, the keys that can answer it (best first), and its answer once known."""

    piece: Piece
    unit: Unit
    keys: tuple[CacheKey, ...] = ()
    result: QueryResult | None = None
    status: str = "uncacheable"  # hit | miss | uncacheable

    @property
    def order(self) -> tuple[int, str, int]:
        p = self.piece
        return (p.shard.index if p.shard else -1, p.role or "", p.start_ms or p.time_ms or 0)


@dataclass(frozen=True)
class Fetch:
    """One backend call covering one or more contiguous units of the same query."""

    query: str
    role: str | None
    shard_index: int
    start_ms: int | None
    end_ms: int | None
    step_ms: int | None
    time_ms: int | None
    units: tuple[Unit, ...] = field(default=(), compare=False)
    route: str = ""
    # A range call over instant units that lie on its step grid (an instant query's
    # sub-windows): its answer at each unit's time is that unit's instant answer.
    instants: bool = False


@dataclass(frozen=True)
class _Ctx:
    tenant: str
    route: tuple[str, ...]
    now_ms: int
    lookback_ms: int


class AmbiguousTies(Exception):
    """A sharded topk/bottomk whose winners are not determined by value alone."""


class PieceFailed(Exception):
    """A backend answered a piece with an error: relay that answer."""

    def __init__(self, reply: BackendReply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def _bare_unit(p: Piece) -> Unit:
    return Unit(p.query, p.role, p.shard.index if p.shard else -1, p.start_ms, p.end_ms, p.step_ms, p.time_ms)


def coalesce(pieces: Sequence[Piece], target_calls: int, max_points: int = 11_000) -> list[Fetch]:
    """Fetches for `pieces` (no cache): see `coalesce_units`."""
    return coalesce_units([_bare_unit(p) for p in pieces], target_calls, max_points)


def coalesce_units(units: Sequence[Unit], target_calls: int, max_points: int = 11_000) -> list[Fetch]:
    """Group contiguous range units (same query, shard, role and grid) into about
    `target_calls` fetches in all, none longer than `max_points` steps. Instant units of the
    same query at evenly spaced times (the sub-windows of `max_over_time(x[30d])`) become
    range calls over those times (`Fetch.instants`): one call instead of one per time; a lone
    instant unit is fetched by itself."""
    groups: dict[tuple[str, str | None, int, int, str], list[Unit]] = {}
    fetches: list[Fetch] = []
    instants: dict[tuple[str, str | None, int, str], list[Unit]] = {}
    for u in units:
        if not u.is_range:
            if u.route.startswith("split:"):
                fetches.append(Fetch(u.query, u.role, u.shard_index, None, None, None, u.time_ms, (u,), u.route))
            else:
                instants.setdefault((u.query, u.role, u.shard_index, u.route), []).append(u)
            continue
        assert u.step_ms is not None
        # A unit whose route changes along its range (split_time) is fetched by itself.
        groups.setdefault((u.query, u.role, u.shard_index, u.step_ms,
                           u.route if not u.route.startswith("split:") else f"{u.route}#{u.start_ms}"),
                          []).append(u)
    for (query, role, shard_index, route), members in instants.items():
        for run, step in _even_runs(members):
            if step is None:
                u = run[0]
                fetches.append(Fetch(query, role, shard_index, None, None, None, u.time_ms, (u,), route))
                continue
            for i in range(0, len(run), max_points):
                chunk = run[i:i + max_points]
                fetches.append(Fetch(query, role, shard_index, chunk[0].time_ms, chunk[-1].time_ms, step, None,
                                     tuple(chunk), route, instants=True))
    if not groups:
        return fetches
    per_group = max(1, target_calls // len(groups))
    for (query, role, shard_index, step, _), members in groups.items():
        members.sort(key=lambda u: u.start_ms or 0)
        # Contiguous runs on the same grid only.
        runs: list[list[Unit]] = []
        for u in members:
            if runs:
                last = runs[-1][-1]
                assert last.end_ms is not None
                if u.start_ms == last.end_ms + step:
                    runs[-1].append(u)
                    continue
            runs.append([u])
        # Spread the group's call budget over its runs, splitting runs evenly.
        budget = max(per_group, len(runs))
        total = sum(len(r) for r in runs)
        for run in runs:
            n_calls = max(1, min(len(run), round(budget * len(run) / total)))
            size = -(-len(run) // n_calls)
            for i in range(0, len(run), size):
                for chunk in _within_points(run[i:i + size], step, max_points):
                    fetches.append(Fetch(query, role, shard_index, chunk[0].start_ms, chunk[-1].end_ms,
                                         step, None, tuple(chunk), chunk[0].route))
    return fetches


def _even_runs(units: list[Unit]) -> list[tuple[list[Unit], int | None]]:
    """Instant units (one query) in runs of evenly spaced times, oldest first, with their
    spacing; a unit in no run of two or more comes alone with spacing None."""
    ordered = sorted(units, key=lambda u: u.time_ms or 0)
    runs: list[tuple[list[Unit], int | None]] = []
    run: list[Unit] = []
    step: int | None = None
    for u in ordered:
        t = u.time_ms or 0
        if run and t == (run[-1].time_ms or 0):
            runs.append(([u], None))  # the same instant twice: its own call
            continue
        if len(run) >= 2 and step is not None and t - (run[-1].time_ms or 0) == step:
            run.append(u)
            continue
        if len(run) == 1:
            step = t - (run[0].time_ms or 0)
            run.append(u)
            continue
        if run:
            runs.append((run, step if len(run) > 1 else None))
        run, step = [u], None
    if run:
        runs.append((run, step if len(run) > 1 else None))
    return runs


def _within_points(chunk: list[Unit], step: int, max_points: int) -> list[list[Unit]]:
    """`chunk` cut so that no call asks for more than `max_points` steps (Prometheus
    rejects (end - start) / step > 11,000); a single unit is never cut."""
    out: list[list[Unit]] = [[]]
    for u in chunk:
        cur = out[-1]
        assert u.start_ms is not None and u.end_ms is not None
        if cur and cur[0].start_ms is not None and (u.end_ms - cur[0].start_ms) // step > max_points - 1:
            out.append([u])
        else:
            cur.append(u)
    return out


class ShardValues:
    """Shard-label values discovered through /api/v1/label/<name>/values, cached with a TTL.

    Stale values are still a correct partition (the last shard is the complement of the
    listed values), so a refresh happens in the background and never blocks a query once
    values are known. Values are kept per tenant scope (proxy/tenancy.py): discovery runs
    with the requesting tenant's forwarded headers (a refresh task inherits them), so one
    tenant's label values never shape (or show up in the explain output of) another's
    queries; at most MAX_ENTRIES (scope, label) pairs are kept, oldest dropped first."""

    MAX_ENTRIES = 4096

    def __init__(self, backend: Backend, ttl_ms: int) -> None:
        self.backend = backend
        self.ttl_s = ttl_ms / 1000
        self._values: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}
        self._refreshing: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def _fetch(self, label: str) -> None:
        key = (tenant_scope(), label)
        try:
            reply = await self.backend.request(
                "GET", f"/api/v1/label/{label}/values", timeout_s=10, endpoint="/api/v1/label/:name/values"
            )
            if reply.ok:
                import orjson

                data = orjson.loads(reply.body).get("data") or []
                self._values.pop(key, None)
                self._values[key] = (time.monotonic(), tuple(sorted(str(v) for v in data)))
                while len(self._values) > self.MAX_ENTRIES:
                    del self._values[next(iter(self._values))]
        except (PromError, ValueError) as exc:
            log.warning("could not discover values of shard label %s: %s", label, exc)

    async def get(self, labels: Sequence[str]) -> dict[str, tuple[str, ...]]:
        scope = tenant_scope()
        missing = [lb for lb in labels if (scope, lb) not in self._values]
        if missing:
            await asyncio.gather(*(self._fetch(lb) for lb in missing))
        now = time.monotonic()
        for lb in labels:
            key = (scope, lb)
            entry = self._values.get(key)
            if entry and now - entry[0] > self.ttl_s and key not in self._refreshing:
                task = asyncio.create_task(self._fetch(lb))  # inherits the tenant (contextvar)
                self._refreshing[key] = task
                task.add_done_callback(lambda _t, key=key: self._refreshing.pop(key, None))
        return {lb: self._values[(scope, lb)][1] for lb in labels if (scope, lb) in self._values}


class Executor:
    def __init__(self, config: Config, backends: list[Backend]) -> None:
        self.config = config
        self.backends = backends
        self.primary = backends[0]
        self.by_name = {b.name: b for b in backends}
        # Route per piece (issue 6) when there is anything to choose: several backends, or
        # one whose holdings are declared (a metric it does not hold gets a clear 422).
        self.hybrid = len(backends) > 1 or any(b.cfg.holds is not None for b in backends)
        self._ready_cache: dict[str, tuple[float, bool]] = {}
        pc, cc = config.planner, config.cache
        auto_shards = pc.shards == "auto"  # then max_parallel is the cap (planner formula)
        shards = pc.max_parallel if auto_shards else int(pc.shards)
        split = pc.split_interval
        if "split_interval" not in pc.model_fields_set and cc.enabled:
            # The cache only helps a range query that is cut on epoch-aligned boundaries.
            split = cc.split_interval
        self.settings = PlannerSettings(
            split_interval_ms=split,
            shards=shards,
            auto_shards=auto_shards,
            max_samples_per_piece=pc.max_samples_per_piece,
            series_per_node=pc.series_per_node,
            scrape_interval_ms=pc.scrape_interval,
            shard_labels=tuple(pc.shard_labels.items()),
            min_range_to_split_ms=pc.min_range_to_split,
            max_pieces=pc.max_pieces,
            split_instant_windows=pc.split_instant_windows,
            closed_range_windows=pc.range_windows == "closed",
        )
        self.shard_values = ShardValues(self.primary, pc.shard_values_ttl)
        self.flight: SingleFlight[tuple[Any, ...], Any] = SingleFlight("backend")
        self._store: PieceStore | None = None
        self.revalidator: Revalidator | None = None
        # Units fetched whose put has not landed yet: digest -> (answer, fetched_at_ms).
        self._landing: dict[str, tuple[QueryResult, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._invalidated_at_ms = 0
        # Units being fetched right now: digest -> their answer, once the call returns.
        self._inflight: dict[str, asyncio.Future[QueryResult]] = {}
        # Payloads shared by joined lookups, decoded once: digest -> (payload, answer).
        self._decoded: dict[str, tuple[bytes, QueryResult]] = {}
        # Finished backend calls over old data: flight key -> (answer, fetched_at_ms, expiry).
        self._recent_calls: dict[tuple[Any, ...], tuple[Any, int, float]] = {}

    @property
    def cache_enabled(self) -> bool:
        return self.config.cache.enabled

    def store(self) -> PieceStore:
        if self._store is None:
            self._store = make_store(self.config.cache)
        return self._store

    async def start(self) -> None:
        """Create the store and start background revalidation (inside the event loop)."""
        cc = self.config.cache
        if not cc.enabled:
            return
        self.store()
        if cc.revalidate_interval > 0 and self.revalidator is None:
            self.revalidator = Revalidator(
                self.primary, self._invalidate_from_revalidation,
                interval_ms=cc.revalidate_interval, max_age_ms=cc.revalidate_max_age,
                max_entries=cc.revalidate_max_entries, backends=self.by_name,
            )
            self.revalidator.start()

    async def aclose(self) -> None:
        if self.revalidator is not None:
            await self.revalidator.aclose()
        self.flight.cancel_all()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            # Let puts in flight finish briefly: a shutdown should not waste fetched pieces.
            await asyncio.wait(pending, timeout=2.0)
            for t in pending:
                t.cancel()
        if self._store is not None:
            await self._store.aclose()

    def _timeout_s(self, timeout_ms: int | None) -> float:
        limit = self.config.limits.query_timeout
        ms = min(timeout_ms, limit) if timeout_ms else limit
        return max(ms, 1) / 1000

    # --- planning -------------------------------------------------------------------------

    async def _plan(self, req: QueryRequest) -> Plan:
        from shardplanner.planner import samples_limit_message

        values: Mapping[str, Sequence[str]] = {}
        max_samples = self.config.limits.max_samples
        if self.settings.shards > 1 or max_samples:
            labels = sorted({label for _, label in self.settings.shard_labels})
            values = await self.shard_values.get(labels)
        plan = make_plan(req, self.settings, values)
        refusal = samples_limit_message(plan, max_samples)  # limits.max_samples (0: off)
        if refusal is not None:
            raise PromError("execution", refusal)
        return plan

    def _forward_whole(self, plan: Plan, pairs: Pairs) -> bool:
        if any(k in UNMERGEABLE_PARAMS for k, _ in pairs):
            return True
        if len(plan.pieces) != 1 or plan.merge.kind != "passthrough":
            return False
        piece = plan.pieces[0]
        # The original bytes go out only when nothing was rewritten (query and times).
        return piece.query == plan.request.query and piece.start_ms == plan.request.start_ms \
            and piece.end_ms == plan.request.end_ms and piece.time_ms == plan.request.time_ms

    # --- cache units ----------------------------------------------------------------------

    def _context(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str]) -> _Ctx:
        extras = sorted((k, v) for k, v in pairs if k not in PLANNED_PARAMS and k not in UNKEYED_PARAMS)
        route = (self.primary.cfg.ident, *(f"{k}={v}" for k, v in extras))
        return _Ctx(tenant_scope(), route, wall_ms(), req.lookback_ms)

    def _router(self, req: QueryRequest, plan: Plan) -> Router | None:
        """Per-request routing state (hybrid fleets only)."""
        if not self.hybrid:
            return None
        lo, hi = (req.start_ms, req.end_ms) if req.is_range else (req.time_ms, req.time_ms)
        assert lo is not None and hi is not None
        query: Any
        try:
            query = pin_query(parse(req.query), lo, hi)
        except CannotParse:
            query = req.query
        router = Router(holdings_of(self.backends, wall_ms()), query, req.lookback_ms,
                        {b.name: b.cfg.ident for b in self.backends})
        router.by_piece = plan.merge.combine_time
        router.edge_ms = edge_ms(query if not isinstance(query, str) else None, req.lookback_ms)
        return router

    def _route_of(self, router: Router, p: Piece, start_ms: int | None, end_ms: int | None) -> str:
        """Route id of piece `p` over `[start_ms, end_ms]` (a 422 if nobody holds it)."""
        q = p.query if router.by_piece else None
        if p.is_range:
            assert start_ms is not None and end_ms is not None and p.step_ms is not None
            r = router.range_route(start_ms, end_ms, p.step_ms, q)
        else:
            assert p.time_ms is not None
            r = router.instant_route(p.time_ms, q)
        rid = router.id(router.checked(r))
        router.routes[rid] = r
        return rid

    def _unit(self, p: Piece, start_ms: int | None, end_ms: int | None, ctx: _Ctx,
              router: Router | None = None) -> Unit:
        rid = self._route_of(router, p, start_ms, end_ms) if router is not None else ""
        bare = Unit(p.query, p.role, p.shard.index if p.shard else -1, start_ms, end_ms, p.step_ms, p.time_ms,
                    route=rid)
        if p.is_range:
            assert start_ms is not None and end_ms is not None
            lo, hi = start_ms, end_ms
        else:
            assert p.time_ms is not None
            lo = hi = p.time_ms
        fp = footprint(p.query, lo, hi, lookback_ms=ctx.lookback_ms)
        if fp is None:
            return bare
        piece = replace(p, start_ms=start_ms, end_ms=end_ms) if p.is_range else p
        route = (rid, *ctx.route[1:]) if rid else ctx.route
        key = CacheKey.for_piece(piece, lookback_ms=ctx.lookback_ms, route=route, tenant=ctx.tenant)
        return replace(bare, key=key, ttl_ms=ttl_for(fp.end_ms, ctx.now_ms, self.config.cache), footprint=fp)

    def _slots(self, plan: Plan, ctx: _Ctx | None, router: Router | None = None) -> list[Slot]:
        """One slot per planned piece, with its cache unit and lookup keys (none when the
        cache is off or the piece is not cacheable)."""
        if ctx is None:
            if router is None:
                return [Slot(p, _bare_unit(p)) for p in plan.pieces]
            return [Slot(p, replace(_bare_unit(p), route=self._route_of(router, p, p.start_ms, p.end_ms)))
                    for p in plan.pieces]
        cc = self.config.cache
        interval = self.settings.split_interval_ms
        slots: list[Slot] = []
        for p in plan.pieces:
            exact = self._unit(p, p.start_ms, p.end_ms, ctx, router)
            cell = None
            if p.is_range and interval:
                assert p.start_ms is not None and p.end_ms is not None and p.step_ms is not None
                cell = cell_of(p.start_ms, p.step_ms, interval)
                if p.end_ms > cell[1]:
                    cell = None  # a coarsened piece: cached as itself
            if cell is None or cell == (p.start_ms, p.end_ms):
                slots.append(Slot(p, exact, (exact.key,) if exact.storable and exact.key else ()))
                continue
            whole = self._unit(p, cell[0], cell[1], ctx, router)
            keys = tuple(u.key for u in (whole, exact) if u.storable and u.key)
            old = whole.footprint is not None and whole.footprint.end_ms <= ctx.now_ms - cc.max_freshness
            # Never extend past what one backend call may ask for (Prometheus: 11,000 steps).
            small = (cell[1] - cell[0]) // (p.step_ms or 1) <= self.config.limits.max_points - 1
            extend = whole.storable and old and small and cc.extend_partial and plan.time_split
            slots.append(Slot(p, whole if extend else exact, keys))
        return slots

    async def _lookup(self, slots: Sequence[Slot]) -> None:
        """Fill the slots that the landing zone or the store can answer (one get_many)."""
        wanted: dict[str, CacheKey] = {}
        for s in slots:
            if s.keys:
                s.status = "miss"
                for k in s.keys:
                    wanted.setdefault(k.digest, k)
        if not wanted:
            return
        found: dict[str, QueryResult] = {}
        for digest in wanted:
            landed = self._landed(digest)
            if landed is not None:
                found[digest] = landed
        rest = [k for d, k in wanted.items() if d not in found]
        if rest:
            payloads = await self.store().get_many(rest)
            # Lookups that joined one read (50 users on one dashboard) get the very same
            # payload object: decode it once. Keyed by digest, checked by identity, kept a
            # moment (the joined lookups resume together).
            decoded = self._decoded
            loop = asyncio.get_running_loop()
            todo: list[tuple[CacheKey, bytes]] = []
            for k, payload in zip(rest, payloads):
                if payload is None:
                    continue
                memo = decoded.get(k.digest)
                if memo is not None and memo[0] is payload:
                    found[k.digest] = memo[1]
                else:
                    todo.append((k, payload))
            # A warm 24 h panel reads megabytes: decode off the event loop (Arrow's
            # decompression releases the GIL), so other requests go on meanwhile.
            if sum(len(p) for _, p in todo) > DECODE_IN_THREAD_BYTES:
                outcomes = await asyncio.to_thread(_decode_payloads, [p for _, p in todo])
            else:
                outcomes = _decode_payloads([p for _, p in todo])
            for (k, payload), r in zip(todo, outcomes):
                if isinstance(r, Exception):  # an undecodable entry is a miss
                    METRICS.cache_errors.labels("decode").inc()
                    log.warning("cached piece %s does not decode (%s): treated as a miss", k.digest[:16], r)
                    continue
                found[k.digest] = r
                entry = decoded[k.digest] = (payload, r)
                loop.call_later(0.5, lambda d=k.digest, e=entry: decoded.get(d) is e and decoded.pop(d))
        for s in slots:
            for k in s.keys:
                r = found.get(k.digest)
                if r is None:
                    continue
                p = s.piece
                if p.is_range:
                    if r.result_type != "matrix":
                        continue
                    assert p.start_ms is not None and p.end_ms is not None
                    if (k.start_ms, k.end_ms) != (p.start_ms, p.end_ms):
                        r = slice_time(r, p.start_ms, p.end_ms)
                s.result, s.status = r, "hit"
                break

    async def _lookup_finer(self, slots: Sequence[Slot], ctx: _Ctx, router: Router | None) -> None:
        """Zooming out: a missing range piece at step S is answered by the cached cell of the
        same query at a finer step s (s divides S; `cache.reuse_finer_steps`), subsampled.
        Exact: a range query's value at t does not depend on its step (the planner pins
        `@ start()`/`end()` into the query text, which is part of the key), and the finer
        grid `start mod s` holds every point `start + k*S`. One extra batched lookup, only
        for pieces that missed."""
        interval = self.settings.split_interval_ms
        if not interval:
            return
        wanted: dict[str, CacheKey] = {}
        candidates: list[tuple[Slot, list[CacheKey]]] = []
        for s in slots:
            p = s.piece
            if s.result is not None or not s.keys or not p.is_range:
                continue
            assert p.start_ms is not None and p.end_ms is not None and p.step_ms is not None
            keys: list[CacheKey] = []
            for fine in self.config.cache.reuse_finer_steps:
                if fine >= p.step_ms or p.step_ms % fine:
                    continue
                c0, c1 = cell_of(p.start_ms, fine, interval)
                if p.start_ms < c0 or p.end_ms > c1:
                    continue
                try:
                    u = self._unit(replace(p, step_ms=fine), c0, c1, ctx, router)
                except PromError:
                    continue
                if u.key is not None and u.storable:
                    keys.append(u.key)
                    wanted.setdefault(u.key.digest, u.key)
            if keys:
                candidates.append((s, keys))
        if not wanted:
            return
        found: dict[str, QueryResult] = {}
        rest = []
        for digest, k in wanted.items():
            landed = self._landed(digest)
            if landed is not None:
                found[digest] = landed
            else:
                rest.append(k)
        if rest:
            got = [(k, p) for k, p in zip(rest, await self.store().get_many(rest)) if p is not None]
            for (k, _), r in zip(got, _decode_payloads([p for _, p in got])):
                if isinstance(r, Exception):  # an undecodable entry is a miss
                    METRICS.cache_errors.labels("decode").inc()
                else:
                    found[k.digest] = r
        for s, keys in candidates:
            for k in keys:
                r = found.get(k.digest)
                if r is None or r.result_type != "matrix":
                    continue
                p = s.piece
                assert p.start_ms is not None and p.end_ms is not None and p.step_ms is not None
                s.result, s.status = subsample(r, p.start_ms, p.end_ms, p.step_ms), "hit"
                METRICS.cache_finer_step.inc()
                break

    def _landed(self, digest: str | None) -> QueryResult | None:
        """A unit fetched by this process whose put has not landed yet (or just did)."""
        landed = self._landing.get(digest) if digest is not None else None
        if landed is None or landed[1] < self._invalidated_at_ms:
            return None
        return landed[0]

    def _count(self, slots: Sequence[Slot]) -> str:
        """X-Cache value for an answer; counts the query in promaccel_cache_lookups_total."""
        keyed = sum(1 for s in slots if s.keys)
        hits = sum(1 for s in slots if s.status == "hit")
        status = "HIT" if slots and hits == len(slots) else "PARTIAL" if hits else "MISS"
        if keyed:
            METRICS.cache.labels(status.lower()).inc()
        return status

    # --- storing --------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> bool:
        """Run `coro` in the background (referenced, bounded); False if too many are pending."""
        if len(self._tasks) >= self.config.cache.max_pending_puts:
            coro.close()
            return False
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _keep(self, units: Sequence[Unit], results: Sequence[QueryResult], fetched_at_ms: int,
              baselines: Mapping[tuple[str, int], bytes]) -> None:
        """Land fetched units and store them in the background."""
        if fetched_at_ms < self._invalidated_at_ms:
            return  # fetched before an invalidation through this process
        entries: list[tuple[Unit, QueryResult, bytes | None]] = []
        budget = CALL_BUDGET.get()
        for u, r in zip(units, results):
            if not u.storable or u.key is None or u.footprint is None or r.warnings:
                continue
            if budget is not None and not budget.new_key():
                METRICS.cache_skipped.labels("max_new_cache_keys").inc()
                continue
            baseline = None
            if self.revalidator is not None and _digest_backend(u) is not None:
                dq = digest_query(u.footprint)
                if dq is not None:
                    baseline = baselines.get((dq, u.footprint.end_ms))
                    if baseline is None:
                        continue  # cannot be revalidated: not cached
            entries.append((u, r, baseline))
        if not entries:
            return
        kind = self.store().kind
        if not self._spawn(self._put(entries, fetched_at_ms)):
            METRICS.cache_puts.labels(kind, "dropped").inc(len(entries))
            return
        for u, r, _ in entries:
            assert u.key is not None
            self._landing[u.key.digest] = (r, fetched_at_ms)

    async def _put(self, entries: list[tuple[Unit, QueryResult, bytes | None]], fetched_at_ms: int) -> None:
        try:
            compression = self.config.cache.compression
            # Encoded and written a few megabytes at a time: a 3 M-sample answer's pieces
            # written at once held every payload, its framed copy and the socket buffer's
            # copy at the same moment (~100 MB at the peak of 20 heavy queries).
            for group in _groups_by_samples(entries, PUT_GROUP_SAMPLES):
                if sum(r.n_samples for _, r, _ in group) > ENCODE_IN_THREAD_SAMPLES:
                    items = await asyncio.to_thread(_encode_items, group, fetched_at_ms, compression)
                else:  # a thread hop costs more than encoding a few thousand samples
                    items = _encode_items(group, fetched_at_ms, compression)
                await self.store().put_many(items)
                del items
            if self.revalidator is not None:
                for u, _, baseline in entries:
                    fp = u.footprint
                    assert fp is not None
                    dq = digest_query(fp)
                    if baseline is not None and dq is not None:
                        self.revalidator.record(dq, fp.end_ms, baseline, fp.metrics, fp.start_ms, fp.end_ms,
                                                _digest_backend(u) or "")
        except Exception:  # noqa: BLE001 -- the cache never fails a query
            METRICS.cache_errors.labels("put").inc()
            log.exception("storing fetched pieces failed")
        finally:
            landed = [(u.key.digest, r) for u, r, _ in entries if u.key is not None]
            asyncio.get_running_loop().call_later(LANDING_GRACE_S, self._unland, landed)

    def _unland(self, landed: list[tuple[str, QueryResult]]) -> None:
        for digest, r in landed:
            entry = self._landing.get(digest)
            if entry is not None and entry[0] is r:
                del self._landing[digest]

    def _recent_call(self, key: tuple[Any, ...]) -> Any:
        entry = self._recent_calls.get(key)
        if entry is None:
            return None
        if entry[2] < time.monotonic() or entry[1] < self._invalidated_at_ms:
            del self._recent_calls[key]
            return None
        return entry[0]

    def _remember_call(self, key: tuple[Any, ...], answer: Any, fetched_at_ms: int) -> None:
        # Big answers are not kept: holding a 50 MB answer for seconds after its query is
        # done costs more memory (20 heavy queries at once) than the duplicate call it
        # might save; dashboard panels' calls are far smaller (4 MiB: ~260k samples).
        first = answer[0] if isinstance(answer, tuple) else answer
        body = getattr(first, "body", None)
        size = len(body) if body is not None else 16 * getattr(first, "n_samples", 0)
        if size > 4 << 20:
            return
        now = time.monotonic()
        if len(self._recent_calls) >= 64:
            for k in [k for k, e in self._recent_calls.items() if e[2] < now]:
                del self._recent_calls[k]
            if len(self._recent_calls) >= 64:
                return
        self._recent_calls[key] = (answer, fetched_at_ms, now + RECENT_CALL_S)

    async def _baselines(self, units: Sequence[Unit], timeout_s: float) -> dict[tuple[str, int], bytes]:
        """Revalidation digests of the storable units, taken before their fetch."""
        if self.revalidator is None:
            return {}
        wanted = []
        backend = ""
        for u in units:
            who = _digest_backend(u)
            if u.storable and u.footprint is not None and who is not None:
                dq = digest_query(u.footprint)
                if dq is not None:
                    wanted.append((dq, u.footprint.end_ms))
                    backend = who  # one fetch, one route
        if not wanted:
            return {}
        return await self.revalidator.baselines(wanted, timeout_s, backend)

    # --- endpoints ------------------------------------------------------------------------

    async def instant(self, p: InstantParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        req = QueryRequest(query=p.query, time_ms=p.time_ms)
        return await self._run(req, pairs, headers, "/api/v1/query", p.timeout_ms)

    async def range(self, p: RangeParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        req = QueryRequest(query=p.query, start_ms=p.start_ms, end_ms=p.end_ms, step_ms=p.step_ms)
        return await self._run(req, pairs, headers, "/api/v1/query_range", p.timeout_ms)

    async def _run(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str], path: str,
                   timeout_ms: int | None) -> Response:
        tally = [0]
        SAMPLES_TALLY.set(tally)
        CALL_BUDGET.set(_Budget(self.config.limits.max_backend_calls, self.config.limits.max_new_cache_keys))
        response = await self._run_query(req, pairs, headers, path, timeout_ms)
        if tally[0]:
            response.headers["X-Promaccel-Samples-Processed"] = str(tally[0])
        return response

    async def _run_query(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str], path: str,
                         timeout_ms: int | None) -> Response:
        timeout_s = self._timeout_s(timeout_ms)
        want_arrow = ARROW_STREAM in headers.get("accept", "")
        plan = await self._plan(req)
        METRICS.pieces.observe(len(plan.pieces))
        mode = "sharded" if plan.sharded else ("split" if plan.time_split else "whole")
        METRICS.planned.labels(mode, "" if plan.sharded else reason_code(plan.notes)).inc()
        unmergeable = any(k in UNMERGEABLE_PARAMS for k, _ in pairs)
        ctx = self._context(req, pairs, headers) if self.cache_enabled and not unmergeable else None
        router = self._router(req, plan)
        backend = self.primary
        if router is not None:
            whole = self._whole_route(router, req)
            router.partial_ok = whole.kind != "single"
            if whole.kind == "unroutable" or (_merges(whole) and (
                    _absent_like(router.query) or _pinned_at(router.query) is not None)):
                return await self._cross_store(req, pairs, headers, timeout_s, ctx, router, whole, want_arrow)
            if whole.kind == "single":
                backend = self.by_name[whole.backend]
            elif unmergeable:
                raise PromError("execution", f"{', '.join(sorted(k for k, _ in pairs if k in UNMERGEABLE_PARAMS))} "
                                f"cannot be answered for a query that needs several backends ({whole.key()})")
        if self._forward_whole(plan, pairs) and not want_arrow and (router is None or whole.kind == "single"):
            return await self._whole(plan, pairs, path, timeout_s, ctx, backend, router)
        extra = [(k, v) for k, v in pairs if k not in PLANNED_PARAMS]
        try:
            try:
                result, status = await self._execute(plan, extra, timeout_s, ctx, router)
            except AmbiguousTies:
                # Ties at the k-th place: Prometheus's pick depends on its heap over all
                # series, so run the query unsharded (time pieces are still exact).
                METRICS.planned.labels("unsharded_rerun", "topk_tie").inc()
                plan = make_plan(plan.request, replace(self.settings, shards=1), {})
                result, status = await self._execute(plan, extra, timeout_s, ctx, router)
        except PieceFailed as failed:
            return relay(failed.reply, {"X-Promaccel-Pieces": str(len(plan.pieces))})
        except Undecodable:
            # Native histograms and other shapes the merge does not model: forward whole.
            if router is not None and whole.kind != "single":
                raise PromError("execution", "this answer's shape (e.g. native histograms) cannot be merged "
                                f"across backends ({whole.key()})") from None
            reply = await backend.request(
                "POST", path, form=pairs, timeout_s=timeout_s, limited=True, endpoint=path
            )
            return relay(reply, {"X-Promaccel-Pieces": "1"})
        out_headers = {"X-Promaccel-Pieces": str(len(plan.pieces)), "X-Cache": status}
        if want_arrow:
            return Response(encode_arrow_stream(result), media_type=ARROW_STREAM, headers=out_headers)
        return json_response(result, out_headers)

    # --- cross-store queries ----------------------------------------------------------------

    async def _cross_store(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str], timeout_s: float,
                           ctx: _Ctx | None, router: Router, whole: Route, want_arrow: bool) -> Response:
        """A query no single backend can answer (a join of metrics that live in different
        stores): the largest subtrees one backend can answer run as queries of their own
        (planned, cached, sharded like any query), and promaccel evaluates the binary
        operators and aggregations above them on the decoded answers. Anything else above
        them is a 422 naming the metrics, the backends and the operator -- never a guess."""
        if any(k in UNMERGEABLE_PARAMS for k, _ in pairs):
            raise PromError("execution", whole.reason)
        expr = router.query
        if isinstance(expr, str):
            raise PromError("execution", whole.reason)
        extra = [(k, v) for k, v in pairs if k not in PLANNED_PARAMS]
        counter = [0]
        try:
            async with asyncio.timeout(timeout_s):
                result = await self._evaluate(expr, req, extra, timeout_s, ctx, router, whole, counter)
        except TimeoutError:
            raise PromError("timeout", f"query timed out after {timeout_s:g}s") from None
        except PieceFailed as failed:
            return relay(failed.reply, {"X-Promaccel-Pieces": str(counter[0])})
        if not isinstance(result, QueryResult):
            raise PromError("execution", whole.reason)
        METRICS.planned.labels("cross_store", "").inc()
        out_headers = {"X-Promaccel-Pieces": str(counter[0]), "X-Cache": "MISS"}
        if want_arrow:
            return Response(encode_arrow_stream(result), media_type=ARROW_STREAM, headers=out_headers)
        return json_response(result, out_headers)

    async def _evaluate(self, node: Any, req: QueryRequest, extra: Pairs, timeout_s: float, ctx: _Ctx | None,
                        router: Router, whole: Route, counter: list[int]) -> QueryResult | float:
        from shardplanner.ast import Agg, Binary, Call, Number, Paren
        from shardplanner.serialize import to_promql

        from .binop import BinopError, evaluate_binary

        while isinstance(node, Paren):
            node = node.expr
        if isinstance(node, Number):
            return node.value
        if req.is_range:
            assert req.start_ms is not None and req.end_ms is not None and req.step_ms is not None
            r = router.range_route(req.start_ms, req.end_ms, req.step_ms, node)
        else:
            assert req.time_ms is not None
            r = router.instant_route(req.time_ms, node)
        pinned = _pinned_at(node) if _merges(r) else None
        if pinned is not None:
            # `sum(x @ T)` is the same at every step: `sum(x)` at T. Asked that way, the
            # overlap merge sees the backends' gaps around T (with `@` every step of its
            # probe would read the same instant).
            from shardplanner.ast import Selector, transform

            free = transform(node, lambda n: replace(n, at=None) if isinstance(n, Selector) else n)
            at_t = QueryRequest(query=to_promql(free), time_ms=pinned, lookback_ms=req.lookback_ms)
            value = await self._evaluate(free, at_t, extra, timeout_s, ctx, router, whole, counter)
            if isinstance(value, QueryResult):
                return _restamp(value, req)
        if r.kind != "unroutable" and not (_merges(r) and _absent_like(node)):
            # A scalar-typed side (scalar(x), time()) comes back as a one-series matrix for a
            # range query; evaluate_binary knows it is a scalar from the expression.
            sub = replace(req, query=to_promql(node))
            plan = await self._plan(sub)
            counter[0] += len(plan.pieces)
            try:
                result, _ = await self._execute(plan, extra, timeout_s, ctx, self._router(sub, plan))
            except AmbiguousTies:
                plan = make_plan(sub, replace(self.settings, shards=1), {})
                result, _ = await self._execute(plan, extra, timeout_s, ctx, self._router(sub, plan))
            return result
        if isinstance(node, Binary):
            lhs, rhs = await asyncio.gather(
                self._evaluate(node.lhs, req, extra, timeout_s, ctx, router, whole, counter),
                self._evaluate(node.rhs, req, extra, timeout_s, ctx, router, whole, counter),
            )
            try:
                return evaluate_binary(node, lhs, rhs)
            except BinopError as exc:
                raise PromError("execution", exc.message) from None
        if isinstance(node, Call) and node.func in _ABSENT_LIKE and len(node.args) == 1:
            # absent()/scalar() over backends that are merged: the merge cannot see that an
            # "absent" from a backend in an outage is wrong, so the argument is merged first
            # and the function applied here, on the merged series.
            arg = node.args[0]
            inner_expr = Call("count_over_time", (arg,)) if node.func == "absent_over_time" else arg
            inner = await self._evaluate(inner_expr, req, extra, timeout_s, ctx, router, whole, counter)
            if isinstance(inner, QueryResult):
                return _absent_or_scalar(node, inner, req)
        if isinstance(node, Agg) and node.op in _LOCAL_AGGS and (node.param is None or isinstance(node.param, Number)):
            inner = await self._evaluate(node.expr, req, extra, timeout_s, ctx, router, whole, counter)
            if isinstance(inner, QueryResult):
                return _aggregate_locally(node, inner, req.time_ms)
        raise PromError("execution", whole.reason)

    @staticmethod
    def _whole_route(router: Router, req: QueryRequest) -> Route:
        if req.is_range:
            assert req.start_ms is not None and req.end_ms is not None and req.step_ms is not None
            return router.range_route(req.start_ms, req.end_ms, req.step_ms)
        assert req.time_ms is not None
        return router.instant_route(req.time_ms)

    async def _whole(self, plan: Plan, pairs: Pairs, path: str, timeout_s: float, ctx: _Ctx | None,
                     backend: Backend | None = None, router: Router | None = None) -> Response:
        """A query the planner left whole: its cached answer, or the backend's bytes."""
        backend = backend or self.primary
        slots = self._slots(plan, ctx, router) if ctx is not None and not any(
            k in UNMERGEABLE_PARAMS for k, _ in pairs) else []
        if slots and slots[0].keys:
            await self._lookup(slots)
            if slots[0].result is not None:
                status = self._count(slots)
                return json_response(slots[0].result, {"X-Promaccel-Pieces": "1", "X-Cache": status})
        unit = slots[0].unit if slots and slots[0].unit.storable else None
        tenant = ctx.tenant if ctx is not None else tenant_scope()
        key = ("whole", path, tuple(pairs), tenant, backend.name)
        reply: BackendReply | None = self._recent_call(key) if unit is not None else None
        if reply is not None:
            METRICS.coalesced.labels("recent").inc()
        else:
            reply = await self.flight.do(key, lambda: self._forward(key, path, pairs, timeout_s, unit, backend))
        status = self._count(slots)
        return relay(reply, {"X-Promaccel-Pieces": "1", "X-Cache": status})

    async def _forward(self, key: tuple[Any, ...], path: str, pairs: Pairs, timeout_s: float,
                       unit: Unit | None, backend: Backend) -> BackendReply:
        baselines = await self._baselines([unit], timeout_s) if unit is not None else {}
        fetched_at = wall_ms()
        fetch_log.debug("fetch %s whole from %s", path, backend.name)
        reply = await backend.request(
            "POST", path, form=pairs, timeout_s=timeout_s, limited=True, endpoint=path
        )
        if _needs_range_form(backend, path, reply) and any(k == "time" for k, _ in pairs):
            try:
                result = await self._ask_range_form(backend, pairs, timeout_s)
            except PieceFailed as failed:
                return failed.reply
            reply = BackendReply(200, encode_prometheus_json(result), JSON)
        if unit is not None and reply.ok:
            self._remember_call(key, reply, fetched_at)
            self._spawn(self._keep_whole(reply.body, unit, fetched_at, baselines))
        return reply

    async def _keep_whole(self, body: bytes, unit: Unit, fetched_at_ms: int,
                          baselines: Mapping[tuple[str, int], bytes]) -> None:
        # Decoding for the cache happens after the answer was relayed.
        await asyncio.sleep(0)
        try:
            result = decode_prometheus_json(body)
        except CodecError:
            return
        if unit.is_range and result.result_type != "matrix":
            return
        self._keep([unit], [result], fetched_at_ms, baselines)

    async def _execute(self, plan: Plan, extra: Pairs, timeout_s: float,
                       ctx: _Ctx | None, router: Router | None = None) -> tuple[QueryResult, str]:
        slots = self._slots(plan, ctx, router)
        await self._lookup(slots)
        if ctx is not None and self.config.cache.reuse_finer_steps:
            await self._lookup_finer(slots, ctx, router)
        # Pieces another request is fetching right now: wait for that call instead.
        waits: list[tuple[Slot, asyncio.Future[QueryResult]]] = []
        missing: list[Slot] = []
        for s in slots:
            if s.result is not None:
                continue
            digest = s.unit.key.digest if s.unit.key is not None else None
            landed = self._landed(digest)
            if landed is not None:
                s.result, s.status = _fit(s, landed), "hit"
            elif digest is not None and digest in self._inflight:
                waits.append((s, self._inflight[digest]))
            else:
                missing.append(s)
        if waits:
            METRICS.coalesced.labels("piece").inc(len(waits))
        slot_of = {s.unit: s for s in missing}
        fetches = coalesce_units([s.unit for s in missing], self.primary.cfg.max_parallel,
                                 self.config.limits.max_points)
        budget = CALL_BUDGET.get()
        if budget is not None:
            budget.check(len(fetches))  # before any call is made: a 422 naming the limit
        try:
            async with asyncio.timeout(timeout_s):
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self._fetch(f, extra, timeout_s, ctx, router)) for f in fetches]
                    shared = [tg.create_task(_wait(fut)) for _, fut in waits]
        except* PieceFailed as group:
            raise _first(group.exceptions) from None
        except* PromError as group:
            raise _first(group.exceptions) from None
        except* Undecodable as group:
            raise _first(group.exceptions) from None
        except* TimeoutError:
            raise PromError(
                "timeout", f"query timed out after {timeout_s:g}s ({len(fetches)} backend calls)"
            ) from None
        # Segments to merge: each cached or shared piece, and each fetched answer cut to
        # its pieces.
        segments: list[tuple[tuple[int, str, int], int, str | None, QueryResult]] = [
            (s.order, s.unit.shard_index, s.piece.role, s.result) for s in slots if s.result is not None
        ]
        for (s, _), t in zip(waits, shared):
            segments.append((s.order, s.unit.shard_index, s.piece.role, _fit(s, t.result())))
        results = [t.result() for t in tasks]
        del tasks
        for i, f in enumerate(fetches):
            covered = [slot_of[u] for u in f.units]
            # The call's answer was cut into its units to be stored: merge those (they live
            # until their put lands anyway) and let the whole answer go now, one full copy
            # fewer at the merge's peak (a 24 h answer of 3 M samples is ~50 MB a copy).
            landed = [self._landed(u.key.digest if u.key is not None else None) for u in f.units]
            if f.step_ms is not None and len(f.units) > 1 and all(r is not None for r in landed):
                results[i] = None  # type: ignore[call-overload]
                for s, r in zip(covered, landed):
                    assert r is not None
                    segments.append((s.order, f.shard_index, f.role, _fit(s, r)))
                continue
            result = results[i]
            if f.instants:
                # A range call over instant units: each unit's answer is the call's at its time.
                parts = self._cut(f, f.units, result)
                assert parts is not None  # _call checked that the answer is a matrix
                results[i] = None  # type: ignore[call-overload]
                for s, part in zip(covered, parts):
                    segments.append((s.order, f.shard_index, f.role, part))
                continue
            first = min(covered, key=lambda s: s.order)
            if f.step_ms is not None:
                lo = min(s.piece.start_ms or 0 for s in covered)
                hi = max(s.piece.end_ms or 0 for s in covered)
                if (f.start_ms, f.end_ms) != (lo, hi):
                    result = slice_time(result, lo, hi)
            segments.append((first.order, f.shard_index, f.role, result))
        segments.sort(key=lambda seg: seg[0])
        if plan.sharded and plan.merge.op in ("topk", "bottomk") and topk_ambiguous(
            [(shard, r) for _, shard, _, r in segments], plan.merge
        ):
            raise AmbiguousTies()
        status = self._count(slots)
        # Deterministic merge order: shard index, then role, then time.
        merged = merge([(role, r) for _, _, role, r in segments], plan.merge, time_ms=plan.request.time_ms)
        return merged, status

    async def _fetch(self, f: Fetch, extra: Pairs, timeout_s: float, ctx: _Ctx | None,
                     router: Router | None = None) -> QueryResult:
        if f.step_ms is not None:
            assert f.start_ms is not None and f.end_ms is not None
            path = "/api/v1/query_range"
            form = [("query", f.query), ("start", _seconds(f.start_ms)), ("end", _seconds(f.end_ms)),
                    ("step", _seconds(f.step_ms)), *extra]
        else:
            assert f.time_ms is not None
            path = "/api/v1/query"
            form = [("query", f.query), ("time", _seconds(f.time_ms)), *extra]
        tenant = ctx.tenant if ctx is not None else tenant_scope()
        key = ("piece", path, tuple(form), tenant, f.route)
        recent = self._recent_call(key)
        if recent is not None:
            METRICS.coalesced.labels("recent").inc()
            result, fetched_at, baselines = recent
            # Its units may have left the landing zone without reaching the store (a
            # corrupt entry was deleted since): store them again.
            unlanded = [u for u in f.units if u.storable and u.key is not None
                        and u.key.digest not in self._landing]
            if unlanded:
                self._store_fetch(f, unlanded, result, fetched_at, baselines)
            return result  # type: ignore[no-any-return]
        return await self.flight.do(  # type: ignore[no-any-return]
            key, lambda: self._fetch_now(key, f, path, form, timeout_s, router)
        )

    async def _fetch_now(self, key: tuple[Any, ...], f: Fetch, path: str, form: Pairs,
                         timeout_s: float, router: Router | None = None) -> QueryResult:
        # Announce the call's units, so that requests needing one of them wait for this call.
        loop = asyncio.get_running_loop()
        announced: dict[str, asyncio.Future[QueryResult]] = {}
        for u in f.units:
            if u.key is not None and u.key.digest not in self._inflight:
                fut: asyncio.Future[QueryResult] = loop.create_future()
                fut.add_done_callback(_retrieve)
                announced[u.key.digest] = self._inflight[u.key.digest] = fut
        try:
            result = await self._call(key, f, path, form, timeout_s, router)
        except BaseException as exc:
            for fut in announced.values():
                if fut.done():
                    continue
                if isinstance(exc, Exception):
                    fut.set_exception(exc)
                else:
                    fut.cancel()
            raise
        finally:
            for digest, fut in announced.items():
                if self._inflight.get(digest) is fut:
                    del self._inflight[digest]
        return result

    async def _call(self, key: tuple[Any, ...], f: Fetch, path: str, form: Pairs,
                    timeout_s: float, router: Router | None = None) -> QueryResult:
        storable = [u for u in f.units if u.storable] if self.cache_enabled else []
        baselines = await self._baselines(storable, timeout_s) if storable else {}
        fetched_at = wall_ms()
        if fetch_log.isEnabledFor(logging.DEBUG):
            fetch_log.debug("fetch %s start_ms=%s end_ms=%s step_ms=%s time_ms=%s units=%d query=%s",
                           path, f.start_ms, f.end_ms, f.step_ms, f.time_ms, len(f.units), f.query)
        result = await self._answer(f, path, form, timeout_s, router)
        keyed = [u for u in f.units if u.key is not None]
        parts = self._cut(f, keyed, result)
        for u, part in zip(keyed, parts or ()):
            assert u.key is not None
            fut = self._inflight.get(u.key.digest)
            if fut is not None and not fut.done():
                fut.set_result(part)
        if parts is None:
            raise PromError("internal", f"a range query answered with a {result.result_type}")
        if storable and not result.warnings:
            by_digest = {u.key.digest: part for u, part in zip(keyed, parts) if u.key is not None}
            self._keep(storable, [by_digest[u.key.digest] for u in storable if u.key is not None],
                       fetched_at, baselines)
            if len(storable) == len(f.units):
                self._remember_call(key, (result, fetched_at, baselines), fetched_at)
        return result

    async def _ask(self, backend: Backend, path: str, form: Pairs, timeout_s: float) -> QueryResult:
        """One backend call, decoded; a backend error answer raises PieceFailed. AMP bills by
        samples processed: its calls carry `stats=all`, and the count is kept per backend in
        /metrics and per answer in the X-Promaccel-Samples-Processed header."""
        amp = backend.cfg.kind == "amp" and not any(k == "stats" for k, _ in form)
        if amp:
            form = [*form, ("stats", "all")]
        budget = CALL_BUDGET.get()
        if budget is not None:
            budget.charge()  # every call counts, retries of a route's parts included
        reply = await backend.request("POST", path, form=form, timeout_s=timeout_s, limited=True, endpoint=path)
        if _needs_range_form(backend, path, reply):
            return await self._ask_range_form(backend, form, timeout_s)
        if not reply.ok:
            raise PieceFailed(reply)
        if amp:
            m = _SAMPLES.search(reply.body, max(0, len(reply.body) - 4096))
            if m is not None:
                n = int(m.group(1))
                METRICS.samples_processed.labels(backend.name).inc(n)
                tally = SAMPLES_TALLY.get()
                if tally is not None:
                    tally[0] += n
        try:
            return decode_prometheus_json(reply.body)
        except Undecodable:
            raise
        except CodecError as exc:
            raise PromError("internal", f"could not decode a backend answer: {exc}") from exc

    async def _ask_range_form(self, backend: Backend, form: Pairs, timeout_s: float) -> QueryResult:
        """AMP refuses instant queries that read 32 days or more ("only supported for range
        type queries"): ask the same query as a range query over the single step `time`,
        whose answer at that step is the instant query's."""
        t = next(v for k, v in form if k == "time")
        query = next(v for k, v in form if k == "query")
        ranged = [(k, v) for k, v in form if k != "time"] + [("start", t), ("end", t), ("step", "60")]
        METRICS.planned.labels("amp_range_form", "").inc()
        result = await self._ask(backend, "/api/v1/query_range", ranged, timeout_s)
        return _instant_of(result, query, int(round(float(t) * 1000)))

    async def _answer(self, f: Fetch, path: str, form: Pairs, timeout_s: float,
                      router: Router | None) -> QueryResult:
        """A fetch's answer from the backend(s) of its route: one call, or one per time part
        and backend, overlap parts merged (`proxy/overlap.py`) and time parts concatenated."""
        if router is None or not f.route:
            return await self._ask(self.primary, path, form, timeout_s)
        route = router.routes[f.route]
        if route.kind == "single":
            try:
                return await self._ask(self.by_name[route.backend], path, form, timeout_s)
            except (PieceFailed, PromError) as exc:
                why = _unavailable(exc)
                if why is None or not router.partial_ok:
                    raise
                # Other backends answer the rest of the request: say plainly what is missing
                # (an answer with a warning is never cached).
                METRICS.backend_missing.labels(route.backend).inc()
                lo = f.start_ms if f.start_ms is not None else f.time_ms
                hi = f.end_ms if f.end_ms is not None else f.time_ms
                return QueryResult.empty("matrix" if f.step_ms is not None else "vector", warnings=[
                    f"promaccel: backend {route.backend!r} did not answer ({why}); the data from "
                    f"{_seconds(lo or 0)} to {_seconds(hi or 0)} is missing"])
        if route.kind != "split_time":
            lo = f.start_ms if f.start_ms is not None else f.time_ms
            hi = f.end_ms if f.end_ms is not None else f.time_ms
            assert lo is not None and hi is not None
            return await self._ask_part(TimePart(lo, hi, route.backends), path, form, timeout_s, router, f.step_ms)
        outcomes = await asyncio.gather(
            *(self._ask_part(p, path, form, timeout_s, router, f.step_ms) for p in route.parts),
            return_exceptions=True,
        )
        answered, failed = _survivors(zip(route.parts, outcomes))
        results = [r for _, r in answered]
        missing: list[str] = []
        for part, why, _ in failed:
            # The only holders of this part are down: the rest of the answer still comes,
            # with a warning saying plainly what is missing (and it is never cached).
            for name in part.backends:
                METRICS.backend_missing.labels(name).inc()
            missing.append(f"promaccel: backend {'+'.join(map(repr, part.backends))} did not answer ({why}); "
                           f"the data from {_seconds(part.start_ms)} to {_seconds(part.end_ms)} is missing")
        if not results:
            raise failed[0][2]
        merged = results[0] if len(results) == 1 else concat(results)
        if missing:
            merged.warnings = [*merged.warnings, *missing]
        return merged

    async def _ask_part(self, part: TimePart, path: str, form: Pairs, timeout_s: float,
                        router: Router, step_ms: int | None) -> QueryResult:
        lo, hi = part.start_ms, part.end_ms
        ranged = path.endswith("/query_range") and step_ms is not None
        if ranged and len(part.backends) > 1:
            # The overlap merge sees a backend's gaps by their missing steps: look one edge
            # beyond the part on each side (same grid), so a gap that starts just outside
            # it is seen too; the answer is cropped back to the part.
            assert step_ms is not None
            pad = -(-router.edge_ms // step_ms) * step_ms
            if (hi - lo + 2 * pad) // step_ms <= self.config.limits.max_points - 1:
                lo, hi = lo - pad, hi + pad
        if ranged:
            form = [(k, _seconds(lo) if k == "start" else _seconds(hi) if k == "end" else v) for k, v in form]
        if len(part.backends) == 1:
            return await self._ask(self.by_name[part.backend], path, form, timeout_s)
        instant_at: int | None = None
        original = (path, form)
        if not ranged and _probe_instant(form):
            # An instant has no neighbouring steps, so a backend's outage next to it cannot
            # be seen: ask for the range [t - edge, t + edge] instead (its value at t is the
            # instant query's) and keep t.
            instant_at = part.start_ms
            pad = -(-router.edge_ms // OVERLAP_PROBE_STEP_MS) * OVERLAP_PROBE_STEP_MS
            path = "/api/v1/query_range"
            form = [(k, v) for k, v in form if k != "time"] + [
                ("start", _seconds(instant_at - pad)), ("end", _seconds(instant_at + pad)),
                ("step", _seconds(OVERLAP_PROBE_STEP_MS))]
        def ask_each(path: str, form: Pairs) -> Any:
            return asyncio.gather(*(self._ask(self.by_name[name], path, form, timeout_s) for name in part.backends),
                                  return_exceptions=True)

        outcomes = await ask_each(path, form)
        if instant_at is not None and any(isinstance(o, PieceFailed) and _unavailable(o) is None
                                          for o in outcomes):
            # The range failed where the instant may not (e.g. duplicate series at an
            # earlier step of a join): ask the instant itself.
            instant_at = None
            outcomes = await ask_each(*original)
        answered, failed = _survivors(zip(part.backends, outcomes))
        answers = [r for _, r in answered]
        warnings: list[str] = []
        for name, why, _ in failed:
            warnings.append(missing_warning(name, why))
            METRICS.backend_missing.labels(name).inc()
        if not answers:
            raise failed[0][2]
        from .overlap import merge_overlap

        merged = merge_overlap(answers, edge_ms=router.edge_ms)
        if instant_at is not None:
            at = slice_time(merged, instant_at, instant_at)
            merged = QueryResult("vector", at.labels, at.offsets, at.t_ms, at.value, at.warnings, at.infos)
        elif (lo, hi) != (part.start_ms, part.end_ms):
            merged = slice_time(merged, part.start_ms, part.end_ms)
        if merged.result_type == "vector":
            merged = _in_answer_order(merged, answers)
        if warnings:
            merged.warnings = [*merged.warnings, *warnings]
        return merged

    @staticmethod
    def _cut(f: Fetch, units: Sequence[Unit], result: QueryResult) -> list[QueryResult] | None:
        """A fetched answer cut into `units` (units of `f`, in time order); None if it cannot
        be cut (a range call that did not answer with a matrix)."""
        if f.step_ms is None:
            return [result for _ in units]
        if result.result_type != "matrix":
            return None
        if f.instants:
            parts = split_time(result, [(u.time_ms or 0, u.time_ms or 0) for u in units])
            return [_instant_of(part, f.query, u.time_ms or 0) for u, part in zip(units, parts)]
        if len(units) == 1 and (units[0].start_ms, units[0].end_ms) == (f.start_ms, f.end_ms):
            return [result]
        return split_time(result, [(u.start_ms or 0, u.end_ms or 0) for u in units])

    def _store_fetch(self, f: Fetch, units: Sequence[Unit], result: QueryResult, fetched_at: int,
                     baselines: Mapping[tuple[str, int], bytes]) -> None:
        """Keep `units` (storable units of `f`, in time order) cut from a fetched answer."""
        parts = self._cut(f, units, result)
        if parts is not None and not result.warnings:
            self._keep(units, parts, fetched_at, baselines)

    # --- admin ----------------------------------------------------------------------------

    def _forget_fetched(self) -> None:
        # Anything fetched before now must not be served or stored any more.
        self._invalidated_at_ms = wall_ms()
        self._landing.clear()
        self._recent_calls.clear()

    async def invalidate(self, metric_names: Sequence[str] | None, start_ms: int | None,
                         end_ms: int | None) -> int:
        if not self.cache_enabled:
            raise PromError("unavailable", "the cache is disabled (cache.enabled: false)")
        self._forget_fetched()
        return await self.store().invalidate(metric_names, start_ms, end_ms)

    async def _invalidate_from_revalidation(self, metric_names: Sequence[str] | None, start_ms: int,
                                            end_ms: int) -> int:
        return await self.invalidate(metric_names, start_ms, end_ms)

    async def bump_generation(self) -> int:
        if not self.cache_enabled:
            raise PromError("unavailable", "the cache is disabled (cache.enabled: false)")
        self._forget_fetched()
        if self.revalidator is not None:
            self.revalidator.forget_all()
        return await self.store().bump_generation()

    def cache_stats(self) -> dict[str, Any]:
        if not self.cache_enabled:
            return {"enabled": False}
        out: dict[str, Any] = {"enabled": True, **self.store().stats(),
                               "landing": len(self._landing), "pending_tasks": len(self._tasks),
                               "split_interval_ms": self.settings.split_interval_ms}
        if self.revalidator is not None:
            out["revalidation"] = {"records": len(self.revalidator), **self.revalidator.stats}
        return out

    # --- explain and readiness ------------------------------------------------------------

    async def explain(self, req: QueryRequest, headers: Mapping[str, str] | None = None,
                      pairs: Pairs = ()) -> dict[str, Any]:
        plan = await self._plan(req)
        data = explain_plan(plan)
        ctx = self._context(req, pairs, headers or {}) if self.cache_enabled else None
        router = self._router(req, plan)
        if router is not None:
            whole = self._whole_route(router, req)
            data["route"] = {"kind": whole.kind, "backends": list(whole.backends),
                             "parts": [[p.start_ms, p.end_ms, list(p.backends)] for p in whole.parts],
                             "reason": whole.reason or None, "notes": list(whole.notes)}
            if whole.kind == "unroutable":
                return data
        slots = self._slots(plan, ctx, router)
        if ctx is not None:
            await self._lookup(slots)
        missing = [s.unit for s in slots if s.result is None]
        data["fetches"] = len(coalesce_units(missing, self.primary.cfg.max_parallel, self.config.limits.max_points))
        for d, s in zip(data["pieces"], slots):
            d["cache"] = s.status
            if s.unit.route:
                d["route"] = router.routes[s.unit.route].key() if router is not None else s.unit.route
            if s.unit.key is not None and s.unit.is_range and (s.unit.start_ms, s.unit.end_ms) != (
                    s.piece.start_ms, s.piece.end_ms):
                d["cache_unit"] = [s.unit.start_ms, s.unit.end_ms]
        data["cache"] = {
            "enabled": self.cache_enabled,
            "hits": sum(1 for s in slots if s.status == "hit"),
            "misses": sum(1 for s in slots if s.status == "miss"),
            "uncacheable": sum(1 for s in slots if s.status == "uncacheable"),
        }
        return data

    async def backend_ready(self, backend: Backend) -> bool:
        now = time.monotonic()
        cached = self._ready_cache.get(backend.name)
        if cached and now - cached[0] < 2.0:
            return cached[1]
        try:
            if backend.cfg.kind == "prometheus":
                reply = await backend.request("GET", "/-/ready", timeout_s=3, endpoint="ready")
            else:
                reply = await backend.request(
                    "GET", "/api/v1/query", params=[("query", "vector(1)")], timeout_s=3, endpoint="ready"
                )
            ok = reply.ok
        except PromError:
            ok = False
        self._ready_cache[backend.name] = (now, ok)
        return ok


def _fit(slot: Slot, unit_result: QueryResult) -> QueryResult:
    """A unit's answer cut to the slot's piece (a cell's answer for a partial piece)."""
    p, u = slot.piece, slot.unit
    if p.is_range and (u.start_ms, u.end_ms) != (p.start_ms, p.end_ms):
        assert p.start_ms is not None and p.end_ms is not None
        return slice_time(unit_result, p.start_ms, p.end_ms)
    return unit_result


async def _wait(fut: asyncio.Future[QueryResult]) -> QueryResult:
    # shield: a request giving up (deadline, client gone) must not cancel the shared call.
    return await asyncio.shield(fut)


def _retrieve(fut: asyncio.Future[QueryResult]) -> None:
    # Nobody may be waiting: mark a failure as seen so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


def _groups_by_samples(entries: list[_E], max_samples: int) -> list[list[_E]]:
    """Consecutive groups of entries (unit, result, ...) of at most `max_samples` samples
    each (a single larger entry is a group of its own)."""
    groups: list[list[_E]] = []
    size = 0
    for e in entries:
        n = e[1].n_samples
        if not groups or size + n > max_samples:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += n
    return groups


def _decode_payloads(payloads: Sequence[bytes]) -> list[QueryResult | Exception]:
    """Cached pieces back to results; a payload that does not decode gives its exception."""
    out: list[QueryResult | Exception] = []
    for payload in payloads:
        try:
            out.append(QueryResult.from_ipc_bytes(payload))
        except Exception as exc:  # noqa: BLE001 -- reported by the caller as a miss
            out.append(exc)
    return out


def _encode_items(entries: Sequence[tuple[Unit, QueryResult, bytes | None]], fetched_at_ms: int,
                  compression: str = "lz4") -> list[CacheItem]:
    """Arrow IPC payloads (`cache.compression`) for the store; runs in a worker thread."""
    items = []
    for u, r, _ in entries:
        fp = u.footprint
        assert u.key is not None and fp is not None
        meta = PieceMeta(fp.metrics, fp.start_ms, fp.end_ms, fetched_at_ms)
        # Small pieces are stored uncompressed: nothing to gain, and compression's fixed cost
        # doubled the encoding and decoding time of a one-series answer.
        small = r.n_samples <= COMPRESS_ABOVE_SAMPLES
        items.append(CacheItem(u.key, r.to_ipc_bytes(None if compression == "none" or small else compression),
                               u.ttl_ms, meta))
    return items


_LOCAL_AGGS = frozenset({"sum", "min", "max", "count", "group", "avg", "topk", "bottomk"})
_ABSENT_LIKE = frozenset({"absent", "absent_over_time", "scalar"})
_DECOMPOSE = _ABSENT_LIKE | {"vector"}


# Step of the range an overlap instant is asked as (`Executor._ask_part`).
OVERLAP_PROBE_STEP_MS = 60_000


def _probe_instant(form: Pairs) -> bool:
    """Can this instant overlap piece be asked as a range (its answer is an instant vector,
    and its order is not meaningful: not sort()/sort_desc())?"""
    from shardplanner.ast import Call, MatrixSel, String, Subquery, unparen

    from .binop import is_scalar_expr

    query = next((v for k, v in form if k == "query"), "")
    try:
        node = unparen(parse(query))
    except CannotParse:
        return False
    if isinstance(node, MatrixSel | Subquery | String) or is_scalar_expr(node):
        return False
    return not (isinstance(node, Call) and node.func in ("sort", "sort_desc"))


_CLOCK_FUNCS = frozenset({"time", "minute", "hour", "day_of_month", "day_of_week", "day_of_year",
                          "days_in_month", "month", "year"})


def _pinned_at(expr: Any) -> int | None:
    """T when every selector of `expr` is pinned `@ T` (one T, no subquery, no function of the
    evaluation time): then its value at any step is its value at T."""
    from shardplanner.ast import Call, Selector, Subquery, walk

    if isinstance(expr, str):
        return None
    ats: set[Any] = set()
    for n in walk(expr):
        if isinstance(n, Subquery) or (isinstance(n, Call) and n.func in _CLOCK_FUNCS and not n.args):
            return None
        if isinstance(n, Selector):
            ats.add(n.at)
    if len(ats) != 1:
        return None
    (at,) = ats
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def _restamp(value: QueryResult, req: QueryRequest) -> QueryResult:
    """An instant answer (evaluated at a pinned time) as the answer at every step of `req`."""
    grid = _grid(req)
    n = value.n_series
    if value.result_type == "scalar":
        v = float(value.value[0]) if len(value.value) else float("nan")
        if not req.is_range:
            return QueryResult.scalar(int(grid[0]), v)
        return QueryResult("matrix", [{}], np.array([0, len(grid)], dtype=np.int64), grid, np.full(len(grid), v))
    values = value.value[value.offsets[:-1]] if n else np.zeros(0)
    rtype = "matrix" if req.is_range else "vector"
    offsets = np.arange(n + 1, dtype=np.int64) * len(grid)
    out = QueryResult(rtype, list(value.labels), offsets, np.tile(grid, n), np.repeat(values, len(grid)),
                      list(value.warnings), list(value.infos))
    if rtype == "matrix" and n > 1:
        from .merge import concat as _concat

        out = _concat([out])  # Prometheus sorts range answers by labels
    return out


def _merges(route: Route) -> bool:
    """Does `route` merge several backends' answers for some step (an overlap)?"""
    return route.kind == "overlap" or any(len(p.backends) > 1 for p in route.parts)


def _absent_like(expr: Any) -> bool:
    """Does `expr` use a function whose answer is not per series (absent, scalar, vector)?
    Over merged backends those are evaluated by promaccel above the merge."""
    from shardplanner.ast import Call, walk

    if isinstance(expr, str):
        return False
    return any(isinstance(n, Call) and n.func in _DECOMPOSE for n in walk(expr))


def _grid(req: QueryRequest) -> npt.NDArray[np.int64]:
    if req.is_range:
        assert req.start_ms is not None and req.end_ms is not None and req.step_ms is not None
        return np.arange(req.start_ms, req.end_ms + 1, req.step_ms, dtype=np.int64)
    assert req.time_ms is not None
    return np.array([req.time_ms], dtype=np.int64)


def _absent_or_scalar(node: Any, inner: QueryResult, req: QueryRequest) -> QueryResult:
    """absent(v) / absent_over_time(m) (with `inner` = count_over_time(m)) / scalar(v) of a
    merged answer, as Prometheus computes them."""
    from shardplanner.ast import MatrixSel, Selector

    grid = _grid(req)
    if node.func == "scalar":
        counts = np.zeros(len(grid), dtype=np.int64)
        values = np.full(len(grid), np.nan)
        pos = np.searchsorted(grid, inner.t_ms)
        np.add.at(counts, pos, 1)
        values[pos] = inner.value  # kept only where exactly one series has a sample
        values[counts != 1] = np.nan
        if not req.is_range:
            return QueryResult.scalar(int(grid[0]), float(values[0]))
        return QueryResult("matrix", [{}], np.array([0, len(grid)], dtype=np.int64), grid, values)
    # absent: 1 at the steps where the argument has no series; labels from its selector's
    # equality matchers (a label given twice is left out), as Prometheus does.
    sel = node.args[0]
    if isinstance(sel, MatrixSel):
        sel = sel.selector
    labels: dict[str, str] = {}
    if isinstance(sel, Selector) and not sel.or_matchers:
        seen: dict[str, int] = {}
        for m in sel.matchers:
            seen[m.name] = seen.get(m.name, 0) + 1
        for m in sel.matchers:
            if m.op == "=" and m.name != "__name__" and seen[m.name] == 1 and m.value:
                labels[m.name] = m.value
    t = grid[~np.isin(grid, inner.t_ms)]
    rtype = "matrix" if req.is_range else "vector"
    if len(t) == 0:
        return QueryResult.empty(rtype)
    return QueryResult(rtype, [labels], np.array([0, len(t)], dtype=np.int64), t, np.ones(len(t)))


def _aggregate_locally(node: Any, inner: QueryResult, time_ms: int | None) -> QueryResult:
    """`op by/without (...) (inner)` on a decoded answer, with the re-aggregation kernels of
    the merge: each series is its own partial (count: ones summed; avg: sum / count)."""
    from shardplanner.plan import MergeRecipe

    if node.without:
        # `without` drops the metric name too (the kernels group by the remaining labels).
        labels = [{k: v for k, v in d.items() if k != "__name__"} for d in inner.labels]
        inner = QueryResult(inner.result_type, labels, inner.offsets, inner.t_ms, inner.value,
                            inner.warnings, inner.infos)
    ones = QueryResult(inner.result_type, inner.labels, inner.offsets, inner.t_ms,
                       np.ones_like(inner.value), inner.warnings, inner.infos)
    param = float(node.param.value) if node.param is not None else None
    recipe = MergeRecipe("aggregate", op=node.op, grouping=node.grouping or (), without=node.without, param=param)
    if node.op == "count":
        return merge([(None, ones)], replace(recipe, op="sum"), time_ms=time_ms)
    if node.op == "avg":
        return merge([("sum", inner), ("count", ones)], recipe, time_ms=time_ms)
    return merge([(None, inner)], recipe, time_ms=time_ms)


_SAMPLES = re.compile(rb'"totalQueryableSamples":\s*(\d+)')
# Samples processed by AMP for the current request (a one-element list per request).
SAMPLES_TALLY: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("samples_tally", default=None)


class _Budget:
    """One query's allowance of backend calls (limits.max_backend_calls) and of new cache
    entries (limits.max_new_cache_keys); 0 means no limit. Shared by every task of the query
    (a context variable set when the query starts)."""

    def __init__(self, max_calls: int, max_keys: int) -> None:
        self.max_calls, self.max_keys = max_calls, max_keys
        self.calls = self.keys = 0

    def check(self, more: int) -> None:
        """422 if `more` calls would go over the limit (nothing is charged)."""
        if self.max_calls and self.calls + more > self.max_calls:
            raise PromError(
                "execution",
                f"this query needs more than {self.max_calls} backend calls "
                f"({self.calls} made, {more} more planned; limits.max_backend_calls): "
                "narrow the time range or simplify the query",
            )

    def charge(self) -> None:
        self.check(1)
        self.calls += 1

    def new_key(self) -> bool:
        """Whether one more new cache entry may be written."""
        if self.max_keys and self.keys >= self.max_keys:
            return False
        self.keys += 1
        return True


CALL_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("call_budget", default=None)


_RANGE_ONLY = b"only supported for range type queries"


def _needs_range_form(backend: Backend, path: str, reply: BackendReply) -> bool:
    return (backend.cfg.kind == "amp" and path.endswith("/api/v1/query") and reply.status == 422
            and _RANGE_ONLY in reply.body)


def _instant_of(result: QueryResult, query: str, t_ms: int) -> QueryResult:
    """A one-step range answer as the instant answer at `t_ms` (scalar-typed queries give a
    scalar)."""
    from .binop import is_scalar_expr

    try:
        scalar = is_scalar_expr(parse(query))
    except CannotParse:
        scalar = False
    if scalar:
        v = float(result.value[0]) if len(result.value) else float("nan")
        return QueryResult.scalar(t_ms, v, warnings=list(result.warnings), infos=list(result.infos))
    return QueryResult("vector", result.labels, result.offsets, np.full(len(result.t_ms), t_ms, dtype=np.int64),
                       result.value, result.warnings, result.infos)


def _digest_backend(u: Unit) -> str | None:
    """The backend whose digests revalidate unit `u`: "" for the default backend, the name of
    a single-backend route; None for an overlap or a route split in time (several backends'
    data: cached without revalidation; invalidation and generations still apply)."""
    if not u.route:
        return ""
    if u.route.startswith(("overlap:", "split:")):
        return None
    return u.route.split("=", 1)[0]


def _in_answer_order(merged: QueryResult, answers: Sequence[QueryResult]) -> QueryResult:
    """An instant vector in the order the backends gave it (preferred backend's order first):
    Prometheus's order is meaningful for sort(), sort_desc() and topk()."""
    pos: dict[bytes, int] = {}
    for a in answers:
        for k in a.canonical_keys():
            pos.setdefault(k, len(pos))
    keys = merged.canonical_keys()
    order = sorted(range(len(keys)), key=lambda i: pos.get(keys[i], len(pos) + i))
    if order == list(range(len(keys))) or merged.n_samples != len(keys):
        return merged
    idx = np.asarray(order, dtype=np.int64)
    return QueryResult("vector", [merged.labels[i] for i in order], merged.offsets.copy(),
                       merged.t_ms[idx], merged.value[idx], merged.warnings, merged.infos)


def _survivors(outcomes: Any) -> tuple[list[tuple[Any, QueryResult]], list[tuple[Any, str, BaseException]]]:
    """(key, answer or exception) pairs -> the answers, and the failures that only make a
    backend's data missing (with why); any other failure (a bad query) is raised."""
    answered: list[tuple[Any, QueryResult]] = []
    failed: list[tuple[Any, str, BaseException]] = []
    for key, out in outcomes:
        if isinstance(out, QueryResult):
            answered.append((key, out))
            continue
        why = _unavailable(out)
        if why is None:
            raise out  # a bad query, an undecodable answer: as from one backend
        failed.append((key, why, out))
    return answered, failed


def _unavailable(exc: BaseException) -> str | None:
    """Why a backend's failure only makes its data missing (unreachable, timed out, 5xx,
    throttled past the retries); None for a failure every backend would give (bad query)."""
    if isinstance(exc, PieceFailed):
        status = exc.reply.status
        return f"HTTP {status}" if status >= 500 or status == 429 else None
    if isinstance(exc, PromError) and exc.kind in ("unavailable", "timeout"):
        return exc.kind
    return None


def _first(excs: Sequence[BaseException]) -> BaseException:
    # Relay the backend's verdict over our own errors, so a bad query reads like Prometheus.
    for e in excs:
        if isinstance(e, PieceFailed):
            return e
    return excs[0]
