"""Planned equivalence: the corpus through promaccel with time splitting and node sharding
(`--split-interval 1h --shards 8`) against Prometheus directly. Float tolerance 1e-9 only
where re-aggregation reorders sums."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy.result.concat import LAZY_ABOVE_SAMPLES
from tests.corpus import QUERIES
from tests.equivalence import compare_case

pytestmark = pytest.mark.prom

# Series are compared by labels (the same series, the same values). Instant answers whose
# outermost call is topk/bottomk/sort/sort_desc are also compared by value order, per
# topk/bottomk group; series of equal value may come in either order (loadtests.compare.Order).
# A topk/bottomk tie at the k-th place, where Prometheus's choice of series depends on its
# input order, is rerun unsharded by promaccel, so the same series are expected.


def _check(prom_url: str, proxy_url: str, path: str, params: dict[str, str], name: str) -> None:
    direct = httpx.post(prom_url + path, data=params, timeout=120)
    proxied = httpx.post(proxy_url + path, data=params, timeout=120)
    problems = compare_case("planned", name, params["query"], path, direct.status_code,
                            orjson.loads(direct.content), proxied.status_code, orjson.loads(proxied.content))
    assert problems == [], (name, params, problems[:5])


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_range_split_and_sharded(prom: Any, planned: Any, name: str) -> None:
    # The start of the data (lookback before the first sample, late series); the middle of
    # the data is tests/e2e/test_equivalence_matrix.py's, at every shards x split.
    windows = [
        {"start": str(prom.start_s - 900), "end": str(prom.start_s + 5400), "step": "45"},
    ]
    for w in windows:
        _check(prom.url, planned.url, "/api/v1/query_range", {"query": QUERIES[name], **w}, name)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_instant_sharded(prom: Any, planned: Any, name: str) -> None:
    for t in (prom.end_s - 60,):
        _check(prom.url, planned.url, "/api/v1/query", {"query": QUERIES[name], "time": str(t)}, name)


def test_pieces_header(prom: Any, planned: Any) -> None:
    params = {"query": "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.end_s - 5 * 3600),
              "end": str(prom.end_s), "step": "60"}
    r = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=60)
    assert r.status_code == 200
    assert int(r.headers["X-Promaccel-Pieces"]) > 8


def test_explain(prom: Any, planned: Any) -> None:
    params = {"query": "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.end_s - 3 * 3600),
              "end": str(prom.end_s), "step": "60"}
    r = httpx.get(planned.url + "/api/v1/explain", params=params, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "success"
    data = r.json()["data"]
    # 3 h at a 1 h split (4 epoch-aligned pieces: the window is not hour-aligned) x 8 node shards,
    # re-aggregated: avg as sum / count
    assert data["sharded"] and data["time_split"], data["notes"]
    assert data["merge"]["kind"] == "aggregate" and data["merge"]["op"] == "avg" and data["merge"]["by"] == ["namespace"]
    assert len(data["time_pieces"]) >= 3 and len(data["shards"]) == 8
    assert {p["role"] for p in data["pieces"]} == {"sum", "count"}  # avg as sum / count
    assert data["piece_count"] == len(data["pieces"]) >= 3 * 8
    answered = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=60)
    assert int(answered.headers["X-Promaccel-Pieces"]) == data["piece_count"]


def test_deterministic_bytes(prom: Any, planned: Any, proxies: Any) -> None:
    """Two promaccel processes with the same plan, each answering cold (their shard pieces
    arrive in whatever order): the same bytes, and Prometheus's answer."""
    other = proxies.get("--split-interval", "1h", "--shards", "8", "--log-level", "info")
    params = {"query": "avg by (namespace) (DCGM_FI_DEV_POWER_USAGE)", "start": str(prom.end_s - 4 * 3600 - 17),
              "end": str(prom.end_s), "step": "30"}
    answers = [httpx.post(p.url + "/api/v1/query_range", data=params, timeout=60) for p in (planned, other)]
    assert [a.headers["X-Cache"] for a in answers] == ["MISS", "MISS"]
    assert int(answers[0].headers["X-Promaccel-Pieces"]) > 8
    assert answers[0].content == answers[1].content
    direct = httpx.post(prom.url + "/api/v1/query_range", data=params, timeout=60)
    assert compare_case("planned", "deterministic_bytes", params["query"], "/api/v1/query_range", direct.status_code,
                        orjson.loads(direct.content), answers[0].status_code, orjson.loads(answers[0].content)) == []


def test_large_answer_streamed_from_its_pieces(prom: Any, planned: Any) -> None:
    """A raw range answer of more samples than concat.LAZY_ABOVE_SAMPLES: merged from its hour
    pieces without a merged copy (written from the pieces as it is streamed), cold
    and then from the cache, it is Prometheus's answer byte for byte."""
    params = {"query": '{__name__=~"DCGM_FI_DEV_(GPU_UTIL|FB_USED|GPU_TEMP|POWER_USAGE)"}',
              "start": str(prom.end_s - 6 * 3600 + 45), "end": str(prom.end_s - 15), "step": "15"}
    direct = httpx.post(prom.url + "/api/v1/query_range", data=params, timeout=120)
    assert direct.status_code == 200
    samples = sum(len(s["values"]) for s in orjson.loads(direct.content)["data"]["result"])
    assert samples > LAZY_ABOVE_SAMPLES
    for cache in ("MISS", "HIT"):
        proxied = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=120)
        assert proxied.headers["X-Cache"] == cache
        assert int(proxied.headers["X-Promaccel-Pieces"]) >= 6  # one an hour
        assert proxied.content == direct.content
