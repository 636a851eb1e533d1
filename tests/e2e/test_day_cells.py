"""Day cells (issue 16 item 3) against real Prometheus 2.42 and real Redis: old whole days of a
range query are one piece and one cache cell each; answers equal Prometheus's, cold and warm,
for steps that do not divide a day (7m, 47s), grids off the minute, offsets and `@`, sharded
or not; a missing day cell is made from its cached hour cells with no backend call; a warm
7-day panel reads its whole days as day cells and only its partial days and "today" as hours.

The CI data (6 h ending 2026-11-01T00:00Z) is old: with the default cache.day_cells_after
(1d) every day before yesterday is a day-cell day; the "today" test moves that line to the
data's last day with day_cells_after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from proxy.pipeline.landing import LANDING_GRACE_S
from tests.corpus import QUERIES
from tests.servers import Promaccel, metric_sum

pytestmark = pytest.mark.prom

HOUR, DAY = 3600, 86_400
# A few queries of each kind that matter to time pieces: range functions, subqueries (absolute
# alignment), offsets (negative too), `@` (pinned and absolute), topk, counters.
SUBSET = ["util_by_namespace", "power_total", "temp_top10", "net_rx_by_instance", "energy_increase", "avg_all",
          "offset_5m", "offset_rate", "negative_offset", "at_start", "at_end", "at_start_offset",
          "offset_then_at_end", "raw_selector", "timestamp_fn", "or_vector0"]


def _server(prom: Any, redis_server: Any, workdir: Path, db: int, *args: str, after_s: int | None = None,
            edge_max: int | None = None, memo: bool = True) -> Promaccel:
    config = workdir / f"day-cells-{db}.yaml"
    lines = ["cache:", f"  redis_url: {redis_server.url.rsplit('/', 1)[0]}/{db}"]
    if after_s is not None:
        lines.append(f"  day_cells_after: {after_s}s")
    if edge_max is not None:
        lines.append(f"  day_cells_edge_max_samples: {edge_max}")
    if not memo:  # a window asked again runs the lookup (not answered with the bytes kept whole)
        lines.append("  answer_memo_bytes: 0")
    config.write_text("\n".join(lines) + "\n")
    return Promaccel.start(prom.url, ("--split-interval", "1h", *args), workdir, config=config)


def _calls(url: str) -> float:
    return metric_sum(url, "promaccel_backend_requests_total", endpoint="/api/v1/query_range")


def _assembled(url: str) -> float:
    return metric_sum(url, "promaccel_cache_day_cells_assembled_total")


def _explain(url: str, form: dict[str, str]) -> dict[str, Any]:
    r = httpx.get(url + "/api/v1/explain", params=form, timeout=60)
    assert r.status_code == 200, r.text[:300]
    return r.json()["data"]  # type: ignore[no-any-return]


def _check(prom: Any, proxy: Promaccel, form: dict[str, str], client: httpx.Client) -> tuple[list[str], httpx.Response]:
    direct = client.post(prom.url + "/api/v1/query_range", data=form)
    proxied = client.post(proxy.url + "/api/v1/query_range", data=form)
    if direct.status_code != proxied.status_code:
        return [f"HTTP {direct.status_code} != {proxied.status_code}: {proxied.text[:200]}"], proxied
    return diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content)), proxied


@pytest.fixture(scope="module", params=[1, 4], ids=["shards1", "shards4"])
def proxy(request: Any, prom: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    shards = request.param
    p = _server(prom, redis_server, tmp_path_factory.mktemp("day_cells"), 10 + shards, "--shards", str(shards))
    yield p
    p.stop()


def test_whole_days_are_day_pieces(prom: Any, proxy: Promaccel) -> None:
    end = prom.end_s
    form = {"query": "sum(DCGM_FI_DEV_POWER_USAGE)", "start": str(end - 2 * DAY - 13), "end": str(end + 1800),
            "step": "120"}
    data = _explain(proxy.url, form)
    # One grid point of Oct 29 (an hour piece), Oct 30 and Oct 31 whole (day pieces), the first
    # half hour of Nov 1 (an hour piece).
    times = [tuple(t) for t in data["time_pieces"]]
    assert [b - a > HOUR * 1000 for a, b in times] == [False, True, True, False]
    days = [d for d in data["pieces"] if "day_cell" in d and _span(d) == tuple(d["day_cell"])]
    assert {_span(d) for d in days} == set(times[1:3])
    # The edge hours of the old days try their day's cell first.
    assert all("day_cell" in d for d in data["pieces"] if _span(d) == times[0])


def _span(piece: dict[str, Any]) -> tuple[int, int]:
    return piece["start_ms"], piece["end_ms"]


@pytest.mark.parametrize("step, skew", [("120", 13), ("420", 0), ("47", 5)], ids=["2m", "7m", "47s"])
def test_equal_to_prometheus_cold_and_warm(prom: Any, proxy: Promaccel, step: str, skew: int) -> None:
    end = prom.end_s
    names = sorted(QUERIES) if step == "120" else SUBSET
    extra = {"at_fixed": f"sum(DCGM_FI_DEV_POWER_USAGE @ {end - 3 * HOUR})",
             "at_fixed_range": f"max(max_over_time(DCGM_FI_DEV_GPU_TEMP[1h] @ {end - 2 * HOUR}))",
             "subquery": "max_over_time(sum(DCGM_FI_DEV_POWER_USAGE)[30m:7m])"}
    cases = [(n, QUERIES[n]) for n in names] + list(extra.items())
    failures: list[str] = []
    with httpx.Client(timeout=120) as client:
        for name, query in cases:
            # Two whole days (Oct 30, Oct 31) and the edges; the data is the end of Oct 31.
            form = {"query": query, "start": str(end - 2 * DAY - 3 * HOUR + skew), "end": str(end + 2 * HOUR + 31),
                    "step": step}
            for round_ in ("cold", "warm"):
                problems, r = _check(prom, proxy, form, client)
                if problems:
                    failures.append(f"{name} {round_}: {problems[:2]}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


def test_warm_whole_days_make_no_backend_call(prom: Any, proxy: Promaccel) -> None:
    end = prom.end_s
    with httpx.Client(timeout=120) as client:
        for query in ("avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)", "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))"):
            form = {"query": query, "start": str(end - 3 * DAY + 600), "end": str(end + 600), "step": "300"}
            assert _check(prom, proxy, form, client)[0] == []
            calls = _calls(proxy.url)
            # Slid by one step: the whole days and hours are the same cells.
            form.update(start=str(end - 3 * DAY + 900), end=str(end + 900))
            problems, r = _check(prom, proxy, form, client)
            assert problems == [] and r.headers["X-Cache"] == "HIT"
            assert _calls(proxy.url) == calls


def test_a_window_sliding_inside_a_day_cell_is_prometheuss_answer(prom: Any, proxy: Promaccel) -> None:
    """A window inside an old day whose day cell is cached reads the cell for each of its hour
    pieces; warm, the pieces between its edges are one cut of the cell (pipeline/lookup.py)
    and the answer is gzipped from that cut's kept deflate runs (codec/deflate.py) from the
    second ask on; asked again, the window's answer is the bytes kept whole. Sliding a step at a
    time and asked three times at each place (gzip, as Grafana asks), every answer is
    Prometheus's."""
    end = prom.end_s
    query = "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    with httpx.Client(timeout=120, headers={"Accept-Encoding": "gzip"}) as client:
        whole = {"query": query, "start": str(end - 2 * DAY), "end": str(end + 600), "step": "60"}
        assert _check(prom, proxy, whole, client)[0] == []  # Oct 31 fetched and stored as a day cell
        time.sleep(LANDING_GRACE_S + 0.5)  # then read from the store, and kept decoded
        calls = _calls(proxy.url)
        for k in range(4):
            form = {"query": query, "start": str(end - 5 * HOUR - 30 * 60 + k * 60),
                    "end": str(end - HOUR - 25 * 60 + k * 60), "step": "60"}
            for _ in range(3):
                problems, r = _check(prom, proxy, form, client)
                assert problems == [], problems[:3]
                assert r.headers["X-Cache"] == "HIT" and r.headers.get("Content-Encoding") == "gzip"
        assert _calls(proxy.url) == calls
    # The cells' JSON and the folded cut's deflated runs were kept (and are told to operators).
    def kept(memo: str) -> float:
        return metric_sum(proxy.url, "promaccel_warm_memo_bytes", memo=memo)

    assert kept("json") > 0 and kept("deflate") > 0
    # A window asked again was answered with the bytes kept whole (pipeline/answer_memo.py:
    # after its lookup, or before planning): those are the answers compared above too.
    served = sum(metric_sum(proxy.url, "promaccel_answer_memo_total", result=r) for r in ("hit", "recalled"))
    assert kept("answer") > 0 and served >= 4


