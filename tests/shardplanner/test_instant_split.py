"""Instant queries over long range windows, split in time (issue 4 item 6), `shards: auto`
(item 3) and the samples-touched guardrail (item 9).

1. Pure: the planner's sub-windows + proxy.result.merge's combine_time against a reference
   `*_over_time` over the whole closed window `[t-r, t]` (Prometheus 2.42), with samples
   exactly on the split boundaries.
2. Real Prometheus 2.42 (session fixtures): the same queries through promaccel
   (`--split-interval 1h --shards 8`, and 30m) and directly, evaluation times on and off the
   boundaries (also 1 ms after one); exact for max/min/count, 1e-9 relative for sums. The
   pieces are cached (a repeat is a cache HIT) and `/api/v1/explain` shows them.
3. `shards: auto` and `limits.max_samples` through a running promaccel.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from proxy.result import QueryResult
from proxy.result.merge import merge
from shardplanner.ast import MatrixSel, walk
from shardplanner.plan import PlannerSettings, QueryRequest, Span
from shardplanner.planner import plan
from shardplanner.promql import parse
from shardplanner.shards import series_in_shard

Series = tuple[dict[str, str], dict[int, float]]

# --------------------------------------------------------------------------------------
# 1. planner + merge against a reference, pure
# --------------------------------------------------------------------------------------

INTERVAL = 10_000  # ms; samples every 1 s, so every boundary holds samples


def _over_time(func: str, values: list[float]) -> float:
    """Prometheus 2.42 functions.go over one series' window (values in time order)."""
    if func == "count_over_time":
        return float(len(values))
    acc = values[0]
    for v in values[1:]:
        if func == "sum_over_time":
            acc += v
        elif func == "max_over_time":
            if v > acc or math.isnan(acc):
                acc = v
        elif func == "min_over_time":
            if v < acc or math.isnan(acc):
                acc = v
    return acc


def _eval(series: list[Series], func: str, agg: str | None, by: tuple[str, ...],
          t: int, range_ms: int, offset_ms: int) -> dict[tuple[tuple[str, str], ...], float]:
    """`agg by (by) (func(m[range] offset o))` at t, closed window, in series label order."""
    lo, hi = t - offset_ms - range_ms, t - offset_ms
    per_series = []
    for d, pts in sorted(series, key=lambda s: sorted(s[0].items())):
        vals = [pts[x] for x in sorted(pts) if lo <= x <= hi]
        if vals:
            labels = {k: v for k, v in d.items() if k != "__name__"}
            per_series.append((labels, _over_time(func, vals)))
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, v in per_series:
        key = tuple(sorted(labels.items() if agg is None else ((k, labels[k]) for k in by if k in labels)))
        if key not in out:
            out[key] = v
        elif agg == "sum":
            out[key] += v
        elif agg == "max" and (v > out[key] or math.isnan(out[key])):
            out[key] = v
        elif agg == "min" and (v < out[key] or math.isnan(out[key])):
            out[key] = v
    return out


