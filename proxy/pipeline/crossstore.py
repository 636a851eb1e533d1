"""Cross-store evaluation: a query no single backend can answer. The largest subtrees one
backend can answer run as queries of their own (planned, cached, sharded like any query), and
promaccel evaluates what lies above them on the decoded answers. This stage DECIDES what runs
where, as the engine's typed tree (proxy/engine/nodes.py), fetches the tree's leaves, and
hands them to the engine's evaluator (proxy/engine/evaluator.py):

- a range query's steps that some backend answers whole are routed as usual; only the
  stretches of steps no single backend answers are evaluated here (SegmentsNode);
- operators, functions and aggregations above subtrees held by different stores (a join of
  AMP's DCGM_* with the local node_*): BinaryNode, CallNode, AggregateNode, AbsentNode;
- a range function whose window straddles two stores (`increase(x[6h])` where AMP stops and
  the local Prometheus starts): the window's raw samples come from each store for the
  stretch it holds (a RawWindow leaf, proxy/pipeline/raw_fetch.py) and the function is
  evaluated with Prometheus 2's semantics (WindowNode); over a subquery, its inner expression
  is asked on the subquery's own step grid (routed like any query) and the function applied
  (SubqueryNode).
Whatever cannot be answered exactly gets a 422 naming the metrics, the backends and the
operator -- never a guess."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardplanner.analysis import ABSENT_LIKE, absent_like, pinned_at
from shardplanner.ast import (
    Agg,
    Binary,
    Call,
    MatrixSel,
    Number,
    Paren,
    Selector,
    String,
    Subquery,
    Unary,
    transform,
)
from shardplanner.explain import reason_code
from shardplanner.functions import unknown_names
from shardplanner.holdings import ALL_METRICS, BackendHolding
from shardplanner.names import NO_METRIC, fixed_names, needs_names, per_series_selector, resolve_names, with_names
from shardplanner.plan import Plan, QueryRequest, Span
from shardplanner.read_windows import listed_names
from shardplanner.routing import Route as PieceRoute
from shardplanner.routing import served_segments
from shardplanner.serialize import to_promql

from ..backends import Backend
from ..backends.tenancy import Tenant
from ..engine.aggregate import AGGREGATIONS
from ..engine.evaluator import constant, evaluate_off_loop, param_args, range_arg
from ..engine.kernels import TABLE
from ..engine.local_ops import grid_of
from ..engine.nodes import (
    AbsentNode,
    AggregateNode,
    BinaryNode,
    CallNode,
    Inner,
    Leaf,
    Literal,
    Node,
    PinnedNode,
    RawWindow,
    SegmentsNode,
    SubqueryNode,
    UnionNode,
    WindowNode,
    children,
    leaves,
)
from ..engine.work import WorkBudget
from ..errors import PromError
from ..observe.metrics import METRICS
from ..result import QueryResult
from .eval_interval import EvaluationIntervals
from .explain import Explanation
from .hybrid.route import merges, router_for
from .hybrid.router import Router
from .names import MetricNames
from .planning import Planner
from .raw_fetch import RawCache, fetch_raw, window_parts
from .stage import Stage
from .values import Answer, PieceFailed, Query

_ABSENT_LIKE = ABSENT_LIKE


@dataclass(frozen=True, eq=False)
class Sub(Leaf):
    """A subtree one backend (or an overlap, or a time split) answers: planned, and run from
    Merge down like any query. A leaf of the engine's tree (proxy/engine/nodes.py)."""

    plan: Plan
    route: PieceRoute
    extra: tuple[BackendHolding, ...] = ()  # holdings of names no store has (`_resolved`)


@dataclass(frozen=True)
class Building:
    """What every step of building a query's tree needs: the reason it went across stores
    (the error when a part cannot be answered exactly) and the tenant it is planned for."""

    reason: str
    tenant: Tenant


