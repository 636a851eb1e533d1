"""proxy/cache's modules import each other without a cycle (type-checking imports counted:
leases <-> redis_store <-> store was one, issue 29), and import no other module's private
(`_x`) names -- the lease commands use the Redis store's public `LeaseHost` methods."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "proxy" / "cache"


def _imports(path: Path) -> tuple[set[str], list[str]]:
    """The proxy/cache modules `path` imports (by file stem) and the private names it imports
    from other modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mods: set[str] = set()
    private: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                mods.add(module.split(".")[0] if module else "")
                if not module:
                    mods.update(a.name for a in node.names)
            elif node.level == 0 and module.startswith("proxy.cache."):
                mods.add(module.split(".")[2])
            private += [f"{module}.{a.name}" for a in node.names if a.name.startswith("_") and a.name != "__future__"]
    return mods - {"", "__init__"}, private


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p)[0] for p in CACHE.glob("*.py") if p.stem != "__init__"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_cache_modules() -> None:
    graph = _graph()
    assert {"leases", "redis_store", "store"} <= set(graph)
    assert "redis_store" not in graph["leases"] and "leases" not in graph["store"]
    assert _cycles(graph) == []


def test_no_private_names_imported() -> None:
    owned = [*CACHE.glob("*.py"), *(ROOT / "proxy" / "primitives").glob("*.py"),
             ROOT / "proxy" / "backends" / "circuit.py", ROOT / "proxy" / "singleflight.py",
             *(ROOT / "proxy" / "pipeline" / f"{m}.py" for m in ("names", "planning", "leases", "discovery", "series_counts"))]
    bad = {str(p.relative_to(ROOT)): priv for p in owned if p.exists() for priv in [_imports(p)[1]] if priv}
    assert bad == {}


def test_the_redis_store_is_a_lease_host() -> None:
    """Every LeaseHost method is a public method of RedisStore with the same parameters."""
    import inspect

    from proxy.cache.leases import LeaseHost
    from proxy.cache.redis_store import RedisStore

    wanted = [n for n in vars(LeaseHost) if not n.startswith("_") and callable(getattr(LeaseHost, n))]
    assert sorted(wanted) == ["generation", "guarded", "pipeline", "verify"]
    for name in wanted:
        have = inspect.signature(getattr(RedisStore, name))
        want = inspect.signature(getattr(LeaseHost, name))
        assert list(have.parameters) == list(want.parameters), name
