"""`make demo` end to end at a tiny size: the hybrid topology starts, the sample panel and the
cross-store join give the reference's answers (the demo exits 1 otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, require

pytestmark = pytest.mark.prom


def test_demo_hybrid_once(tmp_path: Path) -> None:
    require("prometheus")
    require("promtool")
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.demo", "--once", "--nodes", "4", "--gpus-per-node", "2",
         "--hours", "8", "--data-dir", str(tmp_path / "demo"), "--port", "0", "--prometheus-port", "0"],
        cwd=str(ROOT), capture_output=True, text=True, timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert text.count("same answer       : yes") == 2, text[-3000:]
    assert "route             : single amp" in text and "(SigV4)" in text
    assert "Grafana data source URL (Prometheus type): http://127.0.0.1:" in text
