"""Auth and tenants, served: one promaccel with four tenants over two real Prometheus backends
(the by_metric slices of tests/hybrid.py: "gpu" holds only DCGM_*, "nodes" only node_*, kube_*,
up), with bearer tokens from the config (a digest), a file and a variable, basic auth from a
password file, and an admin token.

    team-gpu    Bearer, tokens_sha256          backends [gpu]
    team-gpu2   Bearer, tokens_file            backends [gpu]   (same backends as team-gpu)
    team-nodes  basic auth (Grafana's)         backends [nodes]
    team-all    Bearer, tokens_env             every backend

Checked: 401 JSON with a challenge for missing/wrong credentials on every API route, health
and /metrics open; a tenant's queries, metadata and relays reach its backends only (answers
equal to its backend's own); two tenants over the same backends do not share cached cells or
backend calls; admin routes take only the admin token; no token, password, basic-auth blob
or digest in the process's log (at debug level), in any error body, or in /metrics."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from loadtests.load import start_prometheus, stop_prometheus
from proxy.config.auth import sha256_hex
from tests.hybrid import END, HOUR, SLICES, START, build_slice
from tests.servers import Promaccel, require, serving_copy

pytestmark = pytest.mark.prom

TOKEN_GPU = "gpu-token-5f0c8d2e9a41b7c3"
TOKEN_GPU2 = "gpu2-token-77e1a0c94b2d6f18"
TOKEN_ALL = "all-token-c2b96a1de4f05738"
NODES_USER, NODES_PASSWORD = "grafana-nodes", "nodes-pw-9d3e61b0a7c4f528"
ADMIN = "admin-token-1a2b3c4d5e6f7a8b"
SECRETS = [TOKEN_GPU, TOKEN_GPU2, TOKEN_ALL, NODES_PASSWORD, ADMIN,
           base64.b64encode(f"{NODES_USER}:{NODES_PASSWORD}".encode()).decode()]
SECRETS += [sha256_hex(s) for s in SECRETS[:5]]

GPU = {"Authorization": f"Bearer {TOKEN_GPU}"}
GPU2 = {"Authorization": f"Bearer {TOKEN_GPU2}"}
ALL = {"Authorization": f"Bearer {TOKEN_ALL}"}
NODES = httpx.BasicAuth(NODES_USER, NODES_PASSWORD)  # what Grafana's "Basic auth" sends
RANGE = {"start": str(START + HOUR), "end": str(START + 3 * HOUR), "step": "60"}


@dataclass
class Setup:
    proxy: Promaccel
    gpu: str  # URL of the DCGM-only Prometheus
    nodes: str  # URL of the node/kube-only Prometheus
    gpu_dir: str
    nodes_dir: str
    bodies: list[bytes]  # every error body seen, for the secrets check


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require("prometheus")
    require("promtool")
    work = tmp_path_factory.mktemp("auth")
    procs: list[Any] = []
    proxy = None
    try:
        urls, dirs = {}, {}
        for spec in SLICES:
            if spec.scenario != "by_metric":
                continue
            built, _ = build_slice(spec)
            data_dir = serving_copy(built, work / spec.backend)
            proc = start_prometheus(str(data_dir), log_path=str(work / f"{spec.backend}.log"))
            procs.append(proc)
            urls[spec.backend], dirs[spec.backend] = proc.url, str(data_dir)  # type: ignore[attr-defined]
        tokens = work / "gpu2-tokens"
        tokens.write_text(f"# team-gpu2\n{TOKEN_GPU2}\n")
        password = work / "nodes-password"
        password.write_text(NODES_PASSWORD + "\n")
        cfg = {
            "backends": [
                {"name": "gpu", "url": urls["amp"], "holds": {"metrics": ["DCGM_.*"]}},
                {"name": "nodes", "url": urls["local"], "holds": {"metrics": ["node_.*", "kube_.*", "up"]},
                 "primary": True},
            ],
            "auth": {"tenants": [
                {"name": "team-gpu", "tokens_sha256": [sha256_hex(TOKEN_GPU)], "backends": ["gpu"]},
                {"name": "team-gpu2", "tokens_file": str(tokens), "backends": ["gpu"]},
                {"name": "team-nodes", "basic": [{"user": NODES_USER, "password_file": str(password)}],
                 "backends": ["nodes"]},
                {"name": "team-all", "tokens_env": "PROMACCEL_AUTH_TEAM_ALL"},
            ]},
        }
        path = work / "promaccel.yaml"
        path.write_text(orjson.dumps(cfg).decode())  # JSON is YAML
        proxy = Promaccel.start(None, ("--split-interval", "1h", "--shards", "4", "--log-level", "debug"), work,
                                config=path, env={"PROMACCEL_AUTH_TEAM_ALL": TOKEN_ALL, "PROMACCEL_ADMIN_TOKEN": ADMIN})
        yield Setup(proxy, urls["amp"], urls["local"], dirs["amp"], dirs["local"], [])
    finally:
        if proxy is not None:
            proxy.stop()
        for p in procs:
            stop_prometheus(p)


def _get(s: Setup, path: str, auth: Any = None, headers: dict[str, str] | None = None,
         params: Any = None, method: str = "GET", data: Any = None) -> httpx.Response:
    r = httpx.request(method, s.proxy.url + path, params=params, data=data, headers=headers, auth=auth, timeout=60)
    if r.status_code >= 400:
        s.bodies.append(r.content)
    return r


def _names(s: Setup, **kw: Any) -> list[str]:
    r = _get(s, "/api/v1/label/__name__/values", **kw)
    assert r.status_code == 200, r.text
    names: list[str] = r.json()["data"]
    return names


ROUTES = [("GET", "/api/v1/query", {"query": "up"}), ("POST", "/api/v1/query_range", None),
          ("GET", "/api/v1/labels", None), ("GET", "/api/v1/label/job/values", None),
          ("GET", "/api/v1/series", {"match[]": "up"}), ("GET", "/api/v1/metadata", None),
          ("GET", "/api/v1/status/buildinfo", None), ("GET", "/api/v1/status/flags", None),
          ("GET", "/api/v1/explain", {"query": "up"}), ("GET", "/api/v1/rules", None)]
WRONG = [None, {"Authorization": "Bearer not-a-token-0123456789"}, {"Authorization": f"Bearer {TOKEN_GPU}0"},
         {"Authorization": f"Token {TOKEN_GPU}"}, {"Authorization": "Basic !!!"},
         {"Authorization": f"Bearer {ADMIN}"}]


@pytest.mark.parametrize(("method", "path", "params"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_missing_or_wrong_credentials_get_401_json(setup: Setup, method: str, path: str, params: Any) -> None:
    data = {"query": "up", **RANGE} if method == "POST" else None
    for headers in WRONG:
        r = _get(setup, path, headers=headers, params=params, method=method, data=data)
        assert r.status_code == 401, (path, headers, r.status_code, r.text)
        body = r.json()
        assert body["status"] == "error" and body["errorType"] == "unauthorized" and body["error"], body
        assert r.headers["content-type"] == "application/json"
        assert 'Bearer realm="promaccel"' in r.headers["www-authenticate"]
        assert 'Basic realm="promaccel"' in r.headers["www-authenticate"]
    r = _get(setup, path, auth=httpx.BasicAuth(NODES_USER, NODES_PASSWORD + "x"), params=params, method=method, data=data)
    assert r.status_code == 401


def test_health_and_metrics_stay_open(setup: Setup) -> None:
    for path in ("/-/healthy", "/-/ready", "/metrics"):
        assert _get(setup, path).status_code == 200, path


def test_each_tenant_sees_only_its_backends(setup: Setup) -> None:
    gpu_direct = httpx.get(setup.gpu + "/api/v1/label/__name__/values", timeout=30).json()["data"]
    nodes_direct = httpx.get(setup.nodes + "/api/v1/label/__name__/values", timeout=30).json()["data"]
    assert gpu_direct and nodes_direct and not set(gpu_direct) & set(nodes_direct)
    assert _names(setup, headers=GPU) == gpu_direct
    assert _names(setup, headers=GPU2) == gpu_direct
    assert _names(setup, auth=NODES) == nodes_direct
    assert _names(setup, headers=ALL) == sorted(set(gpu_direct) | set(nodes_direct))
    # labels and series: team-nodes never sees a GPU label or series, even asking by name
    labels = _get(setup, "/api/v1/labels", auth=NODES).json()["data"]
    assert labels == httpx.get(setup.nodes + "/api/v1/labels", timeout=30).json()["data"]
    assert "gpu" in _get(setup, "/api/v1/labels", headers=GPU).json()["data"] and "gpu" not in labels
    series = _get(setup, "/api/v1/series", auth=NODES, params={"match[]": "DCGM_FI_DEV_GPU_UTIL"})
    assert series.status_code == 200 and series.json()["data"] == []
    gpu_series = _get(setup, "/api/v1/series", headers=ALL, params={"match[]": "DCGM_FI_DEV_GPU_UTIL"}).json()["data"]
    assert gpu_series and gpu_series == httpx.get(setup.gpu + "/api/v1/series", timeout=30,
                                                  params={"match[]": "DCGM_FI_DEV_GPU_UTIL"}).json()["data"]
    # relays go to the tenant's first backend (config order, as without auth): /status/flags
    # names that backend's own data directory
    for kw, data_dir in (({"headers": GPU}, setup.gpu_dir), ({"auth": NODES}, setup.nodes_dir),
                         ({"headers": ALL}, setup.gpu_dir)):
        flags = _get(setup, "/api/v1/status/flags", **kw).json()["data"]
        assert flags["storage.tsdb.path"] == data_dir


def test_queries_run_over_the_tenants_backends_only(setup: Setup) -> None:
    query = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    direct = httpx.post(setup.gpu + "/api/v1/query_range", data={"query": query, **RANGE}, timeout=60).json()
    assert direct["data"]["result"]
    for kw in ({"headers": GPU}, {"headers": ALL}):
        r = _get(setup, "/api/v1/query_range", method="POST", data={"query": query, **RANGE}, **kw)
        assert r.status_code == 200, r.text
        assert diff_answers(direct, r.json()) == []
    # team-nodes: none of its backends has DCGM_* (in its holdings or its metric names): for it
    # the metric does not exist, as in a Prometheus holding only its data; only its own
    # backends are asked
    r = _get(setup, "/api/v1/query_range", method="POST", data={"query": query, **RANGE}, auth=NODES)
    assert r.status_code == 200 and r.json()["data"]["result"] == [], r.text
    explain = _get(setup, "/api/v1/explain", params={"query": query, **RANGE}, auth=NODES).json()["data"]
    assert explain["route"]["backends"] == ["nodes"], explain["route"]
    # node metrics through team-nodes, against the nodes backend itself
    query = "sum(rate(node_network_receive_bytes_total[5m]))"
    direct = httpx.post(setup.nodes + "/api/v1/query_range", data={"query": query, **RANGE}, timeout=60).json()
    assert direct["data"]["result"]
    r = _get(setup, "/api/v1/query_range", method="POST", data={"query": query, **RANGE}, auth=NODES)
    assert r.status_code == 200 and diff_answers(direct, r.json()) == []
    r = _get(setup, "/api/v1/query_range", method="POST", data={"query": query, **RANGE}, headers=GPU)
    assert r.status_code == 200 and r.json()["data"]["result"] == [], r.text


def test_tenants_do_not_share_cache_or_calls(setup: Setup) -> None:
    """team-gpu and team-gpu2 see the same backend: each still misses on its first call."""
    form = {"query": "max by (Hostname) (DCGM_FI_DEV_FB_USED)", "start": str(END - 3 * HOUR),
            "end": str(END - HOUR), "step": "120"}

    def ask(headers: dict[str, str]) -> tuple[str, int]:
        r = _get(setup, "/api/v1/query_range", method="POST", data=form, headers=headers)
        assert r.status_code == 200, r.text
        return r.headers["x-cache"], int(r.headers["x-promaccel-backend-calls"])

    first = ask(GPU)
    assert first[0] == "MISS" and first[1] > 0
    assert ask(GPU) == ("HIT", 0)
    other = ask(GPU2)  # same query, same backend, another tenant: not the first one's cells
    assert other[0] == "MISS" and other[1] == first[1]
    assert ask(GPU2) == ("HIT", 0)


def test_admin_routes_take_only_the_admin_token(setup: Setup) -> None:
    path = "/api/v1/admin/cache/stats"
    assert _get(setup, path).status_code == 401
    for kw in ({"headers": GPU}, {"headers": ALL}, {"auth": NODES}):
        r = _get(setup, path, **kw)
        assert r.status_code in (401, 403), r.text  # basic auth is not a bearer token: 401
        assert r.json()["status"] == "error"
    assert _get(setup, path, headers=GPU).status_code == 403
    r = _get(setup, path, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and r.json()["data"]["enabled"] is True
    r = _get(setup, "/api/v1/admin/cache/generation", method="POST", headers=GPU)
    assert r.status_code == 403


def test_auth_failures_are_counted(setup: Setup) -> None:
    def failures() -> dict[str, float]:
        out = {}
        for line in _get(setup, "/metrics").text.splitlines():
            if line.startswith("promaccel_auth_failures_total{"):
                out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        return out

    before = failures()
    _get(setup, "/api/v1/labels")
    _get(setup, "/api/v1/labels", headers={"Authorization": "Bearer nope-nope-nope-nope"})
    after = failures()
    assert after["missing"] == before.get("missing", 0) + 1
    assert after["invalid"] == before.get("invalid", 0) + 1


def test_no_secret_in_logs_errors_or_metrics(setup: Setup) -> None:
    """Last in this module: the log has every request above (debug level, access lines)."""
    _get(setup, "/api/v1/query", headers=GPU, params={"query": "up"})  # at least one success logged
    _get(setup, "/api/v1/query", params={"query": "up"}, headers={"Authorization": f"Bearer {TOKEN_GPU}x"})
    metrics = _get(setup, "/metrics").text
    log = setup.proxy.log.read_text(errors="replace")
    assert "team-gpu" in log and "/api/v1/query" in log  # the access log is there (and names tenants)
    assert len(setup.bodies) > 20
    errors = b"\n".join(setup.bodies).decode(errors="replace")
    for secret in SECRETS:
        assert secret not in log, "a secret in the log"
        assert secret not in metrics, "a secret in /metrics"
        assert secret not in errors, "a secret in an error body"
    assert os.environ.get("PROMACCEL_AUTH_TEAM_ALL") is None  # the test's own env stayed clean
