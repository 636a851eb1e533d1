"""The README against the code: the config reference (the YAML block under "Configuration
reference") names only keys the config model has, with values of the right type, and every key
the model has; the `promaccel serve` synopsis lists exactly the CLI parser's flags; the headers,
metrics, environment variables and make targets it names exist; the Arrow stream has the schema
it documents; the ratios it quotes are docs/BENCHMARKS.md's."""

from __future__ import annotations

import re
import subprocess
import textwrap
import typing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from pydantic import BaseModel

from proxy.cli import _parser
from proxy.config import Config
from tests.servers import ROOT

README = (ROOT / "README.md").read_text()
# Keys of the model the README's reference leaves out on purpose.
UNDOCUMENTED = {"backends[].service"}  # SigV4 service name: always "aps" for AMP


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def _config_text() -> str:
    block = re.search(r"```yaml\n(.*?)```", _section("Configuration reference"), re.S)
    assert block, "no yaml block under Configuration reference"
    return block.group(1)


def _config_block() -> dict[str, Any]:
    data = yaml.safe_load(_config_text())
    assert isinstance(data, dict) and data
    return data


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (X, list[X], X | list[X] | None, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        path = prefix + name
        keys.add(path)
        for sub in _models(field.annotation):
            is_list = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(field.annotation))
            keys |= _model_keys(sub, path + ("[]." if is_list and name == "backends" else "."))
    return keys


