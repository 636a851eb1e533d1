"""Hybrid routing through a running promaccel, with two backend *names* over the one test
Prometheus: every answer must equal the direct answer whatever the routing does, and
promaccel's own /metrics shows which backend each call went to.

(`tests/e2e/test_hybrid.py` checks the real thing: backends that each hold only a slice.)"""

from __future__ import annotations

import re
from typing import Any, Iterator

import httpx
import orjson
import pytest

from loadtests.compare import DATA, EMPTY, Expect, diff_answers
from tests.corpus import QUERIES
from tests.equivalence import compare_case, metadata_problems
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

HOUR = 3600


def _iso(ts: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _start(prom: Any, tmp_path_factory: pytest.TempPathFactory, name: str, backends: str,
           extra: str = "") -> Promaccel:
    work = tmp_path_factory.mktemp(name)
    cfg = work / "promaccel.yaml"
    cfg.write_text(f"backends:\n{backends}\nplanner: {{split_interval: 1h, shards: 4}}\n{extra}")
    return Promaccel.start(None, (), work, config=cfg)


@pytest.fixture(scope="module")
def by_time(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Promaccel, int]]:
    t = prom.end_s - 3 * HOUR
    t -= t % HOUR
    proxy = _start(prom, tmp_path_factory, "by_time", f"""
  - name: old
    url: {prom.url}
    holds: {{until: "{_iso(t + 5400)}"}}
  - name: new
    url: {prom.url}
    holds: {{since: "{_iso(t)}"}}
""")
    yield proxy, t
    proxy.stop()


