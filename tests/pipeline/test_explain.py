"""Explanation (proxy/pipeline/explain.py): the explain document as the stages note into it --
planned, routed, unroutable, looked_up (small fake slots), coalesced, cross_store, subquery."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proxy.pipeline.explain import Explanation, route_data
from proxy.pipeline.planning import Planner
from shardplanner.routing import Route, TimePart
from tests.pipeline.stage_helpers import T0, FakeBackend, H, config, range_query, run


def planned(hours: int = 3) -> Any:
    q = range_query("rate(up[5m])", hours=hours)
    return run(Planner(config(split_interval="1h"), FakeBackend()).plan(q.req))  # type: ignore[arg-type]


def slot(status: str, start: int, end: int, *, unit: tuple[int, int] | None = None, route: str = "",
         day: tuple[int, int] | None = None, keyed: bool = True) -> Any:
    lo, hi = unit or (start, end)
    return SimpleNamespace(
        status=status, piece=SimpleNamespace(start_ms=start, end_ms=end),
        unit=SimpleNamespace(route=route, routed=None, key=object() if keyed else None, is_range=True,
                             start_ms=lo, end_ms=hi),
        day=SimpleNamespace(start_ms=day[0], end_ms=day[1]) if day else None)


def test_planned_is_the_plans_description() -> None:
    plan = planned(3)
    e = Explanation(cache_enabled=True)
    e.planned(plan)
    doc = e.document()
    assert doc["piece_count"] == 3 and len(doc["pieces"]) == 3 and doc["time_split"] is True
    assert [(p["start_ms"], p["end_ms"]) for p in doc["pieces"]] == [(p.start_ms, p.end_ms) for p in plan.pieces]
    # Nothing looked up or coalesced: none fetched, none cached.
    assert doc["fetches"] == 0 and doc["cache"] == {"enabled": True, "hits": 0, "misses": 0, "uncacheable": 0}


def test_looked_up_notes_each_pieces_status_unit_route_and_day() -> None:
    plan = planned(3)
    e = Explanation(cache_enabled=True)
    e.planned(plan)
    p0, p1, p2 = plan.pieces
    e.looked_up([
        slot("hit", p0.start_ms, p0.end_ms),
        slot("miss", p1.start_ms, p1.end_ms, unit=(T0, T0 + 2 * H), route="amp=x"),
        slot("uncacheable", p2.start_ms, p2.end_ms, keyed=False, day=(T0, T0 + 24 * H)),
    ])
    e.coalesced(2)
    doc = e.document()
    d0, d1, d2 = doc["pieces"]
    assert [d["cache"] for d in doc["pieces"]] == ["hit", "miss", "uncacheable"]
    assert "cache_unit" not in d0 and "route" not in d0  # the unit is the piece, no route
    assert d1["cache_unit"] == [T0, T0 + 2 * H] and d1["route"] == "amp=x"
    assert d2["day_cell"] == [T0, T0 + 24 * H] and "cache_unit" not in d2
    assert doc["cache"] == {"enabled": True, "hits": 1, "misses": 1, "uncacheable": 1}
    assert doc["fetches"] == 2


def test_routed_then_unroutable() -> None:
    plan = planned(1)
    router = SimpleNamespace(holdings=(), lookback_ms=300_000)
    e = Explanation(cache_enabled=False)
    split = Route("split_time", ("prom", "amp"), (TimePart(T0, T0 + H, ("amp",)), TimePart(T0 + H, T0 + 2 * H, ("prom",))),
                  notes=("recent hours from prom",))
    e.routed(router, split, plan, plan.request)  # type: ignore[arg-type]
    route = e.document()["route"]
    assert (route["kind"], route["backends"], route["reason"]) == ("split_time", ["prom", "amp"], None)
    assert route["parts"] == [[T0, T0 + H, ["amp"]], [T0 + H, T0 + 2 * H, ["prom"]]]
    # The router declares no holdings: each part's store holds nothing of `up` -- a read
    # explain shows (answered empty there), each also a note after the route's own.
    assert {(u["backend"], u["metric"]) for u in route["unheld"]} == {("amp", "up"), ("prom", "up")}
    assert route["notes"] == ["recent hours from prom", *(u["note"] for u in route["unheld"])]
    e.unroutable("no backend holds both sides")
    route = e.document()["route"]
    assert route["kind"] == "unroutable" and route["reason"] == "no backend holds both sides"


def test_route_data_lists_unheld_reads_as_notes() -> None:
    data = route_data(Route.single("prom"), [{"note": "prom holds nothing of x", "metric": "x"}])
    assert data["notes"] == ["prom holds nothing of x"] and data["unheld"][0]["metric"] == "x"
    assert route_data(Route.single("prom"))["unheld"] == []


def sub(fetches: int, hits: int, misses: int, query: str) -> dict[str, Any]:
    plan = planned(1)
    e = Explanation(cache_enabled=True)
    e.planned(plan)
    e.data["query"] = query
    e.looked_up([slot("hit", p.start_ms, p.end_ms) for p in plan.pieces][:hits] +
                [slot("miss", p.start_ms, p.end_ms) for p in plan.pieces][:misses])
    e.coalesced(fetches)
    return e.subquery()


def test_subquery_keeps_what_a_cross_store_tree_shows() -> None:
    d = sub(1, 0, 1, "x")
    assert d["query"] == "x" and d["fetches"] == 1 and d["piece_count"] == 1
    assert d["cache"] == {"enabled": True, "hits": 0, "misses": 1, "uncacheable": 0}
    bare = Explanation(cache_enabled=False).subquery()  # a subquery the path noted nothing of
    assert bare == {"fetches": 0, "cache": {"enabled": False, "hits": 0, "misses": 0, "uncacheable": 0}}


def test_cross_store_sums_its_subqueries_and_turns_an_unroutable_route_into_cross_store() -> None:
    plan = planned(1)
    e = Explanation(cache_enabled=True)
    e.planned(plan)
    e.routed(SimpleNamespace(holdings=(), lookback_ms=300_000), Route("unroutable", reason="x on a, y on b",  # type: ignore[arg-type]
                                                                      notes=("a join",)), plan, plan.request)
    e.unroutable("x on a, y on b")
    left, right = sub(1, 0, 1, "x"), sub(2, 1, 0, "y")
    tree = {"evaluate": "x + y", "args": [{"subquery": left}, {"subquery": right}]}
    e.cross_store(tree, [left, right], pieces=2, backends=["a", "b"])
    doc = e.document()
    assert doc["route"]["kind"] == "cross_store" and doc["route"]["reason"] is None
    assert doc["route"]["backends"] == ["a", "b"] and doc["route"]["notes"][0] == "a join"
    assert len(doc["route"]["notes"]) == 2  # and why the subqueries run apart
    assert doc["cross_store"] is tree and doc["pieces"] == [] and doc["piece_count"] == 2
    assert doc["fetches"] == 3 and doc["cache"] == {"enabled": True, "hits": 1, "misses": 1, "uncacheable": 0}


def test_cross_store_keeps_a_routable_route() -> None:
    plan = planned(1)
    e = Explanation(cache_enabled=False)
    e.planned(plan)
    e.routed(SimpleNamespace(holdings=(), lookback_ms=300_000), Route.single("a"), plan, plan.request)  # type: ignore[arg-type]
    e.cross_store({"subquery": {}}, [], pieces=0, backends=["a"])
    assert e.document()["route"]["kind"] == "single" and e.document()["fetches"] == 0
