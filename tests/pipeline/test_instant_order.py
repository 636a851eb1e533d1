"""Instant answers keep Prometheus's order where it means something: topk/bottomk by the shard
label are concatenated from whole groups per shard, and each group's winners must come by
value (topk descending, bottomk ascending), as Prometheus gives them -- at every shard count."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loadtests.compare import diff_answers

QUERIES = [
    "topk by (instance) (2, node_network_receive_bytes_total)",
    "bottomk by (instance) (2, node_network_receive_bytes_total)",
    "topk by (instance) (3, rate(node_network_receive_bytes_total[5m]))",
    "bottomk by (Hostname) (2, DCGM_FI_DEV_GPU_TEMP)",
]


def _groups_in_value_order(result: list[dict[str, Any]], label: str, descending: bool) -> bool:
    values: dict[str, list[float]] = {}
    for s in result:
        values.setdefault(s["metric"].get(label, ""), []).append(float(s["value"][1]))
    return all(v == sorted(v, reverse=descending) for v in values.values())


@pytest.mark.prom
@pytest.mark.parametrize("shards", ["8", "16"])
@pytest.mark.parametrize("query", QUERIES)
def test_topk_by_shard_label_keeps_prometheus_order(prom: Any, proxies: Any, query: str, shards: str) -> None:
    proxy = proxies.get("--split-interval", "1h", "--shards", shards)
    form = {"query": query, "time": str(prom.end_s - 900)}
    explained = httpx.get(proxy.url + "/api/v1/explain", params=form, timeout=60).json()["data"]
    assert explained["sharded"] and explained["merge"]["kind"] == "concat"
    direct = httpx.post(prom.url + "/api/v1/query", data=form, timeout=60).json()
    proxied = httpx.post(proxy.url + "/api/v1/query", data=form, timeout=60).json()
    assert len(direct["data"]["result"]) >= 8, "the data must give several groups"
    label = "Hostname" if "Hostname" in query else "instance"
    assert _groups_in_value_order(direct["data"]["result"], label, query.startswith("topk"))
    assert diff_answers(direct, proxied, ordered=True) == []
