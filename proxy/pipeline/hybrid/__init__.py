"""Hybrid fleets (several backends, each holding some metrics or time ranges), in one place:

    router.py    Router: which backend(s) hold what a piece reads, per request
    route.py     the Route stage (router_for / whole_route): a query routed, or sent cross-store
    fetch.py     RouteAnswer: a fetch answered by one backend, overlapping ones, or time parts

`shardplanner/routing.py` decides the routes, purely; this package holds the per-request state
and the I/O.
"""
