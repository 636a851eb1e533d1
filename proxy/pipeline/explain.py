"""/api/v1/explain: the query path run with a recorder instead of backends.

`QueryService.explain` runs a query through the very stages a query runs through (path.py),
with an `Explanation` on its context (`RequestContext.explain`). Each stage that decides
something notes it there as it goes -- the plan (Plan), the route (Route), the cross-store
tree and its subqueries (CrossStore), each piece's cache status (Lookup), the backend calls
the misses would take (Coalesce) -- and the leaf (FanOut) makes no call: it answers nothing,
so the stages above merge and evaluate nothing either. Explain therefore cannot disagree with
what the path does: it is the path.

The document: `shardplanner.explain.explain(plan)` (pieces, shards, time split, merge), with
each piece's `cache` status (and `route`, `cache_unit`, `day_cell`), `fetches` and `cache`
counts; for a hybrid fleet `route` (kind, backends, parts, notes, the stores that hold
nothing for the window); for a query evaluated across stores `cross_store`, the tree
(`{"subquery": ...}` leaves, `{"evaluate": ...}` above them: `crossstore.tree_data`), whose subqueries are described
like a whole query. A query the path refuses for its route has `route.kind` "unroutable" and
the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardplanner.explain import explain as explain_plan
from shardplanner.explain import unheld_reads
from shardplanner.plan import Plan, QueryRequest
from shardplanner.routing import Route as PieceRoute

from .hybrid.router import Router

if TYPE_CHECKING:
    from .units import Slot


class Explanation:
    """What the stages decided for one query (or one subquery of a cross-store query)."""

    def __init__(self, cache_enabled: bool) -> None:
        self.cache_enabled = cache_enabled
        self.data: dict[str, Any] = {}

    def planned(self, plan: Plan) -> None:
        """The Plan stage's plan (CrossStore's, for a subquery)."""
        self.data.update(explain_plan(plan))

    def routed(self, router: Router, whole: PieceRoute, plan: Plan, req: QueryRequest) -> None:
        """The Route stage's route of the whole query (CrossStore's of a subquery)."""
        self.data["route"] = route_data(whole, unheld(router, whole, plan.expr, req))

    def unroutable(self, reason: str) -> None:
        """The path refuses the query for its route: the answer would be this 422."""
        self.data["route"].update(kind="unroutable", reason=reason)

    def looked_up(self, slots: Sequence[Slot]) -> None:
        """The Lookup stage's slots, one per planned piece: each one's cache status."""
        for d, s in zip(self.data.get("pieces", ()), slots):
            d["cache"] = s.status
            if s.unit.route:
                d["route"] = s.unit.routed.key() if s.unit.routed is not None else s.unit.route
            if s.unit.key is not None and s.unit.is_range and (s.unit.start_ms, s.unit.end_ms) != (
                    s.piece.start_ms, s.piece.end_ms):
                d["cache_unit"] = [s.unit.start_ms, s.unit.end_ms]
            if s.day is not None:
                d["day_cell"] = [s.day.start_ms, s.day.end_ms]
        self.data["cache"] = {
            "enabled": self.cache_enabled,
            "hits": sum(1 for s in slots if s.status == "hit"),
            "misses": sum(1 for s in slots if s.status == "miss"),
            "uncacheable": sum(1 for s in slots if s.status == "uncacheable"),
        }

    def coalesced(self, fetches: int) -> None:
        """The Coalesce stage's backend calls for the pieces not cached."""
        self.data["fetches"] = fetches

    def cross_store(self, tree: dict[str, Any], described: Sequence[dict[str, Any]], pieces: int,
                    backends: list[str]) -> None:
        """CrossStore's tree as explain shows it (`crossstore.tree_data`), with the subqueries
        `described` in it (`subquery()` of each one's explanation). The whole query's own
        pieces are not what runs; the subqueries' pieces are (X-Promaccel-Pieces counts them)."""
        route = self.data["route"]
        if route["kind"] == "unroutable":
            route["notes"] = [*route["notes"], "no single backend holds everything the query reads: each "
                              "subquery in cross_store runs where its data is, promaccel evaluates the operators "
                              "above them"]
            route.update(kind="cross_store", reason=None, parts=[], backends=backends)
        self.data.update(pieces=[], piece_count=pieces, time_pieces=[], shards=[], sharded=False,
                         time_split=False, cross_store=tree,
                         fetches=sum(d["fetches"] for d in described))
        cache = {"enabled": self.cache_enabled, "hits": 0, "misses": 0, "uncacheable": 0}
        for d in described:
            for k in ("hits", "misses", "uncacheable"):
                cache[k] += d["cache"][k]
        self.data["cache"] = cache

    def subquery(self) -> dict[str, Any]:
        """A subquery's description in a cross-store tree."""
        d = self.data
        out: dict[str, Any] = {k: d[k] for k in ("query", "route", "type", "time_ms", "sharded", "time_split", "merge",
                                 "piece_count", "pieces") if k in d}
        out["fetches"] = d.get("fetches", 0)
        out["cache"] = d.get("cache", {"enabled": self.cache_enabled, "hits": 0, "misses": 0, "uncacheable": 0})
        return out

    def document(self) -> dict[str, Any]:
        """The explain document (a query with nothing to fetch has 0 fetches)."""
        self.data.setdefault("fetches", 0)
        self.data.setdefault("cache", {"enabled": self.cache_enabled, "hits": 0, "misses": 0, "uncacheable": 0})
        return self.data


def route_data(route: PieceRoute, unheld: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`unheld`: the reads a routed store holds nothing of (`unheld_reads`), each also a note."""
    unheld = unheld or []
    return {"kind": route.kind, "backends": list(route.backends),
            "parts": [[p.start_ms, p.end_ms, list(p.backends)] for p in route.parts],
            "reason": route.reason or None, "notes": [*route.notes, *(u["note"] for u in unheld)],
            "unheld": unheld}


def unheld(router: Router, route: PieceRoute, expr: Any, req: QueryRequest) -> list[dict[str, Any]]:
    """The reads of `req` that a store `route` sends them to holds nothing of (explain only:
    the answer is right, empty there, and carries no warning)."""
    if expr is None:  # not parsed: its reads are unknown
        return []
    return unheld_reads(expr, route, router.holdings, req.span.start_ms, req.span.end_ms, router.lookback_ms)