class CrossStore:
    """Stage: evaluate the operators above per-store subqueries.

    `tree()` decides, without running anything, which subtrees run as queries of their own and
    which operators promaccel evaluates above them (or refuses the query with the 422 it
    answers); the stage runs that tree, and /api/v1/explain shows it."""

    def __init__(self, planner: Planner, backends: Sequence[Backend], run: Stage[Query, Answer],
                 max_window_samples: int = 0, raw_cache: RawCache | None = None, *,
                 relay: Stage[Query, Answer] | None = None) -> None:
        self.planner = planner
        self.names = MetricNames(backends, planner.config.planner.shard_values_ttl)
        self.backends = backends
        self.run = run  # the planned path (merge and below) for each subquery
        self.max_window_samples = max_window_samples
        self.intervals = EvaluationIntervals(planner.facts)  # one read per backend, shared with the planner
        self.raw_cache = raw_cache
        self.relay = relay  # the leaf that asks the primary a query as the client sent it

    async def __call__(self, q: Query) -> Answer:
        assert q.plan is not None
        if q.ctx.explain is not None:
            return await self._explain(q, q.ctx.explain)
        unparsable = q.plan.expr is None and reason_code(q.plan.notes) == "unparsable"
        if self.relay is not None and (unparsable or (q.plan.expr is not None and unknown_names(q.plan.expr))):
            # The planner cannot read the query, or it uses a function Prometheus 2.42 does not
            # know (a Prometheus 3 one): most often it is invalid, and Prometheus's own error
            # (400 bad_data, its exact text) is the answer. The primary is asked as the client
            # asked; if it does answer, that answer cannot be shown to hold every backend's
            # data, so the query is refused as before.
            asked = await self.relay(replace(q, whole=None, cache=None))  # the primary, nothing stored
            if asked.reply is not None and not asked.reply.ok:
                return asked
        pieces = "0"
        limits = self.planner.config.limits
        budget = WorkBudget(time.monotonic() + q.timeout_s, limits.max_eval_work, limits.max_eval_series)
        cached: list[str] = []  # X-Cache of each subquery's answer and raw window read
        try:
            async with asyncio.timeout(q.timeout_s):
                tree = await self.tree(q)
                pieces = str(piece_count(tree))
                answers, windows = await self._leaves(tree, q, cached)
                result = await evaluate_off_loop(tree, answers, windows, budget,
                                                 max_subquery_samples=self.max_window_samples)
        except TimeoutError:  # EvalCancelled too
            raise PromError("timeout", f"query timed out after {q.timeout_s:g}s") from None
        except PieceFailed as failed:
            return Answer(reply=failed.reply, headers={"X-Promaccel-Pieces": pieces})
        finally:
            budget.cancel()  # threads of branches still running stop at their next check
        assert isinstance(result, QueryResult)  # tree() refuses a number at the top
        METRICS.planned.labels("cross_store", "").inc()
        return Answer(result=result, headers={"X-Promaccel-Pieces": pieces, "X-Cache": cache_status(cached)},
                      arrow=q.want_arrow)

    async def _explain(self, q: Query, explain: Explanation) -> Answer:
        """Explain: the tree, and each subquery run through the planned path (`self.run`)
        with its own explanation; nothing is fetched, read or evaluated."""
        try:
            tree = await self.tree(q)
        except PromError as exc:
            explain.unroutable(exc.message)
            return Answer()
        described: dict[int, dict[str, Any]] = {}

        async def one(sub: Sub) -> None:
            e = Explanation(explain.cache_enabled)
            e.planned(sub.plan)
            router = router_for(self.backends, sub.req, sub.plan, sub.extra)
            e.routed(router, sub.route, sub.plan, sub.req)
            await self.run(replace(q, req=sub.req, plan=sub.plan, whole=None, router=router,
                                   ctx=replace(q.ctx, explain=e)))
            described[id(sub)] = e.subquery()

        subs = subqueries(tree)
        await asyncio.gather(*(one(s) for s in subs))
        explain.cross_store(tree_data(tree, described), [described[id(s)] for s in subs], piece_count(tree),
                            tree_backends(tree))
        return Answer()

    async def tree(self, q: Query) -> Node:
        """The evaluation tree of `q` (routed: `q.router`, `q.whole` set); a PromError (422) for
        a query that cannot be answered exactly."""
        assert q.whole is not None and q.plan is not None and q.router is not None
        reason = q.whole.reason or "the query cannot be answered exactly across the backends' holdings"
        if q.unmergeable or q.plan.expr is None:
            raise PromError("execution", reason)
        expr, router = await self._resolved(q.plan.expr, q.router, q.ctx.caller.tenant)
        tree = await self._tree(expr, q.req, router, Building(reason, q.ctx.caller.tenant))
        if isinstance(tree, Literal):
            raise PromError("execution", reason)
        return tree

    async def _resolved(self, expr: Any, router: Router, tenant: Tenant) -> tuple[Any, Router]:
        """`expr` with its selectors without a fixed metric name resolved against the stores'
        metric names (`shardplanner/names.py`), and a router that knows the names no store
        has (they read nothing: the primary answers them, with the empty answer every store
        would give). A name no list has refreshes the lists once."""
        holders = router.holdings
        if any(ALL_METRICS in h.metrics for h in holders):
            return expr, router  # a "*" holding answers any selector
        unheld = {n for n in fixed_names(expr) if not any(h.holds_metric(n) for h in holders)}
        if not needs_names(expr) and not unheld:
            return expr, router
        known = await self.names.known(tenant)
        resolved = resolve_names(expr, known)
        absent = {n for n in fixed_names(resolved) if n not in known}
        if absent - {NO_METRIC}:
            known = await self.names.known(tenant, missed=True)
            resolved = resolve_names(expr, known)
            absent = {n for n in fixed_names(resolved) if n not in known}
        nowhere = tuple(sorted(n for n in absent if not any(h.holds_metric(n) for h in holders)))
        if not nowhere:
            return resolved, router
        extra = (BackendHolding(self.backends[0].name, tuple(re.escape(n) for n in nowhere), primary=True),)
        return resolved, router.with_holdings(extra)

    async def _tree(self, node: Any, req: QueryRequest, router: Router, b: Building) -> Node:
        """The evaluation tree of `node` over `req`'s steps: the decision of what runs where,
        one case per shape, in the order they are tried."""
        while isinstance(node, Paren):
            node = node.expr
        folded = constant(node)
        if folded is not None:
            return Literal(folded)
        if isinstance(node, String):
            return Literal(node.value)
        if isinstance(node, Unary):  # -v: v * -1, the metric name dropped, as Prometheus does
            node = Binary("*", node.expr, Number(-1.0))
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
            inner = await self._tree(free, at_t, router, b)
            if not isinstance(inner, Literal):
                return PinnedNode(node, req, inner)
        if r.kind != "unroutable" and not (merges(r) and absent_like(node)):
            # A scalar-typed side (scalar(x), time()) comes back as a one-series matrix for a
            # range query; evaluate_binary knows it is a scalar from the expression.
            sub = replace(req, query=to_promql(node))
            return Sub(sub, await self.planner.plan(sub, b.tenant), r, router.extra)
        if r.kind == "unroutable" and span.is_range and span.step_ms is not None:
            segs = served_segments(node, span.start_ms, span.end_ms, router.holdings, router.lookback_ms,
                                   step_ms=span.step_ms)
            if any(who for _, _, who in segs) and not all(who for _, _, who in segs):
                # Only the steps no single backend answers are evaluated here.
                parts = await asyncio.gather(*(
                    self._tree(node, replace(req, span=Span.range(lo, hi, span.step_ms)), router, b)
                    for lo, hi, _ in segs))
                return SegmentsNode(node, req, tuple(parts))
        groups = self._name_groups(node, req, router)
        if groups is not None:
            # Series of different metrics held by different stores: a union of each store's.
            parts = await asyncio.gather(*(self._tree(n, req, router, b) for n in groups))
            return UnionNode(node, req, tuple(parts))
        if isinstance(node, Binary):
            lhs, rhs = await asyncio.gather(self._tree(node.lhs, req, router, b),
                                            self._tree(node.rhs, req, router, b))
            return BinaryNode(node, req, lhs, rhs)
        if isinstance(node, Call) and node.func in _ABSENT_LIKE and len(node.args) == 1:
            # absent()/scalar() over backends that are merged: the merge cannot see that an
            # "absent" from a backend in an outage is wrong, so the argument is merged first
            # and the function applied here, on the merged series.
            arg = node.args[0]
            inner_expr = Call("count_over_time", (arg,)) if node.func == "absent_over_time" else arg
            inner = await self._tree(inner_expr, req, router, b)
            if not isinstance(inner, Literal):
                return AbsentNode(node, req, inner)
        entry = TABLE.get(node.func) if isinstance(node, Call) else None  # its kernel, by name
        if isinstance(node, Call) and entry is not None and entry.window is not None:
            return await self._range_function(node, req, router, b)
        if isinstance(node, Call) and entry is not None and entry.instant is not None and not _stamps_samples(node):
            args = await asyncio.gather(*(self._tree(a, req, router, b) for a in node.args))
            return CallNode(node, req, tuple(args))
        if isinstance(node, Agg) and node.op in AGGREGATIONS:
            # The parameter may be any expression (`topk(2 * 3, ...)`, `quantile(scalar(y), ...)`):
            # evaluated as its own tree, a scalar per step (engine.go aggregation()).
            parts = await asyncio.gather(self._tree(node.expr, req, router, b),
                                         *([self._tree(node.param, req, router, b)] if node.param else []))
            if not isinstance(parts[0], Literal):
                return AggregateNode(node, req, parts[0], parts[1] if len(parts) > 1 else None)
        if isinstance(node, (MatrixSel, Subquery)) and not span.is_range:
            # A bare range vector at the top of an instant query: its samples, as they are.
            return await self._range_function(Call("__range__", (node,)), req, router, b)
        raise PromError("execution", b.reason)

    @staticmethod
    def _name_groups(node: Any, req: QueryRequest, router: Router) -> list[Any] | None:
        """`node`, per series over one selector listing metrics that different stores hold, as
        one variant per group of names routed alike; None when that is not the case."""
        sel = per_series_selector(node)
        names = listed_names(sel) if sel is not None else ()
        if sel is None or len(names) < 2:
            return None
        span = req.span
        groups: dict[str, list[str]] = {}
        for n in names:
            variant = with_names(node, sel, (n,))
            if span.is_range:
                r = router.range_route(span.start_ms, span.end_ms, span.step, variant)
            else:
                r = router.instant_route(span.time_ms, variant)
            groups.setdefault(r.key(), []).append(n)
        if len(groups) < 2:
            return None
        return [with_names(node, sel, tuple(g)) for g in groups.values()]

    async def _range_function(self, node: Call, req: QueryRequest, router: Router, b: Building) -> Node:
        """`func(x[r])` / `func(expr[r:s])` whose window no single backend holds: over raw
        samples from each store (`window`), or over the inner expression evaluated on the
        subquery's grid (`subquery`); the other arguments must be number literals."""
        arg = range_arg(node)
        grid = grid_of(req)
        params = tuple(await asyncio.gather(*(self._tree(a, req, router, b) for a in param_args(node))))
        if (isinstance(arg, MatrixSel) and isinstance(arg.selector.at, (int, type(None)))
                and any(h.holds_metric(arg.selector.metric_name) for h in router.holdings)):
            sel = arg.selector
            first_t, last_t = _read_times(node.func, sel.at, grid)
            lo = first_t - sel.offset_ms - arg.range_ms
            hi = last_t - sel.offset_ms
            window = RawWindow(sel, tuple(window_parts(router.holdings, sel, lo, hi)), lo, hi)
            return WindowNode(node, req, window, params)
        if isinstance(arg, Subquery) and isinstance(arg.at, (int, type(None))):
            # `[5m:]`: the primary's global.evaluation_interval, as Prometheus steps it.
            step = arg.step_ms or await self.intervals.of(self.backends[0])
            first_t, last_t = _read_times(node.func, arg.at, grid)
            first = first_t - arg.offset_ms - arg.range_ms
            start = -(-first // step) * step  # the first multiple of the step at or after it
            end = last_t - arg.offset_ms
            inner_steps = (end - start) // step + 1 if start <= end else 0
            max_points = self.planner.config.limits.max_points
            if inner_steps > max_points:
                # The inner grid is a range query of its own: the same bound as a client's.
                raise PromError("execution", f"the subquery {to_promql(arg)} would evaluate its inner expression at "
                                f"{inner_steps:,} steps, more than {max_points:,} (limits.max_points): "
                                "raise the subquery's step or shorten its range")
            if start <= end:
                inner_req = QueryRequest.range(to_promql(arg.expr), start, end, step, req.lookback_ms)
                inner = await self._tree(arg.expr, inner_req, router, b)
                if not isinstance(inner, Literal):
                    return SubqueryNode(node, req, inner, params)
        raise PromError("execution", b.reason)

    async def _leaves(self, tree: Node, q: Query, cached: list[str]
                      ) -> tuple[dict[Leaf, QueryResult], dict[RawWindow, QueryResult]]:
        """Every leaf of `tree`, fetched at once: each subquery through the planned path
        (`self.run`), each raw window from the stores that hold its stretches; `cached` gets
        each one's X-Cache."""
        found, raws = leaves(tree)
        subs = [s for s in found if isinstance(s, Sub)]  # the only leaves this stage builds
        got = await asyncio.gather(*(self._subquery(s, q) for s in subs), *(self._window(w, q) for w in raws))
        cached += [c for _, c in got]
        values = [r for r, _ in got]
        return dict(zip(subs, values[:len(subs)])), dict(zip(raws, values[len(subs):]))

    async def _subquery(self, sub: Sub, q: Query) -> tuple[QueryResult, str]:
        # gzip off: the subquery's answer is a result to evaluate over, never bytes kept whole.
        answer = await self.run(replace(q, req=sub.req, plan=sub.plan, whole=None, gzip=False,
                                        router=router_for(self.backends, sub.req, sub.plan, sub.extra)))
        assert answer.result is not None
        return answer.result, answer.headers.get("X-Cache", "MISS")

    async def _window(self, window: RawWindow, q: Query) -> tuple[QueryResult, str]:
        by_name = {b.name: b for b in self.backends}
        cache = self.raw_cache if q.cache is not None else None  # the query may use the cache
        chunks: dict[str, int] = {}
        raw = await fetch_raw(window.selector, window.reads, by_name, q.timeout_s, self.max_window_samples, q.ctx,
                              cache, tally=chunks)
        hits, misses = chunks.get("hit", 0), chunks.get("miss", 0)
        return raw, "HIT" if hits and not misses else "MISS" if misses and not hits else "PARTIAL"


def _read_times(func: str, at: Any, grid: Any) -> tuple[int, int]:
    """The first and last times whose windows a range function reads: the steps' own; with
    `@ T`, T alone. An AtModifierUnsafeFunction with `@ T` is evaluated at every step with the
    window shifted by the step (engine.go setOffsetForAtModifier turns `@` into an offset fixed
    at the query's start), but the series and samples it sees are those of the selector's
    time range, which `@ T` fixes at T (getTimeRangesForSelector; the TSDB querier trims
    chunks to it): the window at T is all that is read."""
    if not isinstance(at, int):
        return int(grid[0]), int(grid[-1])
    return at, at


def _stamps_samples(node: Call) -> bool:
    """timestamp(x) of a selector is each sample's own time, which a decoded answer (stamped
    at its steps) no longer has."""
    arg = node.args[0] if node.func == "timestamp" and node.args else None
    while isinstance(arg, Paren):
        arg = arg.expr
    return isinstance(arg, Selector)


def cache_status(parts: Sequence[str]) -> str:
    """X-Cache of a cross-store answer from its parts' (subqueries, raw windows): HIT when
    every one was served from the cache, MISS when none was, else PARTIAL."""
    if parts and all(p == "HIT" for p in parts):
        return "HIT"
    if not parts or all(p == "MISS" for p in parts):
        return "MISS"
    return "PARTIAL"


def piece_count(tree: Node) -> int:
    """The pieces the subqueries of a tree plan (X-Promaccel-Pieces of its answer)."""
    return sum(len(s.plan.pieces) for s in subqueries(tree))


def subqueries(tree: Node) -> list[Sub]:
    """The subtrees of a tree that run as queries of their own, left to right."""
    return [s for s in leaves(tree)[0] if isinstance(s, Sub)]


def uncovered(node: WindowNode) -> list[tuple[int, int]]:
    """The stretches of a window's time that no store holds (read by nobody: no data there,
    as in a Prometheus with that retention)."""
    return node.window.uncovered()


def tree_backends(tree: Node) -> list[str]:
    """Every backend a tree asks: its subqueries' and its windows' raw reads', left to right."""
    out: dict[str, None] = {}
    if isinstance(tree, Sub):
        out.update(dict.fromkeys(tree.route.backends))
    elif isinstance(tree, WindowNode):
        out.update(dict.fromkeys(b for b, _, _ in tree.window.reads))
    for a in children(tree):
        out.update(dict.fromkeys(tree_backends(a)))
    return list(out)


def operator_text(node: Inner) -> str:
    """What promaccel evaluates at `node`, in PromQL words: `* on (Hostname) group_left ()`,
    `sum by (namespace)`, `topk(5)`, `absent`, `@ 1761955200`, `increase(...[1h])`,
    `max_over_time(...[30m:1m])`."""
    return node.text()


def tree_data(node: Node, described: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A cross-store tree as explain shows it: `{"subquery": {...}}` where one backend (or an
    overlap, or a time split) answers, `{"evaluate": "<operator>", "by": "promaccel", "args":
    [...]}` above them, `{"number": v}` / `{"string": v}` for literals."""
    if isinstance(node, Sub):
        return {"subquery": described[id(node)]}
    if isinstance(node, Inner):
        span = node.req.span
        out: dict[str, Any] = {"evaluate": operator_text(node), "kind": node.KIND, "by": "promaccel",
                               "steps": [span.start_ms, span.end_ms] if span.is_range else [span.start_ms],
                               "args": [tree_data(a, described) for a in children(node)]}
        if isinstance(node, WindowNode):
            # Where the window's raw samples come from; time nobody holds is not read.
            out["reads"] = [{"backend": b, "from_ms": a, "to_ms": z} for b, a, z in node.window.reads]
            out["uncovered"] = [{"from_ms": a, "to_ms": z} for a, z in uncovered(node)]
        return out
    assert isinstance(node, Literal)
    if isinstance(node.value, str):
        return {"string": node.value}
    return {"number": node.value}
