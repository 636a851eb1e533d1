"""Cross-store evaluation: a query no single backend can answer. The largest subtrees one
backend can answer run as queries of their own (planned, cached, sharded like any query), and
promaccel evaluates what lies above them on the decoded answers:

- a range query's steps that some backend answers whole are routed as usual; only the
  stretches of steps no single backend answers are evaluated here (`segments`);
- operators, functions and aggregations above subtrees held by different stores (a join of
  AMP's DCGM_* with the local node_*): `binary`, `function`, `aggregate`, `absent`;
- a range function whose window straddles two stores (`increase(x[6h])` where AMP stops and
  the local Prometheus starts): the window's raw samples come from each store for the
  stretch it holds (proxy/pipeline/raw_fetch.py) and the function is evaluated here with
  Prometheus 2's semantics (`window`); over a subquery, its inner expression is asked on
  the subquery's own step grid (routed like any query) and the function applied here
  (`subquery`).
Whatever cannot be answered exactly gets a 422 naming the metrics, the backends and the
operator -- never a guess."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from shardplanner.analysis import ABSENT_LIKE, absent_like, pinned_at
from shardplanner.ast import (
    COMPARISON_OPS,
    SET_OPS,
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
from shardplanner.functions import AT_UNSAFE, unknown_names
from shardplanner.holdings import ALL_METRICS, BackendHolding
from shardplanner.names import NO_METRIC, fixed_names, needs_names, per_series_selector, resolve_names, with_names
from shardplanner.plan import Plan, QueryRequest, Span
from shardplanner.routing import Route as PieceRoute
from shardplanner.routing import listed_names, served_segments
from shardplanner.serialize import to_promql

from ..backends import Backend
from ..errors import PromError
from ..hybrid import Router
from ..metrics import METRICS
from ..result import QueryResult
from ..result.aggregate import AGGREGATIONS, evaluate_aggregation
from ..result.binop import evaluate_binary
from ..result.functions import INSTANT_FUNCTIONS, evaluate_call
from ..result.stepwise import scalar_steps
from ..result.windows import RANGE_FUNCTIONS, eval_range_function
from ..result.work import WorkBudget
from .ask import Asker
from .eval_interval import EvaluationIntervals
from .local_ops import absent_or_scalar, as_answer, check_distinct, grid_of, joined, restamp
from .names import MetricNames
from .planning import Planner
from .raw_fetch import RawCache, fetch_raw, window_parts
from .routing import merges, router_for
from .stage import Stage
from .values import Answer, PieceFailed, Query

_ABSENT_LIKE = ABSENT_LIKE
# Evaluation runs in these threads, never on the event loop (the window kernels release the
# GIL; numpy mostly does). A node whose inputs hold fewer samples than INLINE_SAMPLES is
# evaluated in place: a thread hop costs more than the work.
_POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="promaccel-eval")
INLINE_SAMPLES = 20_000


async def off_loop(budget: WorkBudget, fn: Callable[[], Any], inline: bool = False) -> Any:
    """`fn()` in an evaluation thread; a cancellation (the query's deadline, a client gone)
    cancels the budget, so the thread stops at its next check."""
    if inline:
        budget.check()
        return fn()
    try:
        return await asyncio.get_running_loop().run_in_executor(_POOL, fn)
    except asyncio.CancelledError:
        budget.cancel()
        raise


@dataclass(frozen=True)
class Sub:
    """A subtree one backend (or an overlap, or a time split) answers: planned, and run from
    Merge down like any query."""

    req: QueryRequest
    plan: Plan
    route: PieceRoute
    extra: tuple[BackendHolding, ...] = ()  # holdings of names no store has (`_resolved`)


@dataclass(frozen=True)
class Op:
    """What promaccel evaluates over `req`'s steps, above its arguments: `binary`, `absent`
    (absent, absent_over_time, scalar), `aggregate`, `function`, `pinned` (an `@`-pinned
    answer restamped at every step), `segments` (each arg answers a stretch of the steps),
    `window` (a range function over raw samples; `reads`: (backend, from, to) stretches of
    its window), `subquery` (a range function over its one arg, the inner expression
    evaluated on the subquery's grid)."""

    kind: str
    node: Any
    args: tuple[Step, ...]
    req: QueryRequest
    reads: tuple[tuple[str, int, int], ...] = ()
    window: tuple[int, int] | None = None  # `window`: the samples' time, first to last (ms)


Step = Sub | Op | float | str  # float: a number literal; str: a string literal


class CrossStore:
    """Stage: evaluate the operators above per-store subqueries.

    `tree()` decides, without running anything, which subtrees run as queries of their own and
    which operators promaccel evaluates above them (or refuses the query with the 422 it
    answers); the stage runs that tree, and /api/v1/explain shows it."""

    def __init__(self, planner: Planner, backends: Sequence[Backend], run: Stage[Query, Answer],
                 max_window_samples: int = 0, raw_cache: RawCache | None = None) -> None:
        self.planner = planner
        self.names = MetricNames(backends, planner.config.planner.shard_values_ttl)
        self.backends = backends
        self.run = run  # the planned path (merge and below) for each subquery
        self.max_window_samples = max_window_samples
        self.intervals = EvaluationIntervals()
        self.raw_cache = raw_cache

    async def __call__(self, q: Query) -> Answer:
        assert q.plan is not None
        unparsable = q.plan.expr is None and reason_code(q.plan.notes) == "unparsable"
        if unparsable or (q.plan.expr is not None and unknown_names(q.plan.expr)):
            # The planner cannot read the query, or it uses a function Prometheus 2.42 does not
            # know (a Prometheus 3 one): most often it is invalid, and Prometheus's own error
            # (400 bad_data, its exact text) is the answer. The primary is asked as the client
            # asked; if it does answer, that answer cannot be shown to hold every backend's
            # data, so the query is refused as before.
            reply, _ = await Asker().sound(self.backends[0], q.path, q.pairs, q.timeout_s)
            if not reply.ok:
                return Answer(reply=reply, headers={"X-Promaccel-Pieces": "1"})
        pieces = "0"
        limits = self.planner.config.limits
        budget = WorkBudget(time.monotonic() + q.timeout_s, limits.max_eval_work, limits.max_eval_series)
        cached: list[str] = []  # X-Cache of each subquery's answer and raw window read
        try:
            async with asyncio.timeout(q.timeout_s):
                tree = await self.tree(q)
                pieces = str(piece_count(tree))
                result = await self._execute(tree, q, budget, cached)
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

    async def tree(self, q: Query) -> Step:
        """The evaluation tree of `q` (routed: `q.router`, `q.whole` set); a PromError (422) for
        a query that cannot be answered exactly."""
        assert q.whole is not None and q.plan is not None and q.router is not None
        reason = q.whole.reason or "the query cannot be answered exactly across the backends' holdings"
        if q.unmergeable or q.plan.expr is None:
            raise PromError("execution", reason)
        expr, router = await self._resolved(q.plan.expr, q.router)
        tree = await self._tree(expr, q.req, router, reason)
        if isinstance(tree, (float, str)):
            raise PromError("execution", reason)
        return tree

    async def _resolved(self, expr: Any, router: Router) -> tuple[Any, Router]:
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
        known = await self.names.known()
        resolved = resolve_names(expr, known)
        absent = {n for n in fixed_names(resolved) if n not in known}
        if absent - {NO_METRIC}:
            known = await self.names.known(missed=True)
            resolved = resolve_names(expr, known)
            absent = {n for n in fixed_names(resolved) if n not in known}
        nowhere = tuple(sorted(n for n in absent if not any(h.holds_metric(n) for h in holders)))
        if not nowhere:
            return resolved, router
        extra = (BackendHolding(self.backends[0].name, tuple(re.escape(n) for n in nowhere), primary=True),)
        return resolved, router.with_holdings(extra)

    async def _tree(self, node: Any, req: QueryRequest, router: Router, reason: str) -> Step:
        while isinstance(node, Paren):
            node = node.expr
        folded = constant(node)
        if folded is not None:
            return folded
        if isinstance(node, String):
            return node.value
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
            inner = await self._tree(free, at_t, router, reason)
            if not isinstance(inner, (float, str)):
                return Op("pinned", node, (inner,), req)
        if r.kind != "unroutable" and not (merges(r) and absent_like(node)):
            # A scalar-typed side (scalar(x), time()) comes back as a one-series matrix for a
            # range query; evaluate_binary knows it is a scalar from the expression.
            sub = replace(req, query=to_promql(node))
            return Sub(sub, await self.planner.plan(sub), r, router.extra)
        if r.kind == "unroutable" and span.is_range and span.step_ms is not None:
            segs = served_segments(node, span.start_ms, span.end_ms, router.holdings, router.lookback_ms,
                                   step_ms=span.step_ms)
            if any(who for _, _, who in segs) and not all(who for _, _, who in segs):
                # Only the steps no single backend answers are evaluated here.
                parts = await asyncio.gather(*(
                    self._tree(node, replace(req, span=Span.range(a, b, span.step_ms)), router, reason)
                    for a, b, _ in segs))
                return Op("segments", node, tuple(parts), req)
        groups = self._name_groups(node, req, router)
        if groups is not None:
            # Series of different metrics held by different stores: a union of each store's.
            parts = await asyncio.gather(*(self._tree(n, req, router, reason) for n in groups))
            return Op("union", node, tuple(parts), req)
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
            if not isinstance(inner, (float, str)):
                return Op("absent", node, (inner,), req)
        if isinstance(node, Call) and node.func in RANGE_FUNCTIONS:
            return await self._range_function(node, req, router, reason)
        if isinstance(node, Call) and node.func in INSTANT_FUNCTIONS and not _stamps_samples(node):
            args = await asyncio.gather(*(self._tree(a, req, router, reason) for a in node.args))
            return Op("function", node, tuple(args), req)
        if isinstance(node, Agg) and node.op in AGGREGATIONS:
            # The parameter may be any expression (`topk(2 * 3, ...)`, `quantile(scalar(y), ...)`):
            # evaluated as its own tree, a scalar per step (engine.go aggregation()).
            parts = await asyncio.gather(self._tree(node.expr, req, router, reason),
                                         *([self._tree(node.param, req, router, reason)] if node.param else []))
            if not isinstance(parts[0], (float, str)):
                return Op("aggregate", node, tuple(parts), req)
        if isinstance(node, (MatrixSel, Subquery)) and not span.is_range:
            # A bare range vector at the top of an instant query: its samples, as they are.
            return await self._range_function(Call("__range__", (node,)), req, router, reason)
        raise PromError("execution", reason)

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

    async def _range_function(self, node: Call, req: QueryRequest, router: Router, reason: str) -> Step:
        """`func(x[r])` / `func(expr[r:s])` whose window no single backend holds: over raw
        samples from each store (`window`), or over the inner expression evaluated on the
        subquery's grid (`subquery`); the other arguments must be number literals."""
        arg = _range_arg(node)
        grid = grid_of(req)
        params = tuple(await asyncio.gather(*(self._tree(a, req, router, reason) for a in _param_args(node))))
        if (isinstance(arg, MatrixSel) and isinstance(arg.selector.at, (int, type(None)))
                and any(h.holds_metric(arg.selector.metric_name) for h in router.holdings)):
            sel = arg.selector
            first_t, last_t = _read_times(node.func, sel.at, grid)
            lo = first_t - sel.offset_ms - arg.range_ms
            hi = last_t - sel.offset_ms
            return Op("window", node, params, req, tuple(window_parts(router.holdings, sel, lo, hi)), (lo, hi))
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
                inner = await self._tree(arg.expr, inner_req, router, reason)
                if not isinstance(inner, (float, str)):
                    return Op("subquery", node, (inner, *params), req)
        raise PromError("execution", reason)

    async def _execute(self, step: Step, q: Query, budget: WorkBudget,
                       cached: list[str]) -> QueryResult | float | str:
        if isinstance(step, (float, str)):
            return step
        if isinstance(step, Sub):
            answer = await self.run(replace(q, req=step.req, plan=step.plan, whole=None,
                                            router=router_for(self.backends, step.req, step.plan, step.extra)))
            assert answer.result is not None
            cached.append(answer.headers.get("X-Cache", "MISS"))
            return answer.result
        args = await asyncio.gather(*(self._execute(a, q, budget, cached) for a in step.args))
        if step.kind == "window":
            return await self._window(step, q, budget, args, cached)
        if step.kind == "subquery":
            inner = args[0]
            bound = self.max_window_samples
            if isinstance(inner, QueryResult) and bound and inner.n_samples > bound:
                raise PromError("execution", f"the subquery {to_promql(_range_arg(step.node))} gathers "
                                f"{inner.n_samples:,} samples, more than the query may gather ({bound:,}: "
                                "limits.max_window_samples, or limits.max_samples if lower)")
        size = sum(a.n_samples for a in args if isinstance(a, QueryResult))
        out: QueryResult | float = await off_loop(budget, functools.partial(self._evaluate_within, step, args, budget),
                              inline=size < INLINE_SAMPLES)
        return out

    async def _window(self, step: Op, q: Query, budget: WorkBudget, params: list[Any],
                      cached: list[str]) -> QueryResult:
        node: Call = step.node
        arg = _range_arg(node)
        assert isinstance(arg, MatrixSel)
        by_name = {b.name: b for b in self.backends}
        cache = self.raw_cache if q.cache is not None else None  # the query may use the cache
        chunks: dict[str, int] = {}
        raw = await fetch_raw(arg.selector, step.reads, by_name, q.timeout_s, self.max_window_samples, cache,
                              tally=chunks)
        hits, misses = chunks.get("hit", 0), chunks.get("miss", 0)
        cached.append("HIT" if hits and not misses else "MISS" if misses and not hits else "PARTIAL")

        def evaluate() -> QueryResult:
            out = range_call(node, raw, params, step.req, arg.range_ms, arg.selector.offset_ms, arg.selector.at,
                             budget)
            budget.series(out.n_series, to_promql(node))
            return out

        return await off_loop(budget, evaluate, inline=raw.n_samples < INLINE_SAMPLES)  # type: ignore[no-any-return]

    @classmethod
    def _evaluate_within(cls, step: Op, args: list[QueryResult | float | str],
                         budget: WorkBudget) -> QueryResult | float:
        """`_evaluate` charged to `budget`: its input samples before it runs (a 422 over
        limits.max_eval_work), its output's after (and its series against max_eval_series)."""
        what = operator_text(step)
        steps = len(grid_of(step.req))
        work = sum(a.n_samples if a.result_type == "matrix" else a.n_series * steps
                   for a in args if isinstance(a, QueryResult))
        budget.charge(work, what)
        out = cls._evaluate(step, args, budget)  # Prometheus's refusals: EvalError, a 422
        if isinstance(out, QueryResult):
            budget.series(out.n_series, what)
            budget.charge(out.n_samples, what)
        return out

    @staticmethod
    def _evaluate(step: Op, args: list[QueryResult | float | str], budget: WorkBudget) -> QueryResult | float:
        node, req = step.node, step.req
        if step.kind == "binary":
            lhs, rhs = args
            assert not isinstance(lhs, str) and not isinstance(rhs, str)
            return evaluate_binary(node, lhs, rhs)
        if step.kind == "function":
            return evaluate_call(node, args, grid_of(req), req.is_range)
        if step.kind in ("segments", "union"):
            assert all(isinstance(a, QueryResult) for a in args)
            results = [a for a in args if isinstance(a, QueryResult)]
            if step.kind == "union":
                check_distinct(results)
            return joined(results, req)
        inner = args[0]
        assert isinstance(inner, QueryResult)  # tree() never puts a literal under these
        if step.kind == "subquery":
            sub = _range_arg(node)
            assert isinstance(sub, Subquery)
            return range_call(node, inner, args[1:], req, sub.range_ms, sub.offset_ms, sub.at, budget)
        if step.kind == "pinned":
            return restamp(inner, req)
        if step.kind == "absent":
            return absent_or_scalar(node, inner, req)
        param = args[1] if len(args) > 1 else None
        assert not isinstance(param, str) or node.op == "count_values"
        return evaluate_aggregation(node, inner, param, grid_of(req), req.is_range)


# The argument of each range function that is its range vector (functions.go's signatures);
# the others are its scalar parameters, in call order. `__range__`: a bare range vector at the
# top of an instant query (its samples are the answer).
_MATRIX_ARG = {"quantile_over_time": 1}


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


def _range_arg(node: Call) -> Any:
    """A range function's range-vector argument, parentheses off."""
    i = _MATRIX_ARG.get(node.func, 0)
    arg: Any = node.args[i] if i < len(node.args) else None
    while isinstance(arg, Paren):
        arg = arg.expr
    return arg


def _param_args(node: Call) -> list[Any]:
    """A range function's scalar parameters (quantile, predict_linear's t, holt_winters's
    factors): expressions, evaluated per step."""
    i = _MATRIX_ARG.get(node.func, 0)
    return [a for j, a in enumerate(node.args) if j != i]


def constant(node: Any) -> float | None:
    """The value of a number-only arithmetic expression (`2 * 3`, `(3)`, `-1`, `99/100`),
    folded here with binop's scalarBinop (Go's arithmetic, math.Pow and math.Mod included)
    instead of asking a backend; None for anything else (comparisons: the backend's
    business)."""
    while isinstance(node, Paren):
        node = node.expr
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Unary):
        v = constant(node.expr)
        return None if v is None else -v
    if isinstance(node, Binary) and node.op not in COMPARISON_OPS and node.op not in SET_OPS:
        a = constant(node.lhs)
        b = constant(node.rhs) if a is not None else None
        if a is None or b is None:
            return None
        out = evaluate_binary(node, a, b)
        return out if isinstance(out, float) else None
    return None


def range_call(node: Call, samples: QueryResult, params: Sequence[Any], req: QueryRequest, range_ms: int,
               offset_ms: int, at: Any, budget: WorkBudget) -> QueryResult:
    """`node.func` over a range vector whose samples are `samples` (a window's raw samples, or
    a subquery's inner answer), at every step of `req`, as engine.go evaluates it:
    - `__range__` (a bare range vector at the top of an instant query): the samples themselves;
    - without `@`: the window walks with the steps;
    - with `@ T`: every step reads the same window, ending at T - offset; the function is
      evaluated once at T and its answer restamped at every step (step invariant), except for
      the AtModifierUnsafeFunctions (predict_linear), which are evaluated at each step."""
    grid = grid_of(req)
    if node.func == "__range__":
        return samples
    steps = [scalar_steps(p, grid) for p in params]
    if at is None:
        out = eval_range_function(node.func, steps, samples, grid, range_ms, offset_ms=offset_ms, budget=budget)
        return as_answer(out, req)
    if node.func in AT_UNSAFE:
        # engine.go setOffsetForAtModifier: `@ T` becomes the offset (start - T) at every step.
        out = eval_range_function(node.func, steps, samples, grid, range_ms, offset_ms=offset_ms + int(grid[0]) - at,
                                  budget=budget)
        return as_answer(out, req)
    # Step invariant (engine.go wraps it in a StepInvariantExpr): evaluated once, at the start
    # (the parameters' values there), and its answer stamped at every step.
    once = eval_range_function(node.func, [p[:1] for p in steps], samples, [at], range_ms,
                               offset_ms=offset_ms, budget=budget)
    return restamp(as_answer(once, QueryRequest.instant("", at, req.lookback_ms)), req)


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


def uncovered(op: Op) -> list[tuple[int, int]]:
    """The stretches of a window's time that no store holds (read by nobody: no data there,
    as in a Prometheus with that retention)."""
    if op.window is None:
        return []
    lo, hi = op.window
    out: list[tuple[int, int]] = []
    at = lo
    for _, a, b in sorted(op.reads, key=lambda r: r[1]):
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
    if at <= hi:
        out.append((at, hi))
    return out


def tree_backends(step: Step) -> list[str]:
    """Every backend a tree asks: its subqueries' and its windows' raw reads'."""
    out: dict[str, None] = {}
    if isinstance(step, Sub):
        out.update(dict.fromkeys(step.route.backends))
    elif isinstance(step, Op):
        out.update(dict.fromkeys(b for b, _, _ in step.reads))
        for a in step.args:
            out.update(dict.fromkeys(tree_backends(a)))
    return list(out)


def operator_text(op: Op) -> str:
    """What promaccel evaluates at `op`, in PromQL words: `* on (Hostname) group_left ()`,
    `sum by (namespace)`, `topk(5)`, `absent`, `@ 1761955200`, `increase(...[1h])`,
    `max_over_time(...[30m:1m])`."""
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
        if isinstance(node.param, Number):
            text += f" (param {node.param.value:g})"
        elif isinstance(node.param, String):
            text += f" (param {node.param.value!r})"
        return text
    if op.kind in ("absent", "function"):
        return str(node.func)
    if op.kind == "segments":
        return "the steps no single backend answers, joined to the steps routed as usual"
    if op.kind == "union":
        return "the union of metrics held by different stores"
    if op.kind in ("window", "subquery"):
        return to_promql(node)
    at = pinned_at(node)
    assert at is not None
    return f"@ {at / 1000:g}"
