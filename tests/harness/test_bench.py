"""The load-test harness: its arithmetic, virtual time, bounds and report; one end-to-end smoke run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtests import bench, report
from loadtests.dashboard import DEFAULT_DASHBOARD, load_dashboard, panel_requests
from tests.servers import require

ROOT = Path(__file__).resolve().parents[2]
NOW = 1793491200 - bench.PHASE_S


# --- statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
@pytest.mark.parametrize("xs", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.linspace(0.001, 9, 37) ** 2)])
def test_percentile_matches_numpy_linear(xs: list[float], q: float) -> None:
    assert report.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edges() -> None:
    assert math.isnan(report.percentile([], 50))
    with pytest.raises(ValueError):
        report.percentile([1.0], 101)
    assert report.percentile([1.0, math.inf, math.inf], 50) == math.inf
    s = report.summarize([0.1, 0.2, 0.3, 0.4])
    assert (s["n"], s["min"], s["max"]) == (4, 0.1, 0.4)
    assert s["p50"] == pytest.approx(0.25)


def test_ratio_of_medians_differs_from_median_of_ratios() -> None:
    # Refresh 2 hit a noisy moment in both modes: pairing cancels it, independent medians do not.
    direct = [1.0, 2.0, 10.0]
    proxied = [2.0, 1.0, 5.0]
    assert report.ratio_of_medians(direct, proxied) == pytest.approx(1.0)
    assert report.median_of_ratios(zip(direct, proxied)) == pytest.approx(0.5)


def test_median_of_ratios_skips_unusable_pairs() -> None:
    pairs = [(0.0, 1.0), (math.nan, 1.0), (2.0, 1.0), (4.0, 1.0), (1.0, math.nan)]
    assert report.median_of_ratios(pairs) == pytest.approx((0.5 + 0.25) / 2)
    assert math.isnan(report.median_of_ratios([]))
    assert math.isnan(report.ratio_of_medians([], [1.0]))


def test_count_ratio() -> None:
    assert report.count_ratio(14, 15) == pytest.approx(15 / 14)
    assert report.count_ratio(0, 0) == 1.0  # a fully cached refresh in both
    assert report.count_ratio(0, 3) == math.inf
    assert math.isnan(report.count_ratio(math.nan, 3))


def test_paired_differences_are_added_time() -> None:
    assert report.paired_differences([(0.010, 0.012), (0.020, 0.019)]) == pytest.approx([0.002, -0.001])


# --- /metrics deltas -------------------------------------------------------------------------

PROMACCEL_BEFORE = """\
# HELP promaccel_backend_requests_total Calls to backends
# TYPE promaccel_backend_requests_total counter
promaccel_backend_requests_total{backend="prom",code="200",endpoint="/api/v1/query_range"} 10.0
promaccel_backend_requests_total{backend="prom",code="200",endpoint="/api/v1/query"} 4.0
promaccel_backend_requests_total{backend="prom",code="200",endpoint="ready"} 7.0
promaccel_cache_lookups_total{result="hit"} 3.0
promaccel_cache_lookups_total{result="miss"} 5.0
"""

PROMACCEL_AFTER = """\
promaccel_backend_requests_total{backend="prom",code="200",endpoint="/api/v1/query_range"} 22.0
promaccel_backend_requests_total{backend="prom",code="200",endpoint="/api/v1/query"} 5.0
promaccel_backend_requests_total{backend="prom",code="200",endpoint="ready"} 9.0
promaccel_backend_requests_total{backend="amp",code="503",endpoint="/api/v1/query_range"} 2.0
promaccel_backend_requests_total{backend="prom",code="400",endpoint="/api/v1/query"} 1e0
promaccel_cache_lookups_total{result="hit"} 30.0
promaccel_cache_lookups_total{result="miss"} 6.0
promaccel_http_request_duration_seconds_bucket{endpoint="/api/v1/query",le="+Inf"} 3.0
"""


def test_backend_calls_delta_counts_query_endpoints_only() -> None:
    a, b = report.parse_metrics(PROMACCEL_BEFORE), report.parse_metrics(PROMACCEL_AFTER)
    # 12 range + 1 instant + 2 new amp series + 1 new 400 series; readiness probes left out
    assert report.backend_calls(a, b) == 16
    by_backend = report.counter_delta(a, b, "promaccel_backend_requests_total", by="backend")
    assert by_backend == {"prom": 12 + 1 + 2 + 1, "amp": 2}


def test_cache_lookups_and_hit_ratio() -> None:
    a, b = report.parse_metrics(PROMACCEL_BEFORE), report.parse_metrics(PROMACCEL_AFTER)
    lookups = report.cache_lookups(a, b)
    assert lookups == {"hit": 27, "miss": 1}
    assert report.hit_ratio(lookups) == pytest.approx(27 / 28)
    assert math.isnan(report.hit_ratio({}))


def test_counter_reset_counts_the_new_value() -> None:
    a = report.parse_metrics('x_total{a="1"} 100\n')
    b = report.parse_metrics('x_total{a="1"} 7\n')
    assert report.counter_delta(a, b, "x_total") == 7


def test_parse_metrics_labels_with_escapes_and_timestamps() -> None:
    text = 'm{a="x\\"y",b="c\\\\d",c="e,f=g"} 1.5 1700000000000\nm 2\nm{z="+Inf"} +Inf\n'
    s = report.parse_metrics(text)
    assert s[("m", (("a", 'x"y'), ("b", "c\\d"), ("c", "e,f=g")))] == 1.5
    assert s[("m", ())] == 2
    assert s[("m", (("z", "+Inf"),))] == math.inf


def test_prometheus_query_traffic() -> None:
    a = report.parse_metrics(
        'prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 5\n'
        'prometheus_http_requests_total{code="200",handler="/metrics"} 50\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query_range"} 1000\n'
        'prometheus_http_response_size_bytes_sum{handler="/metrics"} 99999\n'
    )
    b = report.parse_metrics(
        'prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 8\n'
        'prometheus_http_requests_total{code="400",handler="/api/v1/query"} 1\n'
        'prometheus_http_requests_total{code="200",handler="/metrics"} 52\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query_range"} 4000\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query"} 50\n'
        'prometheus_http_response_size_bytes_sum{handler="/metrics"} 200000\n'
    )
    assert report.prometheus_query_traffic(a, b) == (4, 3050)


# --- virtual time ----------------------------------------------------------------------------


def test_sliding_windows_end_at_now_and_slide_by_30s() -> None:
    ws = bench.sliding_windows(NOW, 3600, 30, 10)
    assert len(ws) == 10
    assert ws[-1] == (NOW - 3600, NOW)
    assert [b - a for a, b in ws] == [3600] * 10
    assert [ws[i + 1][1] - ws[i][1] for i in range(9)] == [30] * 9
    with pytest.raises(ValueError):
        bench.sliding_windows(NOW, 3600, 30, 0)


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_sliding_dashboard_requests_are_step_aligned_per_panel(window: str) -> None:
    dash = load_dashboard(DEFAULT_DASHBOARD)
    window_s = bench.parse_duration_s(window)
    previous: dict[str, tuple[int, int]] = {}
    for start, end in bench.sliding_windows(NOW, window_s, 30, 6):
        reqs = panel_requests(dash, start, end, 1920)
        assert len(reqs) >= 12
        for r in reqs:
            if r.instant:
                assert r.end_ns == round(end * 1e9)
                continue
            assert r.start_ns % r.step_ns == 0 and r.end_ns % r.step_ns == 0
            # rounded down, by less than one step
            assert 0 <= round(end * 1e9) - r.end_ns < r.step_ns
            assert 0 <= round(start * 1e9) - r.start_ns < r.step_ns
            form = r.form()
            assert float(form["start"]) == r.start_ns / 1e9 and float(form["step"]) == r.step_ns / 1e9
            key = bench.panel_key(r)
            if key in previous:
                p_start, p_end = previous[key]
                # a 30 s slide moves the aligned window by 0 or whole steps, never off the grid
                assert (r.end_ns - p_end) % r.step_ns == 0 and 0 <= r.end_ns - p_end <= 30 * 10**9 + r.step_ns
                assert r.end_ns - r.start_ns == p_end - p_start
            previous[key] = (r.start_ns, r.end_ns)


def test_range_request_aligns_down_to_the_step() -> None:
    r = bench.range_request("t", "up", NOW - 86400, NOW, 60)
    assert r.start_ns % (60 * 10**9) == 0 and r.end_ns % (60 * 10**9) == 0
    assert r.end_ns <= NOW * 1e9 < r.end_ns + 60e9
    assert r.points == 1441
    assert r.body() == (f"end={r.end_ns // 10**9}&query=up&start={r.start_ns // 10**9}&step=60")
    i = bench.instant_request("t", "vector(1)", NOW)
    assert i.path == "/api/v1/query" and i.form() == {"query": "vector(1)", "time": "1793491187.655"}


def test_heavy_requests_are_distinct() -> None:
    reqs = bench.heavy_requests(20, NOW, 86400)
    assert len({r.body() for r in reqs}) == 20
    assert all(r.step == 60 and r.points == 1441 for r in reqs)


# --- bounds ----------------------------------------------------------------------------------


def test_budget_caps_requests() -> None:
    b = bench.Budget(3)
    b.take()
    b.take(2)
    with pytest.raises(bench.BudgetExhausted):
        b.take()


def test_deadline() -> None:
    assert bench.Deadline(0).expired()
    assert not bench.Deadline(3600).expired()


def test_client_refuses_non_loopback() -> None:
    with pytest.raises(ValueError, match="127.0.0.1"):
        bench.Client("http://10.1.2.3:9090", bench.Budget(1), 1)
    with pytest.raises(ValueError):
        bench.Client("http://localhost.example.com:9090", bench.Budget(1), 1)
    bench.Client("http://127.0.0.1:9090", bench.Budget(1), 1)


def test_parse_args_bounds_and_scenarios() -> None:
    a = bench.parse_args(["--small", "--scenario", "a,dashboard", "--scenario", "e"])
    assert a.scenarios == ["cold", "dashboard", "heavy"]
    assert a.window == ["1h", "24h", "7d"] and a.slide_s == 30
    assert bench.parse_args([]).scenarios == list(bench.SCENARIOS)
    assert bench.parse_args(["--scenario", "g"]).scenarios == ["workers"]
    assert bench.parse_args([]).workers == 2
    for bad in (["--users", "0"], ["--users", "1000"], ["--scenario", "nope"], ["--refreshes", "0"],
                ["--window", "banana"], ["--heavy", "1000"], ["--workers", "0"], ["--workers", "99"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


# --- answer comparison -----------------------------------------------------------------------


def _matrix(values: list[list[object]], status: str = "success") -> bytes:
    return json.dumps({"status": status, "data": {"resultType": "matrix", "result": [
        {"metric": {"Hostname": "gpu-node-0000"}, "values": values}]}}).encode()


def test_compare_answers() -> None:
    base = bench.Answer(200, _matrix([[1, "0.1"], [2, "NaN"]]), 0.1)
    assert bench.compare_answers(base, bench.Answer(200, base.body, 0.1)) == []
    close = bench.Answer(200, _matrix([[1, "0.10000000000000001"], [2, "NaN"]]), 0.1)
    assert bench.compare_answers(base, close) == []
    off = bench.Answer(200, _matrix([[1, "0.1001"], [2, "NaN"]]), 0.1)
    assert bench.compare_answers(base, off)
    extra_point = bench.Answer(200, _matrix([[0, "0"], [1, "0.1"], [2, "NaN"]]), 0.1)
    assert "timestamps differ" in bench.compare_answers(base, extra_point)[0]
    status = bench.Answer(503, base.body, 0.1)
    assert bench.compare_answers(base, status)[0].startswith("HTTP status")
    assert bench.compare_answers(base, bench.Answer(200, b"<html>", 0.1))


def test_tally_counts_failures_apart_from_mismatches() -> None:
    t = bench.Tally()
    ok = bench.Answer(200, _matrix([[1, "1"]]), 0.1)
    assert t.check("same", ok, bench.Answer(200, ok.body, 0.1))
    assert not t.check("wrong", ok, bench.Answer(200, _matrix([[1, "2"]]), 0.1))
    assert not t.check("down", ok, bench.Answer(0, b"", 0.1, error="ClientConnectorError"))
    assert (t.compared, t.mismatches, t.failures) == (2, 1, 1)
    assert t.mismatch_examples[0].startswith("wrong:")


def test_tally_counts_direct_failures_and_retries_apart() -> None:
    t = bench.Tally()
    ok = bench.Answer(200, _matrix([[1, "1"]]), 0.1)
    timeout = bench.Answer(503, b'{"status":"error","errorType":"timeout"}', 120.0)
    assert not t.check("overloaded", timeout, ok)
    assert t.check("resent", ok, bench.Answer(200, ok.body, 0.1, retries=1))
    assert (t.compared, t.mismatches, t.failures, t.direct_failures) == (1, 0, 0, 1)
    assert t.retries == {"direct": 0, "promaccel": 1}
    # a reference noted once, compared with many users' answers
    assert t.check("user 2", ok, bench.Answer(200, ok.body, 0.1), direct_noted=True)
    assert t.compared == 2


def test_client_resends_once_on_a_stale_keep_alive_connection() -> None:
    """The server drops a kept-alive connection when the next request arrives on it (as an
    idle-timeout race looks from the client); the client resends on a new connection, as Go's
    http.Transport does for Grafana, and counts it."""
    import asyncio

    answer = _matrix([[1, "1"]])
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first_connection = connections == 1
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            if first_connection and served == 1:
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()
            served += 1

    async def run() -> list[bench.Answer]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        req = bench.instant_request("t", "vector(1)", NOW)
        async with server, bench.Client(f"http://127.0.0.1:{port}", bench.Budget(10), 10) as client:
            return [await client.send(req), await client.send(req), await client.send(req)]

    answers = asyncio.run(run())
    assert [(x.status, x.retries, x.error) for x in answers] == [(200, 0, None), (200, 1, None), (200, 0, None)]
    assert connections == 2


def test_scan_log_counts_warnings_and_errors(tmp_path: Path) -> None:
    log = tmp_path / "promaccel.log"
    log.write_text("promaccel serving on http://127.0.0.1:1\n"
                   "2026-11-29 20:06:45,035 WARNING promaccel.cache redis cache get failed: TimeoutError\n"
                   "2026-11-29 20:06:46,000 ERROR promaccel boom\nTraceback (most recent call last):\n")
    found = bench.scan_log(log)
    assert (found["warnings"], found["errors"]) == (1, 2)
    assert "TimeoutError" in found["examples"][0]
    assert bench.scan_log(tmp_path / "missing.log")["warnings"] == 0


def test_code_digest_is_stable() -> None:
    assert bench.code_digest() == bench.code_digest() and len(bench.code_digest()) == 12


# --- report ----------------------------------------------------------------------------------


def _fake_results() -> dict[str, object]:
    refresh = lambda i, d, p: {  # noqa: E731
        "index": i, "start": 0, "end": 1, "first": "direct",
        "direct": {"wall_s": d, "panels": {"A": d / 2, "B": d / 3}, "bytes": 100, "backend_requests": 2,
                   "backend_bytes": 90, "prometheus_cpu_s": 0.1},
        "promaccel": {"wall_s": p, "panels": {"A": p / 2, "B": p / 3}, "bytes": 100, "backend_requests": 2,
                      "backend_bytes": 90, "prometheus_cpu_s": 0.1, "backend_calls": 2,
                      "cache": {"hit": 1, "miss": 1}, "promaccel_cpu_s": 0.05},
    }
    return {
        "command": "python -m loadtests.bench --small",
        "started": "2026-11-29 00:00:00 UTC",
        "machine": {"nproc": 2, "usable_cpus": 2, "ram_gib": 23.4, "cpu_model": "Test CPU", "loadavg": (0.5, 0.4, 0.3)},
        "git": {"commit": "abc123", "dirty_files": 0},
        "dataset": {"nodes": 16, "gpus_per_node": 4, "gpus": 64, "hours": 6, "end_iso": "2026-11-01T00:00:00Z"},
        "scenarios": [
            {"name": "dashboard", "window": "1h", "slide_s": 30.0, "panels": 2, "compared": 6, "mismatches": 0,
             "failures": 0, "refreshes": [refresh(0, 0.5, 0.6), refresh(1, 0.4, 0.2), refresh(2, 0.5, 0.1)]},
            {"name": "tiny", "requests_per_query": 3, "compared": 3, "mismatches": 0,
             "queries": [{"query": "vector(1)", "direct_s": [0.001, 0.002, 0.001],
                          "promaccel_s": [0.002, 0.003, 0.0015]}]},
            {"name": "codec", "ran": False, "note": "not there"},
        ],
        "notes": [],
        "elapsed_s": 12.0,
    }


def test_workers_summary_and_rendering() -> None:
    rnd = lambda i, wall, calls: {"index": i, "wall_s": wall, "user_s": [wall * 0.9, wall],  # noqa: E731
                                  "backend_requests": calls, "promaccel_cpu_s": wall / 2, "failures": 0}
    s = {"name": "workers", "users": 50, "window": "1h", "slide_s": 30.0, "workers": [1, 2],
         "runs": [{"workers": 1, "peak_rss": 2**28, "rounds": [rnd(0, 3.0, 28), rnd(1, 2.0, 0), rnd(2, 1.0, 0)]},
                  {"workers": 2, "peak_rss": 2**29, "rounds": [rnd(0, 2.5, 56), rnd(1, 1.0, 0), rnd(2, 0.5, 1)]},
                  {"workers": 1, "processes": 2, "peak_rss": 2**29,
                   "rounds": [rnd(0, 2.0, 28), rnd(1, 1.0, 0), rnd(2, 1.0, 0)]}]}
    summ = report.workers_summary(s)
    assert list(summ) == ["1 process", "2 workers", "2 processes"]
    assert summ["1 process"]["warm_wall_s"] == 1.5 and summ["2 workers"]["warm_wall_s"] == 0.75
    assert summ["1 process"]["cold_backend_requests"] == 28 and summ["2 workers"]["warm_backend_requests"] == 1
    assert summ["1 process"]["cold_wall_s"] == 3.0 and summ["2 workers"]["peak_rss"] == 2**29
    md = "\n".join(report._render_workers(s))
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


def test_write_report_files_and_latest_links(tmp_path: Path) -> None:
    out = tmp_path / "results" / "run1"
    latest = tmp_path / "results" / "latest.md"
    report.write_report(_fake_results(), out, latest)
    assert (out / "summary.md").exists() and (out / "results.json").exists()
    assert (out / "dashboard-1h.png").stat().st_size > 1000 and (out / "tiny.png").exists()
    assert "![dashboard-1h.png](dashboard-1h.png)" in (out / "summary.md").read_text()
    assert "![dashboard-1h.png](run1/dashboard-1h.png)" in latest.read_text()


def test_progress_line_without_a_terminal() -> None:
    import io

    buf = io.StringIO()
    p = report.Progress(buf, every_s=3600)
    p.update("one")
    p.update("two")  # throttled: not a terminal
    p.done("finished")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("one") and lines[1].endswith("finished")


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
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# promaccel benchmark") and "loadtests.bench --small" in summary
    for png in ("dashboard-1h.png", "cold.png", "tiny.png", "users.png", "heavy-rss.png"):
        assert (out / png).exists(), png
