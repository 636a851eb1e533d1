"""Tests mirror the tree (issue 29 item 7): a product module over 60 lines has a test file of
its name, `tests/<package>/test_<module>.py` (top-level modules: `tests/test_<module>.py`).

The share of product modules (proxy/, shardplanner/; `__init__.py` aside) over 60 lines that
have one is a ratchet: MIN_RATIO is the share reached so far, raised as packages are mirrored,
until the goal of issue 29 (80%). A module that lacks a test file of its name is listed in the
failure message."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_PACKAGES = ("proxy", "shardplanner")
MIN_LINES = 60  # "over 60 lines": a module of 61 lines or more counts
# Reached on 2026-12-04 (third session): every product module over 60 lines has a
# test file of its name (125 of 125). Raise it; never lower it.
MIN_RATIO = 0.99
GOAL = 0.80


def _lines(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n")  # as `wc -l` counts them


def product_modules(root: Path = ROOT) -> list[Path]:
    """Product modules over MIN_LINES lines, relative to `root`."""
    return sorted(p.relative_to(root) for pkg in PRODUCT_PACKAGES for p in (root / pkg).rglob("*.py")
                  if p.name != "__init__.py" and _lines(p) > MIN_LINES)


def unmirrored(root: Path = ROOT) -> tuple[list[Path], list[Path]]:
    """(modules, those without a tests/**/test_<module>.py)."""
    tested = {p.name for p in (root / "tests").rglob("test_*.py")}
    modules = product_modules(root)
    return modules, [m for m in modules if f"test_{m.name}" not in tested]


def test_product_modules_have_a_test_file_of_their_name() -> None:
    modules, missing = unmirrored()
    ratio = 1 - len(missing) / len(modules)
    assert ratio >= MIN_RATIO, (
        f"{len(modules) - len(missing)} of {len(modules)} product modules over {MIN_LINES} lines ({ratio:.1%}) "
        f"have a test file of their name, fewer than the {MIN_RATIO:.0%} reached before (goal {GOAL:.0%}). "
        f"Without tests/<package>/test_<module>.py:\n  " + "\n  ".join(str(m) for m in missing))


def _tree(root: Path, files: dict[str, int]) -> None:
    for rel, lines in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)


def test_the_count_itself(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "proxy/big.py": 61, "proxy/pkg/other.py": 200, "proxy/short.py": 60, "proxy/pkg/__init__.py": 500,
        "shardplanner/plan.py": 100, "loadtests/bench.py": 1000,
        "tests/pkg/test_other.py": 1, "tests/test_short.py": 1, "tests/shardplanner/plan_helpers.py": 1,
    })
    modules, missing = unmirrored(tmp_path)
    # 60 lines is not over 60; __init__ and the harness are not product modules; a helper
    # module is not a test file.
    assert modules == [Path("proxy/big.py"), Path("proxy/pkg/other.py"), Path("shardplanner/plan.py")]
    assert missing == [Path("proxy/big.py"), Path("shardplanner/plan.py")]
