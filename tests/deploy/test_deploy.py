"""The Kubernetes manifests under deploy/: every overlay rendered with `kubectl kustomize`,
each object validated offline against the Kubernetes JSON schemas (kubernetes-validate, strict:
unknown fields are errors), then checked for what the schemas cannot see: the probes hit
promaccel's endpoints on its port, the promaccel.yaml in the ConfigMap loads with promaccel's
own loader (the files it names resolved through the pod's Secret volumes) and listens where the
Service sends traffic, the Service/PDB/HPA target the Deployment's pods, the HPA alone sets the
replica count, each overlay sets the image, Redis requires the password promaccel reads from
the same Secret, NetworkPolicies let only promaccel reach Redis and promaccel reach only DNS,
Redis and its backends, Redis and the Grafana data source point at Services that exist, and no
manifest holds a secret value. No cluster is needed. The ServiceMonitor/PodMonitor components:
test_monitors.py; Redis started with the rendered command and password: test_redis_auth.py.
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


def secret_source(dep: dict[str, Any], c: dict[str, Any], path: str) -> tuple[str, str]:
    """The (Secret name, key) a file path in the container comes from, through its volume
    mounts and the pod's secret / projected-secret volumes; an assertion error if none."""
    mounts = [m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{path} is not under exactly one volume mount"
    rel = path[len(mounts[0]["mountPath"].rstrip("/")) + 1:]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mounts[0]["name"]]
    sources = ([s["secret"] for s in vol["projected"]["sources"] if "secret" in s] if "projected" in vol
               else [{"name": vol["secret"]["secretName"], **vol["secret"]}] if "secret" in vol else [])
    for src in sources:
        items = src.get("items")
        if items is None:  # every key of the Secret, by its name
            return src["name"], rel
        for item in items:
            if item["path"] == rel:
                return src["name"], item["key"]
    raise AssertionError(f"{path}: no Secret behind it (volume {vol['name']})")


_FILE_KEYS = re.compile(r"(?m)^(\s*-?\s*\w+_file:\s*)(\S+)")


def promaccel_config(docs: list[dict[str, Any]], tmp_path: Path,
                     files: dict[str, str] | None = None) -> Config:
    """The promaccel.yaml the container reads (args' --config path, through the volume mount
    to the ConfigMap key), written out and loaded with promaccel's own loader. Each file it
    names (`*_file:`) must come from a Secret mounted into the container; a stand-in is written
    for it (`files`: path -> content; 32 characters by default)."""
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
    text = cm["data"][key]
    stand_ins = tmp_path / "secret-files"
    stand_ins.mkdir(exist_ok=True)

    def stand_in(m: re.Match[str]) -> str:
        path = m.group(2)
        secret_source(dep, c, path)
        local = stand_ins / path.strip("/").replace("/", "_")
        local.write_text((files or {}).get(path, "s" * 32) + "\n")
        return m.group(1) + str(local)

    out = tmp_path / key
    out.write_text(_FILE_KEYS.sub(stand_in, text))
    return load_config(str(out))


# --------------------------------------------------------------------------- rendering + schemas

def test_every_overlay_is_found() -> None:
    assert {"single-prometheus", "single-prometheus-tls", "hybrid-amp", "amp-elasticache"} <= set(OVERLAYS)


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
        for c in spec.get("initContainers", []) + spec["containers"]:
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
    """An IAM role where AMP needs one, and no placeholder role where nothing does."""
    name, docs = overlay
    dep = promaccel_deployment(docs)
    sa = one(docs, "ServiceAccount", dep["spec"]["template"]["spec"]["serviceAccountName"])
    cfg = promaccel_config(docs, tmp_path)
    if not any(b.kind == "amp" for b in cfg.backends):
        assert "eks.amazonaws.com/role-arn" not in sa["metadata"].get("annotations", {}), \
            f"{name}: an IAM role annotation without an AMP backend"
        return
    arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", arn), arn
    if True:
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
    # [ \t]: a value on the same line (a `secret:` volume's mapping on the next line is not one).
    (re.compile(r"(?im)^[ \t]*(password|token|secret|admin_token)[ \t]*:[ \t]*(?!null\b|~|$)\S"),
     "a password/token value"),
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
    clean = ("redis_url: redis://promaccel-redis:6379/0\npassword_file: /var/run/secrets/p\nadmin_token: null\n"
             "redis_password_file: /etc/promaccel-secrets/redis-password\n")
    assert not secret_findings(clean, [])