def _fleet(rng: random.Random, t_end: int) -> list[Series]:
    out = []
    for h in range(5):
        for gpu in range(3):
            d = {"__name__": "m", "Hostname": f"node-{h}", "gpu": str(gpu), "ns": rng.choice("ab")}
            start = rng.randrange(0, t_end // 2)
            stop = rng.randrange(start + 1000, t_end + 5000)
            pts: dict[int, float] = {}
            for x in range(start - start % 1000, stop, 1000):  # on the 1 s grid: hits boundaries
                if rng.random() < 0.1:
                    continue
                r = rng.random()
                pts[x] = math.nan if r < 0.02 else math.inf if r < 0.03 else rng.randrange(-100, 100) / 4
            out.append((d, pts))
    return out


PURE_CASES = [
    ("max_over_time", None, ()),
    ("max_over_time", "max", ("ns",)),
    ("min_over_time", None, ()),
    ("min_over_time", "min", ("Hostname",)),
    ("sum_over_time", None, ()),
    ("sum_over_time", "sum", ("ns",)),
    ("count_over_time", None, ()),
    ("count_over_time", "sum", ()),
    ("count_over_time", "sum", ("ns", "gpu")),
]


@pytest.mark.parametrize(("func", "agg", "by"), PURE_CASES)
@pytest.mark.parametrize("shards", [1, 3])
def test_split_window_merge_matches_whole_window(func: str, agg: str | None, by: tuple[str, ...], shards: int) -> None:
    rng = random.Random(f"{func}{agg}{by}{shards}")
    t_end = 100_000
    series = _fleet(rng, t_end)
    hosts = sorted({d["Hostname"] for d, _ in series})
    settings = PlannerSettings(split_interval_ms=INTERVAL, shards=shards, split_instant_windows=True,
                               shard_labels=(("m", "Hostname"),))
    checked = 0
    for t in (t_end, 60_000, 60_001, 59_999, 45_500, 90_000):  # on, 1 ms after/before, off
        for range_ms, offset_ms in ((35_000, 0), (40_000, 0), (30_001, 0), (25_000, 3_000), (21_000, -1_000)):
            inner = f"{func}(m[{range_ms}ms]{f' offset {offset_ms}ms' if offset_ms else ''})"
            q = inner if agg is None else f"{agg} by ({', '.join(by)}) ({inner})"
            p = plan(QueryRequest(q, Span.instant(t)), settings, {"Hostname": hosts[:-1]})
            assert p.merge.combine_time and len({x.time_ms for x in p.pieces}) >= 2, (q, t)
            assert p.sharded == (shards > 1)
            # Evaluate every piece as Prometheus would (its own window, its own shard).
            pieces: list[tuple[str | None, QueryResult]] = []
            covered = []
            for x in p.pieces:
                assert x.time_ms is not None
                (msel,) = [n for n in walk(parse(x.query)) if isinstance(n, MatrixSel)]
                spec = x.shard
                part = series if spec is None else [s for s in series if series_in_shard(s[0], spec)]
                ev = _eval(part, func, agg, by, x.time_ms, msel.range_ms, msel.selector.offset_ms)
                rows = [(dict(k), [x.time_ms], [v]) for k, v in ev.items()]
                pieces.append((None, QueryResult.from_series("vector", rows)))
                lo = x.time_ms - msel.selector.offset_ms - msel.range_ms
                covered.append((lo, lo + msel.range_ms))
            # The sub-windows partition the whole window (disjoint for sum/count).
            spans = sorted(set(covered))
            assert spans[0][0] == t - offset_ms - range_ms and spans[-1][1] == t - offset_ms
            gap = 1 if func in ("sum_over_time", "count_over_time") else 0
            assert all(b[0] == a[1] + gap for a, b in zip(spans, spans[1:])), spans
            got = merge(pieces, p.merge, time_ms=t)
            want = _eval(series, func, agg, by, t, range_ms, offset_ms)
            rows = got.to_pylist()
            assert {tuple(sorted(d.items())) for d, _, _ in rows} == set(want), (q, t)
            for d, ts, vs in rows:
                assert ts == [t]
                w = want[tuple(sorted(d.items()))]
                v = vs[0]
                if math.isnan(w) or math.isinf(w) or func != "sum_over_time":
                    assert (math.isnan(v) and math.isnan(w)) or v == w, (q, t, d, v, w)
                else:
                    assert math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-9), (q, t, d, v, w)
            checked += 1
    assert checked == 30


def test_shared_boundaries_would_double_count() -> None:
    """The test above can fail: with closed windows cut at shared boundaries (as for
    max/min), sum_over_time counts the boundary samples twice."""
    series: list[Series] = [({"__name__": "m", "Hostname": "a"}, {x: 1.0 for x in range(0, 40_001, 1000)})]
    q = "sum_over_time(m[40s])"
    shared = replace(PlannerSettings(split_interval_ms=INTERVAL, split_instant_windows=True),
                     closed_range_windows=False)
    for settings, want in ((replace(shared, closed_range_windows=True), 41.0), (shared, 44.0)):
        p = plan(QueryRequest(q, Span.instant(40_000)), settings, {})
        pieces = []
        for x in p.pieces:
            (msel,) = [n for n in walk(parse(x.query)) if isinstance(n, MatrixSel)]
            assert x.time_ms is not None
            ev = _eval(series, "sum_over_time", None, (), x.time_ms, msel.range_ms, 0)
            pieces.append((None, QueryResult.from_series("vector", [(dict(k), [x.time_ms], [v]) for k, v in ev.items()])))
        assert merge(pieces, p.merge, time_ms=40_000).to_pylist()[0][2] == [want]


