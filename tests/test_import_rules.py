"""Import rules, checked statically (`ast`) over every .py file, imports inside functions too:

- `shardplanner` is pure: it imports neither `proxy` nor `loadtests` (nor `tests`);
- the product `proxy` imports neither the harness `loadtests` nor `tests`;
- the harness `loadtests` never imports `tests` (tests may import loadtests);
- in shardplanner, proxy and loadtests only `shardplanner/promql.py` talks to promql-parser."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLANNER_MODULES = sorted((ROOT / "shardplanner").rglob("*.py"))
PRODUCT_MODULES = sorted(p for pkg in ("shardplanner", "proxy", "loadtests") for p in (ROOT / pkg).rglob("*.py"))
PARSER_GATE = ROOT / "shardplanner" / "promql.py"
# Top-level package -> the packages of this repository it must never import.
FORBIDDEN = {
    "shardplanner": {"proxy", "loadtests", "tests"},
    "proxy": {"loadtests", "tests"},
    "loadtests": {"tests"},
}
RULED_MODULES = sorted(p for pkg in FORBIDDEN for p in (ROOT / pkg).rglob("*.py"))


def _imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Top-level names of every module `path` imports, however it spells it: `import x.y`,
    `from x import y`, `from ..x import y` (resolved against its package), and
    `importlib.import_module("x")` / `__import__("x")` with a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package_parts = path.relative_to(root).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.add((node.module or "").split(".")[0])
                continue
            base = list(package_parts[: len(package_parts) - (node.level - 1)])
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # `from .. import proxy` from a top-level package
                found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                if isinstance(arg.value, str):
                    found.add(arg.value.lstrip(".").split(".")[0])
    return found


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_modules_found() -> None:
    assert PARSER_GATE in PLANNER_MODULES
    assert len(PLANNER_MODULES) >= 3
    assert {p.relative_to(ROOT).parts[0] for p in RULED_MODULES} == set(FORBIDDEN)
    assert any(len(p.relative_to(ROOT).parts) > 2 for p in RULED_MODULES)  # subpackages too


@pytest.mark.parametrize("path", RULED_MODULES, ids=_rel)
def test_package_import_rules(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    bad = _imported_modules(path) & FORBIDDEN[package]
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: {package} must not import {sorted(FORBIDDEN[package])}"


@pytest.mark.parametrize("path", PRODUCT_MODULES, ids=_rel)
def test_only_promql_module_imports_promql_parser(path: Path) -> None:
    assert ("promql_parser" in _imported_modules(path)) == (path == PARSER_GATE)


@pytest.mark.parametrize(
    "source",
    [
        "import proxy\n",
        "import proxy.app as app\n",
        "from proxy import errors\n",
        "from proxy.backend import Backend\n",
        "from ..proxy import errors\n",
        "from .. import proxy\n",
        "def f():\n    import proxy\n",
        "import importlib\nimportlib.import_module('proxy.cache')\n",
        "__import__('proxy')\n",
    ],
)
def test_detector_sees_every_spelling(tmp_path: Path, source: str) -> None:
    pkg = tmp_path / "shardplanner"
    pkg.mkdir()
    probe = pkg / "probe.py"
    probe.write_text(source)
    assert "proxy" in _imported_modules(probe, root=tmp_path)


@pytest.mark.parametrize(
    ("where", "source", "found"),
    [
        ("proxy/cache/keys.py", "from ...loadtests import bench\n", "loadtests"),
        ("proxy/cache/keys.py", "from ... import tests\n", "tests"),
        ("proxy/cli.py", "def main():\n    from loadtests.bench import main\n", "loadtests"),
        ("loadtests/bench.py", "import tests.compare\n", "tests"),
        ("loadtests/bench.py", "class A:\n    def f(self):\n        from tests import compare\n", "tests"),
    ],
)
def test_detector_resolves_nested_packages(tmp_path: Path, where: str, source: str, found: str) -> None:
    probe = tmp_path / where
    probe.parent.mkdir(parents=True)
    probe.write_text(source)
    assert found in _imported_modules(probe, root=tmp_path)
    package = Path(where).parts[0]
    assert found in FORBIDDEN[package]


def test_detector_ignores_lookalikes(tmp_path: Path) -> None:
    pkg = tmp_path / "shardplanner"
    pkg.mkdir()
    probe = pkg / "probe.py"
    probe.write_text("from . import proxy_free\nimport proxyish\nfrom .ast import Selector\nx = 'proxy'\n")
    assert "proxy" not in _imported_modules(probe, root=tmp_path)


# --- layers inside proxy/ ---------------------------------------------------------------------
# proxy subpackage -> the proxy subpackages it must never import (docs/ARCHITECTURE.md's picture):
#   api > pipeline > {cache, backends} > runtime > {engine, result, codec} > {observe, config}
#   > primitives (> shardplanner, outside proxy/).
# Upward imports are what is refused; `cli` (the entry point) may import anything, `errors`
# (the error type every layer raises) nothing.
_PROXY_PARTS = {p.stem if p.is_file() else p.name for p in (ROOT / "proxy").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
_ABOVE_STORES = {"cli", "api", "pipeline"}
_ABOVE_KERNELS = _ABOVE_STORES | {"cache", "backends", "runtime"}
LAYERS = {
    "api": {"cli"},
    "pipeline": {"cli", "api"},
    "cache": _ABOVE_STORES | {"backends", "runtime", "engine"},
    "backends": _ABOVE_STORES | {"cache", "runtime", "engine", "result", "codec"},
    "runtime": _ABOVE_STORES | {"cache", "backends", "engine"},
    "engine": _ABOVE_KERNELS,
    "result": _ABOVE_KERNELS | {"engine"},
    "codec": _ABOVE_KERNELS | {"engine"},
    "observe": _PROXY_PARTS - {"observe", "primitives", "config", "errors"},
    "config": _PROXY_PARTS - {"config", "primitives"},
    "errors": _PROXY_PARTS - {"errors", "primitives"},
    "primitives": _PROXY_PARTS - {"primitives"},
}
# No top-level module in proxy/ besides these (issue 29: everything else in a package).
TOP_LEVEL_MODULES = {"cli", "errors"}


def test_no_other_top_level_modules() -> None:
    modules = {p.stem for p in (ROOT / "proxy").glob("*.py") if p.stem != "__init__"}
    assert modules <= TOP_LEVEL_MODULES, f"top-level modules in proxy/ outside a package: {sorted(modules - TOP_LEVEL_MODULES)}"


# Third-party libraries only one place in the product may import.
GATES = {"aiohttp": "proxy/backends/transports.py", "httpx": "proxy/backends/transports.py",
         "pyarrow": "proxy/codec/arrow.py", "redis": "proxy/cache/redis_client.py"}
PROXY_MODULES = sorted((ROOT / "proxy").rglob("*.py"))


def _proxy_subpackages(path: Path) -> set[str]:
    """The proxy subpackages (`api`, `pipeline`, ...) that `path` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package_parts = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[list[str]] = []
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = [] if node.level == 0 else list(package_parts[: len(package_parts) - (node.level - 1)])
            mod = base + (node.module.split(".") if node.module else [])
            targets = [mod] if node.module else [mod + [alias.name] for alias in node.names]
        for t in targets:
            if len(t) >= 2 and t[0] == "proxy":
                found.add(t[1])
    return found


