"""Hybrid fleets: which backends hold what each piece reads, decided per request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shardplanner.analysis import absent_like, edge_ms, pinned_at
from shardplanner.holdings import BackendHolding
from shardplanner.plan import Plan, QueryRequest
from shardplanner.routing import Route as PieceRoute

from ...backends import Backend
from ...errors import PromError
from ...primitives.clock import wall_ms
from ..stage import Stage
from ..values import UNMERGEABLE_PARAMS, Answer, Query
from .router import Router, holdings_of


def router_for(backends: Sequence[Backend], req: QueryRequest, plan: Plan,
               extra: Sequence[BackendHolding] = ()) -> Router:
    """Per-request routing state, over the plan's pinned tree (the query text if unparsed);
    `extra`: holdings added for this request (names no store has, see CrossStore)."""
    query = plan.expr if plan.expr is not None else req.query
    return Router((*holdings_of(backends, wall_ms()), *extra), query, req.lookback_ms,
                  {b.name: b.cfg.ident for b in backends}, by_piece=plan.merge.combine_time,
                  edge_ms=edge_ms(plan.expr, req.lookback_ms), extra=tuple(extra))


def whole_route(router: Router, req: QueryRequest) -> PieceRoute:
    span = req.span
    if span.is_range:
        return router.range_route(span.start_ms, span.end_ms, span.step)
    return router.instant_route(span.time_ms)


def merges(route: PieceRoute) -> bool:
    """Does `route` merge several backends' answers for some step (an overlap)?"""
    return route.kind == "overlap" or any(len(p.backends) > 1 for p in route.parts)


def goes_cross_store(whole: PieceRoute, expr: Any) -> bool:
    """Is a query routed `whole` evaluated by CrossStore: no single backend answers it, or its
    answer is not per series over merged backends (absent(), scalar(), an `@`-pinned one)?"""
    return whole.kind == "unroutable" or (merges(whole) and expr is not None and (
        absent_like(expr) or pinned_at(expr) is not None))


def check_mergeable(q: Query, whole: PieceRoute) -> None:
    """A query whose parameters make its answer unmergeable (stats) needs one backend."""
    if whole.kind != "single" and q.unmergeable:
        raise PromError("execution", f"{', '.join(sorted(k for k, _ in q.pairs if k in UNMERGEABLE_PARAMS))} "
                        f"cannot be answered for a query that needs several backends ({whole.key()})")


class Route:
    """Stage (hybrid fleets only): route the query; a query no single backend answers, or one
    whose answer is not per series over merged backends, branches to cross-store evaluation."""

    def __init__(self, backends: Sequence[Backend], next: Stage[Query, Answer],
                 cross_store: Stage[Query, Answer]) -> None:
        self.backends = backends
        self.hybrid = len(backends) > 1 or any(b.cfg.holds is not None for b in backends)
        self.next = next
        self.cross_store = cross_store

    async def __call__(self, q: Query) -> Answer:
        if not self.hybrid:
            return await self.next(q)
        plan = q.plan
        assert plan is not None
        router = router_for(self.backends, q.req, plan)
        whole = whole_route(router, q.req)
        # The request spans several backends: one that is down costs its part of the answer
        # (with a warning), not the whole answer.
        router = router.spanning(whole.kind != "single")
        expr = plan.expr
        q = replace(q, router=router, whole=whole)
        explain = q.ctx.explain
        if explain is not None:
            explain.routed(router, whole, plan, q.req)
        if goes_cross_store(whole, expr):
            return await self.cross_store(q)
        try:
            check_mergeable(q, whole)
        except PromError as exc:
            if explain is None:
                raise
            explain.unroutable(exc.message)
            return Answer()
        return await self.next(q)
