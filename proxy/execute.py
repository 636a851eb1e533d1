"""Query execution: plan, fan out, merge, answer.

    request -> planner (pure) -> fetch groups (coalesced pieces, per-backend semaphore,
    one deadline) -> decode (Arrow/numpy) -> merge -> encode Prometheus JSON

- When the planner leaves a query whole, the client's parameters go to the backend
  unchanged and its answer (status and bytes) is relayed untouched.
- Fetch granularity is not plan granularity: contiguous time pieces of the same shard and
  role are coalesced into about as many backend calls as the backend runs well in parallel
  (`backends[].max_parallel`), because every call pays a fixed cost (series lookup). A
  coalesced call covers exactly the union of its pieces' grid points, so the merge is
  unchanged.
- A piece that fails makes the whole answer fail (siblings cancelled): the backend's own
  error is relayed, or promaccel's timeout/unavailable error; never a partial answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from starlette.responses import Response

from shardplanner.explain import explain as explain_plan
from shardplanner.plan import Piece, Plan, PlannerSettings, QueryRequest
from shardplanner.planner import plan as make_plan

from .arrowcodec import CodecError, QueryResult, Undecodable, decode_prometheus_json, encode_arrow_stream, encode_prometheus_json
from .backend import Backend, BackendReply
from .config import Config
from .errors import PromError
from .forms import Pairs
from .merge import merge
from .metrics import METRICS
from .params import InstantParams, RangeParams
from .ties import topk_ambiguous

log = logging.getLogger("promaccel.execute")

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Parameters the plan sets per piece; everything else the client sent is passed along.
PLANNED_PARAMS = frozenset({"query", "start", "end", "step", "time"})
# Parameters whose effect on the answer the merge cannot reproduce: forward those whole.
UNMERGEABLE_PARAMS = frozenset({"stats"})


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


@dataclass(frozen=True)
class Fetch:
    """One backend call covering one or more contiguous pieces of the same query."""

    query: str
    role: str | None
    shard_index: int
    start_ms: int | None
    end_ms: int | None
    step_ms: int | None
    time_ms: int | None


class AmbiguousTies(Exception):
    """A sharded topk/bottomk whose winners are not determined by value alone."""


class PieceFailed(Exception):
    """A backend answered a piece with an error: relay that answer."""

    def __init__(self, reply: BackendReply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def coalesce(pieces: Sequence[Piece], target_calls: int) -> list[Fetch]:
    """Group contiguous time pieces (same query, shard, role) into about `target_calls`
    fetches in all; instant pieces are fetched one by one."""
    groups: dict[tuple[str, str | None, int], list[Piece]] = {}
    singles: list[Fetch] = []
    for p in pieces:
        shard_index = p.shard.index if p.shard else -1
        if not p.is_range:
            singles.append(Fetch(p.query, p.role, shard_index, None, None, None, p.time_ms))
            continue
        groups.setdefault((p.query, p.role, shard_index), []).append(p)
    fetches: list[Fetch] = list(singles)
    if not groups:
        return fetches
    per_group = max(1, target_calls // len(groups))
    for (query, role, shard_index), members in groups.items():
        members.sort(key=lambda p: p.start_ms or 0)
        # Contiguous runs on the same grid only.
        runs: list[list[Piece]] = []
        for p in members:
            if runs:
                last = runs[-1][-1]
                assert last.end_ms is not None and last.step_ms is not None
                if p.step_ms == last.step_ms and p.start_ms == last.end_ms + last.step_ms:
                    runs[-1].append(p)
                    continue
            runs.append([p])
        # Spread the group's call budget over its runs, splitting runs evenly.
        budget = max(per_group, len(runs))
        total = sum(len(r) for r in runs)
        for run in runs:
            n_calls = max(1, min(len(run), round(budget * len(run) / total)))
            size = -(-len(run) // n_calls)
            for i in range(0, len(run), size):
                chunk = run[i:i + size]
                fetches.append(Fetch(query, role, shard_index, chunk[0].start_ms, chunk[-1].end_ms,
                                     chunk[0].step_ms, None))
    return fetches


class ShardValues:
    """Shard-label values discovered through /api/v1/label/<name>/values, cached with a TTL.

    Stale values are still a correct partition (the last shard is the complement of the
    listed values), so a refresh happens in the background and never blocks a query once
    values are known."""

    def __init__(self, backend: Backend, ttl_ms: int) -> None:
        self.backend = backend
        self.ttl_s = ttl_ms / 1000
        self._values: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    async def _fetch(self, label: str) -> None:
        try:
            reply = await self.backend.request(
                "GET", f"/api/v1/label/{label}/values", timeout_s=10, endpoint="/api/v1/label/:name/values"
            )
            if reply.ok:
                import orjson

                data = orjson.loads(reply.body).get("data") or []
                self._values[label] = (time.monotonic(), tuple(sorted(str(v) for v in data)))
        except (PromError, ValueError) as exc:
            log.warning("could not discover values of shard label %s: %s", label, exc)

    async def get(self, labels: Sequence[str]) -> dict[str, tuple[str, ...]]:
        missing = [lb for lb in labels if lb not in self._values]
        if missing:
            await asyncio.gather(*(self._fetch(lb) for lb in missing))
        now = time.monotonic()
        for lb in labels:
            entry = self._values.get(lb)
            if entry and now - entry[0] > self.ttl_s and lb not in self._refreshing:
                task = asyncio.create_task(self._fetch(lb))
                self._refreshing[lb] = task
                task.add_done_callback(lambda _t, lb=lb: self._refreshing.pop(lb, None))
        return {lb: self._values[lb][1] for lb in labels if lb in self._values}


class Executor:
    def __init__(self, config: Config, backends: list[Backend]) -> None:
        self.config = config
        self.backends = backends
        self.primary = backends[0]
        self._ready_cache: dict[str, tuple[float, bool]] = {}
        pc = config.planner
        shards = pc.shards if isinstance(pc.shards, int) else 8
        self.settings = PlannerSettings(
            split_interval_ms=pc.split_interval,
            shards=shards,
            shard_labels=tuple(pc.shard_labels.items()),
            min_range_to_split_ms=pc.min_range_to_split,
            max_pieces=pc.max_pieces,
        )
        self.shard_values = ShardValues(self.primary, pc.shard_values_ttl)

    async def aclose(self) -> None:
        return None

    def _timeout_s(self, timeout_ms: int | None) -> float:
        limit = self.config.limits.query_timeout
        ms = min(timeout_ms, limit) if timeout_ms else limit
        return max(ms, 1) / 1000

    # --- planning -------------------------------------------------------------------------

    async def _plan(self, req: QueryRequest) -> Plan:
        values: Mapping[str, Sequence[str]] = {}
        if self.settings.shards > 1:
            labels = sorted({label for _, label in self.settings.shard_labels})
            values = await self.shard_values.get(labels)
        return make_plan(req, self.settings, values)

    def _forward_whole(self, plan: Plan, pairs: Pairs) -> bool:
        if any(k in UNMERGEABLE_PARAMS for k, _ in pairs):
            return True
        if len(plan.pieces) != 1 or plan.merge.kind != "passthrough":
            return False
        piece = plan.pieces[0]
        # The original bytes go out only when nothing was rewritten (query and times).
        return piece.query == plan.request.query and piece.start_ms == plan.request.start_ms \
            and piece.end_ms == plan.request.end_ms and piece.time_ms == plan.request.time_ms

    # --- endpoints ------------------------------------------------------------------------

    async def instant(self, p: InstantParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        req = QueryRequest(query=p.query, time_ms=p.time_ms)
        return await self._run(req, pairs, headers, "/api/v1/query", p.timeout_ms)

    async def range(self, p: RangeParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        req = QueryRequest(query=p.query, start_ms=p.start_ms, end_ms=p.end_ms, step_ms=p.step_ms)
        return await self._run(req, pairs, headers, "/api/v1/query_range", p.timeout_ms)

    async def _run(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str], path: str,
                   timeout_ms: int | None) -> Response:
        timeout_s = self._timeout_s(timeout_ms)
        want_arrow = ARROW_STREAM in headers.get("accept", "")
        plan = await self._plan(req)
        METRICS.pieces.observe(len(plan.pieces))
        mode = "sharded" if plan.sharded else ("split" if plan.time_split else "whole")
        METRICS.planned.labels(mode, plan.notes[0][:60] if plan.notes and not plan.sharded else "").inc()
        if self._forward_whole(plan, pairs) and not want_arrow:
            reply = await self.primary.request(
                "POST", path, form=pairs, timeout_s=timeout_s, limited=True, endpoint=path
            )
            return relay(reply, {"X-Promaccel-Pieces": "1"})
        extra = [(k, v) for k, v in pairs if k not in PLANNED_PARAMS]
        try:
            try:
                result = await self._execute(plan, extra, timeout_s)
            except AmbiguousTies:
                # Ties at the k-th place: Prometheus's pick depends on its heap over all
                # series, so run the query unsharded (time pieces are still exact).
                METRICS.planned.labels("unsharded_rerun", "topk tie at the k-th place").inc()
                plan = make_plan(plan.request, replace(self.settings, shards=1), {})
                result = await self._execute(plan, extra, timeout_s)
        except PieceFailed as failed:
            return relay(failed.reply, {"X-Promaccel-Pieces": str(len(plan.pieces))})
        except Undecodable:
            # Native histograms and other shapes the merge does not model: forward whole.
            reply = await self.primary.request(
                "POST", path, form=pairs, timeout_s=timeout_s, limited=True, endpoint=path
            )
            return relay(reply, {"X-Promaccel-Pieces": "1"})
        out_headers = {"X-Promaccel-Pieces": str(len(plan.pieces))}
        if want_arrow:
            return Response(encode_arrow_stream(result), media_type=ARROW_STREAM, headers=out_headers)
        return Response(encode_prometheus_json(result), media_type=JSON, headers=out_headers)

    async def _execute(self, plan: Plan, extra: Pairs, timeout_s: float) -> QueryResult:
        fetches = coalesce(plan.pieces, self.primary.cfg.max_parallel)
        try:
            async with asyncio.timeout(timeout_s):
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self._fetch(f, extra, timeout_s)) for f in fetches]
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
        results = [(f.role, t.result()) for f, t in zip(fetches, tasks)]
        if plan.sharded and plan.merge.op in ("topk", "bottomk") and topk_ambiguous(
            [(f.shard_index, r) for f, (_, r) in zip(fetches, results)], plan.merge
        ):
            raise AmbiguousTies()
        # Deterministic merge order: shard index, then role, then time.
        order = sorted(range(len(fetches)), key=lambda i: (
            fetches[i].shard_index, fetches[i].role or "", fetches[i].start_ms or fetches[i].time_ms or 0))
        time_ms = plan.request.time_ms
        return merge([results[i] for i in order], plan.merge, time_ms=time_ms)

    async def _fetch(self, f: Fetch, extra: Pairs, timeout_s: float) -> QueryResult:
        if f.step_ms is not None:
            assert f.start_ms is not None and f.end_ms is not None
            path = "/api/v1/query_range"
            form = [("query", f.query), ("start", _seconds(f.start_ms)), ("end", _seconds(f.end_ms)),
                    ("step", _seconds(f.step_ms)), *extra]
        else:
            assert f.time_ms is not None
            path = "/api/v1/query"
            form = [("query", f.query), ("time", _seconds(f.time_ms)), *extra]
        reply = await self.primary.request(
            "POST", path, form=form, timeout_s=timeout_s, limited=True, endpoint=path
        )
        if not reply.ok:
            raise PieceFailed(reply)
        try:
            return decode_prometheus_json(reply.body)
        except Undecodable:
            raise
        except CodecError as exc:
            raise PromError("internal", f"could not decode a backend answer: {exc}") from exc

    # --- explain and readiness ------------------------------------------------------------

    async def explain(self, req: QueryRequest) -> dict[str, Any]:
        plan = await self._plan(req)
        data = explain_plan(plan)
        data["fetches"] = len(coalesce(plan.pieces, self.primary.cfg.max_parallel))
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


def _first(excs: Sequence[BaseException]) -> BaseException:
    # Relay the backend's verdict over our own errors, so a bad query reads like Prometheus.
    for e in excs:
        if isinstance(e, PieceFailed):
            return e
    return excs[0]