@pytest.mark.parametrize("path", PROXY_MODULES, ids=_rel)
def test_proxy_layers(path: Path) -> None:
    parts = path.relative_to(ROOT).parts
    layer = parts[1] if len(parts) > 2 else None
    bad = _proxy_subpackages(path) & LAYERS.get(layer or "", set())
    assert not bad, f"{_rel(path)} imports proxy.{sorted(bad)}: proxy/{layer} must not import {sorted(LAYERS[layer or ''])}"


def _runtime_imports(path: Path) -> set[str]:
    """Top-level names of the modules `path` imports at run time (`if TYPE_CHECKING:` blocks
    left out)."""

    class Strip(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt] | None:
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                return node.orelse or None
            return self.generic_visit(node)

    tree = Strip().visit(ast.parse(path.read_text(encoding="utf-8")))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", PROXY_MODULES, ids=_rel)
def test_gated_libraries(path: Path) -> None:
    imported = _runtime_imports(path)
    for lib, gate in GATES.items():
        if lib in imported:
            assert _rel(path) == gate, f"{_rel(path)} imports {lib}: only {gate} may"


def test_layer_detector(tmp_path: Path) -> None:
    probe = ROOT / "proxy" / "pipeline" / "values.py"
    assert "result" in _proxy_subpackages(probe) or "backends" in _proxy_subpackages(probe)


