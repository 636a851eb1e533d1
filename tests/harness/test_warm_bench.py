"""loadtests/warm_bench.py's pure parts: windows, rotation, medians and rates, the Markdown table
and the verdicts on issue 28's targets (the servers' part runs only as the benchmark itself)."""

from __future__ import annotations

import pytest

from loadtests import warm_bench as wb


def test_sliding_ends_move_forward_to_the_last() -> None:
    assert wb.sliding_ends(1000, 4) == [910, 940, 970, 1000]
    assert wb.sliding_ends(1000, 1) == [1000]
    form = wb.range_form("up", 7200)
    assert form == {"query": "up", "start": "3600", "end": "7200", "step": "10"}


def test_rotation_gives_every_mode_every_place() -> None:
    orders = [wb.rotated(wb.MODES, k) for k in range(3)]
    assert orders[0] == ["before", "after", "direct"]
    assert orders[1] == ["after", "direct", "before"]
    for place in range(3):
        assert {o[place] for o in orders} == set(wb.MODES)
    assert wb.rotated(wb.MODES, 3) == orders[0]


def test_miss_queries_are_distinct_plain_nodes_within_the_fleet() -> None:
    queries = [wb.miss_query(k) for k in range(14)]  # --rounds allows up to 14
    assert len(set(queries)) == 14 and wb.TINY_QUERY not in queries
    nodes = [int(q.split("gpu-node-")[1][:4]) for q in queries]
    assert all(n % 16 == 4 and 4 <= n < wb.SPEC.nodes for n in nodes)
    # the miss window lies inside the data and far from the last hours the warm phases ask
    assert wb.SPEC.start <= wb.MISS_END - wb.SPAN and wb.MISS_END < wb.END - 2 * wb.SPAN


def test_sample_median_rate_and_cpu() -> None:
    s = wb.Sample(ms=[30.0, 10.0, 20.0], json_bytes=[2_000_000] * 3, cpu_ms=30.0, cpu_asks=3)
    assert s.median() == 20.0
    assert s.mb_per_s() == pytest.approx(100.0)  # 2 MB in 20 ms
    assert s.cpu_per_ask() == 10.0
    empty = wb.Sample()
    assert empty.median() != empty.median()  # NaN
    assert empty.mb_per_s() is None and empty.cpu_per_ask() is None
    assert wb.ratio(1.0, 0.0) is None and wb.ratio(None, 2.0) is None and wb.ratio(1.0, 4.0) == 0.25


def _results(large_after: float, tiny_after: float, second_after: float) -> wb.Results:
    res: wb.Results = {}
    for label in wb.LARGE:
        res[(label, "before")] = wb.Sample(ms=[30.0, 31.0, 29.0], json_bytes=[2_100_000] * 3, wire_bytes=[350_000] * 3)
        res[(label, "after")] = wb.Sample(ms=[large_after] * 3, json_bytes=[2_100_000] * 3)
        res[(label, "direct")] = wb.Sample(ms=[300.0])
    res[(wb.TINY, "before")] = wb.Sample(ms=[4.0])
    res[(wb.TINY, "after")] = wb.Sample(ms=[tiny_after])
    res[(wb.VECTOR1, "direct")] = wb.Sample(ms=[1.0, 1.2, 0.8])
    for v, second in (("before", 6.0), ("after", second_after)):
        res[(wb.MISS, f"{v} 2nd")] = wb.Sample(ms=[second])
        res[(wb.MISS, f"{v} 10th")] = wb.Sample(ms=[2.0])
    return res


def test_targets_met_and_not_met() -> None:
    met = wb.targets(_results(large_after=10.0, tiny_after=1.5, second_after=3.0))
    assert all(line.endswith(": met") for line in met[:2]), met  # 10 / 30 = 0.33x
    assert "after: warm tiny panel / direct vector(1) 1.50x" in met[3] and met[3].endswith(": met")
    assert met[2].endswith("NOT met")  # before: 4.0 / 1.0
    assert met[4].endswith("NOT met") and "3.00x" in met[4]  # before: 6 / 2
    assert met[5].endswith(": met") and "1.50x" in met[5]
    missed = wb.targets(_results(large_after=10.5, tiny_after=1.6, second_after=3.1))
    assert [line.endswith("NOT met") for line in missed] == [True] * 6
    assert wb.targets({})[0].endswith("not measured")


def test_table_rows_ratios_and_rates() -> None:
    lines = wb.table(_results(large_after=15.0, tiny_after=1.5, second_after=3.0))
    assert lines[0].startswith("| measure | mode | median ms")
    label = next(iter(wb.LARGE))
    rows = [line for line in lines if line.startswith(f"| {label} |")]
    assert [r.split(" | ")[1] for r in rows] == ["before", "after", "direct"]
    before = rows[0].split(" | ")
    assert before[2:6] == ["30.0", "2,100,000", "350,000", "70.0"]  # 2.1 MB in 30 ms
    assert "**0.50x**" in rows[1]
    miss = [line for line in lines if line.startswith(f"| {wb.MISS} |")]
    assert [r.split(" | ")[1] for r in miss] == ["before 2nd", "before 10th", "after 2nd", "after 10th"]
    assert "**0.50x**" in miss[2] and "**1.00x**" in miss[3] and miss[0].split(" | ")[2] == "6.00"


def test_x_cache_counts() -> None:
    assert wb.x_cache_counts(wb.Sample(x_cache=["HIT", "PARTIAL", "HIT"])) == "HIT x2, PARTIAL x1"
