"""How big a query's answer may be, estimated before anything runs
(shardplanner/answer_size.py): series x samples per series x 16 bytes + labels."""

from __future__ import annotations

import pytest

from shardplanner.answer_size import LABEL_BYTES, SAMPLE_BYTES, answer_bytes, answer_series
from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.promql import parse

NODES = {"Hostname": tuple(f"gpu-node-{i:02d}" for i in range(10)), "instance": tuple(f"n{i}:9100" for i in range(10))}


@pytest.mark.parametrize(("query", "series"), [
    ("DCGM_FI_DEV_GPU_UTIL", 80),  # 10 nodes x series_per_node 8
    ('DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-node-0[0-4]"}', 40),
    ("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", 10),
    ("sum by (namespace) (DCGM_FI_DEV_FB_USED)", 10),  # labels coarser than a node's
    ("sum(DCGM_FI_DEV_FB_USED)", 1),
    ("sum without (gpu) (DCGM_FI_DEV_FB_USED)", 80),
    ("topk(3, DCGM_FI_DEV_GPU_TEMP)", 3),
    ("topk(3, DCGM_FI_DEV_GPU_TEMP) by (Hostname)", 30),
    ("rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]) * 8", 80),
    ("DCGM_FI_DEV_GPU_UTIL or node_load1", 160),
    ("vector(1)", 1),
    ("up", None),  # no shard label for `up`: unknown
])
def test_answer_series(query: str, series: int | None) -> None:
    assert answer_series(parse(query), PlannerSettings(), NODES) == series


def test_answer_bytes_counts_points_and_labels() -> None:
    settings = PlannerSettings()
    rng = QueryRequest.range("DCGM_FI_DEV_GPU_UTIL", 0, 3_600_000, 60_000)  # 61 points
    assert answer_bytes(parse(rng.query), rng, settings, NODES) == 80 * (61 * 16 + LABEL_BYTES)
    inst = QueryRequest.instant("DCGM_FI_DEV_GPU_UTIL[5m]", 3_600_000)  # 10 samples a series
    assert answer_bytes(parse(inst.query), inst, settings, NODES) == 80 * (10 * 16 + LABEL_BYTES)
    assert answer_bytes(parse(rng.query), rng, settings, {}) is None
    assert answer_bytes(None, rng, settings, NODES) is None


@pytest.mark.parametrize(("query", "series"), [
    ("count_values(\"v\", DCGM_FI_DEV_GPU_UTIL)", 80),  # one series per distinct value: up to the input's
    ("absent(up)", 1),  # at most one series, known even where `up`'s nodes are not
    ("sum(up) + 1", None),
    ("topk(scalar(up), DCGM_FI_DEV_GPU_UTIL)", 80),  # k not a literal: the input
    ("count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", 10),
    # node_* shards by instance: a grouping by another label counts as coarser than a node's,
    # the input series over series_per_node (80 / 8).
    ("count by (Hostname) (node_load1)", 10),
])
def test_answer_series_more(query: str, series: int | None) -> None:
    assert answer_series(parse(query), PlannerSettings(), NODES) == series


def test_an_instant_subquery_answers_range_over_step_samples() -> None:
    settings = PlannerSettings()
    one = 80 * LABEL_BYTES
    sub = QueryRequest.instant("max_over_time(DCGM_FI_DEV_GPU_UTIL[1h:5m])", 3_600_000)
    assert answer_bytes(parse(sub.query), sub, settings, NODES) == 80 * SAMPLE_BYTES + one  # an instant vector
    raw = QueryRequest.instant("DCGM_FI_DEV_GPU_UTIL[1h:5m]", 3_600_000)
    assert answer_bytes(parse(raw.query), raw, settings, NODES) == 80 * 12 * SAMPLE_BYTES + one
    default_step = QueryRequest.instant("(DCGM_FI_DEV_GPU_UTIL[1h:])", 3_600_000)
    assert answer_bytes(parse(default_step.query), default_step, settings, NODES) == 80 * 60 * SAMPLE_BYTES + one
