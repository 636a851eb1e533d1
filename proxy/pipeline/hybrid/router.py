"""Hybrid fleets: which backend answers what, per request.

`shardplanner/routing.py` decides, purely, which backend(s) hold what a piece reads at each
evaluation timestamp. This module turns that into per-request state for the executor:

- `Router`: built once per request from the configured holdings (resolved against the
  clock rounded down to the minute, so routes, and so cache keys, stay stable between
  refreshes), and never changed after: `range_route` / `instant_route` / `route_of` route
  the request's query over any stretch of its step grid (a piece, a cache cell) and hand the
  route back (a unit carries it, and so its fetch); results are memoised per request. The query
  routed is the planner's pinned query, not a piece's text: shard matchers and avg's
  sum/count roles do not change what a piece reads. Instant-window pieces
  (`MergeRecipe.combine_time`) read different ranges and are routed by their own text.
- `route_id`: the backend part of a cache key: names *and* URLs of the backends a route
  uses, and its time parts, so a piece fetched from AMP never answers for the local
  Prometheus, nor a merged overlap for one backend alone.
- `edge_ms`: how far an unmarked gap in one backend spoils that backend's values next to
  it (lookback + the longest range the query reads): `proxy/result/overlap.py` takes values from
  the other backend within that distance of a gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from shardplanner.ast import Expr
from shardplanner.holdings import BackendHolding
from shardplanner.plan import Span
from shardplanner.read_windows import DEFAULT_LOOKBACK_MS
from shardplanner.routing import Route, route_piece

from ...errors import PromError

if TYPE_CHECKING:
    from ...backends import Backend

ROUTE_CLOCK_MS = 60_000


def holdings_of(backends: Sequence[Backend], now_ms: int) -> list[BackendHolding]:
    """Every backend's holdings, against `now_ms` rounded down to the minute."""
    now = now_ms - now_ms % ROUTE_CLOCK_MS
    out: list[BackendHolding] = []
    for b in backends:
        out.extend(b.cfg.holdings(now))
    return out


def route_id(route: Route, urls: Mapping[str, str]) -> str:
    """Route key with each backend's URL: `single:local=http://...`, `overlap:...`."""
    def who(names: Sequence[str]) -> str:
        return "+".join(f"{n}={urls[n]}" for n in names)

    if route.kind == "single":
        return who(route.backends)  # the same string as a one-backend promaccel's keys
    if route.kind == "overlap":
        return "overlap:" + who(route.backends)
    if route.kind == "split_time":
        return "split:" + ",".join(f"{who(p.backends)}@{p.start_ms}-{p.end_ms}" for p in route.parts)
    raise ValueError("an unroutable route has no id")


@dataclass(frozen=True, eq=False)
class Router:
    """Routes for one request (see the module docstring). Immutable: what it decides is handed
    back (`route_of` gives a unit its route id *and* route, which the unit and its fetch
    carry), never written into it, so the same router may be shared by every stage and
    subquery of a request. The memo is a cache of a pure function: it never changes an answer."""

    holdings: tuple[BackendHolding, ...]
    query: Expr | str
    lookback_ms: int
    urls: Mapping[str, str]
    # Route instant-window pieces by their own text (`MergeRecipe.combine_time`).
    by_piece: bool = False
    # The overlap merge's edge (lookback + the longest range read); None: the lookback.
    edge_ms: int | None = None
    # The request spans several backends: a backend that is down costs its part of the
    # answer (with a warning), not the whole answer.
    partial_ok: bool = False
    # Holdings added for this request (`with_holdings`): names no store has.
    extra: tuple[BackendHolding, ...] = ()
    _memo: dict[tuple[object, ...], tuple[Expr | str, Route]] = field(
        default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        lookback = self.lookback_ms or DEFAULT_LOOKBACK_MS
        object.__setattr__(self, "holdings", tuple(self.holdings))
        object.__setattr__(self, "lookback_ms", lookback)
        object.__setattr__(self, "urls", MappingProxyType(dict(self.urls)))
        object.__setattr__(self, "edge_ms", lookback if self.edge_ms is None else self.edge_ms)
        object.__setattr__(self, "extra", tuple(self.extra))

    @property
    def edge(self) -> int:
        """`edge_ms`, always set (`__post_init__` fills in the lookback)."""
        assert self.edge_ms is not None
        return self.edge_ms

    def with_holdings(self, extra: Sequence[BackendHolding]) -> Router:
        """The same request routed with `extra` holdings as well (a new memo: other holders)."""
        return replace(self, holdings=(*self.holdings, *extra), extra=(*self.extra, *extra))

    def spanning(self, partial_ok: bool) -> Router:
        """The same routes, with `partial_ok` set (the memo shared: the holdings are the same)."""
        out = replace(self, partial_ok=partial_ok)
        object.__setattr__(out, "_memo", self._memo)
        return out

    def range_route(self, start_ms: int, end_ms: int, step_ms: int, query: Expr | str | None = None) -> Route:
        return self._route(query, start_ms, end_ms, step_ms)

    def instant_route(self, time_ms: int, query: Expr | str | None = None) -> Route:
        return self._route(query, time_ms, time_ms, None)

    def route_of(self, piece_query: str, span: Span) -> tuple[str, Route]:
        """The route id and route of a piece (text `piece_query`) over `span` (a 422 if nobody
        holds it): the request's query is routed, or the piece's own text (`by_piece`)."""
        q = piece_query if self.by_piece else None
        if span.is_range:
            r = self.range_route(span.start_ms, span.end_ms, span.step, q)
        else:
            r = self.instant_route(span.time_ms, q)
        return self.id(self.checked(r)), r

    def _route(self, query: Expr | str | None, start_ms: int, end_ms: int, step_ms: int | None) -> Route:
        q = self.query if query is None else query
        # An expression is keyed by its identity, and the memo keeps it alive: a freed
        # expression's id can be reused by the next one made (CrossStore routes short-lived
        # variants, one per metric name), which would be handed the freed one's route.
        key = (q if isinstance(q, str) else id(q), start_ms, end_ms, step_ms)
        found = self._memo.get(key)
        if found is None:
            found = (q, route_piece(q, start_ms, end_ms, self.holdings, self.lookback_ms, step_ms=step_ms))
            self._memo[key] = found
        return found[1]

    def checked(self, route: Route) -> Route:
        if route.kind == "unroutable":
            raise PromError("execution", route.reason)
        return route

    def id(self, route: Route) -> str:
        return route_id(route, self.urls)
