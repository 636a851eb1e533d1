"""loadtests/timeline.py: virtual time, step-aligned requests (and the heavy scenario's distinct queries)."""

from __future__ import annotations

import pytest

from loadtests import timeline
from loadtests.dashboard import DEFAULT_DASHBOARD, load_dashboard, panel_requests
from loadtests.scenarios.heavy import heavy_requests

NOW = 1793491200 - timeline.PHASE_S


# --- virtual time ----------------------------------------------------------------------------


def test_sliding_windows_end_at_now_and_slide_by_30s() -> None:
    ws = timeline.sliding_windows(NOW, 3600, 30, 10)
    assert len(ws) == 10
    assert ws[-1] == (NOW - 3600, NOW)
    assert [b - a for a, b in ws] == [3600] * 10
    assert [ws[i + 1][1] - ws[i][1] for i in range(9)] == [30] * 9
    with pytest.raises(ValueError):
        timeline.sliding_windows(NOW, 3600, 30, 0)


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_sliding_dashboard_requests_are_step_aligned_per_panel(window: str) -> None:
    dash = load_dashboard(DEFAULT_DASHBOARD)
    window_s = timeline.parse_duration_s(window)
    previous: dict[str, tuple[int, int]] = {}
    for start, end in timeline.sliding_windows(NOW, window_s, 30, 6):
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
            key = timeline.panel_key(r)
            if key in previous:
                p_start, p_end = previous[key]
                # a 30 s slide moves the aligned window by 0 or whole steps, never off the grid
                assert (r.end_ns - p_end) % r.step_ns == 0 and 0 <= r.end_ns - p_end <= 30 * 10**9 + r.step_ns
                assert r.end_ns - r.start_ns == p_end - p_start
            previous[key] = (r.start_ns, r.end_ns)


def test_range_request_aligns_down_to_the_step() -> None:
    r = timeline.range_request("t", "up", NOW - 86400, NOW, 60)
    assert r.start_ns % (60 * 10**9) == 0 and r.end_ns % (60 * 10**9) == 0
    assert r.end_ns <= NOW * 1e9 < r.end_ns + 60e9
    assert r.points == 1441
    assert r.body() == (f"end={r.end_ns // 10**9}&query=up&start={r.start_ns // 10**9}&step=60")
    i = timeline.instant_request("t", "vector(1)", NOW)
    assert i.path == "/api/v1/query" and i.form() == {"query": "vector(1)", "time": "1793491187.655"}


def test_heavy_requests_are_distinct() -> None:
    reqs = heavy_requests(20, NOW, 86400)
    assert len({r.body() for r in reqs}) == 20
    assert all(r.step == 60 and r.points == 1441 for r in reqs)