# --------------------------------------------------------------------------------------
# 2. against the real Prometheus 2.42
# --------------------------------------------------------------------------------------

# (query template with {r} for the range, exact?) -- exact: no float sum is reordered.
PROM_QUERIES = [
    ("max_over_time(DCGM_FI_DEV_POWER_USAGE[{r}])", True),
    ("max by (namespace) (max_over_time(DCGM_FI_DEV_GPU_TEMP[{r}]))", True),
    ("min_over_time(DCGM_FI_DEV_POWER_USAGE[{r}] offset 20m)", True),
    ("min by (Hostname) (min_over_time(DCGM_FI_DEV_SM_CLOCK[{r}]))", True),
    ("sum_over_time(DCGM_FI_DEV_POWER_USAGE[{r}])", False),
    ("sum by (namespace) (sum_over_time(DCGM_FI_DEV_GPU_UTIL[{r}]))", False),
    ("sum(sum_over_time(node_network_receive_bytes_total[{r}]))", False),
    ("count_over_time(DCGM_FI_DEV_GPU_UTIL[{r}])", True),
    ("sum(count_over_time(DCGM_FI_DEV_GPU_UTIL[{r}]))", True),
    ("sum by (Hostname) (count_over_time(DCGM_FI_DEV_XID_ERRORS[{r}] offset 20m))", True),
    ("sum without (gpu, UUID, pci_bus_id, device) (count_over_time(DCGM_FI_DEV_FB_USED[{r}]))", True),
    ("count_over_time(up[{r}])", True),  # no shard label: split in time only
]
RANGES = ["90m", "150m", "6h"]


def _times(prom: Any) -> dict[str, str]:
    end = prom.end_s  # epoch-aligned (whole hours): the scrape grid lands on the boundaries
    return {
        "on_boundary": str(end - 3600),
        "1ms_after_boundary": f"{end - 2 * 3600}.001",
        "1ms_before_boundary": f"{end - 3600 - 1}.999",
        "off_boundary": str(end - 3 * 3600 + 17),
        "end": str(end),
    }


def _check_instant(prom: Any, proxy: Any, query: str, t: str, exact: bool, min_pieces: int) -> None:
    params = {"query": query, "time": t}
    direct = httpx.post(prom.url + "/api/v1/query", data=params, timeout=120)
    proxied = httpx.post(proxy.url + "/api/v1/query", data=params, timeout=120)
    assert direct.status_code == proxied.status_code == 200, (query, t, proxied.text[:300])
    d, p = orjson.loads(direct.content), orjson.loads(proxied.content)
    assert d["data"]["result"], (query, t, "vacuous: Prometheus returns nothing")
    assert int(proxied.headers["X-Promaccel-Pieces"]) >= min_pieces, (query, t)
    problems = diff_answers(d, p, rel=0.0 if exact else 1e-9)
    assert problems == [], (query, t, problems[:5])


@pytest.mark.prom
@pytest.mark.parametrize(("template", "exact"), PROM_QUERIES, ids=[q for q, _ in PROM_QUERIES])
def test_instant_windows_split_1h_shards_8(prom: Any, planned: Any, template: str, exact: bool) -> None:
    for r in RANGES:
        for t in _times(prom).values():
            # [90m] at 1h: 2 or 3 sub-windows; [6h]: 6 or 7; times shards where sharded.
            _check_instant(prom, planned, template.format(r=r), t, exact, min_pieces=2)


