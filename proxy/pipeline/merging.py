"""The top of the planned path: the merge of the pieces, and what a failed piece becomes."""

from __future__ import annotations

from dataclasses import replace

from ..codec.errors import Undecodable
from ..errors import PromError
from ..observe.metrics import METRICS
from ..result.merge import merge
from ..result.ties import topk_ambiguous
from .lookup import Pieces
from .planning import Planner
from .stage import Stage
from .values import AmbiguousTies, Answer, PieceFailed, Query


class Fallback:
    """Stage: a piece's backend error is the answer (relayed as the backend gave it); an
    answer the merge cannot model (native histograms) is the whole query's, asked of one
    backend by `relay` (the leaf that relays: forward.py)."""

    def __init__(self, relay: Stage[Query, Answer], next: Stage[Query, Answer]) -> None:
        self.relay = relay
        self.next = next

    async def __call__(self, q: Query) -> Answer:
        assert q.plan is not None
        try:
            return await self.next(q)
        except PieceFailed as failed:
            return Answer(reply=failed.reply, headers={"X-Promaccel-Pieces": str(len(q.plan.pieces))})
        except Undecodable:
            if q.whole is not None and q.whole.kind != "single":
                raise PromError("execution", "this answer's shape (e.g. native histograms) cannot be merged "
                                f"across backends ({q.whole.key()})") from None
            return await self.relay(q)


class Merge:
    """Stage: concat / re-aggregate the pieces in one deterministic order; a sharded topk
    tied at the k-th place is run again unsharded (Prometheus's pick depends on its heap over
    all series, which no sharded plan can replay; time pieces are still exact)."""

    def __init__(self, planner: Planner, next: Stage[Query, Pieces]) -> None:
        self.planner = planner
        self.next = next

    async def __call__(self, q: Query) -> Answer:
        if q.ctx.explain is not None:  # nothing was fetched: nothing to merge
            await self.next(q)
            return Answer()
        try:
            return await self._merged(q)
        except AmbiguousTies:
            assert q.plan is not None
            METRICS.planned.labels("unsharded_rerun", "topk_tie").inc()
            return await self._merged(replace(q, plan=self.planner.unsharded(q.plan)))

    async def _merged(self, q: Query) -> Answer:
        plan = q.plan
        assert plan is not None
        pieces = await self.next(q)
        headers = {"X-Promaccel-Pieces": str(len(plan.pieces)), "X-Cache": pieces.status}
        if pieces.encoded is not None:
            return Answer(encoded=pieces.encoded, headers=headers)
        segments, ticket = pieces.segments, pieces.ticket
        del pieces  # the segments go once merged (a lazy merge keeps what it reads)
        if plan.sharded and plan.merge.kind == "aggregate" and plan.merge.op in ("topk", "bottomk") and topk_ambiguous(
                [(shard, r) for _, shard, _, r in segments], plan.merge):
            raise AmbiguousTies()
        # Deterministic merge order: shard index, then role, then time. A large answer of
        # time pieces stays in its pieces (lazy): the response streams it from them, so it
        # is never held twice (pieces + merged copy).
        merged = merge([(role, r) for _, _, role, r in segments], plan.merge, time_ms=plan.request.time_ms,
                       lazy=True)
        del segments
        return Answer(result=merged, headers=headers, arrow=q.want_arrow, ticket=ticket)
