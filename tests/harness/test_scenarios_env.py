"""loadtests/scenarios/env.py: the promaccel log scan and the source digest."""

from __future__ import annotations

from pathlib import Path

from loadtests.scenarios import env


def test_scan_log_counts_warnings_and_errors(tmp_path: Path) -> None:
    log = tmp_path / "promaccel.log"
    log.write_text("promaccel serving on http://127.0.0.1:1\n"
                   "2026-11-29 20:06:45,035 WARNING promaccel.cache redis cache get failed: TimeoutError\n"
                   "2026-11-29 20:06:46,000 ERROR promaccel boom\nTraceback (most recent call last):\n")
    found = env.scan_log(log)
    assert (found.warnings, found.errors) == (1, 2)
    assert "TimeoutError" in found.examples[0]
    assert env.scan_log(tmp_path / "missing.log").warnings == 0


def test_code_digest_is_stable() -> None:
    assert env.code_digest() == env.code_digest() and len(env.code_digest()) == 12
