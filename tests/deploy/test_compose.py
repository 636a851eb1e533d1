"""Static checks of the local stack: docker-compose.yml, Dockerfile, Grafana provisioning,
the GPU Fleet dashboard, Prometheus config and the example promaccel config.

Docker is not available where these run, so they check that the pieces agree with each other
(service names, ports, mounted paths, data source URL) rather than starting anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
GRAFANA = ROOT / "config" / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "promaccel.yaml"
DASH_PROVIDER = GRAFANA / "provisioning" / "dashboards" / "gpu-fleet.yaml"
DASHBOARD = GRAFANA / "dashboards" / "gpu-fleet.json"
PROMETHEUS_YML = ROOT / "config" / "prometheus.yml"
EXAMPLE_CONFIG = ROOT / "config" / "promaccel.example.yaml"


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def datasources() -> list[dict[str, Any]]:
    return _load_yaml(DATASOURCES)["datasources"]


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def _flag(args: list[str], name: str) -> list[str]:
    """Values of --name VALUE and --name=VALUE."""
    out = []
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
    return out


def _bind_mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    mounts = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            if v.get("type") == "bind":
                mounts.append((v["source"], v["target"]))
            continue
        source, target = v.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def _published(svc: dict[str, Any]) -> dict[int, str]:
    """container port -> host binding."""
    out = {}
    for p in svc.get("ports", []):
        parts = str(p).split(":")
        out[int(parts[-1].split("/")[0])] = ":".join(parts[:-1])
    return out


# --- compose ---------------------------------------------------------------------------------

def test_services_exist(services: dict[str, Any]) -> None:
    assert {"generator", "prometheus", "redis", "promaccel", "grafana"} <= set(services)


def test_images_are_pinned(services: dict[str, Any]) -> None:
    assert services["prometheus"]["image"] == "prom/prometheus:v2.42.0"
    assert services["redis"]["image"].startswith("redis:7")
    image, _, tag = services["grafana"]["image"].partition(":")
    assert image == "grafana/grafana" and tag and tag != "latest"


def test_generator_builds_tsdb_into_shared_volume(services: dict[str, Any], compose: dict[str, Any]) -> None:
    gen = services["generator"]
    assert gen["build"]["context"] == "."
    assert gen["build"].get("dockerfile", "Dockerfile") == "Dockerfile"
    assert gen["build"]["target"] == "generator"
    script = " ".join(_command(gen)) if isinstance(gen["command"], list) else gen["command"]
    assert "python -m loadtests.load build" in script
    m = re.search(r"--data-dir\s+(\S+)", script)
    assert m, script
    data_dir = m.group(1)
    gen_vols = {v.split(":")[1]: v.split(":")[0] for v in gen["volumes"] if isinstance(v, str)}
    assert gen_vols.get(data_dir) in compose["volumes"], "the TSDB must go to a named volume"
    # Prometheus reads the same named volume as its storage.tsdb.path.
    prom = services["prometheus"]
    prom_vols = {v.split(":")[0]: v.split(":")[1] for v in prom["volumes"] if isinstance(v, str)}
    tsdb_path = _flag(_command(prom), "--storage.tsdb.path")
    assert tsdb_path and prom_vols[gen_vols[data_dir]] == tsdb_path[0]


def test_generator_script_is_valid_shell_with_compose_escaping(services: dict[str, Any]) -> None:
    gen = services["generator"]
    script = gen["command"][0]
    # Compose interpolates ${VAR} itself; the script's own variables must be escaped as $${VAR}.
    assert re.findall(r"(?<!\$)\$\{GEN_", script) == []
    for var in re.findall(r"\$\$\{(\w+)\}", script):
        assert var in gen["environment"], var


def test_prometheus_waits_for_generator_and_keeps_history(services: dict[str, Any]) -> None:
    prom = services["prometheus"]
    assert prom["depends_on"]["generator"]["condition"] == "service_completed_successfully"
    args = _command(prom)
    assert "--storage.tsdb.retention.time=100y" in args
    cfg = _flag(args, "--config.file")
    assert cfg, "prom/prometheus loses its default flags when command is overridden"
    mounts = dict((t, s) for s, t in _bind_mounts(prom))
    assert mounts[cfg[0]] == "./config/prometheus.yml"


def test_promaccel_command_points_at_prometheus_and_redis(services: dict[str, Any]) -> None:
    svc = services["promaccel"]
    assert svc["build"]["context"] == "."
    assert svc["build"].get("target", "promaccel") == "promaccel"
    args = _command(svc)
    assert args[0] == "serve"
    backends = _flag(args, "--backend")
    assert backends == ["http://prometheus:9090"]
    assert urlparse(backends[0]).hostname in services
    redis = _flag(args, "--redis")
    assert redis and urlparse(redis[0]).scheme == "redis" and urlparse(redis[0]).hostname == "redis"
    assert urlparse(redis[0]).port == 6379
    assert _flag(args, "--host") == ["0.0.0.0"]
    assert _flag(args, "--port") == ["9091"]
    assert set(svc["depends_on"]) >= {"prometheus", "redis"}


def test_promaccel_cli_accepts_the_compose_command(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import proxy.cli as cli
    # Parse only, do not serve: every flag in the compose command must exist in the real CLI.
    seen: list[Any] = []
    monkeypatch.setattr(cli, "_serve", lambda args, argv: seen.append(args) or 0)
    assert cli.main(_command(services["promaccel"])) == 0
    (ns,) = seen
    assert ns.backend == ["http://prometheus:9090"]
    assert ns.redis == "redis://redis:6379/0"
    assert (ns.host, ns.port) == ("0.0.0.0", 9091)


def test_grafana_mounts_provisioning_and_dashboards(services: dict[str, Any]) -> None:
    graf = services["grafana"]
    mounts = dict(_bind_mounts(graf))
    assert mounts["./config/grafana/provisioning"] == "/etc/grafana/provisioning"
    # The dashboard provider reads the path the dashboards directory is mounted at.
    provider = _load_yaml(DASH_PROVIDER)["providers"][0]
    assert mounts["./config/grafana/dashboards"] == provider["options"]["path"]
    env = graf["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Admin"
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home == provider["options"]["path"] + "/" + DASHBOARD.name
    assert 3000 in _published(graf)


def test_published_ports_are_loopback_only(services: dict[str, Any]) -> None:
    # Anonymous Admin Grafana must not be reachable from the network.
    for name, svc in services.items():
        for port, host in _published(svc).items():
            assert host.startswith("127.0.0.1"), (name, port, host)


def test_every_mounted_repo_path_exists(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for source, _ in _bind_mounts(svc):
            assert (ROOT / source).resolve().exists(), (name, source)
            assert (ROOT / source).resolve().is_relative_to(ROOT), (name, source)


def test_named_volumes_are_declared(services: dict[str, Any], compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for v in svc.get("volumes", []):
            source = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if source and not source.startswith((".", "/")):
                assert source in declared, (name, source)


def test_depends_on_names_services(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, (name, dep)


# --- Dockerfile ------------------------------------------------------------------------------

def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    names = [n for _, n in stages]
    assert "python:3.11-slim" in text
    assert "generator" in names and names[-1] == "promaccel", "the default (last) stage is the proxy"
    assert re.search(r"^RUN pip install \. ", text, re.M)
    assert "python -m proxy.codec.warmup" in text, "the image carries the compiled hot path"
    assert re.search(r'^ENTRYPOINT \["promaccel"\]', text, re.M)
    assert "promtool" in text
    # Every local path the Dockerfile copies exists (README* is optional).
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        for src in line.split()[:-1]:
            if "*" not in src:
                assert (ROOT / src).exists(), src


def test_pyproject_packages_are_copied_into_the_image() -> None:
    import tomllib

    # Package discovery (`proxy*` takes in proxy/cache/ ...): each top-level package is copied.
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*").rstrip(".") for pattern in include}
    assert packages == {"proxy", "shardplanner", "loadtests"}
    text = DOCKERFILE.read_text()
    for pkg in sorted(packages):
        assert re.search(rf"^COPY {pkg} ", text, re.M), pkg


# --- Grafana provisioning ----------------------------------------------------------------------

def test_promaccel_datasource_points_at_promaccel_service(
    datasources: list[dict[str, Any]], services: dict[str, Any]
) -> None:
    by_name = {ds["name"]: ds for ds in datasources}
    ds = by_name["promaccel"]
    assert ds["type"] == "prometheus"
    assert ds["isDefault"] is True
    assert [d["name"] for d in datasources if d.get("isDefault")] == ["promaccel"]
    url = urlparse(ds["url"])
    assert (url.scheme, url.hostname, url.port) == ("http", "promaccel", 9091)
    assert url.hostname in services
    assert _flag(_command(services["promaccel"]), "--port") == [str(url.port)]
    assert ds["jsonData"]["httpMethod"] == "POST"
    assert ds["jsonData"]["timeInterval"] == "30s"


def test_direct_datasource_points_at_prometheus(datasources: list[dict[str, Any]], services: dict[str, Any]) -> None:
    ds = {d["name"]: d for d in datasources}["prometheus-direct"]
    url = urlparse(ds["url"])
    assert url.hostname == "prometheus" and url.hostname in services and url.port == 9090
    assert ds["jsonData"]["timeInterval"] == "30s"


def test_timeinterval_matches_prometheus_scrape_interval(datasources: list[dict[str, Any]]) -> None:
    prom = _load_yaml(PROMETHEUS_YML)
    for ds in datasources:
        assert ds["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]


def test_timeinterval_matches_load_test_assumption(datasources: list[dict[str, Any]]) -> None:
    from loadtests.dashboard import DATASOURCE_TIME_INTERVAL

    assert {d["jsonData"]["timeInterval"] for d in datasources} == {DATASOURCE_TIME_INTERVAL}


# --- dashboard -------------------------------------------------------------------------------

def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.extend(p.get("panels", []) if p.get("type") == "row" else [p])
    return out


def test_dashboard_is_valid(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] == "GPU Fleet"
    assert dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    panels = _panels(dashboard)
    assert 10 <= len(panels) <= 20
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["type"] in {"timeseries", "stat"}, p["title"]
        assert p["title"]
        assert "maxDataPoints" not in p, "Grafana derives it from the panel width"
        g = p["gridPos"]
        assert 1 <= g["w"] <= 24 and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t["refId"]


def test_dashboard_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in _panels(dashboard):
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]


def test_dashboard_datasources_resolve(dashboard: dict[str, Any], datasources: list[dict[str, Any]]) -> None:
    uids = {d["uid"] for d in datasources}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for p in _panels(dashboard):
        for ref in [p.get("datasource")] + [t.get("datasource") for t in p["targets"]]:
            if ref is None:
                continue  # default data source: promaccel
            assert ref["type"] == "prometheus"
            uid = ref["uid"]
            m = re.fullmatch(r"\$\{?(\w+)\}?", uid)
            if m:
                var = variables[m.group(1)]
                assert var["type"] == "datasource" and var["query"] == "prometheus"
                assert var["current"]["value"] in uids
            else:
                assert uid in uids


def test_dashboard_covers_the_typical_panels(dashboard: dict[str, Any]) -> None:
    exprs = {t["expr"] for p in _panels(dashboard) for t in p["targets"]}
    for expected in (
        "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
        "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
        "sum by (namespace) (DCGM_FI_DEV_FB_USED)",
        "topk(10, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
        "count(DCGM_FI_DEV_XID_ERRORS > 0)",
        "sum by (phase) (kube_pod_status_phase)",
    ):
        assert expected in exprs, expected
    joined = "\n".join(exprs)
    assert "$__rate_interval" in joined and "$__interval" in joined
    widths = {p["gridPos"]["w"] for p in _panels(dashboard)}
    assert len(widths) >= 3, "several panel widths give several steps"


def test_dashboard_provider(dashboard: dict[str, Any]) -> None:
    provider = _load_yaml(DASH_PROVIDER)
    assert provider["apiVersion"] == 1
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["options"]["path"].startswith("/")


# --- prometheus.yml and the example promaccel config -----------------------------------------

def test_prometheus_yml() -> None:
    prom = _load_yaml(PROMETHEUS_YML)
    assert prom["global"]["scrape_interval"] == "30s"
    for job in prom["scrape_configs"]:
        assert job["job_name"] and job["static_configs"][0]["targets"]


def test_example_config_shape() -> None:
    cfg = _load_yaml(EXAMPLE_CONFIG)
    assert set(cfg) >= {"listen", "backends", "cache", "planner", "limits"}
    assert cfg["listen"]["port"] == 9091
    assert cfg["backends"][0]["kind"] in {"prometheus", "amp"}


def test_example_config_validates_against_the_real_schema() -> None:
    import proxy.config as config
    cfg = config.build_config(_load_yaml(EXAMPLE_CONFIG))
    assert cfg.listen.port == 9091
    assert cfg.backends[0].url == "http://127.0.0.1:9090"
