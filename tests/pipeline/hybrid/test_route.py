"""The Route stage (`proxy/pipeline/hybrid/route.py`) with a fake next stage: a single-backend
fleet passes through; a hybrid query is routed (`router_for`, `whole_route`) and one no single
backend answers goes to CrossStore. Moved from tests/pipeline/test_pipeline_stages.py (its
helpers are shared from there)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxy.errors import PromError
from proxy.pipeline.hybrid.route import Route, goes_cross_store, merges, router_for, whole_route
from proxy.pipeline.planning import Planner
from proxy.pipeline.values import Answer, Query
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest
from tests.pipeline.stage_helpers import T0, FakeBackend, Recorder, config, range_query, run


def test_route_passes_single_backend_queries_through() -> None:
    rec, cross = Recorder(), Recorder()
    q = replace(range_query("up"), plan=run(Planner(config(), FakeBackend()).plan(range_query("up").req)))
    run(Route([FakeBackend()], rec, cross)(q))  # type: ignore[list-item]
    assert rec.got == [q] and cross.got == []


def hybrid_config() -> Any:
    from proxy.config import build_config

    return build_config({
        "backends": [
            {"name": "local", "url": "http://127.0.0.1:1", "holds": {"metrics": ["node_.*"]}},
            {"name": "amp", "url": "http://127.0.0.1:2", "holds": {"metrics": ["DCGM_.*"]}},
        ],
        "cache": {"enabled": False},
    })


def test_route_sends_a_join_across_stores_to_cross_store_which_evaluates_above_them() -> None:
    from proxy.backends import Backend
    from proxy.pipeline.crossstore import CrossStore

    cfg = hybrid_config()
    backends = [Backend(b) for b in cfg.backends]
    planner = Planner(cfg, backends[0])
    q = Query(req=QueryRequest.instant("sum(DCGM_FI_DEV_GPU_UTIL) + sum(node_load1)", T0), pairs=[],
              path="/api/v1/query", timeout_s=5)
    q = replace(q, plan=run(planner.plan(q.req)))
    asked: list[tuple[str, str]] = []

    def per_store(sub: Query) -> Answer:
        assert sub.router is not None and sub.plan is not None
        route = sub.router.instant_route(T0)
        asked.append((sub.req.query, route.backend))
        value = 2.0 if "DCGM" in sub.req.query else 3.0
        return Answer(result=QueryResult.from_series("vector", [({}, [T0], [value])]))

    planned = Recorder()
    cross = CrossStore(planner, backends, Recorder(per_store))
    answer = run(Route(backends, planned, cross)(q))
    assert planned.got == []  # no single backend holds both metrics
    assert sorted(asked) == [("sum(DCGM_FI_DEV_GPU_UTIL)", "amp"), ("sum(node_load1)", "local")]
    assert answer.result is not None and answer.result.to_pylist() == [({}, [T0], [5.0])]
    assert answer.headers["X-Promaccel-Pieces"] == "2"
    # What promaccel cannot evaluate above the stores is a 422 naming them, never a guess.
    q2 = Query(req=QueryRequest.instant("sum(DCGM_FI_DEV_GPU_UTIL) / sum(node_load1)", T0), pairs=[("stats", "all")],
               path="/api/v1/query", timeout_s=5)  # query stats need one backend
    q2 = replace(q2, plan=run(planner.plan(q2.req)))
    with pytest.raises(PromError) as err:
        run(Route(backends, planned, cross)(q2))
    assert err.value.kind == "execution" and "amp" in str(err.value.body()) and "local" in str(err.value.body())


def test_router_for_routes_the_whole_query_by_its_holders() -> None:
    from proxy.backends import Backend

    cfg = hybrid_config()
    backends = [Backend(b) for b in cfg.backends]
    planner = Planner(cfg, backends[0])
    for query, want in (("sum(node_load1)", "local"), ("sum(DCGM_FI_DEV_GPU_UTIL)", "amp")):
        req = QueryRequest.instant(query, T0)
        plan = run(planner.plan(req))
        whole = whole_route(router_for(backends, req, plan), req)
        assert (whole.kind, whole.backends) == ("single", (want,))
        assert not merges(whole) and not goes_cross_store(whole, plan.expr)
    req = QueryRequest.instant("sum(DCGM_FI_DEV_GPU_UTIL) + sum(node_load1)", T0)
    plan = run(planner.plan(req))
    whole = whole_route(router_for(backends, req, plan), req)
    assert whole.kind == "unroutable" and goes_cross_store(whole, plan.expr)
