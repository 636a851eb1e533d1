"""loadtests/report.py: the Markdown, plots and results.json of a run, from typed results; old
results.json dicts still render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtests import report
from loadtests.client import Tally
from loadtests.scenarios import load_result
from loadtests.scenarios.codec import CodecResult
from loadtests.scenarios.dashboard import DashboardResult, ModeRefresh, Refresh
from loadtests.scenarios.result import Meters
from loadtests.scenarios.sizes import PanelSize, size_class
from loadtests.scenarios.tiny import TinyQuery, TinyResult
from loadtests.scenarios.workers import LayoutRun, WorkersResult, WorkersRound


def _refresh(i: int, d: float, p: float) -> Refresh:
    direct = ModeRefresh(d, {"A": d / 2, "B": d / 3}, 100, None, Meters(2, 90, 0.1))
    prox = ModeRefresh(p, {"A": p / 2, "B": p / 3}, 100, ["1", "1"],
                       Meters(2, 90, 0.1, backend_calls=2, cache={"hit": 1, "miss": 1}, promaccel_cpu_s=0.05))
    return Refresh(i, 0, 1, "direct", direct, prox)


def _fake_results() -> dict[str, Any]:
    return {
        "command": "python -m loadtests.bench --small",
        "started": "2026-11-29 00:00:00 UTC",
        "machine": {"nproc": 2, "usable_cpus": 2, "ram_gib": 23.4, "cpu_model": "Test CPU", "loadavg": (0.5, 0.4, 0.3)},
        "git": {"commit": "abc123", "dirty_files": 0},
        "dataset": {"nodes": 16, "gpus_per_node": 4, "gpus": 64, "hours": 6, "end_iso": "2026-11-01T00:00:00Z"},
        "scenarios": [
            DashboardResult(window="1h", slide_s=30.0, panels=2, tally=Tally(compared=6), promaccel_peak_rss=2**28,
                            promaccel_cpu_s=0.5,
                            refreshes=[_refresh(0, 0.5, 0.6), _refresh(1, 0.4, 0.2), _refresh(2, 0.5, 0.1)]),
            TinyResult(requests_per_query=3, tally=Tally(compared=3),
                       queries=[TinyQuery("vector(1)", False, [0.001, 0.002, 0.001], [0.002, 0.003, 0.0015])]),
            CodecResult(note="not there"),
        ],
        "notes": [],
        "elapsed_s": 12.0,
    }


def test_workers_summary_and_rendering() -> None:
    def rnd(i: int, wall: float, calls: float) -> WorkersRound:
        return WorkersRound(i, wall, [wall * 0.9, wall], calls, wall / 2, 0)

    s = WorkersResult(users=50, window="1h", slide_s=30.0, runs=[
        LayoutRun(1, 1, [rnd(0, 3.0, 28), rnd(1, 2.0, 0), rnd(2, 1.0, 0)], 2**28),
        LayoutRun(2, 1, [rnd(0, 2.5, 56), rnd(1, 1.0, 0), rnd(2, 0.5, 1)], 2**29),
        LayoutRun(1, 2, [rnd(0, 2.0, 28), rnd(1, 1.0, 0), rnd(2, 1.0, 0)], 2**29)])
    summ = report.workers_summary(s)
    assert list(summ) == ["1 process", "2 workers", "2 processes"]
    assert summ["1 process"]["warm_wall_s"] == 1.5 and summ["2 workers"]["warm_wall_s"] == 0.75
    assert summ["1 process"]["cold_backend_requests"] == 28 and summ["2 workers"]["warm_backend_requests"] == 1
    assert summ["1 process"]["cold_wall_s"] == 3.0 and summ["2 workers"]["peak_rss"] == 2**29
    md = report.render_markdown({"scenarios": [s]})
    assert "2 workers vs 1 process: warm round **0.500x**" in md and "56 vs 28 (**2.000x**)" in md
    assert "2 processes vs 1 process: warm round **0.667x**" in md and "28 vs 28 (**1.000x**)" in md


def test_render_markdown_starts_with_the_command_and_machine() -> None:
    md = report.render_markdown(_fake_results())
    head = md.splitlines()[:8]
    assert head[2] == "```" and head[3] == "python -m loadtests.bench --small"
    assert "16 nodes × 4 GPUs" in md and "Test CPU" in md and "abc123" in md and "23.4 GiB" in md
    assert "mismatches: 0" in md
    # warm refreshes 1..2: ratios 0.5 and 0.2 -> median of ratios 0.35
    assert "0.350x" in md
    # tiny: added p50 = median(1, 1, 0.5) ms
    assert "| `vector(1)` | 3 | 1.00 | " in md and "| 1.00 | " in md
    assert "not there" in md and "| requests reaching Prometheus | 2 | 2 |" in md


def test_write_report_files_and_latest_links(tmp_path: Path) -> None:
    out = tmp_path / "results" / "run1"
    latest = tmp_path / "results" / "latest.md"
    report.write_report(_fake_results(), out, latest)
    assert (out / "summary.md").exists() and (out / "results.json").exists()
    assert (out / "dashboard-1h.png").stat().st_size > 1000 and (out / "tiny.png").exists()
    assert "![dashboard-1h.png](dashboard-1h.png)" in (out / "summary.md").read_text()
    assert "![dashboard-1h.png](run1/dashboard-1h.png)" in latest.read_text()


def test_results_json_round_trips_to_the_same_report(tmp_path: Path) -> None:
    """results.json keeps the flat form (the tally's counts beside the scenario's fields) and
    `python -m loadtests.report` renders the same summary from it."""
    results = _fake_results()
    report.write_report(results, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    dash = saved["scenarios"][0]
    assert dash["name"] == "dashboard" and dash["compared"] == 6 and "tally" not in dash
    assert dash["refreshes"][1]["promaccel"]["meters"]["backend_calls"] == 2
    again = load_result(dash)
    assert again == results["scenarios"][0]
    before = (tmp_path / "summary.md").read_text()
    assert report.main([str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "summary.md").read_text() == before


def test_sizes_by_class_with_and_without_gzip() -> None:
    assert [size_class(n) for n in (12_000, 49_999, 50_000, 999_999, 3_200_000)] == [
        "tiny (< 50 KB)", "tiny (< 50 KB)", "medium (50 KB – 1 MB)", "medium (50 KB – 1 MB)", "large (> 1 MB)"]
    sizes = [PanelSize("tiny one", 12_000, 2_000, [0.002, 0.002], [0.001, 0.001]),
             PanelSize("big one", 3_200_000, 400_000, [0.040, 0.050, 0.040], [0.020, 0.020, 0.030]),
             PanelSize("big two", 1_700_000, 200_000, [0.016], [0.010])]
    md = "\n".join(report.size_lines(sizes))
    # large: median answer 2.45 MB, gzip median of the panels' medians 28 ms, identity 15 ms
    assert "| large (> 1 MB) | 2 | 2.3 MiB | 293.0 KiB | 28.0 | 87.5 | 15.0 | 163.3 |" in md
    assert "| tiny (< 50 KB) | 1 | 11.7 KiB | 2.0 KiB | 2.00 | 6.0 | 1.00 | 12.0 |" in md
    assert "medium" not in md.split("<details>")[0]  # no medium panel: no row
    assert "differ" not in md
    sizes[0].differs = True
    assert "**The gzip and the identity answers differ** for tiny one" in "\n".join(report.size_lines(sizes))


def test_results_json_written_before_the_typed_results_still_renders() -> None:
    """Runs before 2026-12-04 wrote meters beside a record's keys and (d)'s rounds as
    "<mode>_<key>" keys; `python -m loadtests.report` re-renders them unchanged."""
    old_mode = lambda w: {"wall_s": w, "panels": {"A": w}, "bytes": 10, "backend_requests": 3,  # noqa: E731
                          "backend_calls": 4, "cache": {"hit": 2, "miss": 0}}
    old = {"scenarios": [
        {"name": "cold", "query": "q", "range": "24h", "step": 60, "points_per_series": 1441, "answer_bytes": 100,
         "reps": [{"first": "direct", "direct_s": 1.0, "promaccel_s": 0.5, "pieces": "4", "status": [200, 200],
                   "backend_calls": 7, "backend_bytes": 2048}], "compared": 1, "mismatches": 0},
        {"name": "dashboard", "window": "1h", "slide_s": 30.0, "panels": 1, "compared": 2, "mismatches": 1,
         "refreshes": [{"index": i, "start": 0, "end": 1, "first": "direct", "direct": old_mode(1.0),
                        "promaccel": old_mode(0.5)} for i in range(2)]},
        {"name": "users", "users": 2, "window": "1h", "slide_s": 30.0, "single_calls": [4],
         "rounds": [{"index": 0, "direct_wall_s": 1.0, "promaccel_wall_s": 0.5, "direct_user_s": [1.0, 0.9],
                     "promaccel_user_s": [0.5, 0.4], "backend_calls": 5, "direct_failures": 1,
                     "promaccel_failures": 0}]},
    ]}
    cold, dash, users = (load_result(s) for s in old["scenarios"])
    assert cold.reps[0].meters.backend_calls == 7 and cold.compared == 1  # type: ignore[attr-defined]
    assert dash.refreshes[1].promaccel.meters.backend_calls == 4 and dash.mismatches == 1  # type: ignore[attr-defined]
    assert users.rounds[0].promaccel.meters.backend_calls == 5  # type: ignore[attr-defined]
    assert users.rounds[0].direct.failures == 1  # type: ignore[attr-defined]
    md = report.render_markdown(old)
    assert "could not render" not in md
    assert "| 0 | direct | 1,000 | 500 | 0.500x | 4 | 7 | 2.0 KiB |" in md
    assert "| promaccel backend calls (its /metrics) | – | 4 |" in md
    assert "| 0 | 4 | 5 | 1.250x |" in md and "1 / 0 |" in md
