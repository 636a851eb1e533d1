"""Pass-through equivalence: every corpus query, instant and range, through promaccel
(no acceleration) and straight to Prometheus must give identical parsed JSON."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.corpus import QUERIES
from tests.equivalence import compare_case

pytestmark = pytest.mark.prom


def _assert_same(prom_url: str, name: str, path: str, params: dict[str, str], direct: httpx.Response,
                 proxied: httpx.Response) -> None:
    d, p = orjson.loads(direct.content), orjson.loads(proxied.content)
    problems = compare_case("passthrough", name, params["query"], path, direct.status_code, d,
                            proxied.status_code, p)
    assert problems == [], (name, params, problems[:5])
    if d == p:
        return
    # Prometheus itself sums in an order that can change between two identical calls (e.g.
    # after label_replace); only when it disagrees with itself may floats differ here.
    again = orjson.loads(httpx.post(prom_url + path, data=params, timeout=60).content)
    assert again != d, "promaccel changed an answer Prometheus gives deterministically"


def _windows(prom: Any) -> dict[str, dict[str, str]]:
    end = prom.end_s
    return {
        "range_3h_60s": {"start": str(end - 4 * 3600), "end": str(end - 3600), "step": "60"},
        "range_edge_15s": {"start": str(prom.start_s - 600), "end": str(prom.start_s + 1800), "step": "15"},
    }


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_instant(prom: Any, passthrough: Any, name: str) -> None:
    params = {"query": QUERIES[name], "time": str(prom.end_s - 2 * 3600 + 7)}
    direct = httpx.post(prom.url + "/api/v1/query", data=params, timeout=60)
    proxied = httpx.post(passthrough.url + "/api/v1/query", data=params, timeout=60)
    _assert_same(prom.url, name, "/api/v1/query", params, direct, proxied)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_range(prom: Any, passthrough: Any, name: str) -> None:
    for window in _windows(prom).values():
        params = {"query": QUERIES[name], **window}
        direct = httpx.get(prom.url + "/api/v1/query_range", params=params, timeout=60)
        proxied = httpx.get(passthrough.url + "/api/v1/query_range", params=params, timeout=60)
        _assert_same(prom.url, name, "/api/v1/query_range", params, direct, proxied)
