"""The hybrid Router memoises routes per request, an expression keyed by its identity. CrossStore
routes short-lived variants of a node (one per metric name, `_name_groups`): a freed variant's
id is soon reused by the next one made, and a memo that did not keep its expressions alive
handed that next variant the freed one's route (a union of names from different stores was
then routed to one store: a 422 "unroutable" for a query explain said answers, now and then)."""

from __future__ import annotations

from proxy.pipeline.hybrid.router import Router
from shardplanner.holdings import BackendHolding
from shardplanner.names import per_series_selector, with_names
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
