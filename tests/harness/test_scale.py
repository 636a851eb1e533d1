"""loadtests/scale.py's measured inputs (docs/SCALE.md), the parts that need no Prometheus."""

from __future__ import annotations

from loadtests.gen import BENCH_SPEC, CI_SPEC
from loadtests.scale import pieces_per_refresh, samples_per_scrape


def test_sample_fit_predicts_the_bench_fleet() -> None:
    per_gpu, per_node, const, rows = samples_per_scrape()
    assert per_gpu > 0 and per_node > 0 and len(rows) == 4
    predicted = (per_gpu * BENCH_SPEC.nodes * BENCH_SPEC.gpus_per_node + per_node * BENCH_SPEC.nodes + const)
    # `python -m loadtests.load sizes`: 89.2 M samples over the bench's 24 h (2,880 scrapes).
    assert abs(predicted * BENCH_SPEC.n_scrapes / 89.2e6 - 1) < 0.02


def test_pieces_per_refresh_of_the_fleet_dashboard() -> None:
    pieces = pieces_per_refresh(CI_SPEC.end)
    # 14 requests; a 24 h window is 25 hour cells each (docs/BENCHMARKS.md: 350 pieces planned).
    assert pieces["1h"][0] == pieces["24h"][0] == 14
    assert pieces["24h"][1] == 14 * 25
    assert pieces["1h"][1] < pieces["24h"][1] < pieces["7d"][1]
