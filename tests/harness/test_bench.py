"""loadtests/bench.py, the CLI: its options and bounds; one end-to-end smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import bench
from loadtests.scenarios import SCENARIOS
from tests.servers import require

ROOT = Path(__file__).resolve().parents[2]


def test_parse_args_bounds_and_scenarios() -> None:
    a = bench.parse_args(["--small", "--scenario", "a,dashboard", "--scenario", "e"])
    assert a.scenarios == ["cold", "dashboard", "heavy"]
    assert a.window == ["1h", "24h", "7d"] and a.slide_s == 30
    assert bench.parse_args([]).scenarios == list(SCENARIOS)
    assert bench.parse_args(["--scenario", "g"]).scenarios == ["workers"]
    assert bench.parse_args([]).workers == 2
    assert bench.parse_args([]).size_reps == 5 and bench.parse_args(["--size-reps", "0"]).size_reps == 0
    for bad in (["--users", "0"], ["--users", "1000"], ["--scenario", "nope"], ["--refreshes", "0"],
                ["--window", "banana"], ["--heavy", "1000"], ["--workers", "0"], ["--workers", "99"],
                ["--size-reps", "-1"], ["--size-reps", "101"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)



# --- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_smoke_small(tmp_path: Path) -> None:
    for binary in ("prometheus", "promtool", "redis-server"):
        require(binary)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadtests.bench", "--small", "--refreshes", "2", "--window", "1h",
           "--users", "3", "--users-refreshes", "2", "--cold-reps", "1", "--tiny-requests", "10",
           "--heavy", "4", "--duration-limit", "60", "--codec-args", "--series 500 --points 64 --reps 1",
           "--out", str(out), "--no-latest"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads((out / "results.json").read_text())
    names = [s["name"] for s in results["scenarios"]]
    assert names == ["cold", "dashboard", "tiny", "users", "heavy", "codec", "workers"]
    assert sum(s.get("mismatches", 0) for s in results["scenarios"]) == 0
    assert sum(s.get("compared", 0) for s in results["scenarios"]) > 50
    assert all(s.get("failures", 0) == 0 for s in results["scenarios"])
    for name in ("dashboard", "tiny"):  # warm answers by size, with and without gzip (issue 28 item 5)
        sizes = next(s for s in results["scenarios"] if s["name"] == name)["sizes"]
        assert sizes and all(z["gzip_s"] and z["identity_s"] and not z["differs"] for z in sizes), name
    summary = (out / "summary.md").read_text()
    assert summary.count("Warm answers by size") == 2
    assert summary.startswith("# promaccel benchmark") and "loadtests.bench --small" in summary
    for png in ("dashboard-1h.png", "cold.png", "tiny.png", "users.png", "heavy-rss.png"):
        assert (out / png).exists(), png
