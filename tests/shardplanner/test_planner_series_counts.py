"""The samples estimate from real series counts (`PlannerSettings.series_counts`, pure data the
proxy learns and passes in): `shards: auto` and `limits.max_samples` follow the real counts,
and fall back to nodes x series_per_node for a metric whose count is not known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardplanner.plan import PlannerSettings, QueryRequest, Span
from shardplanner.planner import estimate_samples, metrics_to_count, plan
from shardplanner.promql import parse

HOSTS = [f"gpu-node-{i:04d}" for i in range(10)]
VALUES = {"Hostname": HOSTS, "instance": [f"{h}:9100" for h in HOSTS]}
HOUR = 3_600_000
T = 1_700_000_000_000
GPU = "DCGM_FI_DEV_GPU_UTIL"
EST = PlannerSettings(series_per_node=8, scrape_interval_ms=30_000)
AUTO = PlannerSettings(shards=16, auto_shards=True, split_interval_ms=HOUR, max_samples_per_piece=1000)


def counted(settings: PlannerSettings, **counts: int) -> PlannerSettings:
    return replace(settings, series_counts=tuple(sorted(counts.items())))


@pytest.mark.parametrize(
    ("query", "steps", "counts", "want"),
    [
        # the real count replaces nodes x series_per_node (80 for 10 nodes)
        (f"sum({GPU})", 61, {GPU: 37}, (37 * 61, 37)),
        (f"max_over_time({GPU}[1h])", 1, {GPU: 200}, (200 * 120, 200)),
        # a selector keeping some nodes keeps that share of the series, rounded up
        (f'{GPU}{{Hostname="gpu-node-0001"}}', 1, {GPU: 37}, (4, 4)),
        (f'{GPU}{{Hostname=~"gpu-node-000[0-4]"}}', 1, {GPU: 40}, (20, 20)),
        (f'{GPU}{{Hostname=~"nothing"}}', 3, {GPU: 40}, (0, 0)),
        # each metric its own count; one not counted falls back to the guess
        (f"{GPU} / DCGM_FI_DEV_GPU_TEMP", 2, {GPU: 10, "DCGM_FI_DEV_GPU_TEMP": 30}, (2 * 40, 40)),
        (f"{GPU} / DCGM_FI_DEV_GPU_TEMP", 2, {GPU: 10}, (2 * (10 + 80), 90)),
        # counts do not make an estimate where the shard label or its values are unknown
        ("up", 1, {"up": 5}, None),
        (f"sum({GPU})", 1, {}, (80, 80)),
    ],
)
def test_estimate_from_real_counts(query: str, steps: int, counts: dict[str, int],
                                   want: tuple[int, int] | None) -> None:
    assert estimate_samples(parse(query), steps, counted(EST, **counts), VALUES) == want


def _shards(settings: PlannerSettings, req: QueryRequest) -> int:
    p = plan(req, settings, VALUES)
    return max((x.shard.count for x in p.pieces if x.shard), default=1)


def test_auto_shard_count_follows_the_real_series_count() -> None:
    # 3 h at 60 s split at 1 h: the longest piece has 60 steps.
    req = QueryRequest(f"sum by (namespace) ({GPU})", Span.range(0, 3 * HOUR, 60_000))
    assert _shards(AUTO, req) == 5  # the guess: 80 series x 60 = 4,800 samples -> 5 shards
    # few real series (one GPU reports on 3 nodes): 3 x 60 = 180 samples, no shards
    p = plan(req, counted(AUTO, **{GPU: 3}), VALUES)
    assert not p.sharded and "about 180 of 1000 samples" in " ".join(p.notes)
    # more real series than the guess: 120 x 60 = 7,200 -> 8 shards; 400 x 60 -> capped at the 10 nodes
    assert _shards(counted(AUTO, **{GPU: 120}), req) == 8
    assert _shards(counted(AUTO, **{GPU: 400}), req) == 10
    # monotone in the count: ceil(n x 60 / 1000), capped at the 10 known nodes
    got = [_shards(counted(AUTO, **{GPU: n}), req) for n in (1, 17, 34, 50, 67, 84, 100, 117, 150, 200)]
    assert got == sorted(got) and got[0] == 1 and got[-1] == 10


def test_the_max_samples_estimate_follows_the_real_count() -> None:
    req = QueryRequest(f"sum({GPU})", Span.range(0, 2 * HOUR, 60_000))
    p = plan(req, counted(PlannerSettings(split_interval_ms=HOUR), **{GPU: 1000}), VALUES)
    assert (p.estimated_samples, p.estimated_series) == (1000 * 121, 1000)


def test_metrics_to_count() -> None:
    s = PlannerSettings()
    assert metrics_to_count(QueryRequest(f"sum(rate({GPU}[5m])) / on() group_left "
                                         f"count(node_load1) + {GPU}", Span.instant(T)), s) == (GPU, "node_load1")
    # no shard label configured for up: nothing its count would change
    assert metrics_to_count(QueryRequest("up + vector(1)", Span.instant(T)), s) == ()
    assert metrics_to_count(QueryRequest("sum(", Span.instant(T)), s) == ()
    assert metrics_to_count(QueryRequest('{__name__="DCGM_FI_DEV_GPU_TEMP"}', Span.instant(T)), s) \
        == ("DCGM_FI_DEV_GPU_TEMP",)
