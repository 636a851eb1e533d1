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
              Shard count: settings.shards, or with settings.auto_shards (`shards: auto`)
                  shards = min(ceil(S / max_samples_per_piece), settings.shards)
              where S is the estimated samples of the largest piece before sharding
              (`estimate_samples`: the metric's real series count -- or, unknown, known
              nodes x series_per_node -- x steps x samples per step), and 1 -- not
              sharded -- when that is below 2 (`_auto_shard_count`).
4. split      range query, settings.split_interval_ms set, range >= min_range_to_split_ms:
              epoch-aligned time pieces on the query's own step grid (`timesplit`); the
              query text is the same for every time piece. Every range query can be cut this
              way once `@ start()/end()` are pinned: each step is evaluated on its own.
              Instant `max_over_time(x[7d])`, `sum_over_time`, `count_over_time`,
              `min_over_time` (and `max by`/`min by`/`sum by` over them) can be cut into
              sub-windows recombined with max/min/sum (settings.split_instant_windows;
              rules and the disjoint sub-windows of sum/count in `_instant_window`).
5. budget     settings.max_pieces: the time split is served first (measured: time pieces
              speed up more than node shards); only if it alone exceeds the budget is its
              interval multiplied (multiples of an epoch-aligned interval stay aligned).
              Shards get what is left: fewer shards, or none. Never fails.
6. estimate   `Plan.estimated_samples`: samples the whole query touches (`estimate_samples`),
              for the executor's `limits.max_samples` guardrail (`samples_limit_message`).

A piece's query is the client's original string unless something was rewritten (pinned,
sharded, windowed); rewritten ASTs are printed with `shardplanner.serialize.to_promql`.
Pieces are ordered by time, then shard index, then role ("sum" before "count").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from shardplanner import regex as _regex
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
    children,
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
    Span,
)
from shardplanner.promql import CannotParse, TooComplex, parse
from shardplanner.serialize import to_promql
from shardplanner.shards import make_shards
from shardplanner.timesplit import (
    count_pieces,
    count_windows,
    day_cells_fit,
    split_range,
    split_range_days,
    split_window,
)

__all__ = ["estimate_samples", "metrics_to_count", "nodes_selected", "plan", "samples_limit_message", "shard_label_for"]

_ROLE_ORDER = ("sum", "count")
# Instant window split: *_over_time function -> (the aggregation that recombines the
# sub-windows' answers exactly, whether the sub-windows must be disjoint). max/min are
# idempotent: a boundary sample seen by two sub-windows does not matter. sum/count are not:
# on closed windows (Prometheus 2) their sub-windows are made disjoint.
_WINDOW_FUNCS = {
    "max_over_time": ("max", False),
    "min_over_time": ("min", False),
    "sum_over_time": ("sum", True),
    "count_over_time": ("sum", True),  # sum of counts
}
# Evaluation interval assumed for a subquery without a step (`x[1h:]`), for estimates only.
_DEFAULT_SUBQUERY_STEP_MS = 60_000


