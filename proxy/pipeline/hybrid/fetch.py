"""A fetch's answer from the backend(s) of the route it carries: one backend, several backends
that each hold the same times (answers merged, `proxy/result/overlap.py`), or parts split in
time (concatenated). A backend that is down costs its part of the answer, with a warning saying
what is missing (never cached, `warnings.py`), when the rest of the answer can come from others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from shardplanner.analysis import probe_as_range
from shardplanner.ast import Agg, Call, Paren
from shardplanner.plan import MergeRecipe
from shardplanner.promql import CannotParse, parse
from shardplanner.routing import TimePart

from ...backends import Backend
from ...config import Config
from ...errors import PromError
from ...observe.metrics import METRICS
from ...result import QueryResult
from ...result.merge import concat, merge
from ...result.overlap import merge_overlap
from ...result.pieces import slice_time
from ..ask import Asker, seconds
from ..context import RequestContext
from ..units import Fetch
from ..values import Pairs, PieceFailed
from .router import Router
from .warnings import OVERLAP_LOST, lost_between, missing_warning, unavailable

# Step of the range an overlap instant is asked as.
OVERLAP_PROBE_STEP_MS = 60_000


def _probe_instant(form: Pairs) -> bool:
    query = next((v for k, v in form if k == "query"), "")
    try:
        return probe_as_range(parse(query))
    except CannotParse:
        return False


def _value_order(form: Pairs) -> MergeRecipe | None:
    """Prometheus orders an instant sort()/sort_desc()/topk()/bottomk() by value (per group;
    sort as a bottomk of one group, sort_desc as a topk): the concat recipe that restores it."""
    try:
        expr: Any = parse(next((v for k, v in form if k == "query"), ""))
    except CannotParse:
        return None
    while isinstance(expr, Paren):
        expr = expr.expr
    if isinstance(expr, Call) and expr.func in ("sort", "sort_desc"):
        return MergeRecipe(kind="concat", op="bottomk" if expr.func == "sort" else "topk")
    if isinstance(expr, Agg) and expr.op in ("topk", "bottomk"):
        op: Literal["topk", "bottomk"] = "topk" if expr.op == "topk" else "bottomk"
        return MergeRecipe(kind="concat", op=op, grouping=tuple(expr.grouping or ()), without=expr.without)
    return None


class RouteAnswer:
    def __init__(self, config: Config, backends: Sequence[Backend], ask: Asker) -> None:
        self.config = config
        self.primary = backends[0]
        self.by_name = {b.name: b for b in backends}
        self.ask = ask

    async def answer(self, f: Fetch, path: str, form: Pairs, timeout_s: float,
                     router: Router | None, ctx: RequestContext) -> QueryResult:
        """A fetch's answer from the backend(s) of its route: one call, or one per time part
        and backend, overlap parts merged (`proxy/overlap.py`) and time parts concatenated;
        every call made for the query of `ctx`."""
        if router is None or not f.route:
            return await self._ask(self.primary, path, form, timeout_s, ctx)
        # Decided by the router when the fetch's units were made (`SlotMaker`), carried along.
        route = f.routed
        assert route is not None, f"a fetch routed {f.route!r} carries no route"
        if route.kind == "single":
            try:
                return await self._ask(self.by_name[route.backend], path, form, timeout_s, ctx)
            except (PieceFailed, PromError) as exc:
                why = unavailable(exc)
                if why is None or not router.partial_ok:
                    raise
                # Other backends answer the rest of the request: say plainly what is missing
                # (an answer with a warning is never cached).
                METRICS.backend_missing.labels(route.backend).inc()
                lo, hi = f.span.start_ms, f.span.end_ms
                return QueryResult.empty("matrix" if f.span.is_range else "vector", warnings=[
                    missing_warning(route.backends, why, lost_between(lo or 0, hi or 0))])
        if route.kind != "split_time":
            lo, hi = f.span.start_ms, f.span.end_ms
            return await self._ask_part(TimePart(lo, hi, route.backends), path, form, timeout_s, router, f.step_ms,
                                        ctx)
        outcomes = await asyncio.gather(
            *(self._ask_part(p, path, form, timeout_s, router, f.step_ms, ctx) for p in route.parts),
            return_exceptions=True,
        )
        answered, failed = survivors(zip(route.parts, outcomes))
        results = [r for _, r in answered]
        missing: list[str] = []
        for part, why, _ in failed:
            # The only holders of this part are down: the rest of the answer still comes,
            # with a warning saying plainly what is missing (and it is never cached).
            for name in part.backends:
                METRICS.backend_missing.labels(name).inc()
            missing.append(missing_warning(part.backends, why, lost_between(part.start_ms, part.end_ms)))
        if not results:
            raise failed[0][2]
        merged = results[0] if len(results) == 1 else concat(results)
        if missing:
            merged.warnings = [*merged.warnings, *missing]
        return merged

    async def _ask(self, backend: Backend, path: str, form: Pairs, timeout_s: float,
                   ctx: RequestContext) -> QueryResult:
        """One backend's decoded answer; a range query's must be a matrix (Prometheus answers
        every query_range with one): a vector or scalar is garbage from that backend, refused
        as a 502 naming it -- as `Asker.sound` refuses a garbled body -- not cut or merged
        into a 500 (fetch.py's cut, result/pieces.py's slice_time)."""
        result = await self.ask(backend, path, form, timeout_s, ctx)
        if path.endswith("/query_range") and result.result_type != "matrix":
            raise PromError("unavailable", f"backend {backend.name!r} answered {path} with a {result.result_type}, "
                            "not a matrix", status=502)
        return result

    async def _ask_part(self, part: TimePart, path: str, form: Pairs, timeout_s: float,
                        router: Router, step_ms: int | None, ctx: RequestContext) -> QueryResult:
        lo, hi = part.start_ms, part.end_ms
        ranged = path.endswith("/query_range") and step_ms is not None
        if ranged and len(part.backends) > 1:
            # The overlap merge sees a backend's gaps by their missing steps: look one edge
            # beyond the part on each side (same grid), so a gap that starts just outside
            # it is seen too; the answer is cropped back to the part.
            assert step_ms is not None
            pad = -(-router.edge // step_ms) * step_ms
            if (hi - lo + 2 * pad) // step_ms <= self.config.limits.max_points - 1:
                lo, hi = lo - pad, hi + pad
        if ranged:
            form = [(k, seconds(lo) if k == "start" else seconds(hi) if k == "end" else v) for k, v in form]
        if len(part.backends) == 1:
            return await self._ask(self.by_name[part.backend], path, form, timeout_s, ctx)
        instant_at: int | None = None
        original = (path, form)
        if not ranged and _probe_instant(form):
            # An instant has no neighbouring steps, so a backend's outage next to it cannot
            # be seen: ask for the range [t - edge, t + edge] instead (its value at t is the
            # instant query's) and keep t.
            instant_at = part.start_ms
            pad = -(-router.edge // OVERLAP_PROBE_STEP_MS) * OVERLAP_PROBE_STEP_MS
            path = "/api/v1/query_range"
            form = [(k, v) for k, v in form if k != "time"] + [
                ("start", seconds(instant_at - pad)), ("end", seconds(instant_at + pad)),
                ("step", seconds(OVERLAP_PROBE_STEP_MS))]
        def ask_each(path: str, form: Pairs) -> Any:
            return asyncio.gather(*(self._ask(self.by_name[name], path, form, timeout_s, ctx) for name in part.backends),
                                  return_exceptions=True)

        outcomes = await ask_each(path, form)
        if instant_at is not None and any(isinstance(o, PieceFailed) and unavailable(o) is None
                                          for o in outcomes):
            # The range failed where the instant may not (e.g. duplicate series at an
            # earlier step of a join): ask the instant itself.
            instant_at = None
            outcomes = await ask_each(*original)
        answered, failed = survivors(zip(part.backends, outcomes))
        answers = [r for _, r in answered]
        warnings: list[str] = []
        for name, why, _ in failed:
            warnings.append(missing_warning((name,), why, OVERLAP_LOST))
            METRICS.backend_missing.labels(name).inc()
        if not answers:
            raise failed[0][2]
        merged = merge_overlap(answers, edge_ms=router.edge)
        if instant_at is not None:
            at = slice_time(merged, instant_at, instant_at)
            merged = QueryResult("vector", at.labels, at.offsets, at.t_ms, at.value, at.warnings, at.infos)
        elif (lo, hi) != (part.start_ms, part.end_ms):
            merged = slice_time(merged, part.start_ms, part.end_ms)
        if merged.result_type == "vector":
            merged = in_answer_order(merged, answers)
            recipe = _value_order(original[1]) if instant_at is not None else None
            if recipe is not None:  # asked as a range: the answers' order is by labels
                merged = merge([(None, merged)], recipe)
        if warnings:
            merged.warnings = [*merged.warnings, *warnings]
        return merged


def survivors(outcomes: Any) -> tuple[list[tuple[Any, QueryResult]], list[tuple[Any, str, BaseException]]]:
    """(key, answer or exception) pairs -> the answers, and the failures that only make a
    backend's data missing (with why); any other failure (a bad query) is raised."""
    answered: list[tuple[Any, QueryResult]] = []
    failed: list[tuple[Any, str, BaseException]] = []
    for key, out in outcomes:
        if isinstance(out, QueryResult):
            answered.append((key, out))
            continue
        why = unavailable(out)
        if why is None:
            raise out  # a bad query, an undecodable answer: as from one backend
        failed.append((key, why, out))
    return answered, failed


def in_answer_order(merged: QueryResult, answers: Sequence[QueryResult]) -> QueryResult:
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
