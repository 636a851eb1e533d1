"""proxy/primitives sits below every layer (both cache/ and backends/ use it): it imports no
other proxy module, so any layer may import it without a cycle or a sibling import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "proxy" / "primitives").glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_primitives_import_no_proxy_module(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level > 1 or (node.level == 0 and (node.module or "").startswith("proxy")):
                bad.append(ast.unparse(node))
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("proxy")]
    assert not bad, f"{path.name} imports {bad}"


def test_modules_found() -> None:
    assert {p.name for p in MODULES} >= {"breaker.py", "clock.py"}
