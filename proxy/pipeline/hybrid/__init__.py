"""Hybrid fleets (several backends, each holding some metrics or time ranges), in one place:

    router.py    Router: which backend(s) hold what a piece reads, per request; immutable: the
                 route of a unit is handed back and carried by the unit and its fetch
    route.py     the Route stage (router_for / whole_route): a query routed, or sent cross-store
    fetch.py     RouteAnswer: a fetch answered by one backend, overlapping ones, or time parts
    warnings.py  the one warning for a backend that did not answer, and the rule for when a
                 failure only makes a backend's data missing (also used by api/metadata.py)

`shardplanner/routing.py` decides the routes, purely; this package holds the per-request state
and the I/O.
"""
