"""Cross-store evaluation: a query no single backend can answer (a join of metrics that live in
different stores). The largest subtrees one backend can answer run as queries of their own
(planned, cached, sharded like any query), and promaccel evaluates the binary operators and
aggregations above them on the decoded answers. Anything else above them is a 422 naming the
metrics, the backends and the operator -- never a guess."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from shardplanner.analysis import ABSENT_LIKE, absent_like, pinned_at
from shardplanner.ast import Agg, Binary, Call, Number, Paren, Selector, transform
from shardplanner.explain import reason_code
from shardplanner.plan import MergeRecipe, Plan, QueryRequest
from shardplanner.routing import Route as PieceRoute
from shardplanner.serialize import to_promql

from ..backends import Backend
from ..errors import PromError
from ..hybrid import Router
from ..metrics import METRICS
from ..result import QueryResult, ResultType
from ..result.binop import BinopError, evaluate_binary
from ..result.merge import concat, merge
from .ask import Asker
from .planning import Planner
from .routing import merges, router_for
from .stage import Stage
from .values import Answer, PieceFailed, Query

_LOCAL_AGGS = frozenset({"sum", "min", "max", "count", "group", "avg", "topk", "bottomk"})
_ABSENT_LIKE = ABSENT_LIKE


@dataclass(frozen=True)
class Sub:
    """A subtree one backend (or an overlap, or a time split) answers: planned, and run from
    Merge down like any query."""

    req: QueryRequest
    plan: Plan
    route: PieceRoute


@dataclass(frozen=True)
class Op:
    """An operator promaccel evaluates above its arguments: `binary`, `absent` (absent,
    absent_over_time, scalar), `aggregate`, or `pinned` (an `@`-pinned answer restamped at
    every step of `req`)."""

    kind: str
    node: Any
    args: tuple[Step, ...]
    req: QueryRequest


Step = Sub | Op | float  # float: a number literal


class CrossStore:
    """Stage: evaluate the operators above per-store subqueries.

    `tree()` decides, without running anything, which subtrees run as queries of their own and
    which operators promaccel evaluates above them (or refuses the query with the 422 it
    answers); the stage runs that tree, and /api/v1/explain shows it."""

    def __init__(self, planner: Planner, backends: Sequence[Backend], run: Stage[Query, Answer]) -> None:
        self.planner = planner
        self.backends = backends
        self.run = run  # the planned path (merge and below) for each subquery

    async def __call__(self, q: Query) -> Answer:
        assert q.plan is not None
        if q.plan.expr is None and reason_code(q.plan.notes) == "unparsable":
            # The planner cannot read the query: most often it is invalid, and Prometheus's own
            # error (400 bad_data, its exact text) is the answer. The primary is asked as the
            # client asked; if it does answer, that answer cannot be shown to hold every
            # backend's data, so the query is refused as before.
            reply, _ = await Asker().sound(self.backends[0], q.path, q.pairs, q.timeout_s)
            if not reply.ok:
                return Answer(reply=reply, headers={"X-Promaccel-Pieces": "1"})
        pieces = "0"
        try:
            async with asyncio.timeout(q.timeout_s):
                tree = await self.tree(q)
                pieces = str(piece_count(tree))
                result = await self._execute(tree, q)
        except TimeoutError:
            raise PromError("timeout", f"query timed out after {q.timeout_s:g}s") from None
        except PieceFailed as failed:
            return Answer(reply=failed.reply, headers={"X-Promaccel-Pieces": pieces})
        assert isinstance(result, QueryResult)  # tree() refuses a number at the top
        METRICS.planned.labels("cross_store", "").inc()
        return Answer(result=result, headers={"X-Promaccel-Pieces": pieces, "X-Cache": "MISS"},
                      arrow=q.want_arrow)

    async def tree(self, q: Query) -> Step:
        """The evaluation tree of `q` (routed: `q.router`, `q.whole` set); a PromError (422) for
        a query that cannot be answered exactly."""
        assert q.whole is not None and q.plan is not None and q.router is not None
        reason = q.whole.reason or "the query cannot be answered exactly across the backends' holdings"
        if q.unmergeable or q.plan.expr is None:
            raise PromError("execution", reason)
        tree = await self._tree(q.plan.expr, q.req, q.router, reason)
        if isinstance(tree, float):
            raise PromError("execution", reason)
        return tree

    async def _tree(self, node: Any, req: QueryRequest, router: Router, reason: str) -> Step:
        while isinstance(node, Paren):
            node = node.expr
        if isinstance(node, Number):
            return node.value
        span = req.span
        if span.is_range:
            r = router.range_route(span.start_ms, span.end_ms, span.step, node)
        else:
            r = router.instant_route(span.time_ms, node)
        pinned = pinned_at(node) if merges(r) else None
        if pinned is not None:
            # `sum(x @ T)` is the same at every step: `sum(x)` at T. Asked that way, the
            # overlap merge sees the backends' gaps around T (with `@` every step of its
            # probe would read the same instant).
            free = transform(node, lambda n: replace(n, at=None) if isinstance(n, Selector) else n)
            at_t = QueryRequest.instant(to_promql(free), pinned, req.lookback_ms)
            inner = await self._tree(free, at_t, router, reason)
            if not isinstance(inner, float):
                return Op("pinned", node, (inner,), req)
        if r.kind != "unroutable" and not (merges(r) and absent_like(node)):
            # A scalar-typed side (scalar(x), time()) comes back as a one-series matrix for a
            # range query; evaluate_binary knows it is a scalar from the expression.
            sub = replace(req, query=to_promql(node))
            return Sub(sub, await self.planner.plan(sub), r)
        if isinstance(node, Binary):
            lhs, rhs = await asyncio.gather(self._tree(node.lhs, req, router, reason),
                                            self._tree(node.rhs, req, router, reason))
            return Op("binary", node, (lhs, rhs), req)
        if isinstance(node, Call) and node.func in _ABSENT_LIKE and len(node.args) == 1:
            # absent()/scalar() over backends that are merged: the merge cannot see that an
            # "absent" from a backend in an outage is wrong, so the argument is merged first
            # and the function applied here, on the merged series.
            arg = node.args[0]
            inner_expr = Call("count_over_time", (arg,)) if node.func == "absent_over_time" else arg
            inner = await self._tree(inner_expr, req, router, reason)
            if not isinstance(inner, float):
                return Op("absent", node, (inner,), req)
        if isinstance(node, Agg) and node.op in _LOCAL_AGGS and (node.param is None or isinstance(node.param, Number)):
            inner = await self._tree(node.expr, req, router, reason)
            if not isinstance(inner, float):
                return Op("aggregate", node, (inner,), req)
        raise PromError("execution", reason)

    async def _execute(self, step: Step, q: Query) -> QueryResult | float:
        if isinstance(step, float):
            return step
        if isinstance(step, Sub):
            answer = await self.run(replace(q, req=step.req, plan=step.plan, whole=None,
                                            router=router_for(self.backends, step.req, step.plan)))
            assert answer.result is not None
            return answer.result
        args = await asyncio.gather(*(self._execute(a, q) for a in step.args))
        if step.kind == "binary":
            try:
                return evaluate_binary(step.node, args[0], args[1])
            except BinopError as exc:
                raise PromError("execution", exc.message) from None
        inner = args[0]
        assert isinstance(inner, QueryResult)  # tree() never puts a number under these
        if step.kind == "pinned":
            return _restamp(inner, step.req)
        if step.kind == "absent":
            return _absent_or_scalar(step.node, inner, step.req)
        return _aggregate_locally(step.node, inner, step.req.time_ms)


def piece_count(step: Step) -> int:
    """The pieces the subqueries of a tree plan (X-Promaccel-Pieces of its answer)."""
    if isinstance(step, Sub):
        return len(step.plan.pieces)
    if isinstance(step, Op):
        return sum(piece_count(a) for a in step.args)
    return 0


def subqueries(step: Step) -> list[Sub]:
    """The subtrees of a tree that run as queries of their own, left to right."""
    if isinstance(step, Sub):
        return [step]
    if isinstance(step, Op):
        return [s for a in step.args for s in subqueries(a)]
    return []


def operator_text(op: Op) -> str:
    """What promaccel evaluates at `op`, in PromQL words: `* on (Hostname) group_left ()`,
    `sum by (namespace)`, `topk(5)`, `absent`, `@ 1761955200`."""
    node = op.node
    if op.kind == "binary":
        text = str(node.op) + (" bool" if node.return_bool else "")
        m = node.matching
        if m is not None:
            text += f" {'on' if m.on else 'ignoring'} ({', '.join(m.labels)})"
            if m.group is not None:
                text += f" group_{m.group} ({', '.join(m.include)})"
        return text
    if op.kind == "aggregate":
        text = str(node.op)
        if node.grouping is not None:
            text += f" {'without' if node.without else 'by'} ({', '.join(node.grouping)})"
        return text + (f" (param {node.param.value:g})" if node.param is not None else "")
    if op.kind == "absent":
        return str(node.func)
    at = pinned_at(node)
    assert at is not None
    return f"@ {at / 1000:g}"


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
    rtype: ResultType = "matrix" if req.is_range else "vector"
    offsets = np.arange(n + 1, dtype=np.int64) * len(grid)
    out = QueryResult(rtype, list(value.labels), offsets, np.tile(grid, n), np.repeat(values, len(grid)),
                      list(value.warnings), list(value.infos))
    if rtype == "matrix" and n > 1:
        out = concat([out])  # Prometheus sorts range answers by labels
    return out


def _grid(req: QueryRequest) -> npt.NDArray[np.int64]:
    span = req.span
    return np.arange(span.start_ms, span.end_ms + 1, span.step_ms or 1, dtype=np.int64)


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
    rtype: ResultType = "matrix" if req.is_range else "vector"
    if len(t) == 0:
        return QueryResult.empty(rtype)
    return QueryResult(rtype, [labels], np.array([0, len(t)], dtype=np.int64), t, np.ones(len(t)))


def _aggregate_locally(node: Any, inner: QueryResult, time_ms: int | None) -> QueryResult:
    """`op by/without (...) (inner)` on a decoded answer, with the re-aggregation kernels of
    the merge: each series is its own partial (count: ones summed; avg: sum / count)."""
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