def plan(
    req: QueryRequest,
    settings: PlannerSettings,
    shard_values: Mapping[str, Sequence[str]],
    day_cells_until_ms: int | None = None,
) -> Plan:
    """Plan ``req``. Deterministic: the same inputs give the same plan, piece for piece.
    ``day_cells_until_ms``: whole days of the query that end by then are one time piece each
    (day cells, `timesplit.split_range_days`); the caller derives it from its clock."""
    try:
        expr = parse(req.query, settings.dialect)
    except TooComplex as exc:
        return _single(req, req.query, notes=(f"too complex to plan ({exc}): forwarded unplanned",))
    except CannotParse:
        return _single(req, req.query, notes=("unparsable by planner",))

    pinned = _pin(expr, req.span.start_ms, req.span.end_ms)
    rewritten = pinned != expr
    notes: list[str] = []

    if req.is_range and isinstance(unparen(pinned), MatrixSel | Subquery | String):
        # Prometheus rejects these as range queries: one backend call gives its own error.
        return _single(req, req.query, notes=("not a range-query expression",), expr=pinned)

    shard = _shard_decision(pinned, settings, notes)
    window = _instant_window(req, pinned, settings, notes) if not req.is_range else None
    times, days = _time_pieces(req, pinned, settings, notes, day_cells_until_ms)

    roles: tuple[str | None, ...] = (None,)
    if shard is not None and shard.mode == "aggregate" and shard.agg is not None and shard.agg.op == "avg":
        roles = _ROLE_ORDER
    n_time = len(times) if window is None else len(window.windows)
    steps = req.span.points
    estimate = estimate_samples(pinned, steps, settings, shard_values)
    wanted = settings.shards
    if shard is not None and settings.auto_shards:
        wanted = _auto_shard_count(req, pinned, window, times, settings, shard_values, notes)
    specs = _budgeted_shards(shard, wanted, n_time * len(roles), settings, shard_values, notes)
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
                pieces.append(Piece(to_promql(node), Span.instant(eval_ms), shard=spec, role=role))
    else:
        variants = [(spec, role, text(node)) for spec, role, node in shard_exprs(pinned)]
        for t in times:
            span = req.span.with_bounds(t[0], t[1]) if req.is_range else req.span
            for spec, role, query in variants:
                pieces.append(Piece(query, span, shard=spec, role=role))

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
        estimated_samples=None if estimate is None else estimate[0],
        estimated_series=None if estimate is None else estimate[1],
        expr=pinned,
        day_cells_until_ms=day_cells_until_ms if days else None,
    )


# --- stage helpers -------------------------------------------------------------------------


def _single(req: QueryRequest, query: str, notes: tuple[str, ...] = (), expr: Expr | None = None) -> Plan:
    return Plan(request=req, pieces=(Piece(query, req.span),), merge=MergeRecipe("passthrough"), notes=notes, expr=expr)


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
    agg: Agg | None = None  # the top aggregation ("aggregate"; "concat": a topk/bottomk by the label)


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
        # topk/bottomk by the shard label: whole groups per shard, concatenated; the merge
        # keeps Prometheus's order of an instant answer (per group, by value).
        ordered = top if isinstance(top, Agg) and top.op in ("topk", "bottomk") else None
        return _Shard(label, "concat", ordered)
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
        label = _label_of(name, tuple(map(tuple, shard_labels)))
        if label is None:
            return None, f"no shard label configured for metric {name}"
        found.add(label)
    if not found:
        return None, "no series selectors"
    if len(found) > 1:
        return None, f"selectors resolve to different shard labels {sorted(found)}"
    return found.pop(), ""


@functools.lru_cache(maxsize=4096)
def _label_of(name: str, shard_labels: tuple[tuple[str, str], ...]) -> str | None:
    """The shard label of metric `name` (first whole match), kept per name and configuration:
    every request plans again, for the same few metrics (issue 28, the tiny panel's cost)."""
    return next((lbl for pattern, lbl in shard_labels if _metric_pattern(pattern).fullmatch(name)), None)


def _metric_pattern(pattern: str) -> _regex.Matcher:
    try:
        return _regex.matcher(pattern)
    except _regex.RegexError:
        return _NOTHING  # a broken pattern matches nothing


class _MatchesNothing:
    def fullmatch(self, text: str) -> None:
        return None


_NOTHING = _MatchesNothing()


