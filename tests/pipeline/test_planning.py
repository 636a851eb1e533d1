"""The Plan stage and the Planner (proxy/pipeline/planning.py), with a fake next stage and a
backend that records its calls: the plan handed down, the cache context per tenant scope,
explain noting the plan; shard-label values and series counts asked per tenant, with that
tenant's forwarded headers; limits.max_samples."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.backends import BackendReply
from proxy.backends.tenancy import NO_TENANT, Caller, Tenant
from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.context import RequestContext
from proxy.pipeline.explain import Explanation
from proxy.pipeline.planning import Plan, Planner
from tests.pipeline.stage_helpers import (
    EMPTY_VECTOR,
    JSON,
    FakeBackend,
    Recorder,
    RecordingBackend,
    config,
    range_query,
    run,
    values_of,
)

TEAM_A = Tenant((("x-scope-orgid", "a"),), "a")
TEAM_B = Tenant((("x-scope-orgid", "b"),), "b")
ONE_LABEL: dict[str, Any] = {"shard_labels": {"DCGM_.*": "Hostname"}}


def shards(plan: Any) -> int:
    return plan.pieces[0].shard.count if plan.sharded else 1  # type: ignore[no-any-return]


def test_plan_hands_down_the_plan_with_the_pinned_tree() -> None:
    cfg = config(split_interval="1h", shards=1)
    rec = Recorder()
    run(Plan(Planner(cfg, FakeBackend()), FakeBackend(), False, rec)(range_query("sum(rate(x[5m] @ end()))")))  # type: ignore[arg-type]
    (q,) = rec.got
    assert q.plan is not None and len(q.plan.pieces) == 3 and q.plan.time_split
    assert q.plan.expr is not None and "@ end()" not in repr(q.plan.expr)  # pinned once, here
    assert q.cache is None  # cache disabled


def test_plan_reports_the_plans_shape_on_the_answer() -> None:
    cfg = config(split_interval="1h", shards=1)
    answer = run(Plan(Planner(cfg, FakeBackend()), FakeBackend(), False, Recorder())(range_query("up", hours=2)))  # type: ignore[arg-type]
    assert answer.info["plan_pieces"] == 2 and answer.info["time_split"] is True
    assert answer.info["sharded"] is False


def test_plan_refuses_past_max_samples() -> None:
    cfg = load_config(None, backends=["http://x:1"], overrides={
        "planner": {"split_interval": "1h", "shards": 1}, "limits": {"max_samples": 1},
        "cache": {"enabled": False}})
    planner = Planner(cfg, FakeBackend())  # type: ignore[arg-type]
    planner.shard_values.get = lambda labels, tenant=None: values_of({"Hostname": tuple(f"n{i}" for i in range(8))})  # type: ignore[method-assign,misc]
    rec = Recorder()
    with pytest.raises(PromError, match="max_samples") as err:
        run(Plan(planner, FakeBackend(), False, rec)(range_query("sum(DCGM_FI_DEV_GPU_UTIL)")))  # type: ignore[arg-type]
    assert err.value.status == 422 and rec.got == []  # refused before anything below runs


def cached_config() -> Any:
    return load_config(None, backends=["http://127.0.0.1:1"], overrides={"planner": {"split_interval": "1h"}})


def test_plan_sets_the_cache_context_of_the_callers_tenant() -> None:
    cfg = cached_config()
    backend = RecordingBackend()
    rec = Recorder()
    stage = Plan(Planner(cfg, backend), backend, True, rec)
    q = range_query("up")
    q = replace(q, pairs=[*q.pairs, ("timeout", "10s"), ("dedup", "false")])
    run(stage(replace(q, ctx=RequestContext(Caller(TEAM_A)))))
    run(stage(replace(q, ctx=RequestContext(Caller(TEAM_B)))))
    run(stage(q))
    a, b, nobody = (got.cache for got in rec.got)
    assert (a.tenant, b.tenant, nobody.tenant) == ("a", "b", "")
    # The route: the backend's identity and the extra parameters that change an answer
    # (timeout does not).
    assert a.route == (backend.cfg.ident, "dedup=false") == b.route
    assert a.lookback_ms == q.req.lookback_ms
    # A query with stats=all cannot be merged from pieces: nothing is cached for it.
    run(stage(replace(q, pairs=[*q.pairs, ("stats", "all")])))
    assert rec.got[-1].cache is None and rec.got[-1].plan is not None


def test_plan_notes_the_plan_for_explain() -> None:
    cfg = config(split_interval="1h", shards=1)
    explanation = Explanation(cache_enabled=False)
    rec = Recorder()
    q = replace(range_query("up", hours=3), ctx=RequestContext(explain=explanation))
    run(Plan(Planner(cfg, FakeBackend()), FakeBackend(), False, rec)(q))  # type: ignore[arg-type]
    (handed,) = rec.got
    doc = explanation.document()
    assert doc["piece_count"] == 3 == len(doc["pieces"]) == len(handed.plan.pieces)
    assert [p["start_ms"] for p in doc["pieces"]] == [p.start_ms for p in handed.plan.pieces]
    assert doc["time_split"] is True


def tenant_fleet(method: str, path: str, pairs: list[tuple[str, str]], caller: Caller) -> BackendReply:
    """Each tenant sees its own nodes: tenant a two, tenant b three, nobody none."""
    nodes = {"a": ["a1", "a2"], "b": ["b1", "b2", "b3"]}.get(caller.tenant.scope, [])
    if path.startswith("/api/v1/label/"):
        return BackendReply(200, orjson.dumps({"status": "success", "data": nodes}), JSON)
    query = dict(pairs).get("query", "")
    if query.startswith("count("):
        return BackendReply(200, orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1, str(len(nodes) * 100)]}]}}), JSON)
    return BackendReply(200, EMPTY_VECTOR, JSON)


def test_planner_asks_shard_values_and_series_counts_per_tenant_with_its_headers() -> None:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"shards": "auto", "max_parallel": 8, "max_samples_per_piece": 1, **ONE_LABEL},
        "cache": {"enabled": False}})
    backend = RecordingBackend(handler=tenant_fleet)
    planner = Planner(cfg, backend)
    req = range_query("sum(DCGM_FI_DEV_GPU_UTIL)", hours=1).req

    async def main() -> tuple[Any, Any, Any]:
        return (await planner.plan(req, TEAM_A), await planner.plan(req, TEAM_B), await planner.plan(req, TEAM_A))

    plan_a, plan_b, again = run(main())
    # Each tenant's plan is cut by the nodes that tenant sees.
    assert plan_a.sharded and plan_b.sharded
    assert shards(plan_a) < shards(plan_b) and shards(again) == shards(plan_a)
    text_a, text_b = (" ".join(p.query for p in plan.pieces) for plan in (plan_a, plan_b))
    assert '"a1"' in text_a and '"b1"' not in text_a and '"b1"' in text_b and '"a1"' not in text_b
    label_calls = [(c[1], c[3].tenant) for c in backend.calls if c[1].startswith("/api/v1/label/")]
    count_calls = [(dict(c[2])["query"], c[3].tenant) for c in backend.calls if c[1] == "/api/v1/query"]
    assert label_calls == [("/api/v1/label/Hostname/values", TEAM_A), ("/api/v1/label/Hostname/values", TEAM_B)]
    assert count_calls == [('count({__name__="DCGM_FI_DEV_GPU_UTIL"})', TEAM_A),
                           ('count({__name__="DCGM_FI_DEV_GPU_UTIL"})', TEAM_B)]  # tenant a's kept


def test_planner_without_a_tenant_asks_with_none() -> None:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"shards": 4, **ONE_LABEL}, "cache": {"enabled": False}})
    backend = RecordingBackend(handler=tenant_fleet)
    plan = run(Planner(cfg, backend).plan(range_query("sum(DCGM_FI_DEV_GPU_UTIL)", hours=1).req))
    assert [c[3].tenant for c in backend.calls] == [NO_TENANT]
    assert not plan.sharded  # nobody sees any node: nothing to shard by


def test_the_samples_limit_uses_the_tenants_series_counts() -> None:
    """limits.max_samples: 422 for the tenant whose counted series put the query over it."""
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"shards": 1, **ONE_LABEL}, "limits": {"max_samples": 250 * 61}, "cache": {"enabled": False}})
    backend = RecordingBackend(handler=tenant_fleet)
    planner = Planner(cfg, backend)
    req = range_query("sum(DCGM_FI_DEV_GPU_UTIL)", hours=1).req
    run(planner.plan(req, TEAM_A))  # 200 series x 60 points: within
    with pytest.raises(PromError, match="max_samples") as err:
        run(planner.plan(req, TEAM_B))  # 300 series: over
    assert err.value.status == 422 and err.value.kind == "execution"
