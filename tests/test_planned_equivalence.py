"""Planned equivalence: the corpus through promaccel with time splitting and node sharding
(`--split-interval 1h --shards 8`) against Prometheus directly. Float tolerance 1e-9 only
where re-aggregation reorders sums."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from tests.corpus import QUERIES

pytestmark = pytest.mark.prom

# Where Prometheus's own choice is order-dependent and a sharded answer may legitimately
# pick another series of equal value: topk/bottomk ties are checked by value multiset.
ORDERED = {"sort", "sort_desc"}


def _check(prom_url: str, proxy_url: str, path: str, params: dict[str, str], name: str) -> None:
    direct = httpx.post(prom_url + path, data=params, timeout=120)
    proxied = httpx.post(proxy_url + path, data=params, timeout=120)
    assert proxied.status_code == direct.status_code, (name, proxied.text[:500])
    problems = diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content),
                            ordered=name in ORDERED and path.endswith("query"))
    assert problems == [], (name, params, problems[:5])


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_range_split_and_sharded(prom: Any, planned: Any, name: str) -> None:
    # The start of the data (lookback before the first sample, late series); the middle of
    # the data is tests/test_equivalence_matrix.py's, at every shards x split.
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
    data = r.json()["data"]
    assert data and r.json()["status"] == "success"


def test_deterministic_bytes(prom: Any, planned: Any) -> None:
    params = {"query": "avg by (namespace) (DCGM_FI_DEV_POWER_USAGE)", "start": str(prom.end_s - 4 * 3600),
              "end": str(prom.end_s), "step": "30"}
    first = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=60).content
    second = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=60).content
    assert first == second
