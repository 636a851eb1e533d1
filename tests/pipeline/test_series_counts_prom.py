"""`shards: auto` on the CI fleet sizes shards from the real series count (issue 28 item 3):
promaccel in front of the real test Prometheus picks the shard count the pure planner gives for
the series Prometheus itself counts -- not the one the fixed guess (`series_per_node`) gives,
which differs on this fleet (4 GPUs a node, guess 8) -- and the answers stay Prometheus's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.config import load_config
from proxy.pipeline.planning import planner_settings
from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.planner import plan
from tests.equivalence import compare_case
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

OVERRIDES: dict[str, Any] = {
    "planner": {"shards": "auto", "max_parallel": 16, "split_interval": "1h", "max_samples_per_piece": 500},
    "cache": {"enabled": False},
}
QUERIES = ["sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "avg(DCGM_FI_DEV_GPU_TEMP)",
           "max by (Hostname) (rate(DCGM_FI_DEV_POWER_USAGE[5m]))"]


def _shards(data: dict[str, Any]) -> int:
    return max((s["count"] for s in data.get("shards") or ()), default=1)


def _expected(settings: PlannerSettings, req: QueryRequest, hosts: list[str], counts: dict[str, int]) -> int:
    s = PlannerSettings(**{**settings.__dict__, "series_counts": tuple(sorted(counts.items()))})
    p = plan(req, s, {"Hostname": hosts})
    return max((x.shard.count for x in p.pieces if x.shard), default=1)


def test_auto_shards_follow_the_real_series_count(prom: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text(json.dumps({"backends": [{"name": "default", "url": prom.url}], **OVERRIDES}))
    settings = planner_settings(load_config(None, backends=[prom.url], overrides=OVERRIDES))
    server = Promaccel.start(None, ("--config", str(cfg)), tmp_path)
    end = prom.end_s - 600
    window = {"start": str(end - 5 * 3600 - 13), "end": str(end), "step": "120"}
    req_of = lambda q: QueryRequest.range(q, int(window["start"]) * 1000, end * 1000, 120_000)  # noqa: E731
    try:
        with httpx.Client(timeout=120) as client:
            hosts = client.get(prom.url + "/api/v1/label/Hostname/values").json()["data"]
            seen_differ = 0
            for query in QUERIES:
                metric = query.split("(")[-1].split(")")[0].split("[")[0]
                real = client.get(prom.url + "/api/v1/query", params={
                    "query": f'count({{__name__="{metric}"}})', "time": str(end)}).json()["data"]["result"]
                n = int(real[0]["value"][1])
                want = _expected(settings, req_of(query), hosts, {metric: n})
                guess = _expected(settings, req_of(query), hosts, {})
                seen_differ += want != guess
                explain = client.get(server.url + "/api/v1/explain", params={"query": query, **window}).json()["data"]
                assert _shards(explain) == want, (query, n, explain.get("notes"))
                assert explain["estimated_series"] == n
                direct = client.post(prom.url + "/api/v1/query_range", data={"query": query, **window})
                proxied = client.post(server.url + "/api/v1/query_range", data={"query": query, **window})
                assert compare_case("series_counts", query, query, "/api/v1/query_range", direct.status_code,
                                    orjson.loads(direct.content), proxied.status_code,
                                    orjson.loads(proxied.content)) == []
            assert seen_differ  # the guess would have sized them otherwise: the count is what decided
    finally:
        server.stop()
