"""loadtests.dashboard: the requests Grafana sends for a dashboard refresh.

Worked examples are computed by hand from Grafana's rules (see the module docstring); the
backend step table below reuses input/expected pairs from Grafana's own
pkg/promlib/models/prometheus_interval_test.go.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

import pytest

from loadtests import dashboard as d

S = 1_000_000_000  # ns per second
H = 3600
END = 1_700_000_123.456  # an unaligned "now"


def one_panel(w: int, expr: str = "up", **target_extra: object) -> dict:
    target = {"refId": "A", "expr": expr, "range": True, **target_extra}
    return {"panels": [{"id": 1, "type": "timeseries", "title": "p", "gridPos": {"x": 0, "y": 0, "w": w, "h": 8},
                        "targets": [target]}]}


def only(dash: dict, range_s: float, end: float = END, **kw: object) -> d.PanelRequest:
    reqs = d.panel_requests(dash, end - range_s, end, **kw)  # type: ignore[arg-type]
    assert len(reqs) == 1
    return reqs[0]


# --- rounding tables -------------------------------------------------------------------------

def test_frontend_and_backend_round_differ_only_on_thresholds() -> None:
    # Frontend uses "<", backend "<=": at exactly 45 s they disagree.
    assert d.round_interval_frontend_ms(45_000) == 60_000
    assert d.round_interval_backend_ns(45 * S) == 30 * S
    assert d.round_interval_frontend_ms(44_999) == 30_000
    assert d.round_interval_backend_ns(46 * S) == 60 * S
    # Away from the thresholds they agree.
    for ms in (3_750, 22_500, 90_001, 135_000, 630_000, 1_350_000, 5_000_000):
        assert d.round_interval_frontend_ms(ms) * 1_000_000 == d.round_interval_backend_ns(ms * 1_000_000)
    # The backend has a 24h bucket up to 1w; the frontend too (its table just skips 48h).
    assert d.round_interval_frontend_ms(100_000_000) == 86_400_000
    assert d.round_interval_backend_ns(100_000 * S) == 86_400 * S
    assert d.round_interval_frontend_ms(10**12) == 31_536_000_000


# --- the worked examples ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("range_s", "w", "width_px", "interval_ms", "step"),
    [
        # 24h on a half-width panel: 86400s/960px = 90s -> frontend rounds to 2m (90s is not
        # < 90s) -> backend keeps 2m because 90s < intervalMs.
        (24 * H, 12, 960, 120_000, 120),
        # 24h full width: 45s -> frontend 1m; the backend table alone would give 30s.
        (24 * H, 24, 1920, 60_000, 60),
        # 24h on a quarter-width stat: 180s -> 2m on both sides.
        (24 * H, 6, 480, 120_000, 120),
        # 1h: 3.75s -> 5s, raised to the data source's 30s minimum.
        (1 * H, 12, 960, 30_000, 30),
        # 6h: 22.5s -> 20s -> 30s minimum.
        (6 * H, 12, 960, 30_000, 30),
        # 12h: exactly 45s -> 1m.
        (12 * H, 12, 960, 60_000, 60),
        # 7d: 630s -> 10m.
        (7 * 24 * H, 12, 960, 600_000, 600),
        # 30d full width: 1350s -> 20m.
        (30 * 24 * H, 24, 1920, 1_200_000, 1200),
    ],
)
def test_step_from_range_and_panel_width(range_s: int, w: int, width_px: int, interval_ms: int, step: int) -> None:
    r = only(one_panel(w), range_s)
    assert r.width_px == width_px == r.max_data_points
    assert r.interval_ms == interval_ms
    assert r.step == step
    assert r.form()["step"] == str(step)


def test_screen_width_changes_panel_width() -> None:
    assert d.panel_width_px(12, 1920) == 960
    assert d.panel_width_px(8, 1920) == 640
    assert d.panel_width_px(12, 1280) == 640
    # 24h on a 12-wide panel of a 1280px screen: 135s -> 2m; of a 3840px screen: 45s -> 1m.
    assert only(one_panel(12), 24 * H, width_px=1280).step == 120
    assert only(one_panel(12), 24 * H, width_px=3840).step == 60


def test_alignment_rounds_start_and_end_down_to_the_step() -> None:
    r = only(one_panel(12), 24 * H)  # step 120s
    # end 1700000123.456 -> floor(/120)*120 = 1700000040; start 1699913723.456 -> 1699913640
    assert (r.start, r.end, r.step) == (1_699_913_640, 1_700_000_040, 120)
    assert r.form() == {"query": "up", "start": "1699913640", "end": "1700000040", "step": "120"}
    assert r.points == 721
    # 1h at 30s: end -> 1700000100, start -> 1699996500
    r = only(one_panel(12), 1 * H)
    assert (r.start, r.end) == (1_699_996_500, 1_700_000_100)
    # Both ends are floored, so the last point can be up to one step before "now" and the
    # first up to one step before the requested start: never after it.
    for range_s in (H, 6 * H, 24 * H, 7 * 24 * H):
        r = only(one_panel(12), range_s)
        assert r.start_ns % r.step_ns == 0 and r.end_ns % r.step_ns == 0
        assert END - r.step < r.end <= END
        assert END - range_s - r.step < r.start <= END - range_s


def test_alignment_follows_the_browser_utc_offset() -> None:
    # A 1h step in a +05:30 browser aligns to :30 past the UTC hour.
    assert d.align_ns(1_700_000_000 * S, 3600 * S, utc_offset_s=19_800) == 1_699_997_400 * S
    assert d.align_ns(1_700_000_000 * S, 3600 * S, utc_offset_s=0) == 1_699_999_200 * S
    # Steps dividing the offset are unaffected.
    assert d.align_ns(1_700_000_123 * S, 30 * S, utc_offset_s=19_800) == d.align_ns(1_700_000_123 * S, 30 * S)


def test_already_aligned_times_stay() -> None:
    r = d.panel_requests(one_panel(12), 1_699_913_640, 1_700_000_040)[0]
    assert (r.start, r.end, r.step) == (1_699_913_640, 1_700_000_040, 120)


# --- variables -------------------------------------------------------------------------------

def test_interval_variables_24h_half_width() -> None:
    expr = "rate(x[$__rate_interval]) + avg_over_time(y[$__interval]) + z[${__interval}] + $__interval_ms"
    r = only(one_panel(12, expr), 24 * H)
    # step 2m; rate interval = max(2m + 30s, 4 * 30s) = 150s in Go Duration syntax.
    assert r.expr == "rate(x[2m30s]) + avg_over_time(y[2m]) + z[2m] + 120000"


def test_interval_variables_1h() -> None:
    r = only(one_panel(12, "rate(x[$__rate_interval])[$__interval]"), 1 * H)
    assert r.expr == "rate(x[2m0s])[30s]"  # max(30s + 30s, 120s) = 2m0s


def test_range_variables() -> None:
    r = only(one_panel(6, "increase(x[$__range]) / $__range_s + $__range_ms"), 24 * H)
    assert r.expr == "increase(x[86400s]) / 86400 + 86400000"


def test_rate_interval_uses_unset_datasource_default_15s() -> None:
    r = only(one_panel(12, "rate(x[$__rate_interval])"), 1 * H, ds_time_interval="")
    # no timeInterval: frontend floor 15s; 3.75s -> 5s -> 15s; rate = max(30s, 60s)
    assert r.step == 15
    assert r.expr == "rate(x[1m0s])"


def test_user_template_variables() -> None:
    dash = one_panel(12, 'avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{namespace="$ns", Hostname=~"$host"})')
    dash["templating"] = {"list": [
        {"type": "datasource", "name": "ds", "query": "prometheus", "current": {"value": "promaccel"}},
        {"type": "custom", "name": "ns", "current": {"value": "team-a"}},
        {"type": "query", "name": "host", "multi": True, "current": {"value": ["gpu-0.a", "gpu-1.a"]}},
    ]}
    r = only(dash, 1 * H)
    assert r.expr == 'avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{namespace="team-a", Hostname=~"(gpu-0\\\\.a|gpu-1\\\\.a)"})'
    r = only(dash, 1 * H, variables={"ns": "team-b"})
    assert 'namespace="team-b"' in r.expr
    # Unknown variables are left alone, as Grafana leaves them (e.g. "$1" in label_replace).
    r = only(one_panel(12, 'label_replace(up, "n", "$1", "instance", "(.*)")'), 1 * H)
    assert '"$1"' in r.expr


# --- query options ---------------------------------------------------------------------------

def test_panel_min_interval_replaces_datasource_minimum() -> None:
    dash = one_panel(12)
    dash["panels"][0]["interval"] = "5m"
    r = only(dash, 1 * H)
    assert r.interval_ms == 300_000 and r.step == 300


def test_panel_max_data_points() -> None:
    dash = one_panel(12)
    dash["panels"][0]["maxDataPoints"] = 100
    r = only(dash, 24 * H)  # 864s -> 15m
    assert r.max_data_points == 100 and r.step == 900


def test_safe_interval_caps_points_at_11000() -> None:
    dash = one_panel(12)
    dash["panels"][0]["maxDataPoints"] = 100_000
    dash["panels"][0]["interval"] = "1s"
    # 24h/100000 = 0.864s -> intervalMs 1s, but 24h/11000 = 7.85s -> safe interval 10s wins.
    r = only(dash, 24 * H)
    assert r.interval_ms == 1_000 and r.step == 10
    assert r.points <= 11_000


def test_query_min_step() -> None:
    r = only(one_panel(12, "x[$__rate_interval]", interval="1m"), 1 * H)
    # "Min step" 1m raises the step to 1m and becomes the scrape interval of $__rate_interval:
    # max(intervalMs 30s + 1m, 4 * 1m) = 4m.
    assert r.step == 60
    assert r.expr == "x[4m0s]"


def test_hidden_and_empty_targets_are_not_sent() -> None:
    dash = one_panel(12)
    dash["panels"][0]["targets"] += [{"refId": "B", "expr": "down", "hide": True}, {"refId": "C", "expr": ""}]
    assert [r.ref_id for r in d.panel_requests(dash, END - H, END)] == ["A"]


def test_rows_and_text_panels() -> None:
    dash = {"panels": [
        {"type": "text", "id": 1, "gridPos": {"w": 24}},
        {"type": "row", "id": 2, "collapsed": True, "panels": [
            {"type": "timeseries", "id": 3, "title": "inner", "gridPos": {"w": 12}, "targets": [{"expr": "up"}]}]},
    ]}
    reqs = d.panel_requests(dash, END - H, END)
    assert [(r.title, r.panel_id) for r in reqs] == [("inner", 3)]


def test_instant_query_is_not_aligned() -> None:
    r = only(one_panel(6, "sum(x)", instant=True, range=False), 24 * H)
    assert r.instant and r.path == "/api/v1/query"
    assert r.form() == {"query": "sum(x)", "time": "1700000123.456"}
    both = d.panel_requests(one_panel(6, "sum(x)", instant=True, range=True), END - H, END)
    assert [(x.path, x.ref_id) for x in both] == [("/api/v1/query_range", "A"), ("/api/v1/query", "A-Instant")]


# --- Grafana's own test vectors for calculatePrometheusInterval ----------------------------

@pytest.mark.parametrize(
    ("query_interval", "ds", "interval_ms", "factor", "range_h", "max_dp", "want_s"),
    [
        ("10m", "", 300_000, 1, 48, 761, 600),  # min step bigger than calculated
        ("2m", "", 300_000, 1, 48, 761, 300),  # calculated bigger than min step
        ("2m", "", 900_000, 1, 48, 175, 900),
        ("", "15s", 0, 1, 12, 0, 30),  # no maxDataPoints -> 1500
        ("", "15s", 0, 1, 1, 0, 15),
        ("", "15s", 0, 10, 48, 0, 1200),  # intervalFactor
        ("", "240s", 0, 1, 48, 0, 240),
        ("$__interval", "15s", 60_000, 1, 48, 0, 120),
        ("$__rate_interval", "30s", 100_000, 1, 48, 12384, 130),
        ("${__rate_interval}", "30s", 30_000, 1, 1, 12384, 120),
        ("150s", "30s", 100_000, 1, 48, 12384, 150),
        ("", "15s", 0, 1, 30 * 24, 0, 1800),
        ("", "30s", 30_000, 1, 1, 1613, 30),
        ("", "15s", 0, 1, 1, 10, 300),
        ("", "15s", 0, 1, 1, 10000, 15),
    ],
)
def test_backend_step_matches_grafana_vectors(
    query_interval: str, ds: str, interval_ms: int, factor: int, range_h: int, max_dp: int, want_s: int
) -> None:
    got = d.backend_step_ns(
        range_h * H * S,
        interval_ms=interval_ms,
        max_data_points=max_dp,
        query_interval=query_interval,
        ds_time_interval=ds,
        interval_factor=factor,
    )
    assert got == want_s * S


# --- formatting ------------------------------------------------------------------------------

def test_go_duration_string() -> None:
    assert d.go_duration_string(150 * S) == "2m30s"
    assert d.go_duration_string(120 * S) == "2m0s"
    assert d.go_duration_string(3600 * S) == "1h0m0s"
    assert d.go_duration_string(3 * S // 2) == "1.5s"
    assert d.go_duration_string(S // 2) == "500ms"
    assert d.go_duration_string(0) == "0s"


def test_format_interval_truncates() -> None:
    assert d.format_interval(90 * S) == "1m"
    assert d.format_interval(120 * S) == "2m"
    assert d.format_interval(86_400 * S) == "1d"
    assert d.format_interval(S // 2) == "500ms"


def test_grafana_duration_parsing() -> None:
    assert d.parse_grafana_duration_ns("30s") == 30 * S
    assert d.parse_grafana_duration_ns("30") == 30 * S
    assert d.parse_grafana_duration_ns("1m30s") == 90 * S
    assert d.parse_grafana_duration_ns("2d") == 2 * 86_400 * S
    assert d.parse_grafana_duration_ns("<1m>") == 60 * S
    with pytest.raises(ValueError):
        d.parse_grafana_duration_ns("abc")
    assert d.parse_frontend_interval_ms("30s") == 30_000
    assert d.parse_frontend_interval_ms("1.5m") == 60_000  # parseInt
    assert d.parse_frontend_interval_ms("10") == 10_000


def test_time_formatting_and_body() -> None:
    assert d.format_seconds(1_700_000_040 * S) == "1700000040"
    assert d.format_seconds(1_700_000_123_456_000_000) == "1700000123.456"
    assert d.format_seconds(S // 2) == "0.5"
    r = only(one_panel(12, 'sum by (namespace) (x{a="b c"})'), 24 * H)
    body = r.body()
    assert body.startswith("end=1700000040&query=sum+by+%28namespace%29")  # keys sorted like Go
    assert parse_qs(body) == {k: [v] for k, v in r.form().items()}


# --- the shipped dashboard -------------------------------------------------------------------

def test_gpu_fleet_dashboard_requests() -> None:
    dash = d.load_dashboard()
    reqs = d.panel_requests(dash, END - 24 * H, END)
    targets = [t for p in d.iter_panels(dash) for t in p.get("targets", []) if not t.get("hide")]
    assert len(reqs) == len(targets) >= 12
    for r in reqs:
        assert r.expr.strip(), r.title
        assert "$" not in r.expr, (r.title, r.expr)  # every variable substituted
        assert r.title
        assert 0 < r.points <= 11_000
        assert r.start_ns % r.step_ns == 0 and r.end_ns % r.step_ns == 0
        assert set(r.form()) == {"query", "start", "end", "step"}
    by_title = {r.title: r for r in reqs}
    assert by_title["GPU utilisation by node"].expr == "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    assert by_title["GPU utilisation by node"].step == 120
    assert by_title["Pods by phase"].step == 60  # full width
    assert by_title["NVLink throughput by node"].expr == (
        "sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[2m30s]))"
    )


@pytest.mark.parametrize("range_s", [15 * 60, H, 6 * H, 24 * H, 7 * 24 * H])
def test_gpu_fleet_dashboard_exprs_parse(range_s: int) -> None:
    from shardplanner.promql import parse

    for r in d.panel_requests(d.load_dashboard(), END - range_s, END):
        parse(r.expr)


def test_accepts_json_text_and_path() -> None:
    text = d.DEFAULT_DASHBOARD.read_text()
    a = d.panel_requests(text, END - H, END)
    b = d.panel_requests(d.DEFAULT_DASHBOARD, END - H, END)
    c = d.panel_requests({"dashboard": json.loads(text)}, END - H, END)
    assert a == b == c
