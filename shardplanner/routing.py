"""Which backend holds the data a piece reads: routing for hybrid fleets. Pure.

During a migration to AMP each backend holds some metrics for some time window. A piece can
be answered by a backend only if that backend holds *every* sample the piece reads, so the
unit of routing is the piece's read windows, not its evaluation range:

    reads("rate(x[5m]) offset 1h", 10:00, 11:00)  ->  [("x", 08:55, 10:00)]

Semantics, decided once here (the executor just follows the `Route`):

- A holding (`holdings.py`) is a closed window `[since_ms, until_ms]` (None: unbounded) of the metrics whose
  names fully match one of its patterns; `"*"` holds every metric, and is the only pattern
  that serves a selector without a fixed metric name (`{__name__=~"DCGM_.*"}`).
- Data no backend holds at a time does not exist (like data past retention): a read only has
  to be covered where *some* backend holds its metric. So with one local Prometheus holding
  the last 15 d, a 30 d panel still routes to it, as it would without promaccel. A metric
  that no backend's patterns name at all is a configuration gap: `unroutable`, never a
  silently empty answer.
- The decision is made per evaluation timestamp of the step grid and depends only on that
  timestamp (not on how the planner cut the query into pieces): a timestamp goes to every
  backend that holds all its reads. So the same dashboard point gets the same answer whatever
  the split interval, the panel width or the cache state.
    one backend          -> `single`
    several backends     -> `overlap` (the migration overlap: query all, merge per series,
                            dedupe, fill gaps, prefer the first backend listed)
    changes along range  -> `split_time`: step-grid-aligned parts, each with its own backends
    nobody, somewhere    -> `unroutable`, with a message naming metrics, backends and times
  A timestamp whose reads nobody holds at all (before every retention) goes to one backend,
  the preferred one among those whose patterns name every metric read: no pointless overlap.
- A read window is never split across backends: at a boundary where local starts exactly
  where AMP stops, the timestamps whose 5 m lookback straddles it are unroutable. Windows
  that overlap by at least the longest lookback/range (true for one metric under "AMP since
  D" + "local last 15 d") have no such timestamps for single-metric queries; a join of a
  metric held by both with one held only by local still has them in the first lookback of
  local's window (the older samples of the one are in AMP only, the other is in local only).

Because a timestamp's route does not depend on the piece, the executor may route the pinned
query once over the whole request (`route_piece(expr, start, end, ..., step_ms=step)`) and
give each planner piece the parts it overlaps: shard matchers and avg's sum/count roles do
not change what a piece reads. (Instant-window pieces, `split_instant_windows`, read
different ranges: route those one by one, e.g. with `route(piece, holdings)`.)

Windows are closed and in integer ms; a sample exactly at `eval - lookback` is counted as
read (Prometheus 2 includes it, Prometheus 3 does not): conservative either way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from shardplanner.ast import (
    Agg,
    At,
    Binary,
    Call,
    Expr,
    MatrixSel,
    Selector,
    Subquery,
    children,
    selectors,
)
from shardplanner.holdings import ALL_METRICS, BackendHolding, fmt_time
from shardplanner.plan import Piece
from shardplanner.promql import CannotParse, parse
from shardplanner.serialize import to_promql
from shardplanner.timesplit import first_grid_point_at_or_after

__all__ = [
    "DEFAULT_LOOKBACK_MS",
    "Placement",
    "Read",
    "Route",
    "RouteKind",
    "TimePart",
    "partition_window",
    "reads",
    "route",
    "route_piece",
    "served_segments",
]

DEFAULT_LOOKBACK_MS = 300_000


# --- what a query reads --------------------------------------------------------------------


class Read(NamedTuple):
    """One selector's samples: metric name (None: picked by regex or not at all) and the
    closed sample-time window `[from_ms, to_ms]` it may touch."""

    metric: str | None
    from_ms: int
    to_ms: int


@dataclass(frozen=True)
class _Shape:
    """A selector's read window as a function of the evaluation range [a, b]:
    `[a + lo_ms, b + hi_ms]`, or the fixed `pinned` window when `@` fixes its times.
    `name`: one of the names of a selector that names its metrics as a literal alternation
    (`{__name__=~"a|b"}` reads a and b: one shape each)."""

    selector: Selector
    lo_ms: int
    hi_ms: int
    pinned: tuple[int, int] | None
    name: str | None = None

    @property
    def metric(self) -> str | None:
        return self.name if self.name is not None else self.selector.metric_name

    @property
    def text(self) -> str:
        if self.selector == _UNPARSED:
            return "the query (not parsed: it may read any metric)"
        return to_promql(self.selector)

    def window(self, a: int, b: int) -> tuple[int, int]:
        return self.pinned if self.pinned is not None else (a + self.lo_ms, b + self.hi_ms)


# Stands in for every selector of a query the planner cannot parse.
_UNPARSED = Selector(None)


def _shapes(expr: Expr, start_ms: int, end_ms: int, lookback_ms: int) -> list[_Shape]:
    """Every selector's read shape, in print order. `@ start()` / `@ end()` resolve to
    `start_ms` / `end_ms` (the planner pins them to the whole query's before splitting)."""

    def at_ms(at: At) -> int | None:
        if at == "start":
            return start_ms
        if at == "end":
            return end_ms
        return at

    out: list[_Shape] = []

    # Evaluation times of `node`: [a + lo, b + hi] for the range [a, b], or `pin` when fixed.
    def rec(node: Expr, lo: int, hi: int, pin: tuple[int, int] | None) -> None:
        match node:
            case Selector():
                _read(node, lookback_ms, lo, hi, pin)
            case MatrixSel():
                _read(node.selector, node.range_ms, lo, hi, pin)
            case Subquery():
                # Inner steps lie in [t - offset - range, t - offset] (aligned to the
                # subquery step inside it; the bound is what matters here).
                o, r = node.offset_ms, node.range_ms
                at = at_ms(node.at)
                if at is not None:
                    pin = (at - o - r, at - o)
                elif pin is not None:
                    pin = (pin[0] - o - r, pin[1] - o)
                rec(node.expr, lo - o - r, hi - o, pin)
            case _:
                for child in children(node):
                    rec(child, lo, hi, pin)

    def _read(sel: Selector, span: int, lo: int, hi: int, pin: tuple[int, int] | None) -> None:
        o = sel.offset_ms
        at = at_ms(sel.at)
        if at is not None:
            pin = (at - o - span, at - o)
        elif pin is not None:
            pin = (pin[0] - o - span, pin[1] - o)
        names = listed_names(sel)
        for name in names or (None,):
            out.append(_Shape(sel, lo - o - span, hi - o, pin, name))

    rec(expr, 0, 0, None)
    return out


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def listed_names(sel: Selector) -> tuple[str, ...]:
    """The metrics a nameless selector reads when its `__name__` matcher is a literal list,
    `{__name__=~"a|b|c"}` (PromQL regexes are anchored: exactly a, b and c); `()` otherwise."""
    if sel.metric_name is not None or sel.or_matchers:
        return ()
    regexes = [m for m in sel.matchers if m.name == "__name__"]
    if len(regexes) != 1 or regexes[0].op != "=~":
        return ()
    names = regexes[0].value.split("|")
    if not all(_METRIC_NAME.fullmatch(n) for n in names):
        return ()
    return tuple(dict.fromkeys(names))


def reads(
    expr: Expr | str,
    eval_start_ms: int,
    eval_end_ms: int,
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
) -> list[Read]:
    """The samples each selector of `expr` may read when it is evaluated at every time in
    `[eval_start_ms, eval_end_ms]` (an instant query: both the same). One `Read` per selector,
    in print order (a metric read twice appears twice).

        x                         [s, e] -> ("x", s - lookback, e)
        rate(x[1h] offset 1d)     [s, e] -> ("x", s - 1d - 1h, e - 1d)
        max_over_time(x[10m:1m])  [s, e] -> ("x", s - 10m - lookback, e)
        x @ 1000 offset 5m        [s, e] -> ("x", 1000 - 5m - lookback, 1000 - 5m)  (any s, e)
        {__name__=~"DCGM_.*"}     [s, e] -> (None, s - lookback, e)

    Raises `CannotParse` for a query string the planner cannot read.
    """
    if eval_end_ms < eval_start_ms:
        raise ValueError(f"eval_end_ms {eval_end_ms} is before eval_start_ms {eval_start_ms}")
    node = parse(expr) if isinstance(expr, str) else expr
    return [
        Read(s.metric, *s.window(eval_start_ms, eval_end_ms))
        for s in _shapes(node, eval_start_ms, eval_end_ms, lookback_ms)
    ]


# --- routes --------------------------------------------------------------------------------

RouteKind = Literal["single", "overlap", "split_time", "unroutable"]


@dataclass(frozen=True)
class TimePart:
    """Evaluation times `start_ms..end_ms` (grid points of the piece's step grid) go to
    `backends`: one backend, or several to be queried and merged like an `overlap`."""

    start_ms: int
    end_ms: int
    backends: tuple[str, ...]

    @property
    def backend(self) -> str:
        """The preferred backend (the only one unless this part is an overlap)."""
        return self.backends[0]


@dataclass(frozen=True)
class Placement:
    """For an unroutable query: a subtree (or one selector) and the backends that could
    answer it alone for the times in question."""

    promql: str
    metrics: tuple[str | None, ...]
    backends: tuple[str, ...]


@dataclass(frozen=True)
class Route:
    """Where a piece goes.

    - `single`: `backends == (name,)`: send the piece as is.
    - `overlap`: `backends` (>= 2, preferred first) each hold everything the piece reads:
      query all, merge per series (dedupe, fill gaps, prefer `backends[0]`'s value).
    - `split_time`: `parts` partition the piece's step grid in time order; run the piece's
      query over each part's `[start_ms, end_ms]` with the piece's step on the part's
      backend(s) and concatenate. `backends`: every backend used, preferred first.
    - `unroutable`: `reason` is the message for the 422 answer; `placements` says which
      backend(s) could answer each side (`operator` names the joining node, if any).
    `notes`: for /api/v1/explain.
    """

    kind: RouteKind
    backends: tuple[str, ...] = ()
    parts: tuple[TimePart, ...] = ()
    reason: str = ""
    placements: tuple[Placement, ...] = ()
    operator: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def single(cls, backend: str) -> Route:
        return cls("single", (backend,))

    @classmethod
    def overlap(cls, backends: Sequence[str]) -> Route:
        return cls("overlap", tuple(backends))

    @classmethod
    def split_time(cls, parts: Sequence[TimePart]) -> Route:
        names = tuple(dict.fromkeys(n for p in parts for n in p.backends))
        return cls("split_time", names, tuple(parts))

    @classmethod
    def unroutable(cls, reason: str) -> Route:
        return cls("unroutable", reason=reason)

    def restrict(self, start_ms: int, end_ms: int) -> Route:
        """This route for the evaluation times `[start_ms, end_ms]` only, e.g. one planner
        piece of a query routed as a whole (its start and end are grid points of the same
        grid). `split_time` keeps the parts that overlap, cut to the range, and collapses
        to `single`/`overlap` when one remains; the other kinds are unchanged."""
        if self.kind != "split_time":
            return self
        parts = [
            TimePart(max(p.start_ms, start_ms), min(p.end_ms, end_ms), p.backends)
            for p in self.parts
            if p.start_ms <= end_ms and start_ms <= p.end_ms
        ]
        if not parts:
            raise ValueError(f"[{start_ms}, {end_ms}] is outside this route's range")
        if len(parts) == 1:
            who = parts[0].backends
            return Route("single" if len(who) == 1 else "overlap", who, notes=self.notes)
        used = {n for p in parts for n in p.backends}
        return Route(
            "split_time",
            tuple(n for n in self.backends if n in used),
            tuple(parts),
            notes=self.notes,
        )

    @property
    def backend(self) -> str:
        """The single (or preferred) backend."""
        if not self.backends:
            raise ValueError(f"an {self.kind} route has no backend: {self.reason}")
        return self.backends[0]

    def key(self) -> str:
        """A short stable string for cache keys and logs:
        `single:amp`, `overlap:local+amp`, `split:amp@0-3540000,local@3600000-7200000`."""
        match self.kind:
            case "single" | "overlap":
                return f"{self.kind}:{'+'.join(self.backends)}"
            case "split_time":
                return "split:" + ",".join(
                    f"{'+'.join(p.backends)}@{p.start_ms}-{p.end_ms}" for p in self.parts
                )
        return "unroutable"


def route_piece(
    piece_query: Expr | str,
    start_ms: int,
    end_ms: int,
    holdings: Sequence[BackendHolding],
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
    *,
    step_ms: int | None = None,
) -> Route:
    """Route one piece: a range piece `[start_ms, end_ms]` on the grid `start_ms + k*step_ms`,
    or an instant piece (`start_ms == end_ms`, `step_ms` None).

    Each evaluation timestamp goes to every backend that holds all it reads (see the module
    docstring); consecutive timestamps with the same backends form one part. Parts are
    step-grid aligned; `end_ms` off the grid is cropped to the last grid point.
    An unparsable query is routed as if it read every metric (only `"*"` holders) over
    `[t - lookback, t]`, with a note: its real reads are unknown.
    """
    if end_ms < start_ms:
        raise ValueError(f"end_ms {end_ms} is before start_ms {start_ms}")
    if step_ms is None:
        if end_ms != start_ms:
            raise ValueError("a range piece needs step_ms")
        step_ms = 1
    elif step_ms <= 0:
        raise ValueError(f"step_ms must be positive, got {step_ms}")
    fleet = _Fleet(holdings)
    notes: list[str] = []
    expr: Expr | None
    if isinstance(piece_query, str):
        try:
            expr = parse(piece_query)
        except CannotParse:
            expr = None
    else:
        expr = piece_query
    if expr is None:
        shapes = [_Shape(_UNPARSED, -lookback_ms, 0, None)]
        notes.append("query not parsed: routed as if it read every metric over the lookback")
    else:
        shapes = _shapes(expr, start_ms, end_ms, lookback_ms)
    if not shapes:
        return Route("single", (fleet.order[0],), notes=(*notes, "reads no series"))

    unheld = _unheld(shapes, fleet)
    if unheld:
        return unheld

    segments = _segments(shapes, fleet, start_ms, end_ms, step_ms)
    for a, b, who in segments:
        if not who:
            return _diagnose(expr, shapes, fleet, a, b, notes)
    if len(segments) == 1:
        who = segments[0][2]
        return Route("single" if len(who) == 1 else "overlap", who, notes=tuple(notes))
    used = {name for _, _, who in segments for name in who}
    return Route(
        "split_time",
        tuple(n for n in fleet.order if n in used),
        parts=tuple(TimePart(a, b, who) for a, b, who in segments),
        notes=tuple(notes),
    )


Segment = tuple[int, int, tuple[str, ...]]


def _segments(shapes: Sequence[_Shape], fleet: _Fleet, start_ms: int, end_ms: int, step_ms: int) -> list[Segment]:
    """The step grid `start_ms + k*step_ms` (to `end_ms`) cut where the backends that hold
    every read change: `(first, last, backends)`, time order; `()` where nobody holds them
    all."""
    last = start_ms + ((end_ms - start_ms) // step_ms) * step_ms
    starts = sorted(
        {start_ms}
        | {
            first_grid_point_at_or_after(start_ms, step_ms, c)
            for c in fleet.critical_times(shapes)
            if start_ms < c <= last
        }
    )
    segments: list[Segment] = []
    for i, a in enumerate(starts):
        b = starts[i + 1] - step_ms if i + 1 < len(starts) else last
        who = fleet.serving(shapes, a)
        if segments and segments[-1][2] == who:
            segments[-1] = (segments[-1][0], b, who)
        else:
            segments.append((a, b, who))
    return segments


def served_segments(
    expr: Expr,
    start_ms: int,
    end_ms: int,
    holdings: Sequence[BackendHolding],
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
    *,
    step_ms: int,
) -> list[Segment]:
    """`route_piece`'s view of a range: the step grid cut into stretches with the same
    backends, `()` for the steps no single backend answers (a read window straddling two
    stores, a join across stores). Cross-store evaluation answers those steps itself and
    routes the rest as usual. `[]` when some metric read is named by no backend."""
    if step_ms <= 0 or end_ms < start_ms:
        raise ValueError("a range needs start <= end and a positive step")
    fleet = _Fleet(holdings)
    shapes = _shapes(expr, start_ms, end_ms, lookback_ms)
    if shapes and _unheld(shapes, fleet):
        return []
    if not shapes:
        return [(start_ms, start_ms + ((end_ms - start_ms) // step_ms) * step_ms, (fleet.order[0],))]
    return _segments(shapes, fleet, start_ms, end_ms, step_ms)


def partition_window(holdings: Sequence[BackendHolding], metric: str | None, lo_ms: int,
                     hi_ms: int) -> list[tuple[str, int, int]]:
    """The closed sample window `[lo_ms, hi_ms]` of `metric` cut among the backends that hold
    it: `(backend, from, to)` in time order, disjoint, each stretch given to the preferred
    backend holding it (the primary where stores overlap). Stretches nobody holds are left
    out: no backend has their samples."""
    fleet = _Fleet(holdings)
    cuts = {lo_ms, hi_ms + 1}
    for name in fleet.order:
        for s, u in fleet.windows(metric, name):
            for c in (s, u + 1):
                if lo_ms < c <= hi_ms:
                    cuts.add(int(c))
    edges = sorted(cuts)
    out: list[tuple[str, int, int]] = []
    for a, nxt in zip(edges, edges[1:]):
        b = nxt - 1
        who = next((n for n in fleet.order
                    if any(s <= a and b <= u for s, u in fleet.windows(metric, n))), None)
        if who is None:
            continue
        if out and out[-1][0] == who and out[-1][2] == a - 1:
            out[-1] = (who, out[-1][1], b)
        else:
            out.append((who, a, b))
    return out


def route(
    piece: Piece, holdings: Sequence[BackendHolding], lookback_ms: int = DEFAULT_LOOKBACK_MS
) -> Route:
    """`route_piece` for a planner `Piece` (range or instant)."""
    span = piece.span
    return route_piece(piece.query, span.start_ms, span.end_ms, holdings, lookback_ms, step_ms=span.step_ms)


# --- the fleet: coverage per backend -------------------------------------------------------

Interval = tuple[float, float]  # closed; -inf / +inf for unbounded
_INF = float("inf")


class _Fleet:
    """Holdings grouped by backend name, in preference order."""

    def __init__(self, holdings: Sequence[BackendHolding]) -> None:
        if not holdings:
            raise ValueError("no backend holdings to route to")
        self.holdings = tuple(holdings)
        rank: dict[str, tuple[int, int, int]] = {}
        for i, h in enumerate(self.holdings):
            mine = (0 if h.primary else 1, -h.priority, i)
            rank[h.name] = min(rank.get(h.name, mine), mine)
        self.order: tuple[str, ...] = tuple(sorted(rank, key=rank.__getitem__))
        self._windows: dict[tuple[str | None, str | None], tuple[Interval, ...]] = {}

    @staticmethod
    def _interval(h: BackendHolding) -> Interval:
        return (
            -_INF if h.since_ms is None else h.since_ms,
            _INF if h.until_ms is None else h.until_ms,
        )

    def windows(self, metric: str | None, name: str | None = None) -> tuple[Interval, ...]:
        """Merged windows in which backend `name` (None: any backend) holds `metric`. For
        a nameless selector, "any backend" means any at all: series matching its regex may be
        anywhere, so only a "*" holder covering all of that time can answer it."""
        key = (metric, name)
        if key not in self._windows:
            self._windows[key] = self._merged(metric, name)
        return self._windows[key]

    def _merged(self, metric: str | None, name: str | None) -> tuple[Interval, ...]:
        spans = sorted(
            self._interval(h)
            for h in self.holdings
            if (name is None or h.name == name)
            and (h.holds_metric(metric) or (name is None and metric is None))
        )
        merged: list[Interval] = []
        for s, u in spans:
            if merged and s <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], u))
            else:
                merged.append((s, u))
        return tuple(merged)

    def clip(self, metric: str | None, lo: int, hi: int) -> Interval | None:
        """The hull of the part of [lo, hi] where some backend holds `metric` (the only part a
        backend must cover: nobody has the rest), or None when nobody holds any of it."""
        parts = [
            (max(lo, s), min(hi, u)) for s, u in self.windows(metric) if max(lo, s) <= min(hi, u)
        ]
        if not parts:
            return None
        return parts[0][0], parts[-1][1]

    def covers(self, name: str, metric: str | None, lo: int, hi: int) -> bool:
        clipped = self.clip(metric, lo, hi)
        if clipped is None:
            return True
        return any(s <= clipped[0] and clipped[1] <= u for s, u in self.windows(metric, name))

    def holders(self, metric: str | None, lo: int, hi: int) -> tuple[str, ...]:
        return tuple(n for n in self.order if self.covers(n, metric, lo, hi))

    def serving(self, shapes: Sequence[_Shape], t: int) -> tuple[str, ...]:
        """Backends that hold every read of evaluation time `t`, preferred first. When
        nobody holds any of it (all before every retention), the preferred backend among
        those whose patterns name every metric read."""
        windows = [(s.metric, *s.window(t, t)) for s in shapes]
        if all(self.clip(m, lo, hi) is None for m, lo, hi in windows):
            named = [n for n in self.order if all(self._names(n, m) for m, _, _ in windows)]
            return ((named or list(self.order))[0],)
        return tuple(
            n for n in self.order if all(self.covers(n, m, lo, hi) for m, lo, hi in windows)
        )

    def _names(self, name: str, metric: str | None) -> bool:
        return any(h.name == name and h.holds_metric(metric) for h in self.holdings)

    def critical_times(self, shapes: Sequence[_Shape]) -> Iterator[int]:
        """Evaluation times at which `serving` may change: where a moving read window's edge
        crosses a holding boundary. Between two of them `serving` is constant."""
        bounds = {h.since_ms for h in self.holdings if h.since_ms is not None}
        bounds |= {h.until_ms + 1 for h in self.holdings if h.until_ms is not None}
        for s in shapes:
            if s.pinned is not None:
                continue
            for v in bounds:
                for edge in (s.lo_ms, s.hi_ms):
                    for d in (-1, 0, 1):
                        yield v - edge + d


def _unheld(shapes: Sequence[_Shape], fleet: _Fleet) -> Route | None:
    """`unroutable` when some selector's metric is named by no backend's patterns."""
    missing: list[_Shape] = []
    for s in shapes:
        if not any(h.holds_metric(s.metric) for h in fleet.holdings):
            if all(s.metric != m.metric for m in missing):
                missing.append(s)
    if not missing:
        return None
    what = []
    for s in missing:
        if s.metric is None:
            what.append(
                f"{s.text} has no fixed metric name and no backend holds "
                f'"{ALL_METRICS}" (only a "{ALL_METRICS}" holding can answer it)'
            )
        else:
            what.append(f"no backend holds metric {s.metric}")
    reason = (
        "cannot route: "
        + "; ".join(what)
        + " ("
        + "; ".join(h.describe() for h in fleet.holdings)
        + ")"
    )
    return Route(
        "unroutable",
        reason=reason,
        placements=tuple(Placement(s.text, (s.metric,), ()) for s in missing),
    )


def _diagnose(
    expr: Expr | None,
    shapes: Sequence[_Shape],
    fleet: _Fleet,
    a: int,
    b: int,
    notes: list[str],
) -> Route:
    """Why evaluation times [a, b] have no backend: a read window no backend covers alone
    (time gap), or reads that different backends hold (a join across stores)."""
    when = f"evaluation times {fmt_time(a)}..{fmt_time(b)}" if a != b else f"evaluation time {fmt_time(a)}"

    # 1. One selector that nobody holds for its whole read window at time a.
    for s in shapes:
        lo, hi = s.window(a, a)
        if fleet.holders(s.metric, lo, hi):
            continue
        wlo, whi = s.window(a, b)
        if s.metric is None:
            holding = "; ".join(h.describe() for h in fleet.holdings)
            reason = (
                f"cannot route {when}: {s.text} has no fixed metric name, so its series may "
                f'be in any backend, and no backend holding "{ALL_METRICS}" covers its whole '
                f"read window {fmt_time(wlo)}..{fmt_time(whi)} ({holding})"
            )
        else:
            holding = "; ".join(
                h.describe() for h in fleet.holdings if h.holds_metric(s.metric)
            )
            reason = (
                f"cannot route {when}: no backend holds {s.metric} for the whole read window "
                f"{fmt_time(wlo)}..{fmt_time(whi)} ({holding}); one evaluation cannot read from two "
                "backends, so their windows must overlap by at least the selector's "
                "lookback/range"
            )
        placement = Placement(s.text, (s.metric,), ())
        return Route("unroutable", reason=reason, placements=(placement,), notes=tuple(notes))

    # 2. Every selector has a home, but no common one: find the node that joins them.
    def servers(node: Expr) -> tuple[str, ...] | None:
        """Backends that could answer `node` alone at time a; None if it reads nothing.
        The whole query's shapes (which carry enclosing subquery offsets) are picked by
        selector identity: a subtree's selectors are the very objects of the whole tree."""
        ids = {id(s) for s in selectors(node)}
        subset = [s for s in shapes if id(s.selector) in ids]
        if not subset:
            return None
        return fleet.serving(subset, a)

    assert expr is not None  # an unparsed query has one "*" read, handled above
    node = expr
    operator: Expr = expr
    while True:
        kids = [(k, servers(k)) for k in children(node)]
        stuck = [k for k, who in kids if who is not None and not who]
        if stuck:
            node = stuck[0]
            continue
        operator = node
        placements = tuple(
            Placement(to_promql(k), _metrics_of(k), who)
            for k, who in kids
            if who is not None
        )
        break

    op = _operator_name(operator)
    sides = "; ".join(
        f"{p.promql} -> {' or '.join(p.backends)}" for p in placements
    )
    metric_homes: dict[str | None, tuple[str, ...]] = {}
    for s in shapes:
        lo, hi = s.window(a, a)
        metric_homes.setdefault(s.metric, fleet.holders(s.metric, lo, hi))
    homes = ", ".join(
        f"{m if m is not None else '(no fixed name)'} in {'/'.join(w)}"
        for m, w in metric_homes.items()
    )
    reason = (
        f"cannot route {when}: no single backend holds every metric the query reads "
        f"({homes}); {op} joins data held by different backends ({sides}); evaluating it "
        "across backends is not supported"
    )
    return Route(
        "unroutable",
        reason=reason,
        placements=placements,
        operator=op,
        notes=tuple(notes),
    )


def _metrics_of(node: Expr) -> tuple[str | None, ...]:
    """Distinct metric names read by `node`, in print order."""
    return tuple(dict.fromkeys(s.metric_name for s in selectors(node)))


def _operator_name(node: Expr) -> str:
    match node:
        case Binary():
            return f'operator "{node.op}"'
        case Agg():
            return f"aggregation {node.op}"
        case Call():
            return f"function {node.func}"
        case Subquery():
            return "subquery"
    return type(node).__name__.lower()
