"""Real clients against promaccel: promtool, and requests shaped exactly as Grafana sends
them (POST form, start/end aligned to the step, step in float seconds). Each answer must
equal Prometheus's for the same request."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from loadtests.dashboard import panel_requests

pytestmark = pytest.mark.prom

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "dashboards" / "gpu-fleet.json"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool missing: `make test` installs Debian's prometheus package"
    return subprocess.run([binary, "query", *args], capture_output=True, text=True, timeout=120)


def _fill(arg: str, subst: dict[str, str]) -> str:
    for k, v in subst.items():
        arg = arg.replace(k, v)
    return arg


@pytest.mark.parametrize(
    "args",
    [
        ("instant", "--time={t}", "{url}", "sum by (namespace) (DCGM_FI_DEV_FB_USED)"),
        ("instant", "--time={t}", "{url}", 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu-node-000[12]", gpu="0"}'),
        ("range", "--start={s}", "--end={t}", "--step=1m", "{url}", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
        ("range", "--start={s}", "--end={t}", "--step=5m", "{url}",
         "sum by (instance) (rate(node_network_receive_bytes_total[5m]))"),
        ("series", "--match=kube_node_status_allocatable", "--start={s}", "--end={t}", "{url}"),
        ("labels", "--start={s}", "--end={t}", "{url}", "Hostname"),
    ],
    ids=["instant_sum", "instant_selector", "range_avg", "range_rate", "series", "labels"],
)
@pytest.mark.parametrize("mode", ["passthrough", "planned"])
def test_promtool(prom: Any, passthrough: Any, planned: Any, mode: str, args: tuple[str, ...]) -> None:
    server = passthrough if mode == "passthrough" else planned
    t, s = prom.end_s - 3600, prom.end_s - 4 * 3600

    def run(url: str) -> str:
        subst = {"{url}": url, "{t}": str(t), "{s}": str(s)}
        proc = _promtool("-o", "json", *(_fill(a, subst) for a in args))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    direct, proxied = orjson.loads(run(prom.url)), orjson.loads(run(server.url))
    assert direct, "promtool printed nothing: the comparison would prove nothing"
    if args[0] in ("series", "labels"):
        assert proxied == direct
        return
    wrap = {"status": "success", "data": {"resultType": "matrix" if args[0] == "range" else "vector",
                                          "result": direct}}
    got = {"status": "success", "data": {"resultType": wrap["data"]["resultType"], "result": proxied}}
    assert diff_answers(wrap, got) == []


@pytest.mark.parametrize("window_h", [1, 6])
@pytest.mark.parametrize("mode", ["passthrough", "planned"])
def test_grafana_dashboard_requests(prom: Any, passthrough: Any, planned: Any, mode: str, window_h: int) -> None:
    server = passthrough if mode == "passthrough" else planned
    end = prom.end_s - 17
    requests = panel_requests(DASHBOARD.read_text(), end - window_h * 3600, end)
    assert len(requests) >= 12
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Dashboard-Uid": "gpu-fleet",
               "X-Panel-Id": "5", "X-Grafana-Org-Id": "1"}
    for req in requests:
        body = req.body()
        direct = httpx.post(prom.url + req.path, content=body, headers=headers, timeout=120)
        proxied = httpx.post(server.url + req.path, content=body, headers=headers, timeout=120)
        assert proxied.status_code == direct.status_code == 200, (req.title, proxied.text[:300])
        problems = diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content))
        assert problems == [], (req.title, req.expr, problems[:3])


def test_gzip_to_clients_that_ask(prom: Any, passthrough: Any, planned: Any) -> None:
    params = {"query": "DCGM_FI_DEV_GPU_TEMP", "start": str(prom.end_s - 3600), "end": str(prom.end_s), "step": "60"}
    for server in (passthrough, planned):
        r = httpx.post(server.url + "/api/v1/query_range", data=params, headers={"Accept-Encoding": "gzip"}, timeout=60)
        assert r.status_code == 200 and r.headers.get("content-encoding") == "gzip"
        assert r.json()["status"] == "success"
        plain = httpx.post(server.url + "/api/v1/query_range", data=params,
                           headers={"Accept-Encoding": "identity"}, timeout=60)
        assert "content-encoding" not in plain.headers


def _stable_targets(body: dict[str, Any]) -> dict[str, Any]:
    """/api/v1/targets without what changes from one scrape to the next."""
    for t in body["data"]["activeTargets"]:
        for k in ("lastScrape", "lastScrapeDuration", "lastError", "health"):
            t.pop(k, None)
    return body


def test_metadata_endpoints(prom_scraped: Any, passthrough: Any) -> None:
    prom = prom_scraped
    s, e = str(prom.start_s), str(prom.end_s)
    calls = [
        ("GET", "/api/v1/labels", {"start": s, "end": e}),
        ("POST", "/api/v1/labels", {"start": s, "end": e, "match[]": "DCGM_FI_DEV_GPU_TEMP"}),
        ("GET", "/api/v1/label/namespace/values", {"start": s, "end": e}),
        ("GET", "/api/v1/series", [("match[]", "kube_node_status_allocatable"), ("match[]", "node_load1"),
                                   ("start", s), ("end", e)]),
        ("POST", "/api/v1/series", {"match[]": 'up{job="kube-state-metrics"}', "start": s, "end": e}),
        ("GET", "/api/v1/metadata", {}),
        ("GET", "/api/v1/metadata", {"metric": "prometheus_http_requests_total"}),
        ("GET", "/api/v1/targets", {}),
        ("GET", "/api/v1/targets/metadata", {"metric": "prometheus_build_info"}),
        ("GET", "/api/v1/query_exemplars", {"query": "DCGM_FI_DEV_GPU_TEMP", "start": s, "end": e}),
        ("GET", "/api/v1/rules", {}),
        ("GET", "/api/v1/alerts", {}),
        ("GET", "/api/v1/status/flags", {}),
    ]
    for method, path, params in calls:
        if method == "GET":
            d = httpx.get(prom.url + path, params=params, timeout=60)
            p = httpx.get(passthrough.url + path, params=params, timeout=60)
        else:
            d = httpx.post(prom.url + path, data=params, timeout=60)
            p = httpx.post(passthrough.url + path, data=params, timeout=60)
        assert p.status_code == d.status_code, path
        dj, pj = orjson.loads(d.content), orjson.loads(p.content)
        if path == "/api/v1/targets":
            dj, pj = _stable_targets(dj), _stable_targets(pj)
            assert dj["data"]["activeTargets"], "no target: nothing compared"
        if "metadata" in path:
            assert dj["data"], (path, "no metadata: nothing compared")
        assert pj == dj, path


def test_buildinfo_health_ready_metrics(passthrough: Any) -> None:
    info = httpx.get(passthrough.url + "/api/v1/status/buildinfo", timeout=30).json()
    assert info["status"] == "success" and info["data"]["version"] and info["data"]["promaccel"]
    assert httpx.get(passthrough.url + "/-/healthy", timeout=10).status_code == 200
    assert httpx.get(passthrough.url + "/-/ready", timeout=10).status_code == 200
    httpx.get(passthrough.url + "/api/v1/query", params={"query": "vector(1)"}, timeout=10)
    metrics = httpx.get(passthrough.url + "/metrics", timeout=10).text
    assert 'promaccel_http_requests_total{code="200",endpoint="/api/v1/query"}' in metrics
    assert "promaccel_backend_requests_total" in metrics
    assert "promaccel_http_request_duration_seconds_bucket" in metrics


def test_ready_without_backend(tmp_path: Path) -> None:
    from tests.servers import Promaccel, free_port

    dead = Promaccel.start(f"http://127.0.0.1:{free_port()}", (), tmp_path)
    try:
        assert httpx.get(dead.url + "/-/healthy", timeout=10).status_code == 200
        assert httpx.get(dead.url + "/-/ready", timeout=10).status_code == 503
        r = httpx.get(dead.url + "/api/v1/query", params={"query": "up"}, timeout=30)
        assert r.status_code == 503 and r.json()["errorType"] == "unavailable"
    finally:
        dead.stop()


def test_large_answer_streams_and_matches(prom: Any, planned: Any) -> None:
    from proxy.api.responses import STREAM_ABOVE_SAMPLES

    params = {"query": '{__name__=~"DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_USED|SM_CLOCK)"}',
              "start": str(prom.start_s), "end": str(prom.end_s), "step": "15"}
    direct = httpx.post(prom.url + "/api/v1/query_range", data=params, timeout=120)
    proxied = httpx.post(planned.url + "/api/v1/query_range", data=params, timeout=120)
    assert direct.status_code == proxied.status_code == 200
    body = orjson.loads(proxied.content)
    points = sum(len(s["values"]) for s in body["data"]["result"])
    assert points > STREAM_ABOVE_SAMPLES, "the answer must be large enough to be streamed"
    assert "content-length" not in proxied.headers  # encoded in chunks as sent
    assert diff_answers(orjson.loads(direct.content), body) == []


def test_max_query_range_guardrail(prom: Any, proxies: Any, tmp_path: Path) -> None:
    from tests.servers import Promaccel

    cfg = tmp_path / "limits.yaml"
    cfg.write_text("limits: {max_query_range: 2h}\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg)), tmp_path)
    try:
        base = {"query": "sum(DCGM_FI_DEV_POWER_USAGE)", "end": str(prom.end_s), "step": "60"}
        ok = httpx.post(server.url + "/api/v1/query_range", data={**base, "start": str(prom.end_s - 7200)}, timeout=60)
        assert ok.status_code == 200
        over = httpx.post(server.url + "/api/v1/query_range", data={**base, "start": str(prom.end_s - 7260)}, timeout=60)
        assert over.status_code == 422
        body = over.json()
        assert body["errorType"] == "execution" and "limits.max_query_range" in body["error"]
        assert "2h1m" in body["error"] and "narrow the time range" in body["error"]
    finally:
        server.stop()
