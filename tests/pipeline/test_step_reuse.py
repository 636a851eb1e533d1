"""Zooming out reuses the cache (issue 5, item 8): a range query at step S is answered from
pieces cached at a finer step that divides S, subsampled, with exactly Prometheus's answer
and no backend call for those pieces."""

from __future__ import annotations

import re
from typing import Any, Iterator

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

HOUR = 3600
QUERIES = [
    "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "sum by (instance) (rate(node_network_receive_bytes_total[5m]))",
    "max_over_time(sum(DCGM_FI_DEV_POWER_USAGE)[30m:1m])",
    "avg(DCGM_FI_DEV_GPU_TEMP @ start())",
    "topk(3, DCGM_FI_DEV_GPU_TEMP)",
    "DCGM_FI_DEV_XID_ERRORS > 0",
]


@pytest.fixture(scope="module")
def proxy(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    p = Promaccel.start(prom.url, ("--split-interval", "1h"), tmp_path_factory.mktemp("step_reuse"))
    yield p
    p.stop()


def _calls(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(
        r'^promaccel_backend_requests_total\{[^}]*endpoint="/api/v1/query_range"[^}]*\} ([0-9.e+]+)$', text, re.M))


def _finer_hits(url: str) -> float:
    m = re.search(r"^promaccel_cache_finer_step_hits_total ([0-9.e+]+)$",
                  httpx.get(url + "/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else 0.0


def _both(prom: Any, proxy: Promaccel, form: dict[str, str]) -> httpx.Response:
    direct = httpx.post(prom.url + "/api/v1/query_range", data=form, timeout=60)
    proxied = httpx.post(proxy.url + "/api/v1/query_range", data=form, timeout=60)
    assert proxied.status_code == direct.status_code == 200, proxied.text[:300]
    assert diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content)) == [], form
    return proxied


@pytest.mark.parametrize("query", QUERIES)
def test_coarser_steps_come_from_the_finer_pieces(prom: Any, proxy: Promaccel, query: str) -> None:
    start, end = prom.end_s - 5 * HOUR, prom.end_s - HOUR  # whole hours: every cell complete
    _both(prom, proxy, {"query": query, "start": str(start), "end": str(end), "step": "60"})
    for step in ("120", "300", "600"):
        calls, hits = _calls(proxy.url), _finer_hits(proxy.url)
        r = _both(prom, proxy, {"query": query, "start": str(start), "end": str(end), "step": step})
        assert _calls(proxy.url) == calls, f"step {step} asked the backend"
        assert _finer_hits(proxy.url) > hits and r.headers["X-Cache"] == "HIT"


def test_a_step_off_the_finer_grid_is_fetched(prom: Any, proxy: Promaccel) -> None:
    query = "sum(DCGM_FI_DEV_FB_USED)"
    start, end = prom.end_s - 4 * HOUR, prom.end_s - HOUR
    _both(prom, proxy, {"query": query, "start": str(start), "end": str(end), "step": "60"})
    calls = _calls(proxy.url)
    _both(prom, proxy, {"query": query, "start": str(start), "end": str(end), "step": "90"})
    assert _calls(proxy.url) > calls
    # A start off the finer grid (start mod 60 = 17): its grid is not the cached one's.
    calls = _calls(proxy.url)
    _both(prom, proxy, {"query": query, "start": str(start + 17), "end": str(end), "step": "120"})
    assert _calls(proxy.url) > calls
