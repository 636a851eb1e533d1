"""/api/v1/explain tells the truth: for every corpus query (and the cross-store joins) in every
hybrid topology (tests/hybrid.py: by_time, by_metric, overlap), range and instant, explain and
the query itself agree on whether promaccel answers it.

- The query answers (200): explain's `route.kind` is not "unroutable"; a query evaluated across
  stores shows `route.kind` "cross_store" and the tree (`cross_store`: the subqueries, each with
  its route and pieces, and the operators promaccel evaluates above them), and its piece count
  is the answer's `X-Promaccel-Pieces`.
- The query is refused (422): explain says "unroutable" with the same reason as the answer's
  error. Any other error of a query promaccel answers is PromQL's own: the reference
  Prometheus (`prom`, holding everything) answers the same error.
The demo's topology (DCGM_* in AMP, node metrics for the last hours only in a local Prometheus)
is checked the same way by tests/harness/test_demo.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from proxy.backends import Backend
from proxy.backends.tenancy import NOBODY
from proxy.config import build_config
from proxy.errors import PromError
from proxy.pipeline import QueryService
from proxy.pipeline.context import RequestContext
from shardplanner.plan import QueryRequest, Span
from tests.corpus import QUERIES
from tests.e2e.test_hybrid import INSTANTS, JOINS, RANGES
from tests.hybrid import SCENARIOS, Scenario

TIMEOUT = 180


def agree(url: str, path: str, params: dict[str, str], reference: str) -> dict[str, Any]:
    """Run `params` through `path` and explain on promaccel at `url`; assert they agree on
    whether promaccel answers it. An error of a query promaccel does answer (PromQL's own, such
    as many-to-many matching) must be the reference Prometheus's too. Returns explain's data."""
    answer = httpx.post(url + path, data=params, timeout=TIMEOUT)
    explained = httpx.post(url + "/api/v1/explain", data=params, timeout=TIMEOUT)
    # the answer's status and text first: an assertion's repr is cut in the middle
    where = (answer.status_code, answer.text[:300], path, params)
    assert explained.status_code == 200, (*where, explained.text[:500])
    data = explained.json()["data"]
    route = data.get("route") or {}
    assert route, (*where, "no route in explain")
    if route["kind"] == "unroutable":
        assert answer.status_code == 422, (*where, route)
        assert route["reason"] == answer.json()["error"], (*where, route)
        return dict(data)
    if answer.status_code != 200:
        direct = httpx.post(reference + path, data=params, timeout=TIMEOUT)
        # the same error (its text may name another series: which match group fails first
        # depends on Prometheus's evaluation order, per time piece)
        assert (answer.status_code, answer.json().get("errorType")) == (
            direct.status_code, direct.json().get("errorType")), (*where, route, direct.text[:300])
    elif route["kind"] == "cross_store":
        tree = data["cross_store"]
        # the operators promaccel evaluates, or one subquery (a name regex resolved to one store)
        assert "subquery" in tree or (tree["by"] == "promaccel" and (tree["args"] or tree["reads"])), (*where, tree)
        assert data["piece_count"] == int(answer.headers["X-Promaccel-Pieces"]), (*where, data["piece_count"])
        assert route["backends"] and not route["reason"], (*where, route)
    return dict(data)


def subqueries(tree: dict[str, Any]) -> list[dict[str, Any]]:
    if "subquery" in tree:
        return [tree["subquery"]]
    return [s for a in tree.get("args", []) for s in subqueries(a)]


CASES = [(s, q) for s in SCENARIOS for q in sorted(QUERIES)]


@pytest.mark.prom
@pytest.mark.parametrize(("scenario", "name"), CASES, ids=[f"{s}-{q}" for s, q in CASES])
def test_explain_agrees_with_the_query(prom: Any, hybrid: dict[str, Scenario], scenario: str, name: str) -> None:
    url = hybrid[scenario].proxy.url
    for window in RANGES[scenario]:
        agree(url, "/api/v1/query_range", {"query": QUERIES[name], **window}, prom.url)
    for t in INSTANTS[scenario]:
        agree(url, "/api/v1/query", {"query": QUERIES[name], "time": str(t)}, prom.url)


@pytest.mark.prom
@pytest.mark.parametrize("name", sorted(JOINS))
def test_explain_shows_where_a_join_across_stores_runs(prom: Any, hybrid: dict[str, Scenario], name: str) -> None:
    """by_metric: the joins answer, so explain shows the tree: each subquery on the one store
    that holds its metrics, the joining operator evaluated by promaccel."""
    url = hybrid["by_metric"].proxy.url
    for window in RANGES["by_metric"]:
        data = agree(url, "/api/v1/query_range", {"query": JOINS[name], **window}, prom.url)
        assert data["route"]["kind"] == "cross_store", data["route"]
        assert sorted(data["route"]["backends"]) == ["amp", "local"]
        subs = subqueries(data["cross_store"])
        assert len(subs) >= 2
        for sub in subs:
            assert sub["route"]["kind"] == "single", sub["route"]
            (backend,) = sub["route"]["backends"]
            assert ("DCGM_" in sub["query"]) == (backend == "amp"), sub
            assert sub["piece_count"] == len(sub["pieces"]) > 0
            assert all(p["route"] == f"single:{backend}" for p in sub["pieces"]), sub["pieces"]
    for t in INSTANTS["by_metric"]:
        agree(url, "/api/v1/query", {"query": JOINS[name], "time": str(t)}, prom.url)


# --- in process: the tree explain shows is the one the query path would run ----------------


def _service() -> QueryService:
    """by_metric's holdings over backends nothing listens on: explain and a refusal never call
    a backend."""
    cfg = build_config({
        "backends": [
            {"name": "local", "url": "http://127.0.0.1:9", "primary": True,
             "holds": {"metrics": ["node_.*", "kube_.*", "up"]}},
            {"name": "amp", "url": "http://127.0.0.1:9/amp", "holds": {"metrics": ["DCGM_.*"]}},
        ],
        "planner": {"split_interval": "1h"},
    })
    return QueryService(cfg, [Backend(b) for b in cfg.backends])


RANGE = {"span": Span.range(1_761_955_200_000, 1_761_955_200_000 + 2 * 3_600_000, 60_000)}


def test_explain_of_a_join_is_the_tree() -> None:
    async def go() -> dict[str, Any]:
        return await _service().explain(QueryRequest(query=JOINS["ratio_of_sums"] + " * 2", **RANGE))

    data = asyncio.run(go())
    assert data["route"]["kind"] == "cross_store" and data["route"]["backends"] == ["amp", "local"]
    tree = data["cross_store"]
    assert tree["evaluate"] == "*" and tree["args"][1] == {"number": 2.0}
    ratio = tree["args"][0]
    assert ratio["evaluate"] == "/" and ratio["by"] == "promaccel"
    lhs, rhs = (a["subquery"] for a in ratio["args"])
    assert (lhs["query"], lhs["route"]["backends"]) == ("sum(DCGM_FI_DEV_POWER_USAGE)", ["amp"])
    assert (rhs["query"], rhs["route"]["backends"]) == ("sum(node_load1)", ["local"])
    assert lhs["piece_count"] == len(lhs["pieces"]) == 3  # two hours split by the hour
    assert {p["route"] for p in lhs["pieces"]} == {"single:amp"}
    assert data["piece_count"] == 6 and data["pieces"] == [] and data["cache"]["misses"] == 6


@pytest.mark.parametrize("query, pairs", [
    ("sum(DCGM_FI_DEV_GPU_UTIL) / sum(node_load1)", [("stats", "all")]),  # stats needs one backend
])
def test_explain_says_why_the_query_is_refused(query: str, pairs: list[tuple[str, str]]) -> None:
    service = _service()
    req = QueryRequest(query=query, **RANGE)

    async def go() -> tuple[dict[str, Any], PromError]:
        data = await service.explain(req, {}, pairs)
        with pytest.raises(PromError) as refused:
            await service.query(req, [("query", query), *pairs], {}, RequestContext.start(NOBODY, service.config.limits))
        return data, refused.value

    data, refused = asyncio.run(go())
    assert refused.status == 422
    assert data["route"]["kind"] == "unroutable" and data["route"]["reason"] == refused.message
    assert "cross_store" not in data
