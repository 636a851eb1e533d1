"""The one evaluator: a single walk over the evaluation tree (nodes.py), dispatching on the
node type in one place, as Prometheus's evaluator.eval switches on the parser's node types.

    answer = evaluate(tree, answers, windows, budget)                  in the calling thread
    answer = await evaluate_off_loop(tree, answers, windows, budget)   in the evaluation pool

`answers` maps each Leaf to its decoded answer and `windows` each RawWindow to its raw
samples: the pipeline fetches them all (concurrently, cached, planned) before the walk, so
the walk itself does no I/O and runs in one thread hop. Every inner node's value is the
answer on its own `req` steps: a QueryResult ("vector"/"scalar" for an instant `req`, a
"matrix" on the step grid for a range one), or a float / str for a literal.

Limits, as before this walk existed (proxy/engine/work.py): each operator is charged its
input samples before it runs (a 422 over limits.max_eval_work) and its output after (and its
series against limits.max_eval_series); range functions charge their window walk inside the
kernel, a chunk of series at a time with a deadline check between chunks; a subquery's inner
answer is bounded by `max_subquery_samples` (limits.max_window_samples).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from proxy.engine.aggregate import evaluate_aggregation
from proxy.engine.binop import evaluate_binary
from proxy.engine.errors import EvalLimit
from proxy.engine.functions import evaluate_call
from proxy.engine.local_ops import absent_or_scalar, as_answer, check_distinct, grid_of, joined, restamp
from proxy.engine.nodes import (
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
from proxy.engine.stepwise import scalar_steps
from proxy.engine.windows import eval_range_function
from proxy.engine.work import WorkBudget
from proxy.result import QueryResult
from shardplanner.ast import COMPARISON_OPS, SET_OPS, Binary, Call, Number, Paren, Unary
from shardplanner.functions import AT_UNSAFE
from shardplanner.plan import QueryRequest
from shardplanner.serialize import to_promql

__all__ = ["INLINE_SAMPLES", "constant", "evaluate", "evaluate_off_loop", "off_loop", "range_arg", "range_call"]

Value = QueryResult | float | str
T = TypeVar("T")

# Evaluation runs in these threads, never on the event loop (the window kernels release the
# GIL; numpy mostly does). A tree whose inputs hold fewer samples than INLINE_SAMPLES is
# evaluated in place: a thread hop costs more than the work.
_POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="promaccel-eval")
INLINE_SAMPLES = 20_000


async def off_loop(budget: WorkBudget, fn: Callable[[], T], inline: bool = False) -> T:
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


async def evaluate_off_loop(tree: Node, answers: Mapping[Leaf, QueryResult], windows: Mapping[RawWindow, QueryResult],
                            budget: WorkBudget, *, max_subquery_samples: int = 0) -> Value:
    """`evaluate` in the evaluation pool (in place when its inputs are small)."""
    size = sum(a.n_samples for a in answers.values()) + sum(w.n_samples for w in windows.values())
    return await off_loop(budget, lambda: evaluate(tree, answers, windows, budget,
                                                   max_subquery_samples=max_subquery_samples),
                          inline=size < INLINE_SAMPLES)


def evaluate(tree: Node, answers: Mapping[Leaf, QueryResult], windows: Mapping[RawWindow, QueryResult],
             budget: WorkBudget, *, max_subquery_samples: int = 0) -> Value:
    """The value of `tree`, from its leaves' supplied values."""
    missing = [leaf for leaf in leaves(tree)[0] if leaf not in answers]
    if missing:
        raise ValueError(f"no answer supplied for {len(missing)} leaf (leaves) of the tree")
    return _Walk(answers, windows, budget, max_subquery_samples).eval(tree)