@pytest.mark.prom
@pytest.mark.parametrize(("template", "exact"), PROM_QUERIES[::2], ids=[q for q, _ in PROM_QUERIES[::2]])
def test_instant_windows_split_30m(prom: Any, proxies: Any, template: str, exact: bool) -> None:
    proxy = proxies.get("--split-interval", "30m", "--shards", "2")
    times = _times(prom)
    for r in ("1h", "150m"):
        for name in ("on_boundary", "1ms_after_boundary", "off_boundary"):
            _check_instant(prom, proxy, template.format(r=r), times[name], exact, min_pieces=2)


@pytest.mark.prom
def test_instant_window_pieces_are_cached_and_explained(prom: Any, proxies: Any) -> None:
    proxy = proxies.get("--split-interval", "1h", "--shards", "4")
    query = "sum by (namespace) (sum_over_time(DCGM_FI_DEV_GPU_UTIL[5h]))"
    params = {"query": query, "time": str(prom.end_s - 1800)}
    ex = httpx.get(proxy.url + "/api/v1/explain", params=params, timeout=60).json()["data"]
    assert ex["type"] == "instant" and ex["time_split"] and ex["sharded"]
    assert ex["merge"]["combine_time"] and ex["merge"]["op"] == "sum" and ex["merge"]["by"] == ["namespace"]
    # [5h] at end-30m: sub-windows ending at 5 hour boundaries and at t, 4 shards each.
    assert len(ex["time_pieces"]) == 6 and ex["piece_count"] == 24
    assert {p["cache"] for p in ex["pieces"]} == {"miss"}
    assert any("[59m59s999ms])" in p["query"] for p in ex["pieces"])
    first = httpx.post(proxy.url + "/api/v1/query", data=params, timeout=60)
    assert first.status_code == 200 and first.headers["X-Cache"] == "MISS"
    # Stored in the background; the repeat is served from the cache.
    for _ in range(50):
        again = httpx.post(proxy.url + "/api/v1/query", data=params, timeout=60)
        if again.headers["X-Cache"] == "HIT":
            break
    assert again.headers["X-Cache"] == "HIT" and again.content == first.content
    ex = httpx.get(proxy.url + "/api/v1/explain", params=params, timeout=60).json()["data"]
    assert ex["cache"]["hits"] == 24
    # The same sub-windows serve a neighbouring evaluation time: only the newest changes.
    params2 = {"query": query, "time": str(prom.end_s - 1200)}
    ex = httpx.get(proxy.url + "/api/v1/explain", params=params2, timeout=60).json()["data"]
    assert ex["cache"]["hits"] == 16 and ex["cache"]["misses"] == 8  # oldest and newest differ
    direct = httpx.post(prom.url + "/api/v1/query", data=params2, timeout=60)
    proxied = httpx.post(proxy.url + "/api/v1/query", data=params2, timeout=60)
    assert diff_answers(direct.json(), proxied.json()) == []


# --------------------------------------------------------------------------------------
# 3. shards: auto and limits.max_samples through a running promaccel
# --------------------------------------------------------------------------------------


def _hostnames(prom: Any) -> int:
    r = httpx.get(prom.url + "/api/v1/label/Hostname/values", timeout=30)
    return len([v for v in r.json()["data"] if v])


def _series(prom: Any, metric: str) -> int:
    """The metric's series at the end of the data, as Prometheus counts them: what promaccel
    learns (proxy/pipeline/series_counts.py) and sizes `shards: auto` and max_samples from."""
    r = httpx.get(prom.url + "/api/v1/query", params={"query": f"count({metric})", "time": str(prom.end_s)},
                  timeout=30)
    return int(r.json()["data"]["result"][0]["value"][1])


