"""Planning: shard-label values, planner settings from the config, and the Plan stage.

The planner reads regexes in the primary backend's dialect (`shardplanner.promql.Dialect`,
the Go version of its buildinfo, `backend_facts.py`). A query whose text could read
differently in another dialect (`dialect_matters`: it holds `(?<` or an escape) waits, once
per backend, for that fact to be learnt (one shared call of a few hundred bytes, under
FACT_TIMEOUT_S; every later query finds it known): the first such query is planned in the
backend's dialect, never in a guess. Until it is known, or when it cannot be learnt, the
dialect is Go 1.19's (Prometheus 2.42), the conservative reading: a regex only a newer Go
reads is then left to the backend, whose own answer stands."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

import orjson

from shardplanner.answer_size import answer_bytes
from shardplanner.explain import reason_code
from shardplanner.plan import Plan as QueryPlan
from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.planner import metrics_to_count, samples_limit_message
from shardplanner.planner import plan as make_plan
from shardplanner.promql import dialect_matters
from shardplanner.timesplit import DAY_MS

from ..backends import Backend
from ..backends.tenancy import NO_TENANT, Caller, Tenant
from ..config import Config
from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from .backend_facts import BackendFacts
from .discovery import Discovered
from .series_counts import SeriesCounts
from .stage import Stage
from .values import PLANNED_PARAMS, UNKEYED_PARAMS, Answer, CacheCtx, Query

log = logging.getLogger("promaccel.plan")


def planner_settings(config: Config) -> PlannerSettings:
    pc, cc = config.planner, config.cache
    auto_shards = pc.shards == "auto"  # then max_parallel is the cap (planner formula)
    split = pc.split_interval
    if "split_interval" not in pc.model_fields_set and cc.enabled:
        # The cache only helps a range query that is cut on epoch-aligned boundaries.
        split = cc.split_interval
    return PlannerSettings(
        split_interval_ms=split,
        shards=pc.max_parallel if auto_shards else int(pc.shards),
        auto_shards=auto_shards,
        max_samples_per_piece=pc.max_samples_per_piece,
        series_per_node=pc.series_per_node,
        scrape_interval_ms=pc.scrape_interval,
        shard_labels=tuple(pc.shard_labels.items()),
        min_range_to_split_ms=pc.min_range_to_split,
        max_pieces=pc.max_pieces,
        split_instant_windows=pc.split_instant_windows,
        closed_range_windows=pc.range_windows == "closed",
        max_points=config.limits.max_points,
    )


class ShardValues:
    """Shard-label values discovered through /api/v1/label/<name>/values, cached with a TTL
    (`discovery.Discovered`, keyed by tenant scope and label).

    Stale values are still a correct partition (the last shard is the complement of the
    listed values), so a refresh happens in the background and never blocks a query once
    values are known. Values are kept per tenant scope (proxy/backends/tenancy.py): discovery runs
    with the requesting tenant's forwarded headers (a refresh task inherits them), so one
    tenant's label values never shape (or show up in the explain output of) another's
    queries; at most MAX_ENTRIES (scope, label) pairs are kept, oldest dropped first."""

    MAX_ENTRIES = 4096
    # A discovery that failed is not tried again for this long: every query of a sick backend
    # would otherwise add a discovery (and its retries) to its own call.
    RETRY_AFTER_FAILURE_S = 30.0

    def __init__(self, backend: Backend, ttl_ms: int) -> None:
        self.backend = backend
        self.ttl_s = ttl_ms / 1000
        self.values: Discovered[tuple[Tenant, str], tuple[str, ...]] = Discovered(
            "shard_values", self._fetch, ttl_ms, max_entries=self.MAX_ENTRIES,
            retry_after_failure_s=self.RETRY_AFTER_FAILURE_S)

    async def _fetch(self, key: tuple[Tenant, str]) -> tuple[str, ...]:
        tenant, label = key  # the call carries the tenant's headers
        reply = await self.backend.request(
            "GET", f"/api/v1/label/{label}/values", timeout_s=10, endpoint="/api/v1/label/:name/values",
            caller=Caller(tenant))
        data = orjson.loads(reply.body).get("data") if reply.ok else None
        if not isinstance(data, list):
            raise PromError("unavailable", f"could not discover the values of shard label {label} "
                            f"(HTTP {reply.status})")
        return tuple(sorted(str(v) for v in data))

    async def get(self, labels: Sequence[str], tenant: Tenant = NO_TENANT) -> dict[str, tuple[str, ...]]:
        """The values of these labels that `tenant` sees, known or discovered now (a label whose
        discovery failed is left out: the planner then does not shard by it)."""
        got = await self.values.get_many((tenant, lb) for lb in labels)
        return {lb: vals for (_, lb), vals in got.items()}


class Planner:
    """Plans a request: the shard-label values it needs (discovered, cached), the pure
    planner, and limits.max_samples."""

    def __init__(self, config: Config, primary: Backend, facts: BackendFacts | None = None) -> None:
        self.config = config
        self.primary = primary
        self.facts = facts if facts is not None else BackendFacts()
        self.settings = planner_settings(config)  # with the primary's dialect once learnt
        self.shard_values = ShardValues(primary, config.planner.shard_values_ttl)
        self.series_counts = SeriesCounts(primary, config.planner.shard_values_ttl)

    async def plan(self, req: QueryRequest, tenant: Tenant = NO_TENANT) -> QueryPlan:
        """`req` planned with what `tenant` sees of the primary (its shard-label values and
        series counts)."""
        values: Mapping[str, Sequence[str]] = {}
        if dialect_matters(req.query):
            dialect = await self.facts.dialect(self.primary)
            if dialect != self.settings.dialect:  # learnt (or changed): every later plan uses it
                self.settings = replace(self.settings, dialect=dialect)
        settings = self.settings
        max_samples = self.config.limits.max_samples
        if settings.shards > 1 or max_samples:
            if settings.auto_shards or max_samples:
                # The estimate sizes shards / guards the samples: from real series counts
                # where they can be learnt (else series_per_node), asked beside the values.
                values, counts = await asyncio.gather(
                    self._shard_values(tenant),
                    self.series_counts.get(metrics_to_count(req, settings), req.span.end_ms, tenant))
                if counts:
                    settings = replace(settings, series_counts=tuple(sorted(counts.items())))
            else:
                values = await self._shard_values(tenant)
        plan = make_plan(req, settings, values, self.day_cells_until())
        refusal = samples_limit_message(plan, max_samples)  # limits.max_samples (0: off)
        if refusal is not None:
            raise PromError("execution", refusal)
        return plan

    def day_cells_until(self) -> int | None:
        """Days that end by this instant are cut as day cells (`cache.day_cells_after` before
        now, floored to a UTC day); None when off or when nothing is cached."""
        cc = self.config.cache
        if not cc.enabled or not cc.day_cells_after:
            return None
        return ((wall_ms() - cc.day_cells_after) // DAY_MS) * DAY_MS

    async def shard_values_now(self, tenant: Tenant = NO_TENANT) -> Mapping[str, Sequence[str]]:
        """The shard-label values of every configured shard label that `tenant` sees (refused
        pieces cut in shards, `refusals.py`)."""
        return await self._shard_values(tenant)

    async def _shard_values(self, tenant: Tenant) -> Mapping[str, Sequence[str]]:
        return await self.shard_values.get(sorted({label for _, label in self.settings.shard_labels}), tenant)

    async def answer_bytes(self, plan: QueryPlan, tenant: Tenant = NO_TENANT) -> int | None:
        """The answer's decoded bytes, estimated (shardplanner/answer_size.py); None: unknown."""
        return answer_bytes(plan.expr, plan.request, self.settings, await self._shard_values(tenant))

    def unsharded(self, plan: QueryPlan) -> QueryPlan:
        """The same request planned without shards (a topk tie at the k-th place)."""
        return make_plan(plan.request, replace(self.settings, shards=1), {}, plan.day_cells_until_ms)

    def cache_ctx(self, q: Query, primary: Backend) -> CacheCtx:
        extras = sorted((k, v) for k, v in q.pairs if k not in PLANNED_PARAMS and k not in UNKEYED_PARAMS)
        route = (primary.cfg.ident, *(f"{k}={v}" for k, v in extras))
        return CacheCtx(q.ctx.scope, route, wall_ms(), q.req.lookback_ms)


class Plan:
    """Stage: parse (once: cached by text), shard-label values, the plan; the cache context."""

    def __init__(self, planner: Planner, primary: Backend, cache_enabled: bool, next: Stage[Query, Answer]) -> None:
        self.planner = planner
        self.primary = primary
        self.cache_enabled = cache_enabled
        self.next = next

    async def __call__(self, q: Query) -> Answer:
        plan = await self.planner.plan(q.req, q.ctx.caller.tenant)
        if q.ctx.explain is not None:
            q.ctx.explain.planned(plan)
        else:
            METRICS.pieces.observe(len(plan.pieces))
            mode = "sharded" if plan.sharded else ("split" if plan.time_split else "whole")
            METRICS.planned.labels(mode, "" if plan.sharded else reason_code(plan.notes)).inc()
        ctx = self.planner.cache_ctx(q, self.primary) if self.cache_enabled and not q.unmergeable else None
        answer = await self.next(replace(q, plan=plan, cache=ctx))
        answer.info.update(plan_pieces=len(plan.pieces), sharded=plan.sharded, time_split=plan.time_split,
                           plan_reason=reason_code(plan.notes))
        return answer