@pytest.fixture(scope="module")
def overlap_all(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    proxy = _start(prom, tmp_path_factory, "overlap", f"""
  - name: amp
    url: {prom.url}
  - name: local
    url: {prom.url}
    primary: true
""")
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def by_metric(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    proxy = _start(prom, tmp_path_factory, "by_metric", f"""
  - name: amp
    url: {prom.url}
    holds: {{metrics: ["DCGM_.*"]}}
  - name: local
    url: {prom.url}
    holds: {{metrics: ["node_.*", "kube_.*", "up"]}}
""")
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def by_metric_narrow(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    proxy = _start(prom, tmp_path_factory, "by_metric_narrow", f"""
  - name: amp
    url: {prom.url}
    holds: {{metrics: ["DCGM_.*"]}}
  - name: local
    url: {prom.url}
    holds: {{metrics: ["node_.*", "up"]}}
""")
    yield proxy
    proxy.stop()


def _check(prom_url: str, proxy_url: str, path: str, params: dict[str, str], name: str,
           expect: Expect | None = None) -> None:
    direct = httpx.post(prom_url + path, data=params, timeout=120)
    proxied = httpx.post(proxy_url + path, data=params, timeout=120)
    problems = compare_case("hybrid_routing", name, params["query"], path, direct.status_code,
                            orjson.loads(direct.content), proxied.status_code, orjson.loads(proxied.content),
                            expect=expect)
    assert problems == [], (name, params, problems[:5], proxied.text[:300] if problems else "")


def _calls(proxy_url: str) -> dict[str, float]:
    text = httpx.get(proxy_url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for m in re.finditer(r'^promaccel_backend_requests_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("endpoint") in ("/api/v1/query", "/api/v1/query_range"):
            out[labels["backend"]] = out.get(labels["backend"], 0.0) + float(m.group(2))
    return out


# tests/e2e/test_hybrid.py runs the whole corpus over real slices; here a sample of it over two
# names for one Prometheus (every 6th query), where any routing choice must give the answer.
SAMPLE = sorted(QUERIES)[::6] + ["sort", "sort_desc", "absent_present", "at_start", "or_vector0"]


@pytest.mark.parametrize("name", sorted(set(SAMPLE) & set(QUERIES)))
def test_split_in_time_equals_direct(prom: Any, by_time: tuple[Promaccel, int], name: str) -> None:
    proxy, t = by_time
    # Across the hand-over (old until t + 90m, new from t), inside each side, and instants.
    _check(prom.url, proxy.url, "/api/v1/query_range",
           {"query": QUERIES[name], "start": str(t - 2 * HOUR + 17), "end": str(t + 2 * HOUR), "step": "60"}, name)
    # An instant in the overlap (old and new merged); single-backend instants are the
    # range's parts above.
    _check(prom.url, proxy.url, "/api/v1/query", {"query": QUERIES[name], "time": str(t + 900)}, name)


def test_split_in_time_goes_to_the_holder(prom: Any, by_time: tuple[Promaccel, int]) -> None:
    proxy, t = by_time
    before = _calls(proxy.url)
    q = {"query": "sum by (namespace) (DCGM_FI_DEV_GPU_TEMP)", "step": "60"}
    httpx.post(proxy.url + "/api/v1/query_range", data={**q, "start": str(t - 2 * HOUR), "end": str(t - HOUR)},
               timeout=60).raise_for_status()
    mid = _calls(proxy.url)
    assert mid.get("old", 0) > before.get("old", 0) and mid.get("new", 0) == before.get("new", 0)
    httpx.post(proxy.url + "/api/v1/query_range", data={**q, "start": str(t + 2 * HOUR), "end": str(t + 3 * HOUR)},
               timeout=60).raise_for_status()
    after = _calls(proxy.url)
    assert after.get("new", 0) > mid.get("new", 0) and after.get("old", 0) == mid.get("old", 0)
    explain = httpx.get(proxy.url + "/api/v1/explain", params={**q, "start": str(t - HOUR), "end": str(t + 2 * HOUR)},
                        timeout=60).json()["data"]
    assert explain["route"]["kind"] == "split_time"
    assert [p[2] for p in explain["route"]["parts"]] == [["old"], ["old", "new"], ["new"]]


def test_window_straddling_the_stores_equals_direct(prom: Any, by_time: tuple[Promaccel, int]) -> None:
    """A 2h window ending at t + 100m starts before new's data and ends after old's: no store
    holds it, each holds a part; promaccel gathers the raw samples and evaluates it."""
    proxy, t = by_time
    query = "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h]))"
    _check(prom.url, proxy.url, "/api/v1/query", {"query": query, "time": str(t + 6000)}, "straddle_2h")
    _check(prom.url, proxy.url, "/api/v1/query_range",
           {"query": query, "start": str(t - 1800 + 7), "end": str(t + 9000), "step": "47"}, "straddle_2h")
    explain = httpx.post(proxy.url + "/api/v1/explain", data={"query": query, "time": str(t + 6000)},
                         timeout=60).json()["data"]
    assert explain["route"]["kind"] == "cross_store"
    window = explain["cross_store"]["args"][0]
    assert window["kind"] == "window", explain["cross_store"]
    assert [r["backend"] for r in window["reads"]][:1] == ["old"] and window["reads"][-1]["backend"] == "new"
    # The window's raw chunks are cached: the same panel again asks no backend.
    form = {"query": query, "time": str(t + 6000)}
    first = httpx.post(proxy.url + "/api/v1/query", data=form, timeout=60)
    again = httpx.post(proxy.url + "/api/v1/query", data=form, timeout=60)
    assert again.headers["X-Promaccel-Backend-Calls"] == "0", dict(again.headers)
    assert diff_answers(first.json(), again.json()) == []


@pytest.mark.parametrize("name", sorted(set(SAMPLE) & set(QUERIES)))
def test_overlap_equals_direct(prom: Any, overlap_all: Promaccel, name: str) -> None:
    end = prom.end_s
    _check(prom.url, overlap_all.url, "/api/v1/query_range",
           {"query": QUERIES[name], "start": str(end - 4 * HOUR + 17), "end": str(end), "step": "60"}, name)
    _check(prom.url, overlap_all.url, "/api/v1/query", {"query": QUERIES[name], "time": str(end - 2 * HOUR)}, name)


def test_overlap_asks_both(prom: Any, overlap_all: Promaccel) -> None:
    before = _calls(overlap_all.url)
    httpx.post(overlap_all.url + "/api/v1/query", data={"query": "count(up)", "time": str(prom.end_s - 600)},
               timeout=60).raise_for_status()
    after = _calls(overlap_all.url)
    assert after["amp"] > before.get("amp", 0) and after["local"] > before.get("local", 0)


JOINS = [
    "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left () "
    # node_exporter's instance is "<Hostname>:9100": the port is cut off so that the join matches
    "label_replace(count by (instance) (node_network_receive_bytes_total), \"Hostname\", \"$1\", \"instance\", "
    "\"(.+):\\\\d+\")",
    "sum(DCGM_FI_DEV_POWER_USAGE) / sum(kube_node_status_allocatable)",
    "count(DCGM_FI_DEV_GPU_TEMP > 60) + count(up == 1)",
    "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL) and on (Hostname) "
    "label_replace(up{job=\"node-exporter\"}, \"Hostname\", \"$1\", \"instance\", \"(.+):\\\\d+\")",
    "max(DCGM_FI_DEV_GPU_TEMP) > bool max(up)",
    "sum(rate(node_network_receive_bytes_total[5m])) / count(DCGM_FI_DEV_GPU_UTIL)",
    "sum(DCGM_FI_DEV_POWER_USAGE) or vector(0)",
]


@pytest.mark.parametrize("query", JOINS)
def test_cross_store_joins_equal_direct(prom: Any, by_metric: Promaccel, query: str) -> None:
    end = prom.end_s
    _check(prom.url, by_metric.url, "/api/v1/query_range",
           {"query": query, "start": str(end - 3 * HOUR + 17), "end": str(end), "step": "120"}, query)
    _check(prom.url, by_metric.url, "/api/v1/query", {"query": query, "time": str(end - HOUR)}, query)


def test_cross_store_functions_equal_direct(prom: Any, by_metric: Promaccel) -> None:
    """Functions and aggregations above a join of the two stores are evaluated by promaccel."""
    for q in ("quantile(0.9, DCGM_FI_DEV_GPU_UTIL * on(Hostname) group_left() "
              "label_replace(up, \"Hostname\", \"$1\", \"instance\", \"(.*):\\\\d+\"))",
              "round(sum(DCGM_FI_DEV_POWER_USAGE) / sum(node_load1), 0.01)",
              "sort_desc(clamp_max(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * 0 + on() group_left() "
              "scalar(sum(node_load1)), 1e3))"):
        _check(prom.url, by_metric.url, "/api/v1/query", {"query": q, "time": str(prom.end_s - 60)}, "functions")


def test_cross_store_range_function_parameter_from_the_other_store(prom: Any, by_metric: Promaccel) -> None:
    """A range function whose parameter is computed from the other store (it was a 422): the
    parameter is evaluated per step as its own tree, as Prometheus does."""
    q = "quantile_over_time(scalar(avg(DCGM_FI_DEV_GPU_UTIL)) / 100, node_load1[5m])"
    _check(prom.url, by_metric.url, "/api/v1/query", {"query": q, "time": str(prom.end_s - 60)}, q)
    _check(prom.url, by_metric.url, "/api/v1/query_range",
           {"query": q, "start": str(prom.end_s - HOUR + 17), "end": str(prom.end_s), "step": "120"}, q)


def test_straddling_window_samples_are_bounded(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """limits.max_window_samples bounds the raw samples one query gathers: over it, a 422."""
    t = prom.end_s - 3 * HOUR
    t -= t % HOUR
    proxy = _start(prom, tmp_path_factory, "bounded", f"""
  - name: old
    url: {prom.url}
    holds: {{until: "{_iso(t + 1800)}"}}
  - name: new
    url: {prom.url}
    holds: {{since: "{_iso(t)}"}}
""", "limits: {max_window_samples: 1000}")
    try:
        form = {"query": "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h]))", "time": str(t + 6000)}
        r = httpx.post(proxy.url + "/api/v1/query", data=form, timeout=60)
        assert r.status_code == 422, r.text
        assert "limits.max_window_samples" in r.json()["error"]
        small = {"query": 'increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="gpu-node-0000", gpu="0"}[2h])',
                 "time": str(t + 6000)}
        _check(prom.url, proxy.url, "/api/v1/query", small, "bounded_small")
    finally:
        proxy.stop()


def test_metric_no_store_has_is_empty_as_in_prometheus(prom: Any, by_metric: Promaccel) -> None:
    """No holding names it and no store lists it: it exists nowhere, as in Prometheus."""
    for query, expect in (("nothing_holds_this", EMPTY), ("absent(nothing_holds_this)", DATA),
                          ("sum(DCGM_FI_DEV_GPU_UTIL) + count(nothing_holds_this)", EMPTY)):
        _check(prom.url, by_metric.url, "/api/v1/query", {"query": query, "time": str(prom.end_s)}, "nowhere",
               expect)


def test_metric_a_store_has_but_no_holding_names_is_a_clear_422(prom: Any, by_metric_narrow: Promaccel) -> None:
    """A store has it but the holdings do not say who holds it: a configuration gap."""
    r = httpx.post(by_metric_narrow.url + "/api/v1/query", data={
        "query": "sum(kube_node_status_allocatable)", "time": str(prom.end_s)}, timeout=60)
    assert r.status_code == 422, r.text
    assert "kube_node_status_allocatable" in r.json()["error"]


METADATA_CALLS = [
    ("/api/v1/series", {"match[]": "DCGM_FI_DEV_GPU_UTIL"}),
    ("/api/v1/series", {"match[]": "up"}),
    ("/api/v1/labels", {}),
    ("/api/v1/labels", {"match[]": "node_network_receive_bytes_total"}),
    ("/api/v1/label/Hostname/values", {}),
    ("/api/v1/label/__name__/values", {}),
    ("/api/v1/metadata", {}),
    ("/api/v1/metadata", {"limit": "7"}),
    ("/api/v1/metadata", {"limit_per_metric": "1"}),
    ("/api/v1/metadata", {"metric": "prometheus_http_requests_total"}),
]


@pytest.mark.parametrize(("path", "params"), METADATA_CALLS)
def test_metadata_fan_out_equals_direct(prom_scraped: Any, by_metric: Promaccel, path: str,
                                        params: dict[str, str]) -> None:
    prom = prom_scraped
    window = {"start": str(prom.end_s - 2 * HOUR), "end": str(prom.end_s)} if path != "/api/v1/metadata" else {}
    direct = httpx.get(prom.url + path, params={**params, **window}, timeout=60)
    proxied = httpx.get(by_metric.url + path, params={**params, **window}, timeout=60)
    assert proxied.status_code == direct.status_code == 200
    d, p = direct.json(), proxied.json()
    if path == "/api/v1/series":
        assert sorted(map(lambda x: sorted(x.items()), p["data"])) == sorted(map(lambda x: sorted(x.items()), d["data"]))
        assert len(p["data"]) == len(d["data"]) > 0
    elif path == "/api/v1/metadata":
        full = httpx.get(prom.url + path, timeout=60).json()["data"]
        assert metadata_problems(params, d, p, full) == []
    else:
        assert d["data"], "the reference answer is empty: nothing compared"
        assert p["data"] == d["data"]


def test_metadata_asks_only_the_holder(prom: Any, by_metric: Promaccel) -> None:
    def series_calls() -> dict[str, float]:
        text = httpx.get(by_metric.url + "/metrics", timeout=10).text
        out: dict[str, float] = {}
        for m in re.finditer(r'^promaccel_backend_requests_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels.get("endpoint") == "/api/v1/series":
                out[labels["backend"]] = out.get(labels["backend"], 0.0) + float(m.group(2))
        return out

    before = series_calls()
    r = httpx.get(by_metric.url + "/api/v1/series", params={"match[]": "DCGM_FI_DEV_GPU_TEMP"}, timeout=60)
    assert r.status_code == 200 and r.json()["data"]
    after = series_calls()
    assert after.get("amp", 0) == before.get("amp", 0) + 1 and after.get("local", 0) == before.get("local", 0)