@pytest.mark.prom
def test_auto_shards(prom: Any, tmp_path: Path) -> None:
    from tests.servers import Promaccel

    cfg = tmp_path / "auto.yaml"
    # The real series (16 nodes x 4 GPUs) x 60 steps per 1h piece -> ceil(samples / 2000) shards.
    cfg.write_text("planner: {shards: auto, split_interval: 1h, max_samples_per_piece: 2000, max_parallel: 8}\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg)), tmp_path)
    try:
        nodes, series = _hostnames(prom), _series(prom, "DCGM_FI_DEV_GPU_UTIL")
        query = "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL)"
        rng = {"start": str(prom.end_s - 3 * 3600), "end": str(prom.end_s), "step": "60"}
        ex = httpx.get(server.url + "/api/v1/explain", params={"query": query, **rng}, timeout=60).json()["data"]
        want = min(-(-series * 60 // 2000), 8)  # longest piece: 60 steps
        assert want >= 2 and ex["sharded"] and len(ex["shards"]) == want, ex["notes"]
        assert f"auto: {want} shards for about {series * 60} samples per piece" in ex["notes"]
        assert ex["estimated_samples"] == series * 181
        direct = httpx.post(prom.url + "/api/v1/query_range", data={"query": query, **rng}, timeout=60)
        proxied = httpx.post(server.url + "/api/v1/query_range", data={"query": query, **rng}, timeout=60)
        assert diff_answers(direct.json(), proxied.json()) == []
        assert int(proxied.headers["X-Promaccel-Pieces"]) == 4 * want
        # A small query is not sharded.
        small = {"query": 'sum(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-0001"})', **rng}
        ex = httpx.get(server.url + "/api/v1/explain", params=small, timeout=60).json()["data"]
        one = -(-series // nodes) * 60  # 1 node of the 16: its share of the series, rounded up
        assert not ex["sharded"] and any(f"not sharded: auto: every piece within max_samples_per_piece (about {one} of 2000"
                                         in n for n in ex["notes"])
    finally:
        server.stop()


@pytest.mark.prom
def test_max_samples_guardrail(prom: Any, tmp_path: Path) -> None:
    from tests.servers import Promaccel

    series = _series(prom, "DCGM_FI_DEV_POWER_USAGE")
    limit = series * 100  # 1 h (61 steps) passes, 2 h (121) does not
    cfg = tmp_path / "samples.yaml"
    cfg.write_text(f"limits: {{max_samples: {limit}}}\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg), "--split-interval", "1h"), tmp_path)
    try:
        base = {"query": "sum(DCGM_FI_DEV_POWER_USAGE)", "end": str(prom.end_s), "step": "60"}
        ok = httpx.post(server.url + "/api/v1/query_range", data={**base, "start": str(prom.end_s - 3600)}, timeout=60)
        assert ok.status_code == 200, ok.text
        over = httpx.post(server.url + "/api/v1/query_range", data={**base, "start": str(prom.end_s - 7200)}, timeout=60)
        assert over.status_code == 422
        body = over.json()
        assert body["status"] == "error" and body["errorType"] == "execution"
        msg = body["error"]
        assert "limits.max_samples" in msg and f"{series * 121:,} samples" in msg and f"{limit:,}" in msg
        assert "shorter time range" in msg and "larger step" in msg and "more selective matcher" in msg
        # Narrowed as the message says: fewer nodes, or a larger step.
        narrow = {**base, "start": str(prom.end_s - 7200),
                  "query": 'sum(DCGM_FI_DEV_POWER_USAGE{Hostname=~"gpu-node-000[0-3]"})'}
        assert httpx.post(server.url + "/api/v1/query_range", data=narrow, timeout=60).status_code == 200
        coarse = {**base, "start": str(prom.end_s - 7200), "step": "120"}
        assert httpx.post(server.url + "/api/v1/query_range", data=coarse, timeout=60).status_code == 200
        # An instant query over a long window: series x (6h / 30s) samples.
        inst = httpx.post(server.url + "/api/v1/query",
                          data={"query": "max_over_time(DCGM_FI_DEV_GPU_UTIL[6h])", "time": str(prom.end_s)}, timeout=60)
        util = _series(prom, "DCGM_FI_DEV_GPU_UTIL")
        assert inst.status_code == 422 and f"{util * 720:,} samples" in inst.json()["error"]
        # A metric without a shard label cannot be estimated: never refused.
        up = httpx.post(server.url + "/api/v1/query",
                        data={"query": "count_over_time(up[6h])", "time": str(prom.end_s)}, timeout=60)
        assert up.status_code == 200
    finally:
        server.stop()


# The CI fleet's scrape phases are 3..27 s (no target at phase 0), so no sample lies on a
# whole hour or half hour: the 1h/30m tests above never meet a boundary sample. Boundaries at
# multiples of 30m3s (1803 s = 3 mod 30) do: they land on the grid of the targets whose phase
# is 3j mod 30 -- e.g. 1793481963 holds DCGM samples of gpu-node-0001 and -0010 and
# node_exporter ones of gpu-node-0011 (checked below against Prometheus itself).
ODD_INTERVAL = "30m3s"
BOUNDARY_S = 1793481963  # = 994,721 x 1803 s
SUM_COUNT_QUERIES = [
    ("sum_over_time(DCGM_FI_DEV_GPU_UTIL[{r}])", True),
    ("count_over_time(DCGM_FI_DEV_POWER_USAGE[{r}])", True),
    ("sum by (namespace) (sum_over_time(DCGM_FI_DEV_POWER_USAGE[{r}]))", False),
    ("sum(count_over_time(node_network_receive_bytes_total[{r}]))", True),
    ("sum_over_time(node_load1[{r}])", False),
    ("sum without (device) (count_over_time(node_network_transmit_bytes_total[{r}]))", True),
    ("max_over_time(node_load1[{r}])", True),
]


def _boundary_samples(prom: Any, metric: str, t_s: int) -> int:
    """Series with a sample exactly at t_s (a closed [1ms] window ending there holds only
    t_s: samples are whole seconds)."""
    r = httpx.post(prom.url + "/api/v1/query",
                   data={"query": f"count(count_over_time({metric}[1ms]))", "time": str(t_s)}, timeout=60)
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


@pytest.mark.prom
@pytest.mark.parametrize(("template", "exact"), SUM_COUNT_QUERIES, ids=[q for q, _ in SUM_COUNT_QUERIES])
def test_instant_windows_split_on_sample_boundaries(prom: Any, proxies: Any, template: str, exact: bool) -> None:
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "node_load1", "node_network_receive_bytes_total"):
        assert _boundary_samples(prom, metric, BOUNDARY_S) > 0, metric
    proxy = proxies.get("--split-interval", ODD_INTERVAL, "--shards", "2")
    nxt = BOUNDARY_S + 1803
    # Every window below has BOUNDARY_S inside it; the first also ends on a boundary.
    for r in ("1h", "150m", "6h"):
        for t in (str(nxt), f"{nxt}.001", str(nxt + 1803 - 1), str(prom.end_s)):
            _check_instant(prom, proxy, template.format(r=r), t, exact, min_pieces=2)


@pytest.mark.prom
def test_boundary_samples_make_the_disjoint_windows_necessary(prom: Any, tmp_path: Path) -> None:
    """Non-vacuity of the test above: a promaccel told that the backend's windows are
    left-open (Prometheus 3) cuts shared boundaries and over-counts on this 2.42."""
    from tests.servers import Promaccel

    cfg = tmp_path / "left_open.yaml"
    cfg.write_text(f"planner: {{split_interval: {ODD_INTERVAL}, range_windows: left_open}}\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg)), tmp_path)
    try:
        params = {"query": "count_over_time(DCGM_FI_DEV_GPU_UTIL[6h])", "time": str(prom.end_s)}

        def counts(url: str) -> dict[bytes, float]:
            result = httpx.post(url + "/api/v1/query", data=params, timeout=60).json()["data"]["result"]
            return {orjson.dumps(s["metric"], option=orjson.OPT_SORT_KEYS): float(s["value"][1]) for s in result}

        direct, proxied = counts(prom.url), counts(server.url)
        assert direct.keys() == proxied.keys()
        over = [k for k in direct if proxied[k] > direct[k]]
        assert over and all(proxied[k] - direct[k] <= 12 for k in over)  # <= 1 per boundary
        assert all(proxied[k] >= direct[k] for k in direct)
    finally:
        server.stop()
