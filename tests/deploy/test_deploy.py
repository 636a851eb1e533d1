"""The Kubernetes manifests under deploy/: every overlay rendered with `kubectl kustomize`,
each object validated offline against the Kubernetes JSON schemas (kubernetes-validate, strict:
unknown fields are errors), then checked for what the schemas cannot see: the probes hit
promaccel's endpoints on its port, the promaccel.yaml in the ConfigMap loads with promaccel's
own loader and listens where the Service sends traffic, the Service/PDB/HPA target the
Deployment's pods, Redis and the Grafana data source point at Services that exist, and no
manifest holds a secret value. No cluster is needed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from proxy.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
# Kubernetes versions whose schemas every object must satisfy: the oldest EKS still supports
# in standard support here, and a recent one.
KUBE_VERSIONS = ("1.29.0", "1.33.0")
INSTALL_KUBECTL = (
    "kubectl not found on PATH: the deploy/ tests render the overlays with `kubectl kustomize`. "
    "Install Debian's kubernetes-client (`sudo apt-get install kubernetes-client`; `make test` "
    "does it in its system-deps step) or any kubectl >= 1.27."
)
INSTALL_VALIDATE = (
    "kubernetes-validate is not installed: it holds the Kubernetes JSON schemas the rendered "
    "manifests are validated against. `pip install -e '.[test]'` (or `make setup`) installs it."
)


def require_kubectl(path: str | None = None) -> str:
    """kubectl's path, or a test failure naming what to install (never a skip: `make test`
    must not pass without having rendered the manifests)."""
    exe = shutil.which("kubectl", path=path)
    if exe is None:
        pytest.fail(INSTALL_KUBECTL, pytrace=False)
    return exe


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = require_kubectl()
    proc = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize deploy/overlays/{overlay} failed:\n{proc.stderr}", pytrace=False)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def objs(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def promaccel_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "promaccel")


def container(dep: dict[str, Any], name: str = "promaccel") -> dict[str, Any]:
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def container_port(c: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number or a port name) as the container's port number."""
    if isinstance(port, int):
        assert port in [p["containerPort"] for p in c["ports"]], f"port {port} is not a container port"
        return port
    named = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
    assert named, f"no container port named {port!r}"
    return int(named[0])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def promaccel_config(docs: list[dict[str, Any]], tmp_path: Path) -> Config:
    """The promaccel.yaml the container reads (args' --config path, through the volume mount
    to the ConfigMap key), written out and loaded with promaccel's own loader."""
    dep = promaccel_deployment(docs)
    c = container(dep)
    args = c.get("args", [])
    assert args[:1] == ["serve"] and "--config" in args, f"container args: {args}"
    path = args[args.index("--config") + 1]
    mounts = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"--config {path} is not under exactly one volume mount"
    mount = mounts[0]
    key = path[len(mount["mountPath"].rstrip("/")) + 1:]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    cm = one(docs, "ConfigMap", vol["configMap"]["name"])
    assert key in cm["data"], f"ConfigMap {cm['metadata']['name']} has no key {key!r}"
    out = tmp_path / key
    out.write_text(cm["data"][key])
    return load_config(str(out))


# --------------------------------------------------------------------------- rendering + schemas

def test_every_overlay_is_found() -> None:
    assert {"single-prometheus", "hybrid-amp", "amp-elasticache"} <= set(OVERLAYS)


def test_missing_kubectl_fails_naming_the_package(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="kubernetes-client"):
        require_kubectl(path=str(tmp_path))  # an empty directory as PATH


