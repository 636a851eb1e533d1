"""Issue 29's structural bounds on the product code, kept from creeping back: no class over
300 lines and no file over 700 (proxy/, shardplanner/), no module-level ContextVar in proxy/
but OpenTelemetry's own (tracing), no import of another module's private name, and a test
file named after at least 80% of the product modules over 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [p for pkg in ("proxy", "shardplanner") for p in sorted((ROOT / pkg).rglob("*.py"))]
MAX_CLASS_LINES = 300
MAX_FILE_LINES = 700
TESTED_SHARE = 0.8


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_the_product_is_found() -> None:
    assert len(PRODUCT) > 100 and all(p.suffix == ".py" for p in PRODUCT)


def test_no_class_over_300_lines_and_no_file_over_700() -> None:
    big_classes = [f"{p.relative_to(ROOT)}:{n.name} {n.end_lineno - n.lineno + 1}"
                   for p in PRODUCT for n in ast.walk(_tree(p))
                   if isinstance(n, ast.ClassDef) and (n.end_lineno or 0) - n.lineno + 1 > MAX_CLASS_LINES]
    big_files = [f"{p.relative_to(ROOT)} {n}" for p in PRODUCT if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert big_classes == [] and big_files == []


def test_no_module_level_context_vars_but_tracings() -> None:
    found = []
    for p in PRODUCT:
        if p.name == "tracing.py":
            continue
        for n in _tree(p).body:
            value = n.value if isinstance(n, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and "ContextVar" in ast.unparse(value.func):
                found.append(f"{p.relative_to(ROOT)}:{n.lineno}")
    assert found == []


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for p in PRODUCT:
        for n in ast.walk(_tree(p)):
            if isinstance(n, ast.ImportFrom):
                found += [f"{p.relative_to(ROOT)}:{n.lineno} {a.name}" for a in n.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_most_product_modules_have_a_test_file_of_their_name() -> None:
    tests = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    modules = [p for p in PRODUCT if p.name != "__init__.py" and len(p.read_text().splitlines()) > 60]
    untested = [str(p.relative_to(ROOT)) for p in modules if f"test_{p.stem}.py" not in tests]
    assert len(modules) - len(untested) >= TESTED_SHARE * len(modules), untested