def _readme_keys(data: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(data, dict):
        for k, v in data.items():
            keys.add(prefix + k)
            if k in ("shard_labels", "forward_headers"):  # maps of user keys, not config keys
                continue
            keys |= _readme_keys(v, prefix + k + ("[]." if isinstance(v, list) and k == "backends" else "."))
    elif isinstance(data, list):
        for item in data:
            keys |= _readme_keys(item, prefix)
    return keys


def test_config_reference_keys_are_the_models() -> None:
    documented = _readme_keys(_config_block())
    model = _model_keys(Config)
    assert documented - model == set(), "README names config keys the model does not have"
    # an alternative named in a comment counts ("# or password: ...", "and/or until: ...")
    in_comments = set(re.findall(r"#.*?\b(\w+):", _config_text()))
    missing = {k for k in model - documented - UNDOCUMENTED if k.rsplit(".", 1)[-1] not in in_comments}
    assert missing == set(), "config keys missing from the README's reference"


def test_config_reference_values_have_the_models_types() -> None:
    """The whole block is a valid config (each value of its key's type), and every value it
    shows for a top-level section is the model's default (examples: backends, shard_labels)."""
    data = _config_block()
    for backend in data["backends"]:  # the reference shows a secret file that is not there
        backend.pop("basic_auth", None)
    # ... and a tenant's pinned header values, which need tenancy.forward_headers (shown at its
    # default, []) to list the header
    for tenant in data.get("auth", {}).get("tenants") or []:
        tenant.pop("forward_headers", None)
    cfg = Config.model_validate(data)
    defaults = Config()
    examples = {("planner", "shard_labels"), ("cache", "redis_url")}
    for section in ("listen", "cache", "planner", "limits", "tenancy"):
        for key in data[section]:
            if (section, key) in examples:
                continue
            shown, default = getattr(getattr(cfg, section), key), getattr(getattr(defaults, section), key)
            assert shown == default, f"README shows {section}.{key} = {shown!r}, the default is {default!r}"
    assert cfg.log_level == defaults.log_level


def test_serve_synopsis_is_the_parsers() -> None:
    m = re.search(r"`promaccel serve (\[.*?)`\n", README, re.S)
    assert m, "no `promaccel serve [...]` synopsis"
    documented = set(re.findall(r"(--[a-z][a-z-]*)", m.group(1)))
    serve = next(a for a in _parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
                 if a.prog.endswith("serve"))
    flags = {o for action in serve._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    assert documented == flags


def test_flags_named_anywhere_exist() -> None:
    """`promaccel serve ... --flag` in any command line of the README."""
    serve = next(a for a in _parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
                 if a.prog.endswith("serve"))
    flags = {o for action in serve._actions for o in action.option_strings}
    for line in re.findall(r"promaccel serve [^\n`]*", README):
        for flag in re.findall(r"\s(--[a-z][a-z-]*)", line):
            assert flag in flags, (flag, line)


def test_headers_metrics_and_variables_exist() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py")).lower()
    for header in set(re.findall(r"`(X-[A-Za-z-]+)", README)):
        assert header.lower() in source, header
    from proxy.observe.metrics import METRICS

    names = set()
    for family in METRICS.registry.collect():
        names |= {family.name, family.name + "_total"} if family.type == "counter" else {family.name}
    for metric in set(re.findall(r"\b(promaccel_[a-z_]+)", README)):
        assert metric in names, metric
    everything = source + "\n".join(p.read_text() for d in ("loadtests", "tests") for p in (ROOT / d).rglob("*.py")).lower()
    everything += (ROOT / "Makefile").read_text().lower()
    for var in set(re.findall(r"\b(PROMACCEL_[A-Z_]+)", README)):
        assert var.lower() in everything, var
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    for target in set(re.findall(r"`make ([a-z-]+)", README)) | set(re.findall(r"^make ([a-z-]+)", README, re.M)):
        assert target in targets, target


ARROW_TYPES = {
    "int32": pa.int32(),
    "timestamp[ms, UTC]": pa.timestamp("ms", tz="UTC"),
    "float64": pa.float64(),
    "dictionary<int32, map<utf8, utf8>>": pa.dictionary(pa.int32(), pa.map_(pa.utf8(), pa.utf8())),
}


def test_arrow_stream_has_the_documented_schema() -> None:
    import numpy as np

    from proxy.codec.arrow import encode_arrow_stream
    from proxy.result import QueryResult

    bullet = README[README.index("- `Accept: application/vnd.apache.arrow.stream`"):]
    bullet = bullet[:bullet.index("```sh")]
    columns = re.findall(r"`(\w+)`\s+\(([^):]+)[):]", bullet)
    assert [c for c, _ in columns] == ["series", "timestamp", "value", "labels"], columns
    result = QueryResult("matrix", [{"__name__": "up", "job": "a"}, {"__name__": "up", "job": "b"}],
                         np.array([0, 2, 3], dtype=np.int64), np.array([1000, 2000, 1000], dtype=np.int64),
                         np.array([1.0, 2.0, 3.0]))
    schema = pa.ipc.open_stream(encode_arrow_stream(result)).schema
    assert [(f.name, f.type) for f in schema] == [(name, ARROW_TYPES[text]) for name, text in columns]
    documented_meta = set(re.findall(r"`(promaccel\.[a-z_]+)`", bullet))
    assert documented_meta == {k.decode() for k in schema.metadata}, documented_meta


def arrow_example() -> str:
    """The README's Arrow example: the shell block under the `Accept: ...arrow.stream` bullet,
    as a reader pastes it (tests/harness/test_demo.py runs it against a fresh demo)."""
    example = README[README.index("- `Accept: application/vnd.apache.arrow.stream`"):]
    example = example[example.index("```sh\n") + 6:]
    return textwrap.dedent(example[:example.index("```")])


def test_arrow_example_runs_as_printed_in_the_checkout() -> None:
    """Issue 30: the example had fixed dates outside the demo's data (0 rows, no error) and a
    bare `python` without httpx. It runs with the venv's python, takes its times from the clock
    (the demo's data ends at the hour it was built), fails loudly on an error answer, and says
    how many rows it got."""
    example = arrow_example()
    assert example.startswith(".venv/bin/python - <<'EOF'\n") and example.rstrip().endswith("\nEOF"), example
    code = example.split("\n", 1)[1].rsplit("EOF", 1)[0]
    compile(code, "README arrow example", "exec")
    assert not re.search(r"\b20\d\d-\d\d-\d\d", code), "fixed dates: outside the demo's data"
    assert "time.time()" in code and "raise_for_status()" in code and 'print(table.num_rows, "rows")' in code
    assert "http://127.0.0.1:9091/api/v1/query_range" in code


@pytest.mark.prom
def test_arrow_example_gets_rows_from_a_demo_like_promaccel(tmp_path: Path) -> None:
    """The example as printed (but for the port) against a real promaccel over a real Prometheus
    holding a small fleet shaped like the demo's data: ending at this hour. (The suite's own
    Prometheus holds a fixed window in the past, which no example that takes its times from the
    clock can ask for; tests/harness/test_demo.py runs it against the demo itself.)"""
    import time

    from loadtests.gen import FleetSpec
    from loadtests.load import build_tsdb, start_prometheus, stop_prometheus
    from tests.servers import Promaccel, require

    require("promtool")
    require("prometheus")
    spec = FleetSpec(nodes=2, gpus_per_node=1, hours=7, end=int(time.time()) // 3600 * 3600)
    build_tsdb(spec, str(tmp_path / "data"))
    prom = start_prometheus(str(tmp_path / "data"), log_path=str(tmp_path / "prometheus.log"))
    proxy = None
    try:
        proxy = Promaccel.start(prom.url, ("--split-interval", "1h"), tmp_path)  # type: ignore[attr-defined]
        out = subprocess.run(["bash", "-c", arrow_example().replace("http://127.0.0.1:9091", proxy.url)],
                             cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    finally:
        if proxy is not None:
            proxy.stop()
        stop_prometheus(prom)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "labels: dictionary<values=map<string, string>" in out.stdout, out.stdout
    rows = re.search(r"^(\d+) rows$", out.stdout, re.M)
    assert rows and int(rows.group(1)) > 0, out.stdout


@pytest.mark.parametrize("path", ["README.md"])
def test_quoted_ratios_come_from_benchmarks(path: str) -> None:
    """A speed ratio the README quotes (`0.47x`) is one docs/BENCHMARKS.md reports."""
    benchmarks = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    text = (ROOT / path).read_text()
    for ratio in set(re.findall(r"\b(\d+\.\d+x)\b", text)):
        assert ratio in benchmarks, ratio


def test_readme_paths_exist() -> None:
    """Files and directories the README points to."""
    for rel in set(re.findall(r"`((?:config|docs|loadtests|proxy|shardplanner|tests)/[\w./-]+)`", README)):
        assert (ROOT / rel.rstrip("/")).exists() or Path(ROOT, rel.split(" ")[0]).exists(), rel