def test_a_day_cell_is_made_from_its_hour_cells(prom: Any, redis_server: Any, tmp_path: Path) -> None:
    """Oct 31 cached hour by hour (two queries that each hold part of it), then a query that
    holds it whole: its day cell is assembled from the 24 hour cells, no backend call."""
    p = _server(prom, redis_server, tmp_path, 9)
    try:
        end = prom.end_s
        query = "sum by (namespace) (DCGM_FI_DEV_FB_USED)"
        with httpx.Client(timeout=120) as client:
            for a, b in ((end - DAY - 2 * HOUR, end - 11 * HOUR), (end - 12 * HOUR - 600, end + 600)):
                form = {"query": query, "start": str(a), "end": str(b), "step": "60"}
                assert _check(prom, p, form, client)[0] == []
            form = {"query": query, "start": str(end - DAY - HOUR), "end": str(end + 1200), "step": "60"}
            data = _explain(p.url, form)
            assert sum(1 for d in data["pieces"] if "day_cell" in d and _span(d) == tuple(d["day_cell"])) == 1
            calls, made = _calls(p.url), _assembled(p.url)
            problems, r = _check(prom, p, form, client)
            assert problems == [] and r.headers["X-Cache"] == "HIT"
            assert _calls(p.url) == calls and _assembled(p.url) == made + 1
            # Stored: the next one reads the day cell itself.
            deadline = time.monotonic() + 10
            while _explain(p.url, form)["cache"]["misses"] and time.monotonic() < deadline:
                time.sleep(0.1)
            again = _explain(p.url, form)
            assert again["cache"]["misses"] == 0
            problems, r = _check(prom, p, form, client)
            assert problems == [] and _assembled(p.url) == made + 1 and _calls(p.url) == calls
    finally:
        p.stop()


