"""The bench's long dataset (loadtests.bench --long-*): options, which dataset a dashboard
window runs on, the switch to the long dataset's Prometheus, and what the report says. Pure
logic only: no Prometheus, Redis or promaccel is started."""

from __future__ import annotations

import argparse
import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from loadtests import bench, report
from loadtests.client import Budget, BudgetExhausted
from loadtests.gen import BENCH_SPEC, CI_SPEC
from loadtests.load import BENCH_LONG_SPEC, DATASETS
from loadtests.scenarios import dashboard
from loadtests.scenarios import env as scenario_env
from loadtests.scenarios.dashboard import DashboardResult, ModeRefresh, Refresh
from loadtests.scenarios.env import Env, LongData
from loadtests.stats import Progress
from loadtests.timeline import PHASE_S

H = 3600.0
DAY = 86_400.0


# --- options ---------------------------------------------------------------------------------


def test_defaults_send_7d_to_a_32x8x168h_long_dataset() -> None:
    a = bench.parse_args([])
    assert a.long_enabled and (a.long_nodes, a.long_gpus_per_node, a.long_hours) == (32, 8, 168.0)
    assert bench.window_plan(a) == {"1h": "main", "24h": "main", "7d": "long"}
    spec = bench.long_fleet_spec(a)
    assert (spec.nodes, spec.gpus_per_node, spec.hours) == (32, 8, 168.0)
    assert bench.dataset_dir(spec) == bench.CACHE_DIR / "32x8x168h"
    assert bench.dataset_dir(bench.fleet_spec(a)) == bench.CACHE_DIR / "256x8x24h"


def test_long_defaults_are_the_named_bench_long_dataset() -> None:
    assert DATASETS["bench-long"] == BENCH_LONG_SPEC
    assert bench.long_fleet_spec(bench.parse_args([])) == BENCH_LONG_SPEC


def test_long_dataset_ends_where_the_main_one_does() -> None:
    """Same end, scrape interval and seed: the virtual now is the same on both datasets."""
    for argv in ([], ["--small", "--long-hours", "48"], ["--hours", "12", "--long-nodes", "4"]):
        a = bench.parse_args(argv)
        main, long = bench.fleet_spec(a), bench.long_fleet_spec(a)
        assert long.end == main.end and long.scrape_interval == main.scrape_interval and long.seed == main.seed
        assert long.start == long.end - int(long.hours * H)


def test_small_has_no_long_dataset_unless_asked() -> None:
    a = bench.parse_args(["--small"])
    assert not a.long_enabled and bench.long_fleet_spec(a) is None
    assert bench.window_plan(a) == {"1h": "main", "24h": None, "7d": None}
    for extra in (["--long-hours", "48"], ["--long-nodes", "4"], ["--long-gpus-per-node", "2"],
                  ["--long-data-dir", "/tmp/elsewhere"]):
        assert bench.parse_args(["--small", *extra]).long_enabled, extra
    a = bench.parse_args(["--small", "--long-nodes", "4", "--long-gpus-per-node", "2"])
    assert bench.window_plan(a) == {"1h": "main", "24h": "long", "7d": "long"}
    assert bench.dataset_dir(bench.long_fleet_spec(a)).name == "4x2x168h"


def test_no_long_wins() -> None:
    a = bench.parse_args(["--no-long", "--long-hours", "200"])
    assert not a.long_enabled and bench.long_fleet_spec(a) is None
    assert bench.window_plan(a) == {"1h": "main", "24h": "main", "7d": None}


def test_a_main_dataset_long_enough_needs_no_long_one() -> None:
    assert set(bench.window_plan(bench.parse_args(["--hours", "168"])).values()) == {"main"}


@pytest.mark.parametrize("bad", [
    ["--long-hours", "0"], ["--long-hours", "-1"], ["--long-nodes", "0"], ["--long-gpus-per-node", "-2"],
    ["--long-hours", "0.001"],  # not a whole number of 30 s scrapes
    ["--data-dir", "/tmp/x", "--long-data-dir", "/tmp/x"],
])
def test_bad_long_options_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(bad)


def test_same_dirs_are_fine_when_there_is_no_long_dataset() -> None:
    assert not bench.parse_args(["--no-long", "--data-dir", "/tmp/x", "--long-data-dir", "/tmp/x"]).long_enabled


# --- which dataset a window uses ---------------------------------------------------------------


