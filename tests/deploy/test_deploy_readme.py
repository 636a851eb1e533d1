"""README's "Deploy on Kubernetes" commands run as printed, in order (replicas, image,
Secrets), on a copy of deploy/: the replica and image edits land in the overlay's one place
for each, and the `kubectl create secret` commands (run with --dry-run=client: no cluster)
create every Secret, with the keys, that the rendered pods mount or read -- also the TLS
certificate commands for single-prometheus-tls. Steps that need a cluster or Docker (docker
build/push, namespace, labels, apply) and the kustomize CLI's alternative are not run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_deploy import ROOT, container, require_kubectl

README = (ROOT / "README.md").read_text()
SKIP = ("docker ", "(cd $O && kustomize", "kubectl label", "kubectl apply", "kubectl kustomize",
        "kubectl create namespace")


def section() -> str:
    start = README.index("\n## Deploy on Kubernetes\n")
    return README[start:README.index("\n## ", start + 1)]


def blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", section(), re.S)


def script(block: str) -> str:
    lines = []
    for raw in block.splitlines():
        line = re.sub(r"^\s+", "", raw)
        if not line or line.startswith("#") or line.startswith(SKIP):
            continue
        if line.startswith("kubectl ") and " create secret " in line:
            line += " --dry-run=client -o yaml >> secrets.yaml && echo --- >> secrets.yaml"
        lines.append(line)
    return "set -e\n" + "\n".join(lines) + "\n"


def run(text: str, cwd: Path) -> None:
    kubectl = require_kubectl()
    env = {"PATH": f"{Path(kubectl).parent}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{text}\n{proc.stderr}"


def secrets(cwd: Path) -> dict[str, set[str]]:
    docs = [d for d in yaml.safe_load_all((cwd / "secrets.yaml").read_text()) if d]
    assert all(d["kind"] == "Secret" and d["metadata"]["namespace"] == "promaccel" for d in docs)
    return {d["metadata"]["name"]: set(d["data"]) for d in docs}


def referenced(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Secret name -> keys the rendered pods read (volumes and env), optional ones included."""
    out: dict[str, set[str]] = {}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            srcs = [s["secret"] for s in v.get("projected", {}).get("sources", []) if "secret" in s]
            if "secret" in v:
                srcs.append({"name": v["secret"]["secretName"], **v["secret"]})
            for s in srcs:
                out.setdefault(s["name"], set()).update(i["key"] for i in s.get("items", []))
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    out.setdefault(ref["name"], set()).add(ref["key"])
    return out


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    return tmp_path


def render(cwd: Path, overlay: str) -> list[dict[str, Any]]:
    proc = subprocess.run([require_kubectl(), "kustomize", str(cwd / "deploy" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_steps_are_in_order() -> None:
    text = blocks()[0]
    steps = [text.index(s) for s in ("# 1. Replicas", "# 2. Image", "# 3. Secrets", "kubectl apply -k")]
    assert steps == sorted(steps)


def test_readme_commands_set_replicas_image_and_every_secret(copy: Path) -> None:
    run(script(blocks()[0]), copy)
    docs = render(copy, "single-prometheus")
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (4, 4)
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "promaccel"]
    assert container(dep)["image"] == "registry.internal/platform/promaccel:0.1.0"
    assert all(c["image"] == container(dep)["image"] for c in dep["spec"]["template"]["spec"]["initContainers"])
    made, needed = secrets(copy), referenced(docs)
    for name, keys in needed.items():
        assert name in made and keys <= made[name], f"README creates no Secret {name} with {sorted(keys)}"
    # The other overlays read the same Secrets (and the TLS one, below).
    for overlay in ("hybrid-amp", "amp-elasticache"):
        assert set(referenced(render(copy, overlay))) <= set(made), overlay


def test_readme_tls_commands_make_the_secret_redis_and_promaccel_read(copy: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("openssl not found (`apt-get install openssl`)", pytrace=False)
    (tls,) = [b for b in blocks() if "promaccel-redis-tls" in b]
    run(script(tls), copy)
    made = secrets(copy)
    needed = referenced(render(copy, "single-prometheus-tls"))
    assert needed["promaccel-redis-tls"] <= made["promaccel-redis-tls"] == {"tls.crt", "tls.key", "ca.crt"}
    # The Redis pod mounts the whole Secret and reads these three files.
    assert set(re.findall(r"/tls/([\w.]+)", (ROOT / "deploy/components/in-cluster-redis-tls/kustomization.yaml")
                          .read_text())) == {"tls.crt", "tls.key", "ca.crt"}