def _time_pieces(
    req: QueryRequest,
    expr: Expr,
    settings: PlannerSettings,
    notes: list[str],
    day_cells_until_ms: int | None = None,
) -> tuple[list[tuple[int, int]], bool]:
    """Time pieces of a range query within the budget (`[(start, end)]` when not split), and
    whether old days were cut as day cells."""
    if not req.is_range:
        return [(0, 0)], False  # placeholder: one instant evaluation
    start, end, step = req.span.start_ms, req.span.end_ms, req.span.step
    whole = [(start, end)]
    interval = settings.split_interval_ms
    if interval is None or end - start < settings.min_range_to_split_ms:
        return whole, False
    if not rules.time_splittable(expr):
        notes.append("not split in time: the query depends on its own start/end/step")
        return whole, False
    if day_cells_until_ms is not None and day_cells_fit(step, interval, settings.max_points):
        days = split_range_days(start, end, step, interval, day_cells_until_ms, settings.max_pieces)
        # A query that is one whole day stays in hours: one piece would be forwarded whole,
        # in one call (the executor fetches a lone missing day of a planned query as hours).
        if days is not None and len(days) > 1:
            return days, True
    found = _coarsened(
        lambda i: count_pieces(start, end, step, i), interval, settings.max_pieces, notes
    )
    if found is None:
        return whole, False
    return split_range(start, end, step, found), False


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
    wanted: int,
    other_pieces: int,
    settings: PlannerSettings,
    shard_values: Mapping[str, Sequence[str]],
    notes: list[str],
) -> list[ShardSpec]:
    if shard is None or wanted < 2:
        return []
    n = min(wanted, settings.max_pieces // max(other_pieces, 1))
    if n < wanted:
        notes.append(f"shards reduced from {wanted} to {max(n, 1)} by max_pieces")
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
    call: Call  # the *_over_time call inside it
    op: str  # the recombining aggregation: "max" / "min" / "sum"
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
    """An instant query over one long range selector, cut into sub-windows of it that end at
    epoch-aligned multiples of the split interval, each evaluated as an instant query at its
    own end, recombined per output series (MergeRecipe.combine_time):

    =====================================  =========  =========================================
    query (at time t)                      recombine  why exact
    =====================================  =========  =========================================
    max_over_time(x[r])                    max        max of maxes; a boundary sample seen by
    max by/without (g) (max_over_time(..))            two sub-windows does not matter
    min_over_time(x[r]), min by (g) (...)  min        min of mins, likewise
    sum_over_time(x[r])                    sum        sum of sums over DISJOINT sub-windows
    sum by/without (g) (sum_over_time(..))
    count_over_time(x[r])                  sum        sum of counts over disjoint sub-windows
    sum by/without (g) (count_over_time())
    =====================================  =========  =========================================

    Disjoint: Prometheus 2.42 windows are closed, `[t-r, t]`, so adjacent sub-windows would
    share their boundary instant, and the generator's (and real) scrape grids put samples on
    epoch-aligned boundaries. With settings.closed_range_windows every sub-window but the
    oldest starts 1 ms after its older neighbour ends (`timesplit.split_window(disjoint=True)`);
    timestamps are whole milliseconds, so each sample is in exactly one sub-window. Prometheus
    3's left-open windows `(t-r, t]` are disjoint as cut (closed_range_windows=False).

    Not split: the wrappers that are not the recombining aggregation (`count(count_over_time
    (..))` counts series, which sub-windows would count more than once; `sum(max_over_time(..))`
    and the like), avg_over_time and the other *_over_time functions, `rate`/`increase`/`delta`
    (they extrapolate to the window's edges from the first and last sample: not a function of
    sub-window results), a selector with `@`, ranges shorter than min_range_to_split_ms or not
    longer than the split interval, and anything whose sub-window count exceeds max_pieces even
    after coarsening."""
    interval = settings.split_interval_ms
    if not settings.split_instant_windows or interval is None or req.is_range:
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
    op, needs_disjoint = _WINDOW_FUNCS[call.func]
    if isinstance(top, Agg) and (top.op != op or top.param is not None):
        return None
    (arg,) = call.args
    if not isinstance(arg, MatrixSel) or arg.selector.at is not None:
        return None
    if arg.range_ms < settings.min_range_to_split_ms or arg.range_ms <= interval:
        return None
    disjoint = needs_disjoint and settings.closed_range_windows
    if disjoint and interval < 2:
        return None
    t, offset, rng = req.span.time_ms, arg.selector.offset_ms, arg.range_ms
    found = _coarsened(
        lambda i: count_windows(t, offset, rng, i, disjoint=disjoint),
        interval,
        settings.max_pieces,
        notes,
    )
    if found is None:
        return None
    windows = split_window(t, offset, rng, found, disjoint=disjoint)
    if len(windows) < 2:
        return None
    return _Window(expr, call, op, grouping, without, tuple(windows))


# --- samples estimate and auto shard count -------------------------------------------------


def _weighted_selectors(
    node: Expr, per_step: int, settings: PlannerSettings
) -> Iterator[tuple[Selector, int]]:
    """Every selector with the samples it reads per series per evaluation step: 1 for an
    instant selector, range / scrape interval for `x[range]`, times range / step of every
    enclosing subquery."""
    match node:
        case Selector():
            yield node, per_step
        case MatrixSel():
            yield node.selector, per_step * max(1, node.range_ms // settings.scrape_interval_ms)
        case Subquery():
            inner = max(1, node.range_ms // (node.step_ms or _DEFAULT_SUBQUERY_STEP_MS))
            yield from _weighted_selectors(node.expr, per_step * inner, settings)
        case _:
            for child in children(node):
                yield from _weighted_selectors(child, per_step, settings)


def nodes_selected(
    sel: Selector, settings: PlannerSettings, shard_values: Mapping[str, Sequence[str]]
) -> int | None:
    """Known values of the selector's shard label that its own matchers on that label let
    through (all of them without such a matcher); None if unknown."""
    got = _selection(sel, settings, shard_values)
    return None if got is None else got[0]


def _selection(
    sel: Selector, settings: PlannerSettings, shard_values: Mapping[str, Sequence[str]]
) -> tuple[int, int] | None:
    """(nodes the selector keeps, nodes known) of its shard label; None if unknown."""
    label, _ = shard_label_for(sel, settings.shard_labels)
    values = shard_values.get(label) if label is not None else None
    if label is None or not values:
        return None
    snapshot = isinstance(values, tuple)  # the executor's snapshot: the same tuple until refreshed
    known = _count_known_cached(values) if snapshot else _count_known(values)
    groups = tuple(tuple(m for m in g if m.name == label) for g in (sel.or_matchers or (sel.matchers,)))
    if not any(groups):
        return known, known
    return (_count_selected_cached(values, groups) if snapshot else _count_selected(values, groups)), known


def _count_known(values: Sequence[str]) -> int:
    return sum(1 for v in values if v)


_count_known_cached = functools.lru_cache(maxsize=256)(_count_known)


def _count_selected(values: Sequence[str], groups: tuple[tuple[Matcher, ...], ...]) -> int:
    selected: set[str] = set()
    for ms in groups:
        selected.update(v for v in values if v and all(_matches(m, v) for m in ms))
    return len(selected)


# A dashboard repeats `{Hostname=~"$node"}` on every refresh: regexes over thousands of
# label values once per (snapshot, matchers).
_count_selected_cached = functools.lru_cache(maxsize=256)(_count_selected)


def _matches(m: Matcher, value: str) -> bool:
    if m.op in ("=", "!="):
        return (value == m.value) == (m.op == "=")
    try:
        # RE2, as Prometheus: a client regex never runs on a backtracking engine.
        hit = _regex.fullmatch(m.value, value)
    except _regex.RegexError:
        return True  # cannot tell: count it
    return hit == (m.op == "=~")


def estimate_samples(
    expr: Expr,
    steps: int,
    settings: PlannerSettings,
    shard_values: Mapping[str, Sequence[str]],
) -> tuple[int, int] | None:
    """(samples, series) a query touches, estimated; None when it cannot be estimated.

        samples = sum over selectors of  series x steps x per_step

    - nodes: the known values of the selector's shard label (the shard-label snapshot the
      planner gets anyway, so no extra backend call), narrowed by the selector's own matchers
      on that label (`{Hostname=~"gpu-node-00.."}` counts only those nodes);
    - series: the metric's real series count when `settings.series_counts` has it (the proxy
      counts the series a metric has at one instant, cached: `metrics_to_count` says which
      metrics), times nodes / known nodes when the selector keeps only some nodes; otherwise
      nodes x series_per_node (`planner.series_per_node`, default 8: one series per GPU of
      an 8-GPU node for a DCGM metric), the configured guess. Series that churn (a pod's
      series replace each other on one GPU) overlap only briefly, so the series present at
      one instant, not series ever seen, is what bounds the samples;
    - steps: evaluation steps of the query (1 for an instant query);
    - per_step: 1 for an instant selector (one sample per series per step), range / scrape
      interval (`planner.scrape_interval`) for `x[range]`, times range / step of each
      enclosing subquery.

    None when a selector has no plain metric name, no configured shard label, or no known
    label values: the estimate has nothing to stand on, and the guardrail and `shards: auto`
    then leave the query alone. A query with no selectors touches 0 samples."""
    samples = series = 0
    counts = dict(settings.series_counts)
    for sel, per_step in _weighted_selectors(expr, 1, settings):
        selection = _selection(sel, settings, shard_values)
        if selection is None:
            return None
        n_series = _series_selected(sel, *selection, counts, settings)
        series += n_series
        samples += n_series * steps * per_step
    return samples, series


def _series_selected(sel: Selector, nodes: int, known: int, counts: Mapping[str, int],
                     settings: PlannerSettings) -> int:
    """Series of `sel` on `nodes` of the `known` nodes: its metric's real count (spread evenly
    over the known nodes: a selector that keeps 2 nodes of 8 keeps a quarter of the series),
    or the configured guess, nodes x series_per_node, when the count is not known."""
    name = sel.metric_name
    count = counts.get(name) if name is not None and counts else None
    if count is None:
        return nodes * settings.series_per_node
    if nodes >= known:
        return count
    return -(-count * nodes // known)  # rounded up: an estimate that is never 0 for a node with series


def metrics_to_count(req: QueryRequest, settings: PlannerSettings) -> tuple[str, ...]:
    """The metrics whose real series counts `estimate_samples` would use (sorted): the plain
    metric names of the query's selectors that have a configured shard label (the others
    are not estimated at all). () when the query cannot be parsed."""
    try:
        expr = parse(req.query, settings.dialect)
    except (CannotParse, TooComplex):
        return ()
    return tuple(sorted({sel.metric_name for sel in selectors(expr) if sel.metric_name is not None
                         and shard_label_for(sel, settings.shard_labels)[0] is not None}))


def _auto_shard_count(
    req: QueryRequest,
    expr: Expr,
    window: _Window | None,
    times: list[tuple[int, int]],
    settings: PlannerSettings,
    shard_values: Mapping[str, Sequence[str]],
    notes: list[str],
) -> int:
    """`planner.shards: auto`:

        shards = min(ceil(S / max_samples_per_piece), settings.shards)   (1 if that is < 2)

    S is the estimated samples of the largest piece before sharding: the longest time piece
    of a range query (its steps), the longest sub-window of a split instant window, or the
    whole instant query. settings.shards is the cap (`planner.max_parallel` in the executor);
    `_budgeted_shards` then applies max_pieces and `make_shards` the number of known nodes.
    Measured on one small Prometheus, node shards of a query that fits are 0.9-1.5x, so a
    query whose pieces are within the bound is not sharded at all."""
    if window is not None:
        est = estimate_samples(window.with_range(max(r for _, r in window.windows)), 1,
                               settings, shard_values)
    elif req.is_range:
        longest = max(req.span.with_bounds(a, b).points for a, b in times)
        est = estimate_samples(expr, longest, settings, shard_values)
    else:
        est = estimate_samples(expr, 1, settings, shard_values)
    if est is None:
        notes.append("not sharded: auto: no samples estimate (unknown shard-label values)")
        return 1
    per_piece = est[0]
    n = min(-(-per_piece // max(settings.max_samples_per_piece, 1)), settings.shards)
    if n < 2:
        notes.append(
            "not sharded: auto: every piece within max_samples_per_piece "
            f"(about {per_piece} of {settings.max_samples_per_piece} samples)"
        )
        return 1
    notes.append(f"auto: {n} shards for about {per_piece} samples per piece")
    return n


def samples_limit_message(plan: Plan, limit: int) -> str | None:
    """The 422 message when `plan` is estimated to touch more than `limit` samples
    (`limits.max_samples`, 0: no limit); None when within the limit or not estimated."""
    est = plan.estimated_samples
    if not limit or est is None or est <= limit:
        return None
    series = plan.estimated_series or 0
    per_series = f" ({series:,} series x about {est // series:,} samples each)" if series else ""
    return (
        f"the query would touch about {est:,} samples{per_series}, over the limit of "
        f"{limit:,} (limits.max_samples): narrow the query: a shorter time range or range "
        "window, a larger step, or fewer series (a more selective matcher, e.g. on the node "
        "label)"
    )


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
        if shard is not None and shard.agg is not None:  # topk/bottomk by the shard label
            kept = shard.agg
            return MergeRecipe("concat", op=cast(AggOp, kept.op), grouping=kept.grouping or (), without=kept.without)
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