@pytest.mark.parametrize("edge_max", [None, 0], ids=["default", "edge-off"])
def test_a_partly_asked_for_day_is_assembled_only_when_small(prom: Any, redis_server: Any, tmp_path: Path,
                                                             edge_max: int | None) -> None:
    """A query holding 13 h of Oct 31, all 24 cached: by default the day cell is
    made from the hours on the side (to be stored); above cache.day_cells_edge_max_samples
    (0 here) it is not (a heavy panel's day would be a second copy beside its answer), and
    the query that asks for the whole day makes it. Answers equal Prometheus's either way."""
    p = _server(prom, redis_server, tmp_path, 10 if edge_max is None else 11, edge_max=edge_max, memo=False)
    try:
        end = prom.end_s
        query = "sum by (namespace) (DCGM_FI_DEV_FB_USED)"
        skipped = "promaccel_cache_day_cells_skipped_total"
        with httpx.Client(timeout=120) as client:
            # Cold: Oct 31's 24 hours fetched and stored by two queries that each hold part of it.
            edge = {"query": query, "start": str(end - DAY - 2 * HOUR), "end": str(end - 11 * HOUR), "step": "60"}
            rest = {"query": query, "start": str(end - 12 * HOUR - 600), "end": str(end + 600), "step": "60"}
            assert _check(prom, p, edge, client)[0] == [] and _check(prom, p, rest, client)[0] == []
            deadline = time.monotonic() + 10
            while _explain(p.url, edge)["cache"]["misses"] and time.monotonic() < deadline:
                time.sleep(0.1)
            made, skips = _assembled(p.url), metric_sum(p.url, skipped)
            problems, r = _check(prom, p, edge, client)  # warm: every hour of it cached
            assert problems == [] and r.headers["X-Cache"] == "HIT"
            if edge_max is None:
                assert (_assembled(p.url), metric_sum(p.url, skipped)) == (made + 1, skips)
            else:
                assert (_assembled(p.url), metric_sum(p.url, skipped)) == (made, skips + 1)
                # A query that holds the whole day makes its cell from the same cached hours.
                whole = {"query": query, "start": str(end - DAY - HOUR), "end": str(end + 1200), "step": "60"}
                problems, r = _check(prom, p, whole, client)
                assert problems == [] and r.headers["X-Cache"] == "HIT"
                assert _assembled(p.url) == made + 1
    finally:
        p.stop()