# --------------------------------------------------------------------------- issue 30: operating it

def overlay_kustomization(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "overlays" / name / "kustomization.yaml").read_text())


def test_replicas_are_set_only_by_the_hpa(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """No spec.replicas for `kubectl apply` to reset under the HPA, in the rendering or in any
    patch; the overlay's replicas.yaml is where its range is set."""
    name, docs = overlay
    for dep in objs(docs, "Deployment"):
        if dep["metadata"]["name"] == "promaccel":
            assert "replicas" not in dep["spec"], f"{name}: the Deployment sets spec.replicas"
    text = (DEPLOY / "overlays" / name / "kustomization.yaml").read_text()
    assert "/spec/replicas" not in text and "replicas:" not in text.replace("Replicas", "")
    patch = yaml.safe_load((DEPLOY / "overlays" / name / "replicas.yaml").read_text())
    assert patch["kind"] == "HorizontalPodAutoscaler"
    assert set(patch["spec"]) == {"minReplicas", "maxReplicas"}
    (hpa,) = objs(docs, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == \
        (patch["spec"]["minReplicas"], patch["spec"]["maxReplicas"])
    assert {"path": "replicas.yaml"} in overlay_kustomization(name)["patches"]


def test_each_overlay_sets_the_image(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert "images" not in base, "the image is set per overlay, not in the base"
    (img,) = [i for i in overlay_kustomization(name)["images"] if i["name"] == "promaccel"]
    spec = promaccel_deployment(docs)["spec"]["template"]["spec"]
    for c in spec["initContainers"] + spec["containers"]:  # the init container copies the image's cache
        assert c["image"] == f"{img['newName']}:{img['newTag']}", f"{name}: {c['name']} runs {c['image']}"


def test_every_file_promaccel_reads_comes_from_a_secret(
        overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The Redis password and the cache's HMAC key in every overlay (promaccel_config resolves
    each *_file through the pod's Secret volumes), and the admin token from a Secret."""
    name, docs = overlay
    cfg = promaccel_config(docs, tmp_path)
    assert cfg.cache.redis_password_file and cfg.cache.secret_file, name
    assert cfg.cache.frame_secret()[1] == "secret_file"
    dep = promaccel_deployment(docs)
    c = container(dep)
    cm_text = "\n".join(d["data"]["promaccel.yaml"] for d in objs(docs, "ConfigMap") if "promaccel.yaml" in d["data"])
    paths = dict(re.findall(r"(?m)^\s*(redis_password_file|secret_file):\s*(\S+)", cm_text))
    assert secret_source(dep, c, paths["redis_password_file"]) == ("promaccel-redis", "password")
    assert secret_source(dep, c, paths["secret_file"]) == ("promaccel-cache-hmac", "secret")
    (admin,) = [e for e in c["env"] if e["name"] == "PROMACCEL_ADMIN_TOKEN"]
    assert admin["valueFrom"]["secretKeyRef"] == {"name": "promaccel-admin", "key": "token", "optional": True}


def test_in_cluster_redis_requires_the_password_promaccel_reads(
        overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    redis_deps = [d for d in objs(docs, "Deployment") if d["metadata"]["name"] == "promaccel-redis"]
    if not redis_deps:
        assert name == "amp-elasticache", f"{name}: no in-cluster Redis"
        return
    (rc,) = redis_deps[0]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in rc["env"]}
    assert env["REDIS_PASSWORD"] == {"name": "promaccel-redis", "key": "password"}
    assert env["REDISCLI_AUTH"] == env["REDIS_PASSWORD"]
    script = " ".join(rc["command"] + rc["args"])
    assert 'requirepass "${REDIS_PASSWORD}"' in script and "redis-server -" in script
    assert "--requirepass" not in script, "the password is not an argument `ps` shows"
    # The same Secret and key as promaccel's cache.redis_password_file (see the test above).
    dep = promaccel_deployment(docs)
    assert secret_source(dep, container(dep), "/etc/promaccel-secrets/redis-password") == \
        ("promaccel-redis", "password")


def _policies_for(docs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in objs(docs, "NetworkPolicy")
            if all(labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())]


def _egress_ports(policies: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    return [(peer, port["port"]) for p in policies for rule in p["spec"].get("egress", [])
            for peer in rule.get("to", [{}]) for port in rule.get("ports", [{"port": None}])]


def test_network_policies(overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """A default deny for the namespace; promaccel reachable only from labelled namespaces on
    its port; out only to DNS, Redis and its backends; Redis reachable only from promaccel."""
    name, docs = overlay
    pols = objs(docs, "NetworkPolicy")
    assert pols, f"{name}: no NetworkPolicy"
    deny = [p for p in pols if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1 and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert not deny[0]["spec"].get("ingress") and not deny[0]["spec"].get("egress")

    dep = promaccel_deployment(docs)
    pod = dep["spec"]["template"]["metadata"]["labels"]
    mine = [p for p in _policies_for(docs, pod) if p["spec"]["podSelector"]]
    ingress = [r for p in mine for r in p["spec"].get("ingress", [])]
    assert ingress, name
    for rule in ingress:
        assert [set(peer) for peer in rule["from"]] == [{"namespaceSelector"}], rule
        assert rule["from"][0]["namespaceSelector"] == {"matchLabels": {"promaccel.io/query": "true"}}
        assert [p["port"] for p in rule["ports"]] == ["http"]
    out = _egress_ports(mine)
    assert ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
             "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}, 53) in out
    assert all(port is not None for _, port in out), f"{name}: an egress rule open on every port"

    cfg = promaccel_config(docs, tmp_path)
    for b in cfg.backends:
        u = urlparse(str(b.url))
        if b.kind == "amp":
            assert ({"ipBlock": {"cidr": "0.0.0.0/0"}}, 443) in out, f"{name}: no way out to AMP"
            continue
        svc, ns = (u.hostname or "").split(".")[:2]  # <service>.<namespace>.svc
        assert any(peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == ns
                   and port == u.port for peer, port in out), f"{name}: no way out to {b.name} ({ns}:{u.port})"

    redis_pods = [d["spec"]["template"]["metadata"]["labels"] for d in objs(docs, "Deployment")
                  if d["metadata"]["name"] == "promaccel-redis"]
    if redis_pods:
        (rp,) = [p for p in _policies_for(docs, redis_pods[0]) if p["spec"]["podSelector"]]
        assert set(rp["spec"]["policyTypes"]) == {"Ingress", "Egress"} and not rp["spec"].get("egress")
        (rule,) = rp["spec"]["ingress"]
        assert rule["from"] == [{"podSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}]
        assert ({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "promaccel-redis",
                                                 "app.kubernetes.io/component": "cache"}}}, 6379) in out
    else:
        assert ({"ipBlock": {"cidr": "0.0.0.0/0"}}, 6379) in out, f"{name}: no way out to the managed Redis"


def test_no_site_placeholder_outside_the_overlays_marked_set() -> None:
    """Values that name someone's account or registry live only in an overlay, next to a
    `SET:` (or the image note): the base and the components carry none."""
    for path in list((DEPLOY / "base").glob("*.yaml")) + list((DEPLOY / "components").rglob("*.yaml")):
        text = path.read_text()
        assert "111122223333" not in text and "registry.example.com" not in text, path
    for name in OVERLAYS:
        text = (DEPLOY / "overlays" / name / "kustomization.yaml").read_text()
        if "111122223333" in text:
            assert "SET: the IAM role" in text, name
