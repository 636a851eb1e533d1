"""loadtests/stats.py: percentiles, paired ratios, counter deltas between two /metrics scrapes, the progress line."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from loadtests import stats

# --- statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
@pytest.mark.parametrize("xs", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.linspace(0.001, 9, 37) ** 2)])
def test_percentile_matches_numpy_linear(xs: list[float], q: float) -> None:
    assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edges() -> None:
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)
    assert stats.percentile([1.0, math.inf, math.inf], 50) == math.inf
    s = stats.summarize([0.1, 0.2, 0.3, 0.4])
    assert (s["n"], s["min"], s["max"]) == (4, 0.1, 0.4)
    assert s["p50"] == pytest.approx(0.25)


def test_ratio_of_medians_differs_from_median_of_ratios() -> None:
    # Refresh 2 hit a noisy moment in both modes: pairing cancels it, independent medians do not.
    direct = [1.0, 2.0, 10.0]
    proxied = [2.0, 1.0, 5.0]
    assert stats.ratio_of_medians(direct, proxied) == pytest.approx(1.0)
    assert stats.median_of_ratios(zip(direct, proxied)) == pytest.approx(0.5)


def test_median_of_ratios_skips_unusable_pairs() -> None:
    pairs = [(0.0, 1.0), (math.nan, 1.0), (2.0, 1.0), (4.0, 1.0), (1.0, math.nan)]
    assert stats.median_of_ratios(pairs) == pytest.approx((0.5 + 0.25) / 2)
    assert math.isnan(stats.median_of_ratios([]))
    assert math.isnan(stats.ratio_of_medians([], [1.0]))


def test_count_ratio() -> None:
    assert stats.count_ratio(14, 15) == pytest.approx(15 / 14)
    assert stats.count_ratio(0, 0) == 1.0  # a fully cached refresh in both
    assert stats.count_ratio(0, 3) == math.inf
    assert math.isnan(stats.count_ratio(math.nan, 3))


def test_paired_differences_are_added_time() -> None:
    assert stats.paired_differences([(0.010, 0.012), (0.020, 0.019)]) == pytest.approx([0.002, -0.001])


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
    a, b = stats.parse_metrics(PROMACCEL_BEFORE), stats.parse_metrics(PROMACCEL_AFTER)
    # 12 range + 1 instant + 2 new amp series + 1 new 400 series; readiness probes left out
    assert stats.backend_calls(a, b) == 16
    by_backend = stats.counter_delta(a, b, "promaccel_backend_requests_total", by="backend")
    assert by_backend == {"prom": 12 + 1 + 2 + 1, "amp": 2}


def test_cache_lookups_and_hit_ratio() -> None:
    a, b = stats.parse_metrics(PROMACCEL_BEFORE), stats.parse_metrics(PROMACCEL_AFTER)
    lookups = stats.cache_lookups(a, b)
    assert lookups == {"hit": 27, "miss": 1}
    assert stats.hit_ratio(lookups) == pytest.approx(27 / 28)
    assert math.isnan(stats.hit_ratio({}))


def test_counter_reset_counts_the_new_value() -> None:
    a = stats.parse_metrics('x_total{a="1"} 100\n')
    b = stats.parse_metrics('x_total{a="1"} 7\n')
    assert stats.counter_delta(a, b, "x_total") == 7


def test_parse_metrics_labels_with_escapes_and_timestamps() -> None:
    text = 'm{a="x\\"y",b="c\\\\d",c="e,f=g"} 1.5 1700000000000\nm 2\nm{z="+Inf"} +Inf\n'
    s = stats.parse_metrics(text)
    assert s[("m", (("a", 'x"y'), ("b", "c\\d"), ("c", "e,f=g")))] == 1.5
    assert s[("m", ())] == 2
    assert s[("m", (("z", "+Inf"),))] == math.inf


def test_prometheus_query_traffic() -> None:
    a = stats.parse_metrics(
        'prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 5\n'
        'prometheus_http_requests_total{code="200",handler="/metrics"} 50\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query_range"} 1000\n'
        'prometheus_http_response_size_bytes_sum{handler="/metrics"} 99999\n'
    )
    b = stats.parse_metrics(
        'prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 8\n'
        'prometheus_http_requests_total{code="400",handler="/api/v1/query"} 1\n'
        'prometheus_http_requests_total{code="200",handler="/metrics"} 52\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query_range"} 4000\n'
        'prometheus_http_response_size_bytes_sum{handler="/api/v1/query"} 50\n'
        'prometheus_http_response_size_bytes_sum{handler="/metrics"} 200000\n'
    )
    assert stats.prometheus_query_traffic(a, b) == (4, 3050)



def test_progress_line_without_a_terminal() -> None:
    buf = io.StringIO()
    p = stats.Progress(buf, every_s=3600)
    p.update("one")
    p.update("two")  # throttled: not a terminal
    p.done("finished")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("one") and lines[1].endswith("finished")