def test_objects_validate_against_kubernetes_schemas(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail(INSTALL_VALIDATE, pytrace=False)
    name, docs = overlay
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service",
            "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds, f"{name}: {sorted(kinds)}"
    errors = []
    for d in docs:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except Exception as exc:  # ValidationError, SchemaNotFoundError
                errors.append(f"{d['kind']}/{d['metadata']['name']} (Kubernetes {version}): "
                              f"{getattr(exc, 'message', exc)}")
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_schema_validation_rejects_a_broken_object() -> None:
    """The validator above is not vacuous: a misspelled field and a wrong type are errors."""
    import kubernetes_validate

    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": "http", "targetPort": 9091}], "selektor": {"a": "b"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[0], strict=True)


def test_everything_is_namespaced_together(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    (ns,) = objs(docs, "Namespace")
    others = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert others == {ns["metadata"]["name"]}, f"{name}: namespaces {others}"


# --------------------------------------------------------------------------- the promaccel pods

def test_config_loads_and_listens_on_the_container_port(
        overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = overlay
    cfg = promaccel_config(docs, tmp_path)
    assert cfg.listen.host == "0.0.0.0", f"{name}: listen.host must be 0.0.0.0 in a pod"
    c = container(promaccel_deployment(docs))
    assert cfg.listen.port in [p["containerPort"] for p in c["ports"]], name
    svc = one(docs, "Service", "promaccel")
    (sp,) = svc["spec"]["ports"]
    assert container_port(c, sp["targetPort"]) == cfg.listen.port


def test_probes_hit_ready_and_healthy_on_the_container_port(
        overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = overlay
    cfg = promaccel_config(docs, tmp_path)
    c = container(promaccel_deployment(docs))
    expected = {"readinessProbe": "/-/ready", "livenessProbe": "/-/healthy", "startupProbe": "/-/healthy"}
    for probe, path in expected.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path, f"{name}: {probe} {get}"
        assert container_port(c, get["port"]) == cfg.listen.port, f"{name}: {probe} port {get['port']}"
    # /-/ready waits up to 3 s for a backend (proxy/pipeline/service.py): the probe waits longer.
    assert c["readinessProbe"]["timeoutSeconds"] > 3


def test_service_pdb_and_hpa_target_the_deployment(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    dep = promaccel_deployment(docs)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(dep["spec"]["selector"]["matchLabels"], pod_labels)
    svc = one(docs, "Service", "promaccel")
    assert selects(svc["spec"]["selector"], pod_labels), f"{name}: the Service does not select the pods"
    for other in objs(docs, "Deployment"):
        if other is not dep:  # e.g. Redis: its pods must not receive promaccel's traffic
            assert not selects(svc["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])
    (pdb,) = objs(docs, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels), f"{name}: PDB selects no pod"
    (hpa,) = objs(docs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", dep["metadata"]["name"])
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert dep["spec"]["replicas"] >= hpa["spec"]["minReplicas"]
    # A PDB that allows no disruption would block node drains.
    assert pdb["spec"].get("maxUnavailable", 0) >= 1 or pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]
    # The HPA's CPU utilisation is relative to the request: it must be set.
    assert "cpu" in container(dep)["resources"]["requests"]


def test_pods_run_unprivileged_on_a_read_only_root(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    for dep in objs(docs, "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec.get("automountServiceAccountToken") is False, dep["metadata"]["name"]
        writable = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert ":" in c["image"] and not c["image"].endswith(":latest"), f"{name}: image {c['image']}"
            # Every directory the process writes to is a writable volume.
            dirs = {e["value"] for e in c.get("env", []) if e["name"] in ("NUMBA_CACHE_DIR", "HOME", "TMPDIR")}
            mounted = {m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in writable}
            for d in dirs:
                assert any(d == m or d.startswith(m.rstrip("/") + "/") for m in mounted), f"{c['name']}: {d} is read-only"


def test_promaccel_resources_fit_the_measured_memory(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """docs/BENCHMARKS.md (e): 560-605 MiB peak RSS with 20 heavy queries in flight."""
    _, docs = overlay
    res = container(promaccel_deployment(docs))["resources"]

    def mib(q: str) -> float:
        units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]i?)", q)
        assert m, q
        return float(m.group(1)) * units[m.group(2)]

    assert mib(res["requests"]["memory"]) >= 605
    assert mib(res["limits"]["memory"]) >= 2 * mib(res["requests"]["memory"]) * 0.9


def test_iam_role_for_amp(overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = overlay
    dep = promaccel_deployment(docs)
    sa = one(docs, "ServiceAccount", dep["spec"]["template"]["spec"]["serviceAccountName"])
    arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", arn), arn
    cfg = promaccel_config(docs, tmp_path)
    if any(b.kind == "amp" for b in cfg.backends):
        # No static AWS keys anywhere: the SDK chain finds IRSA's web identity token.
        env = {e["name"] for e in container(dep).get("env", [])}
        assert not env & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
        assert "AWS_REGION" in env, f"{name}: AMP without AWS_REGION"


def test_redis_url_names_a_service_or_an_external_host(
        overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = overlay
    cfg = promaccel_config(docs, tmp_path)
    url = cfg.cache.redis_url
    assert url, f"{name}: replicas share nothing without Redis"
    hosts = [h.rpartition("@")[2] for h in url.partition("://")[2].split("/")[0].split(",")]
    for hp in hosts:
        host, _, port = hp.partition(":")
        if "." in host:  # outside the cluster, e.g. ElastiCache
            assert url.startswith("rediss"), f"{name}: Redis outside the cluster without TLS: {url}"
            continue
        svc = one(docs, "Service", host)
        assert int(port or 6379) in [p["port"] for p in svc["spec"]["ports"]]
        backing = [d for d in objs(docs, "Deployment")
                   if selects(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert len(backing) == 1, f"{name}: Service {host} selects {len(backing)} Deployments"


def test_grafana_datasource_points_at_the_service(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    (cm,) = [d for d in objs(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_datasource") == "1"]
    svc = one(docs, "Service", "promaccel")
    (sp,) = svc["spec"]["ports"]
    (text,) = cm["data"].values()
    (ds,) = yaml.safe_load(text)["datasources"]
    assert ds["type"] == "prometheus" and ds["access"] == "proxy"
    u = urlparse(ds["url"])
    expected = {f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc",
                f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"}
    assert u.hostname in expected and u.port == sp["port"], f"{name}: data source URL {ds['url']}, Service {expected}"
    assert ds["jsonData"]["httpMethod"] == "POST"


# --------------------------------------------------------------------------- no secrets

_SECRET_PATTERNS = [
    (re.compile(r"AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}"), "an AWS access key id"),
    (re.compile(r"(?i)aws_secret_access_key|aws_session_token"), "AWS secret key material"),
    (re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:[^/\s@'\"]+@"), "a URL with a password"),
    (re.compile(r"(?im)^\s*(password|token|secret|admin_token)\s*:\s*(?!null\b|~|$)\S"), "a password/token value"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
]


def secret_findings(text: str, docs: list[dict[str, Any]]) -> list[str]:
    found = [f"{what}: {m.group(0)[:40]!r}" for rx, what in _SECRET_PATTERNS for m in rx.finditer(text)]
    found += [f"a Secret object {d['metadata']['name']!r} with data" for d in docs
              if d["kind"] == "Secret" and (d.get("data") or d.get("stringData"))]
    for d in docs:
        for c in (d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])):
            for e in c.get("env", []):
                if re.search(r"(?i)secret|password|token|key", e["name"]) and "value" in e:
                    found.append(f"env {e['name']} with a literal value")
    return found


def test_no_secret_values_in_any_manifest(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    text = "\n".join(yaml.safe_dump(d) for d in docs)
    for cm in objs(docs, "ConfigMap"):  # the embedded files, as written
        text += "\n" + "\n".join(cm.get("data", {}).values())
    assert not secret_findings(text, docs), f"{name}: {secret_findings(text, docs)}"


def test_secret_scan_finds_secrets() -> None:
    """The scan above catches what it is meant to (else its passing proves nothing)."""
    cases = [
        "redis_url: rediss://default:hunter2@cache.example.com:6379",
        "      password: hunter2",
        "key: AKIAABCDEFGHIJKLMNOP",
        "aws_secret_access_key = abc",
    ]
    for case in cases:
        assert secret_findings(case, []), case
    assert secret_findings("", [{"kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "Yg=="}}])
    pod = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"name": "x", "env": [{"name": "REDIS_PASSWORD", "value": "x"}]}]}}}}
    assert secret_findings("", [pod])
    clean = "redis_url: redis://promaccel-redis:6379/0\npassword_file: /var/run/secrets/p\nadmin_token: null\n"
    assert not secret_findings(clean, [])