class _Walk:
    def __init__(self, answers: Mapping[Leaf, QueryResult], windows: Mapping[RawWindow, QueryResult],
                 budget: WorkBudget, max_subquery_samples: int) -> None:
        self.answers = answers
        self.windows = windows
        self.budget = budget
        self.max_subquery_samples = max_subquery_samples

    def eval(self, node: Node) -> Value:
        """A node's value: its arguments' values first (left to right), then its kernel
        (`apply`, the one place that dispatches on the node type)."""
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Leaf):
            return self.answers[node]
        assert isinstance(node, Inner)
        if isinstance(node, WindowNode):
            return self.window(node)
        args = [self.eval(c) for c in children(node)]
        if isinstance(node, SubqueryNode):
            inner = args[0]
            bound = self.max_subquery_samples
            if isinstance(inner, QueryResult) and bound and inner.n_samples > bound:
                raise EvalLimit(f"the subquery {to_promql(range_arg(node.node))} gathers {inner.n_samples:,} "
                                f"samples, more than the query may gather ({bound:,}: limits.max_window_samples, "
                                "or limits.max_samples if lower)")
        return self.charged(node, args)

    def window(self, node: WindowNode) -> QueryResult:
        """A range function over raw samples: the kernel charges its own window walk."""
        params = [self.eval(p) for p in node.params]
        arg = range_arg(node.node)
        sel = arg.selector
        out = range_call(node.node, self.windows[node.window], params, node.req, arg.range_ms, sel.offset_ms, sel.at,
                         self.budget)
        self.budget.series(out.n_series, to_promql(node.node))
        return out

    def charged(self, node: Inner, args: list[Value]) -> QueryResult | float:
        """`apply` charged to the budget: its input samples before it runs (a 422 over
        limits.max_eval_work), its output's after (and its series against max_eval_series)."""
        what = node.text()
        steps = len(grid_of(node.req))
        work = sum(a.n_samples if a.result_type == "matrix" else a.n_series * steps
                   for a in args if isinstance(a, QueryResult))
        self.budget.charge(work, what)
        out = self.apply(node, args)  # Prometheus's refusals: EvalError, a 422
        if isinstance(out, QueryResult):
            self.budget.series(out.n_series, what)
            self.budget.charge(out.n_samples, what)
        return out

    def apply(self, node: Inner, args: Sequence[Value]) -> QueryResult | float:
        """The kernel of `node` over its evaluated arguments."""
        req = node.req
        if isinstance(node, BinaryNode):
            lhs, rhs = args
            assert not isinstance(lhs, str) and not isinstance(rhs, str)
            return evaluate_binary(node.node, lhs, rhs)
        if isinstance(node, CallNode):
            return evaluate_call(node.node, args, grid_of(req), req.is_range)
        if isinstance(node, (SegmentsNode, UnionNode)):
            results = [a for a in args if isinstance(a, QueryResult)]
            assert len(results) == len(args)
            if isinstance(node, UnionNode):
                check_distinct(results)
            return joined(results, req)
        inner = args[0]
        assert isinstance(inner, QueryResult)  # the tree never puts a literal under these
        if isinstance(node, SubqueryNode):
            sub = range_arg(node.node)
            return range_call(node.node, inner, args[1:], req, sub.range_ms, sub.offset_ms, sub.at, self.budget)
        if isinstance(node, PinnedNode):
            return restamp(inner, req)
        if isinstance(node, AbsentNode):
            return absent_or_scalar(node.node, inner, req)
        if not isinstance(node, AggregateNode):  # pragma: no cover - every node type is a case above
            raise TypeError(f"no kernel for {type(node).__name__}")
        param = args[1] if len(args) > 1 else None
        assert not isinstance(param, str) or node.node.op == "count_values"
        return evaluate_aggregation(node.node, inner, param, grid_of(req), req.is_range)


# The argument of each range function that is its range vector (functions.go's signatures);
# the others are its scalar parameters, in call order.
_MATRIX_ARG = {"quantile_over_time": 1}


def range_arg(node: Call) -> Any:
    """A range function's range-vector argument, parentheses off."""
    i = _MATRIX_ARG.get(node.func, 0)
    arg: Any = node.args[i] if i < len(node.args) else None
    while isinstance(arg, Paren):
        arg = arg.expr
    return arg


def param_args(node: Call) -> list[Any]:
    """A range function's scalar parameters (quantile, predict_linear's t, holt_winters's
    factors): expressions, evaluated per step."""
    i = _MATRIX_ARG.get(node.func, 0)
    return [a for j, a in enumerate(node.args) if j != i]


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
