"""The hybrid Router (`proxy/pipeline/hybrid/router.py`): immutable (it hands routes back, a
request's router is the same after its query), and it memoises routes per request, an expression keyed by its identity. CrossStore
routes short-lived variants of a node (one per metric name, `_name_groups`): a freed variant's
id is soon reused by the next one made, and a memo that did not keep its expressions alive
handed that next variant the freed one's route (a union of names from different stores was
then routed to one store: a 422 "unroutable" for a query explain said answers, now and then)."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.errors import PromError
from proxy.pipeline.hybrid.router import Router
from shardplanner.holdings import BackendHolding
from shardplanner.names import per_series_selector, with_names
from shardplanner.plan import Span
from shardplanner.promql import parse

HOUR = 3_600_000
HOLDINGS = (BackendHolding("local", ("node_.*",), primary=True), BackendHolding("amp", ("DCGM_.*",)))
URLS = {"local": "http://127.0.0.1:9", "amp": "http://127.0.0.1:9/amp"}


def test_a_freed_variant_s_route_is_never_handed_to_the_next() -> None:
    node = parse('rate({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"}[5m])')
    sel = per_series_selector(node)
    assert sel is not None
    router = Router(HOLDINGS, node, 0, URLS)
    seen: set[int] = set()
    reused = 0
    for i in range(400):
        name = ("DCGM_FI_DEV_GPU_UTIL", "node_load1")[i % 2]
        variant = with_names(node, sel, (name,))  # freed when the next one is made
        reused += id(variant) in seen
        seen.add(id(variant))
        route = router.range_route(0, HOUR, 60_000, variant)
        want = "amp" if name.startswith("DCGM_") else "local"
        assert (route.kind, route.backends) == ("single", (want,)), (i, name, route)
        del variant
    # memoised routes keep their expressions: no id is ever seen twice while the router lives
    assert reused == 0


def _state(router: Router) -> dict[str, object]:
    """Everything a router says about its request (the memo aside: a cache of a pure function)."""
    return {f.name: getattr(router, f.name) for f in dataclasses.fields(router) if f.name != "_memo"}


def test_a_router_is_unchanged_by_the_routes_it_hands_back() -> None:
    """The route of a unit is handed back (and carried by the unit and its fetch), never written
    into the router: the router of a request is the same after a query as before, and cannot
    be changed by a stage."""
    router = Router(HOLDINGS, parse("sum(node_load1) + sum(DCGM_FI_DEV_GPU_UTIL)"), 0, URLS, by_piece=True)
    before = _state(router)
    rid, route = router.route_of("sum(DCGM_FI_DEV_GPU_UTIL)", Span.range(0, HOUR, 60_000))
    assert (route.kind, route.backends) == ("single", ("amp",)) and rid == router.id(route) == "amp=" + URLS["amp"]
    rid, route = router.route_of("sum(node_load1)", Span.instant(HOUR))
    assert (route.kind, route.backends) == ("single", ("local",))
    with pytest.raises(PromError):  # nobody holds both: a 422, and still nothing written
        Router(HOLDINGS, "x", 0, URLS).route_of("sum(node_load1) + sum(DCGM_FI_DEV_GPU_UTIL)", Span.instant(HOUR))
    assert _state(router) == before and not hasattr(router, "routes")
    with pytest.raises(dataclasses.FrozenInstanceError):
        router.partial_ok = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        router.urls["amp"] = "http://elsewhere"  # type: ignore[index]


def test_derived_routers_leave_the_original_as_it_was() -> None:
    router = Router(HOLDINGS, "up", 0, URLS, edge_ms=7)
    assert router.lookback_ms > 0 and router.edge == 7
    spanning = router.spanning(True)
    extra = BackendHolding("amp", ("new_metric",))
    wider = router.with_holdings([extra])
    assert (router.partial_ok, spanning.partial_ok, wider.partial_ok) == (False, True, False)
    assert router.extra == () and wider.extra == (extra,) and wider.holdings == (*HOLDINGS, extra)
    assert router.holdings == HOLDINGS and spanning.edge == wider.edge == 7
    # Routed by the wider holdings only: the original router still has no holder for the name.
    assert wider.instant_route(HOUR, "new_metric").backends == ("amp",)
    assert router.instant_route(HOUR, "new_metric").kind == "unroutable"


def test_a_router_without_an_edge_uses_its_lookback() -> None:
    assert Router(HOLDINGS, "up", 0, URLS).edge == Router(HOLDINGS, "up", 0, URLS).lookback_ms == 300_000
    assert Router(HOLDINGS, "up", 60_000, URLS).edge == 60_000
