"""components/servicemonitor and components/podmonitor: rendered on top of every overlay with
`kubectl kustomize` and validated against the prometheus-operator's CRD schemas
(monitoring.coreos.com/v1, vendored in crd_schemas/ with their source), strictly: a field the
schema does not define is an error, as `kubectl apply` (server-side strict field validation)
would report it. Then what a schema cannot see: the monitor selects promaccel's Service or pods
and scrapes a port they have, in promaccel's namespace."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.test_deploy import DEPLOY, OVERLAYS, container, one, promaccel_deployment, require_kubectl

SCHEMAS = Path(__file__).parent / "crd_schemas"
MONITORS = {"servicemonitor": ("ServiceMonitor", "servicemonitors"), "podmonitor": ("PodMonitor", "podmonitors")}


def strict(schema: Any) -> Any:
    """The CRD's structural schema with unknown fields refused: every object schema that lists
    its properties (and does not preserve unknown fields) gets additionalProperties: false.
    `metadata` stays open (the API server validates it, not the CRD)."""
    schema = copy.deepcopy(schema)

    def walk(s: Any) -> None:
        if isinstance(s, dict):
            if "properties" in s and "additionalProperties" not in s \
                    and not s.get("x-kubernetes-preserve-unknown-fields"):
                s["additionalProperties"] = False
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)

    walk(schema)
    return schema


def validator(plural: str) -> jsonschema.protocols.Validator:
    (path,) = SCHEMAS.glob(f"{plural}.v*.yaml")
    schema = strict(yaml.safe_load(path.read_text()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def render_with(overlay: str, component: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The overlay with the component added, as a user adds it (its `components:`): a copy of
    the overlay in tmp_path, its base and components named relative to the copy."""
    kubectl = require_kubectl()
    src = DEPLOY / "overlays" / overlay
    work = tmp_path / overlay
    work.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (work / f.name).write_bytes(f.read_bytes())
    k = yaml.safe_load((work / "kustomization.yaml").read_text())

    def moved(ref: str) -> str:  # kustomize takes relative paths only
        return os.path.relpath(DEPLOY / ref[len("../../"):], work) if ref.startswith("../../") else ref

    k["resources"] = [moved(r) for r in k["resources"]]
    k["components"] = [moved(c) for c in k.get("components", []) + [f"../../components/{component}"]]
    (work / "kustomization.yaml").write_text(yaml.safe_dump(k))
    proc = subprocess.run([kubectl, "kustomize", str(work)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", sorted(MONITORS))
def test_monitor_component_validates_and_selects_promaccel(overlay: str, component: str, tmp_path: Path) -> None:
    kind, plural = MONITORS[component]
    docs = render_with(overlay, component, tmp_path)
    (mon,) = [d for d in docs if d["kind"] == kind]
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    errors = sorted(validator(plural).iter_errors(mon), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)

    dep = promaccel_deployment(docs)
    assert mon["metadata"]["namespace"] == dep["metadata"]["namespace"]
    port_names = {p["name"] for p in container(dep)["ports"]}
    want = mon["spec"]["selector"]["matchLabels"]
    if kind == "ServiceMonitor":
        svc = one(docs, "Service", "promaccel")
        assert all(svc["metadata"]["labels"].get(k) == v for k, v in want.items()), "selects no Service"
        (ep,) = mon["spec"]["endpoints"]
        assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    else:
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in want.items()), "selects no promaccel pod"
        (ep,) = mon["spec"]["podMetricsEndpoints"]
        assert ep["port"] in port_names
    assert ep["path"] == "/metrics"


@pytest.mark.parametrize("component", sorted(MONITORS))
def test_the_schema_check_refuses_broken_monitors(component: str) -> None:
    """Not vacuous: a misspelled field, a wrong type and a bad enum value are errors."""
    kind, plural = MONITORS[component]
    mon = yaml.safe_load((DEPLOY / "components" / component / f"{component}.yaml").read_text())
    v = validator(plural)
    assert not list(v.iter_errors(mon))
    eps = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    for breakage in (lambda m: m["spec"][eps][0].__setitem__("intervall", "30s"),
                     lambda m: m["spec"][eps][0].__setitem__("scheme", "gopher"),
                     lambda m: m["spec"].__setitem__("selector", "app=promaccel"),
                     lambda m: m["spec"].__setitem__(eps, {"port": "http"})):
        broken = copy.deepcopy(mon)
        breakage(broken)
        assert list(v.iter_errors(broken)), broken