def test_window_dataset() -> None:
    wd = bench.window_dataset
    assert wd(H, DAY, 7 * DAY) == "main"
    assert wd(DAY, DAY, 7 * DAY) == "main"  # exactly covered: the main dataset
    assert wd(DAY + 30, DAY, 7 * DAY) == "long"
    assert wd(7 * DAY, DAY, 7 * DAY) == "long"  # exactly covered by the long dataset
    assert wd(8 * DAY, DAY, 7 * DAY) is None  # too long for both: skipped
    assert wd(7 * DAY, DAY, None) is None  # no long dataset
    assert wd(H, 6 * H, None) == "main"
    assert wd(2 * DAY, DAY, 12 * H) is None  # a long dataset shorter than the main one never helps


def test_window_plan_keeps_the_order_and_parses_units() -> None:
    a = bench.parse_args(["--window", "7d", "--window", "1h", "--window", "168h", "--window", "2w"])
    assert list(bench.window_plan(a).items()) == [("7d", "long"), ("1h", "main"), ("168h", "long"), ("2w", None)]


# --- the switch to the long dataset ----------------------------------------------------------


class FakeLong(LongData):
    """A LongData whose Prometheus is a URL: nothing is started."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec, Path("/nonexistent"), Path("/nonexistent"), {"nodes": spec.nodes, "hours": spec.hours})
        self.starts = 0
        self.stops = 0

    def start(self, progress: Any, notes: list[str]) -> tuple[str, int]:
        self.starts += 1
        return "http://127.0.0.1:2", 4242

    def stop(self) -> None:
        self.stops += 1


def _env(argv: list[str], long: LongData | None = None) -> Env:
    args = bench.parse_args(argv)
    spec = bench.fleet_spec(args)
    return Env(
        args=args, prom_url="http://127.0.0.1:1", prom_pid=None, data_start_s=float(spec.start),
        now_s=spec.end - PHASE_S, workdir=Path("/nonexistent"), promaccel_args=[], redis=None,
        progress=Progress(io.StringIO(), every_s=3600), budget=Budget(100), dashboard={},
        dataset_info={"nodes": spec.nodes, "hours": spec.hours}, long=long,
    )


def test_on_long_switches_prometheus_and_span_but_shares_the_rest() -> None:
    long = FakeLong(BENCH_LONG_SPEC)
    env = _env([], long)
    on = env.on_long([])
    assert on.prom_url == "http://127.0.0.1:2" and on.prom_pid == 4242
    assert on.dataset == "long" and on.dataset_info == long.info and on.long is None
    assert on.now_s == env.now_s  # same end: same virtual now
    assert on.data_span_s == 168 * H and env.data_span_s == 24 * H
    assert on.budget is env.budget and on.code_digests is env.code_digests and on.log_findings is env.log_findings
    assert on.args is env.args and on.redis is env.redis and on.promaccel is None


def test_dashboard_windows_run_on_their_dataset_and_the_long_prometheus_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    long = FakeLong(BENCH_LONG_SPEC)
    env = _env(["--scenario", "dashboard", "--window", "1h", "--window", "7d", "--window", "30d",
                "--window", "168h"], long)
    seen: list[tuple[str, str, str, float]] = []

    async def fake_dashboard(e: Env, window: str) -> DashboardResult:
        seen.append((window, e.dataset, e.prom_url, e.data_span_s))
        return DashboardResult(window=window)

    monkeypatch.setattr(dashboard, "run", fake_dashboard)
    monkeypatch.setattr(scenario_env, "code_digest", lambda: "x")
    results: dict[str, Any] = {"scenarios": [], "notes": []}
    asyncio.run(bench.run_scenarios(env, results))
    assert seen == [
        ("1h", "main", "http://127.0.0.1:1", 24 * H),
        ("7d", "long", "http://127.0.0.1:2", 168 * H),
        ("30d", "main", "http://127.0.0.1:1", 24 * H),  # fits neither: the main env reports it skipped
        ("168h", "long", "http://127.0.0.1:2", 168 * H),
    ]
    assert long.stops == 1 and [s.window for s in results["scenarios"]] == ["1h", "7d", "30d", "168h"]


def test_the_long_prometheus_stops_when_a_window_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    long = FakeLong(BENCH_LONG_SPEC)
    env = _env(["--scenario", "dashboard", "--window", "7d"], long)

    async def boom(e: Env, window: str) -> DashboardResult:
        raise BudgetExhausted("budget")

    monkeypatch.setattr(dashboard, "run", boom)
    results: dict[str, Any] = {"scenarios": [], "notes": []}
    asyncio.run(bench.run_scenarios(env, results))
    assert long.stops == 1 and "budget" in results["notes"][0]


@pytest.mark.parametrize("argv, hint", [
    (["--no-long"], "the long dataset is off"),
    (["--small"], "the long dataset is off"),
    (["--long-hours", "48"], "so does the long dataset (48 h; --long-hours)"),
])
def test_a_window_no_dataset_covers_is_skipped_with_a_reason(argv: list[str], hint: str) -> None:
    s = asyncio.run(dashboard.run(_env(argv), "7d"))
    assert s.skipped and s.dataset == "main" and not s.refreshes
    assert hint in s.notes[0] and "less than the 7d window" in s.notes[0]


# --- the report ------------------------------------------------------------------------------


def test_dataset_record_and_line() -> None:
    info = {"samples": 78_123_456, "series_summed_over_slices": 600_000, "build_seconds": 700.5}
    rec = bench.dataset_record(BENCH_LONG_SPEC, bench.CACHE_DIR / "32x8x168h", info, 0.01)
    assert rec["data_dir"] == ".cache/bench/32x8x168h" and rec["gpus"] == 256 and rec["built_in_s"] == 700.5
    assert rec["end"] == BENCH_SPEC.end and rec["end_iso"] == "2026-11-01T00:00:00Z" and rec["build_s"] == 0.0
    assert report.dataset_line(rec) == "32 nodes × 8 GPUs × 168 h, 78,123,456 samples"


def _refresh(i: int, d: float, p: float) -> Refresh:
    def mode(w: float) -> ModeRefresh:
        return ModeRefresh(w, {"A": w / 2}, 100)

    return Refresh(i, 0, 1, "direct", mode(d), mode(p))


def test_report_says_which_dataset_each_window_ran_on() -> None:
    main = bench.dataset_record(BENCH_SPEC, bench.CACHE_DIR / "256x8x24h", {"samples": 89_226_989}, 0)
    long = {**bench.dataset_record(BENCH_LONG_SPEC, bench.CACHE_DIR / "32x8x168h", {"samples": 78_000_000}, 0),
            "windows": ["7d"]}
    def dash(w: str, which: str, info: dict[str, Any]) -> DashboardResult:
        return DashboardResult(window=w, slide_s=30.0, panels=1, dataset=which, dataset_info=info,
                               refreshes=[_refresh(0, 1.0, 0.9), _refresh(1, 1.0, 0.1)])
    results = {"command": "python -m loadtests.bench", "dataset": main, "long_dataset": long,
               "scenarios": [dash("24h", "main", main), dash("7d", "long", long)], "notes": []}
    md = report.render_markdown(results)
    assert "- long dataset, for the dashboard window(s) the main one is too short for (7d): 32 nodes × 8 GPUs" in md
    assert "`.cache/bench/32x8x168h`" in md
    assert "## (b) Warm dashboard refresh — 7d (long dataset)" in md
    assert "## (b) Warm dashboard refresh — 24h\n" in md
    assert "Dataset: **the long dataset**, 32 nodes × 8 GPUs × 168 h, 78,000,000 samples" in md
    assert "Dataset: the main dataset, 256 nodes × 8 GPUs × 24 h, 89,226,989 samples." in md


def test_report_without_a_long_dataset_is_unchanged() -> None:
    results = {"command": "python -m loadtests.bench --small",
               "dataset": {"nodes": CI_SPEC.nodes, "gpus_per_node": 4, "hours": 6},
               "scenarios": [DashboardResult(window="1h", slide_s=30.0, panels=1, dataset="", dataset_info={},
                                             refreshes=[_refresh(0, 1.0, 1.0)])], "notes": []}
    md = report.render_markdown(results)
    assert "long dataset" not in md and "Dataset:" not in md


def test_help_documents_the_long_options() -> None:
    text = bench.build_parser().format_help()
    for opt in ("--long-nodes", "--long-gpus-per-node", "--long-hours", "--long-data-dir", "--no-long"):
        assert opt in text
    assert "long dataset" in (bench.__doc__ or "")
    assert isinstance(bench.build_parser(), argparse.ArgumentParser)
