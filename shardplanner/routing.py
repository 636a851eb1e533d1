"""Which backend holds the data a piece reads: routing for hybrid fleets. Pure.

During a migration to AMP each backend holds some metrics for some time window. A piece can
be answered by a backend only if that backend holds *every* sample the piece reads, so the
unit of routing is the piece's read windows (`read_windows.py`), not its evaluation range:

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from shardplanner.ast import Agg, Binary, Call, Expr, Subquery, children, selectors
from shardplanner.coverage import Fleet
from shardplanner.holdings import ALL_METRICS, BackendHolding, fmt_time
from shardplanner.plan import Piece
from shardplanner.promql import CannotParse, parse
from shardplanner.read_windows import DEFAULT_LOOKBACK_MS, UNPARSED, Shape, read_shapes
from shardplanner.serialize import to_promql
from shardplanner.timesplit import first_grid_point_at_or_after

__all__ = [
    "Placement",
    "Route",
    "RouteKind",
    "Segment",
    "TimePart",
    "route",
    "route_piece",
    "served_segments",
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
    fleet = Fleet(holdings)
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
        shapes = [Shape(UNPARSED, -lookback_ms, 0, None)]
        notes.append("query not parsed: routed as if it read every metric over the lookback")
    else:
        shapes = read_shapes(expr, start_ms, end_ms, lookback_ms)
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


def _segments(shapes: Sequence[Shape], fleet: Fleet, start_ms: int, end_ms: int, step_ms: int) -> list[Segment]:
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
    fleet = Fleet(holdings)
    shapes = read_shapes(expr, start_ms, end_ms, lookback_ms)
    if shapes and _unheld(shapes, fleet):
        return []
    if not shapes:
        return [(start_ms, start_ms + ((end_ms - start_ms) // step_ms) * step_ms, (fleet.order[0],))]
    return _segments(shapes, fleet, start_ms, end_ms, step_ms)

def route(
    piece: Piece, holdings: Sequence[BackendHolding], lookback_ms: int = DEFAULT_LOOKBACK_MS
) -> Route:
    """`route_piece` for a planner `Piece` (range or instant)."""
    span = piece.span
    return route_piece(piece.query, span.start_ms, span.end_ms, holdings, lookback_ms, step_ms=span.step_ms)


def _unheld(shapes: Sequence[Shape], fleet: Fleet) -> Route | None:
    """`unroutable` when some selector's metric is named by no backend's patterns."""
    missing: list[Shape] = []
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
    shapes: Sequence[Shape],
    fleet: Fleet,
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