def test_warm_seven_day_panel_reads_day_cells_and_todays_hours(prom: Any, redis_server: Any, tmp_path: Path) -> None:
    """A 7-day panel ending at 13:20 on the data's "today" (Nov 1: day_cells_after puts the
    line there): 6 whole days as day cells, the first partial day's 11 hours and today's 14
    hours as hour cells; 31 cells instead of 169, all hits when warm, equal to Prometheus."""
    end = prom.end_s  # 2026-11-01T00:00Z: "today" begins
    after_s = int(time.time()) - (end + HOUR)  # now - after falls in Nov 1: days up to Oct 31 are old
    p = _server(prom, redis_server, tmp_path, 8, after_s=after_s)
    try:
        hi = end + 13 * HOUR + 20 * 60
        form = {"query": "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)", "start": str(hi - 7 * DAY), "end": str(hi),
                "step": "600"}
        cold = _explain(p.url, form)
        pieces = cold["pieces"]
        days = [d for d in pieces if "day_cell" in d and _span(d) == tuple(d["day_cell"])]
        today = [d for d in pieces if _span(d)[0] >= end * 1000]
        assert (len(days), len(pieces) - len(days) - len(today), len(today)) == (6, 11, 14)
        assert all("day_cell" not in d for d in today)  # today is not a day-cell day
        with httpx.Client(timeout=120) as client:
            assert _check(prom, p, form, client)[0] == []
            deadline = time.monotonic() + 10
            while _explain(p.url, form)["cache"]["misses"] and time.monotonic() < deadline:
                time.sleep(0.1)
            warm = _explain(p.url, form)
            assert warm["cache"] == {"enabled": True, "hits": 31, "misses": 0, "uncacheable": 0}
            calls = _calls(p.url)
            problems, r = _check(prom, p, form, client)
            assert problems == [] and r.headers["X-Cache"] == "HIT" and r.headers["X-Promaccel-Pieces"] == "31"
            assert _calls(p.url) == calls
    finally:
        p.stop()


def test_a_lone_missing_day_is_fetched_as_parallel_hours(prom: Any, redis_server: Any, tmp_path: Path) -> None:
    """A cold query holding one whole old day: fetched as the day's hours over
    backends[].max_parallel (4) calls, not as one call for the day; the next query makes the
    day cell from those hours."""
    p = _server(prom, redis_server, tmp_path, 7)
    try:
        end = prom.end_s
        form = {"query": "avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "start": str(end - DAY - 600),
                "end": str(end + 600), "step": "60"}
        data = _explain(p.url, form)
        assert sum(1 for d in data["pieces"] if "day_cell" in d and _span(d) == tuple(d["day_cell"])) == 1
        assert len(data["pieces"]) == 3  # the last 10 min of Oct 30, Oct 31, the first 10 min of Nov 1
        with httpx.Client(timeout=120) as client:
            calls = _calls(p.url)
            problems, r = _check(prom, p, form, client)
            assert problems == [] and r.headers["X-Cache"] == "MISS"
            assert _calls(p.url) - calls == 4
            form.update(start=str(end - DAY - 540), end=str(end + 660))  # slid by a step
            calls, made = _calls(p.url), _assembled(p.url)
            problems, r = _check(prom, p, form, client)
            assert problems == [] and r.headers["X-Cache"] == "HIT"
            assert _calls(p.url) == calls and _assembled(p.url) == made + 1
    finally:
        p.stop()