def test_primitives_are_below_every_layer() -> None:
    assert {"api", "pipeline", "backends", "cache", "engine", "errors", "config"} <= LAYERS["primitives"]
    assert all("primitives" not in forbidden for forbidden in LAYERS.values())
    probe = ROOT / "proxy" / "pipeline" / "planning.py"
    assert "primitives" in _proxy_subpackages(probe)  # a layer above uses it


# --- no import cycles between product modules ---------------------------------------------
# A cycle (a imports b, b imports a, however far round) means neither module can be read,
# tested or moved without the other, and it only works by the accident of which one loads
# first; lazy imports inside functions hide such a cycle from Python, not from the reader,
# so they count; so do imports under `if TYPE_CHECKING:`, which never run but tie the two
# modules together for the reader (and for mypy) all the same.
CYCLE_PACKAGES = ("proxy", "shardplanner")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT, packages: tuple[str, ...] = CYCLE_PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports, at module level, inside functions or
    for type checking only. `from p import m` is an edge to the module p.m when there is one,
    else to p; a package's own `__init__` is not counted as imported by importing its
    submodules."""
    paths = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = [] if node.level == 0 else package[: len(package) - (node.level - 1)]
                module = ".".join(base + (node.module.split(".") if node.module else []))
                for alias in node.names:
                    found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module)
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                    found.add(node.args[0].value)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reachable = {m: reach(m) for m in graph}
    cycles: list[list[str]] = []
    placed: set[str] = set()
    for m in sorted(graph):
        if m in placed:
            continue
        component = sorted(n for n in reachable[m] if m in reachable[n])
        placed.update(component)
        if len(component) > 1:
            cycles.append(component)
    return cycles


def test_no_import_cycles_between_product_modules() -> None:
    graph = _import_graph()
    assert "proxy.codec.arrow" in graph and "shardplanner.planner" in graph
    cycles = _import_cycles(graph)
    described = ["; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_cycle_detector(tmp_path: Path) -> None:
    pkg = tmp_path / "proxy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import A\n")
    (pkg / "sub" / "a.py").write_text("from proxy.sub import b\nA = 1\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .a import A\n    return A\n")  # lazy: counts
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from proxy import d\n")
    (pkg / "d.py").write_text("import proxy.c\nimport importlib\nimportlib.import_module('proxy.e')\n")
    (pkg / "e.py").write_text("from . import c\n")
    graph = _import_graph(tmp_path, ("proxy",))
    assert graph["proxy.sub.a"] == {"proxy.sub.b"} and graph["proxy.sub.b"] == {"proxy.sub.a"}
    assert graph["proxy.sub"] == {"proxy.sub.a"} and graph["proxy.c"] == {"proxy.d"}  # type-only: an edge too
    assert graph["proxy.d"] == {"proxy.c", "proxy.e"} and graph["proxy.e"] == {"proxy.c"}
    assert _import_cycles(graph) == [["proxy.c", "proxy.d", "proxy.e"], ["proxy.sub.a", "proxy.sub.b"]]
    (pkg / "c.py").write_text("")  # without it: d -> c and d -> e -> c, no cycle through c
    assert _import_cycles(_import_graph(tmp_path, ("proxy",))) == [["proxy.sub.a", "proxy.sub.b"]]
