"""The planner: one `QueryRequest` in, one `Plan` (pieces + merge recipe) out. Pure.

Stages, in order, each on the output of the one before:

1. parse      `shardplanner.promql.parse`; `CannotParse` -> one passthrough piece carrying the
              client's query byte for byte (note "unparsable by planner").
2. pin        `@ start()` / `@ end()` -> the absolute start/end of the *whole* query (both
              the evaluation time for an instant query), so every piece sees the same
              instants. `x @ start()` over [1000 s, 2000 s] -> `x @ 1000.000`.
3. shard      (settings.shards > 1) pick the shard label from the selectors' metric names,
              check the shape against `rules`, and build N matchers with `shards.make_shards`:
              - the whole expression is shard-local (per-series, or aggregated by the shard
                label): every shard runs it with its matcher, merge = concat;
                `avg by (Hostname) (x)` -> `avg by (Hostname) (x{Hostname=~"a|b"})`, ...
              - the top expression is sum/min/max/count/group/topk/bottomk over a shard-local
                input: every shard runs the same aggregation, merge = aggregate(op);
                `sum by (ns) (x)` -> `sum by (ns) (x{Hostname=~"a|b"})`, ...
              - avg over a shard-local input: two pieces per shard, role "sum" and "count":
                `avg(x)` -> `sum(x{H=~"a|b"})` + `count(x{H=~"a|b"})`, merge = aggregate(avg).
              Anything else runs unsharded, with a note saying why.
4. split      range query, settings.split_interval_ms set, range >= min_range_to_split_ms:
              epoch-aligned time pieces on the query's own step grid (`timesplit`); the
              query text is the same for every time piece. Every range query can be cut this
              way once `@ start()/end()` are pinned: each step is evaluated on its own.
              Instant `max_over_time(x[7d])`-like queries can be cut into sub-windows
              (settings.split_instant_windows, see `_instant_window`).
5. budget     settings.max_pieces: the time split is served first (measured: time pieces
              speed up more than node shards); only if it alone exceeds the budget is its
              interval multiplied (multiples of an epoch-aligned interval stay aligned).
              Shards get what is left: fewer shards, or none. Never fails.

A piece's query is the client's original string unless something was rewritten (pinned,
sharded, windowed); rewritten ASTs are printed with `shardplanner.serialize.to_promql`.
Pieces are ordered by time, then shard index, then role ("sum" before "count").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from shardplanner import rules
from shardplanner.ast import (
    Agg,
    Call,
    Expr,
    Matcher,
    MatrixSel,
    Number,
    Selector,
    String,
    Subquery,
    inject_matcher,
    selectors,
    transform,
    unparen,
)
from shardplanner.plan import (
    AggOp,
    MergeRecipe,
    Piece,
    Plan,
    PlannerSettings,
    QueryRequest,
    ShardSpec,
)
from shardplanner.promql import CannotParse, parse
from shardplanner.serialize import to_promql
from shardplanner.shards import make_shards
from shardplanner.timesplit import count_pieces, count_windows, split_range, split_window

__all__ = ["plan", "shard_label_for"]

_ROLE_ORDER = ("sum", "count")
# Instant window split: *_over_time function -> the aggregation that recombines it exactly
# even when sub-windows share a boundary sample (idempotent).
_WINDOW_FUNCS = {"max_over_time": "max", "min_over_time": "min"}


def plan(
    req: QueryRequest, settings: PlannerSettings, shard_values: Mapping[str, Sequence[str]]
) -> Plan:
    """Plan ``req``. Deterministic: the same inputs give the same plan, piece for piece."""
    try:
        expr = parse(req.query)
    except CannotParse:
        return _single(req, req.query, notes=("unparsable by planner",))

    start_ms, end_ms = _whole_query_bounds(req)
    pinned = _pin(expr, start_ms, end_ms)
    rewritten = pinned != expr
    notes: list[str] = []

    if req.is_range and isinstance(unparen(pinned), MatrixSel | Subquery | String):
        # Prometheus rejects these as range queries: one backend call gives its own error.
        return _single(req, req.query, notes=("not a range-query expression",))

    shard = _shard_decision(pinned, settings, notes)
    window = _instant_window(req, pinned, settings, notes) if not req.is_range else None
    times = _time_pieces(req, pinned, settings, notes)

    roles: tuple[str | None, ...] = (None,)
    if shard is not None and shard.agg is not None and shard.agg.op == "avg":
        roles = _ROLE_ORDER
    n_time = len(times) if window is None else len(window.windows)
    specs = _budgeted_shards(shard, n_time * len(roles), settings, shard_values, notes)
    if not specs:
        shard, roles = None, (None,)

    # --- piece queries: one text per (shard, role, window) -------------------------------
    def text(node: Expr) -> str:
        return req.query if node == expr else to_promql(node)

    def shard_exprs(base: Expr) -> list[tuple[ShardSpec | None, str | None, Expr]]:
        if shard is None:
            return [(None, None, base)]
        out: list[tuple[ShardSpec | None, str | None, Expr]] = []
        for spec in specs:
            m = Matcher(spec.label, spec.matcher_op, spec.matcher_value)
            if shard.mode == "concat":
                out.append((spec, None, inject_matcher(base, m)))
                continue
            top = unparen(base)
            assert isinstance(top, Agg)  # mode "aggregate"
            for role in roles:
                agg = top if role is None else replace(top, op=role)
                out.append((spec, role, inject_matcher(agg, m)))
        return out

    pieces: list[Piece] = []
    if window is not None:
        for eval_ms, sub_range_ms in window.windows:
            windowed = window.with_range(sub_range_ms)
            for spec, role, node in shard_exprs(windowed):
                pieces.append(Piece(to_promql(node), time_ms=eval_ms, shard=spec, role=role))
    else:
        variants = [(spec, role, text(node)) for spec, role, node in shard_exprs(pinned)]
        for t in times:
            for spec, role, query in variants:
                if req.is_range:
                    pieces.append(
                        Piece(
                            query,
                            start_ms=t[0],
                            end_ms=t[1],
                            step_ms=req.step_ms,
                            shard=spec,
                            role=role,
                        )
                    )
                else:
                    pieces.append(Piece(query, time_ms=req.time_ms, shard=spec, role=role))

    merge = _merge_recipe(shard, window, len(pieces))
    if rewritten:
        notes.append("@ start()/end() pinned to absolute times")
    return Plan(
        request=req,
        pieces=tuple(pieces),
        merge=merge,
        sharded=shard is not None,
        time_split=(len(times) > 1) or (window is not None and len(window.windows) > 1),
        notes=tuple(notes),
    )


# --- stage helpers -------------------------------------------------------------------------


def _single(req: QueryRequest, query: str, notes: tuple[str, ...] = ()) -> Plan:
    if req.is_range:
        piece = Piece(query, start_ms=req.start_ms, end_ms=req.end_ms, step_ms=req.step_ms)
    else:
        piece = Piece(query, time_ms=req.time_ms)
    return Plan(request=req, pieces=(piece,), merge=MergeRecipe("passthrough"), notes=notes)


def _whole_query_bounds(req: QueryRequest) -> tuple[int, int]:
    if req.is_range:
        if req.start_ms is None or req.end_ms is None:
            raise ValueError("a range query needs start_ms and end_ms")
        return req.start_ms, req.end_ms
    if req.time_ms is None:
        raise ValueError("an instant query needs time_ms")
    return req.time_ms, req.time_ms


def _pin(expr: Expr, start_ms: int, end_ms: int) -> Expr:
    """`@ start()` / `@ end()` -> absolute milliseconds of the whole query."""

    def pin(node: Expr) -> Expr:
        if isinstance(node, Selector | Subquery) and node.at in ("start", "end"):
            return replace(node, at=start_ms if node.at == "start" else end_ms)
        return node

    return transform(expr, pin)


@dataclass(frozen=True)
class _Shard:
    label: str
    mode: str  # "concat" | "aggregate"
    agg: Agg | None = None  # the top aggregation, for mode "aggregate"


def _shard_decision(expr: Expr, settings: PlannerSettings, notes: list[str]) -> _Shard | None:
    """Whether and how to shard `expr` by node, or None (with a note saying why)."""
    if settings.shards < 2:
        return None
    label, why = shard_label_for(expr, settings.shard_labels)
    if label is None:
        notes.append(f"not sharded: {why}")
        return None
    top = unparen(expr)
    if rules.is_shard_local(top, label):
        return _Shard(label, "concat")
    if (
        isinstance(top, Agg)
        and top.op in rules.MERGEABLE_AGGREGATIONS
        and rules.is_shard_local(top.expr, label)
    ):
        if top.op in ("topk", "bottomk"):
            if not isinstance(top.param, Number):
                notes.append(f"not sharded: {top.op} needs a literal k")
                return None
        return _Shard(label, "aggregate", top)
    reasons = list(rules.unshardable_reasons(top, label))
    detail = (
        "; ".join(reasons)
        if reasons
        else (
            f"the expression is neither per-series by {label} nor a mergeable aggregation "
            "of per-series input"
        )
    )
    notes.append(f"not sharded: {detail}")
    return None


def shard_label_for(expr: Expr, shard_labels: Sequence[tuple[str, str]]) -> tuple[str | None, str]:
    """The one shard label of all selectors in `expr` (metric-name regex, first match wins),
    or (None, reason)."""
    found: set[str] = set()
    for sel in selectors(expr):
        name = sel.metric_name
        if name is None:
            return None, "a selector has no plain metric name"
        label = next(
            (lbl for pattern, lbl in shard_labels if _metric_pattern(pattern).fullmatch(name)),
            None,
        )
        if label is None:
            return None, f"no shard label configured for metric {name}"
        found.add(label)
    if not found:
        return None, "no series selectors"
    if len(found) > 1:
        return None, f"selectors resolve to different shard labels {sorted(found)}"
    return found.pop(), ""


@functools.lru_cache(maxsize=128)
def _metric_pattern(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error:
        return re.compile(r"(?!)")  # a broken pattern matches nothing


def _time_pieces(
    req: QueryRequest, expr: Expr, settings: PlannerSettings, notes: list[str]
) -> list[tuple[int, int]]:
    """Time pieces of a range query within the budget; `[(start, end)]` when not split."""
    if not req.is_range:
        return [(0, 0)]  # placeholder: one instant evaluation
    start, end, step = req.start_ms, req.end_ms, req.step_ms
    assert start is not None and end is not None and step is not None
    whole = [(start, end)]
    interval = settings.split_interval_ms
    if interval is None or end - start < settings.min_range_to_split_ms:
        return whole
    if not rules.time_splittable(expr):
        notes.append("not split in time: the query depends on its own start/end/step")
        return whole
    found = _coarsened(
        lambda i: count_pieces(start, end, step, i), interval, settings.max_pieces, notes
    )
    if found is None:
        return whole
    return split_range(start, end, step, found)


def _coarsened(
    count: Callable[[int], int], interval: int, budget: int, notes: list[str]
) -> int | None:
    """The split interval, multiplied as needed to fit `budget` pieces (multiples of an
    epoch-aligned interval stay epoch-aligned); None if even that cannot fit."""
    n = count(interval)
    if n <= budget:
        return interval
    factor = -(-n // max(budget, 1))
    for _ in range(64):
        if count(interval * factor) <= budget:
            notes.append(f"time split coarsened to {interval * factor} ms by max_pieces")
            return interval * factor
        factor *= 2
    notes.append("not split in time: max_pieces")
    return None


def _budgeted_shards(
    shard: _Shard | None,
    other_pieces: int,
    settings: PlannerSettings,
    shard_values: Mapping[str, Sequence[str]],
    notes: list[str],
) -> list[ShardSpec]:
    if shard is None:
        return []
    n = min(settings.shards, settings.max_pieces // max(other_pieces, 1))
    if n < settings.shards:
        notes.append(f"shards reduced from {settings.shards} to {max(n, 1)} by max_pieces")
    if n < 2:
        notes.append("not sharded: max_pieces")
        return []
    values = shard_values.get(shard.label)
    if not values:
        notes.append(f"not sharded: no known values for {shard.label}")
        return []
    specs = make_shards(shard.label, values, n)
    if not specs:
        notes.append(f"not sharded: fewer than two known values for {shard.label}")
    return specs


@dataclass(frozen=True)
class _Window:
    """An instant query cut into sub-windows of its one range selector."""

    expr: Expr  # the pinned query
    call: Call  # the max_over_time / min_over_time call inside it
    op: str  # "max" / "min"
    grouping: tuple[str, ...]
    without: bool
    windows: tuple[tuple[int, int], ...]  # (eval_time_ms, sub_range_ms)

    def with_range(self, range_ms: int) -> Expr:
        arg = self.call.args[0]
        assert isinstance(arg, MatrixSel)
        new_call = replace(self.call, args=(replace(arg, range_ms=range_ms),))
        return transform(self.expr, lambda n: new_call if n is self.call else n)


def _instant_window(
    req: QueryRequest, expr: Expr, settings: PlannerSettings, notes: list[str]
) -> _Window | None:
    """`max_over_time(x[7d])`, `max by (g) (max_over_time(x[7d]))` (and the min forms) at
    time t -> the same query over sub-windows ending at epoch-aligned boundaries, evaluated
    at those boundaries, recombined with max (min). Exact for Prometheus 2 (closed windows;
    a boundary sample is seen by both neighbours, which max/min do not mind) and 3
    (left-open windows, no overlap). Not for sum/count/avg/rate: the boundary semantics
    differ between versions, and rate extrapolates."""
    interval = settings.split_interval_ms
    if not settings.split_instant_windows or interval is None or req.time_ms is None:
        return None
    top = unparen(expr)
    grouping: tuple[str, ...] = ()
    without = True  # bare function: keep every label
    call = top
    if isinstance(top, Agg):
        call = unparen(top.expr)
        grouping, without = (top.grouping or ()), top.without
    if not isinstance(call, Call) or call.func not in _WINDOW_FUNCS:
        return None
    op = _WINDOW_FUNCS[call.func]
    if isinstance(top, Agg) and top.op != op:
        return None
    (arg,) = call.args
    if not isinstance(arg, MatrixSel) or arg.selector.at is not None:
        return None
    if arg.range_ms < settings.min_range_to_split_ms or arg.range_ms <= interval:
        return None
    t, offset, rng = req.time_ms, arg.selector.offset_ms, arg.range_ms
    found = _coarsened(
        lambda i: count_windows(t, offset, rng, i), interval, settings.max_pieces, notes
    )
    if found is None:
        return None
    windows = split_window(t, offset, rng, found)
    if len(windows) < 2:
        return None
    return _Window(expr, call, op, grouping, without, tuple(windows))


def _merge_recipe(shard: _Shard | None, window: _Window | None, n_pieces: int) -> MergeRecipe:
    if window is not None:
        return MergeRecipe(
            "aggregate",
            op=cast(AggOp, window.op),
            grouping=window.grouping,
            without=window.without,
            combine_time=True,
        )
    if n_pieces == 1:
        return MergeRecipe("passthrough")
    if shard is None or shard.mode == "concat":
        return MergeRecipe("concat")
    agg = shard.agg
    assert agg is not None
    param = None
    if agg.op in ("topk", "bottomk"):
        assert isinstance(agg.param, Number)
        param = agg.param.value
    return MergeRecipe(
        "aggregate",
        op=cast(AggOp, agg.op),  # a MERGEABLE_AGGREGATIONS member
        grouping=agg.grouping or (),
        without=agg.without,
        param=param,
    )
