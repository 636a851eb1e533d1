"""The product's one wall clock (proxy/primitives/clock.py): every module reads it from there."""

from __future__ import annotations

import ast
import time
from pathlib import Path

from proxy.primitives.clock import wall_ms

ROOT = Path(__file__).resolve().parents[2]


def test_wall_ms_is_epoch_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    now = wall_ms()
    assert isinstance(now, int) and before <= now <= time.time_ns() // 1_000_000


def test_wall_ms_is_defined_once_and_imported_from_the_clock_module() -> None:
    defined, imported_elsewhere = [], []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "wall_ms":
                defined.append(rel)
            if isinstance(node, ast.ImportFrom) and any(a.name == "wall_ms" for a in node.names):
                if not (node.module or "").endswith("primitives.clock"):
                    imported_elsewhere.append(rel)
    assert defined == ["proxy/primitives/clock.py"]
    assert imported_elsewhere == []
