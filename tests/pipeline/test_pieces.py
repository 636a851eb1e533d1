"""In-process tests of the cache's building blocks: cutting answers by time (proxy/result/pieces.py),
cells on the step grid, coalescing units into fetches, footprints (shardplanner/footprint.py) and the
tenant scope."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.units import Unit, cell_of, coalesce_units
from proxy.result import QueryResult
from proxy.result.merge import concat
from proxy.result.pieces import slice_time, split_time
from shardplanner.footprint import digest_query, footprint
from shardplanner.plan import Span
from shardplanner.timesplit import split_range

H = 3_600_000


def _matrix(series: list[tuple[dict[str, str], list[int]]]) -> QueryResult:
    return QueryResult.from_series(
        "matrix", [(lb, ts, [float(t % 97) if t % 5 else math.nan for t in ts]) for lb, ts in series],
        warnings=[], infos=["an info"],
    )


def _brute(result: QueryResult, a: int, b: int) -> list[tuple[dict[str, str], list[int], list[float]]]:
    out = []
    for lb, ts, vs in result.to_pylist():
        kept = [(t, v) for t, v in zip(ts, vs) if a <= t <= b]
        if kept:
            out.append((lb, [t for t, _ in kept], [v for _, v in kept]))
    return out


def _same(rows_a: list, rows_b: list) -> bool:
    if len(rows_a) != len(rows_b):
        return False
    for (la, ta, va), (lb, tb, vb) in zip(rows_a, rows_b):
        if la != lb or ta != tb:
            return False
        if not all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(va, vb)):
            return False
    return True


def test_slice_keeps_series_order_and_drops_empty_series() -> None:
    r = _matrix([({"a": "1"}, [0, 10, 20]), ({"a": "2"}, [30, 40]), ({"a": "3"}, [10, 40])])
    s = slice_time(r, 10, 30)
    assert [lb for lb, _, _ in s.to_pylist()] == [{"a": "1"}, {"a": "2"}, {"a": "3"}]
    assert s.to_pylist()[0][1] == [10, 20]
    s2 = slice_time(r, 31, 39)
    assert s2.n_series == 0 and s2.result_type == "matrix"  # an empty piece is still an answer
    assert s2.infos == ["an info"]
    assert slice_time(r, 0, 40) is r  # nothing to cut


def test_split_canonical_keys_follow_the_series() -> None:
    r = _matrix([({"a": "1"}, [0, 10]), ({"b": 'x"y'}, [10, 20])])
    first, second = split_time(r, [(0, 5), (10, 20)])
    assert first.canonical_keys() == [r.canonical_keys()[0]]
    assert second.canonical_keys() == r.canonical_keys()


def test_split_rejects_overlapping_bounds_and_non_matrix() -> None:
    r = _matrix([({"a": "1"}, [0, 10])])
    with pytest.raises(ValueError):
        split_time(r, [(0, 10), (10, 20)])
    with pytest.raises(ValueError):
        split_time(QueryResult.empty("vector"), [(0, 1)])


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.lists(st.integers(0, 60), unique=True, max_size=30), max_size=8),
    cuts=st.lists(st.integers(-5, 65), unique=True, min_size=1, max_size=8),
)
def test_split_equals_brute_force_and_partitions(data: list[list[int]], cuts: list[int]) -> None:
    r = _matrix([({"s": str(i)}, sorted(ts)) for i, ts in enumerate(data)])
    cuts = sorted(cuts)
    bounds = [(a, b - 1) for a, b in zip(cuts, cuts[1:])] + [(cuts[-1], cuts[-1] + 3)]
    parts = split_time(r, bounds)
    assert len(parts) == len(bounds)
    for (a, b), part in zip(bounds, parts):
        assert _same(part.to_pylist(), _brute(r, a, b))
    nonempty = [p for p in parts if p.n_series]
    if nonempty:
        joined = concat(nonempty)
        lo, hi = bounds[0][0], bounds[-1][1]
        assert _same(joined.to_pylist(), _brute(r, lo, hi))


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(st.permutations(list(range(0, 40, 3))), min_size=1, max_size=5),
    cuts=st.lists(st.integers(-5, 45), unique=True, min_size=1, max_size=6),
)
def test_split_of_series_out_of_time_order_equals_brute_force(data: list[list[int]], cuts: list[int]) -> None:
    """The compiled cut needs time order within a series; other input takes the per-sample path."""
    r = _matrix([({"s": str(i)}, ts) for i, ts in enumerate(data)])
    cuts = sorted(cuts)
    bounds = [(a, b - 1) for a, b in zip(cuts, cuts[1:])] + [(cuts[-1], cuts[-1] + 3)]
    for (a, b), part in zip(bounds, split_time(r, bounds)):
        assert _same(part.to_pylist(), _brute(r, a, b))


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 10 * H),
    span=st.integers(0, 30 * H),
    step=st.sampled_from([1_000, 15_000, 30_000, 45_000, 60_000, 7 * 60_000, 2 * H, 5 * H]),
    interval=st.sampled_from([H, 2 * H, 6 * H]),
)
def test_cells_match_the_planners_pieces(start: int, span: int, step: int, interval: int) -> None:
    pieces = split_range(start, start + span, step, interval)
    for i, (a, b) in enumerate(pieces):
        cell = cell_of(a, step, interval)
        assert cell[0] <= a and b <= cell[1]
        assert (cell[0] - a) % step == 0 and (cell[1] - a) % step == 0
        assert cell[0] // interval == cell[1] // interval == a // interval
        assert cell[0] - step < (a // interval) * interval  # nothing of the grid left out
        assert cell[1] + step >= (a // interval + 1) * interval
        if 0 < i < len(pieces) - 1:
            assert cell == (a, b)  # interior pieces are whole cells


def _unit(start: int, end: int, step: int = 60_000, query: str = "x", shard: int = -1) -> Unit:
    return Unit(query, None, shard, Span.range(start, end, step))


def test_coalesce_units_contiguous_runs_and_budget() -> None:
    units = [_unit(i * H, (i + 1) * H - 60_000) for i in range(8)]
    fetches = coalesce_units(units, 4)
    assert len(fetches) == 4
    assert [len(f.units) for f in fetches] == [2, 2, 2, 2]
    assert fetches[0].start_ms == 0 and fetches[-1].end_ms == 8 * H - 60_000
    # a gap splits a run; other shards are separate groups
    gap = [units[0], units[2], _unit(0, H - 60_000, shard=1)]
    assert sorted((f.shard_index, f.start_ms) for f in coalesce_units(gap, 4)) == [(-1, 0), (-1, 2 * H), (1, 0)]


def test_coalesce_weighs_day_units_by_their_hours() -> None:
    D = 24 * H
    days = [_unit(i * D, (i + 1) * D - 600_000, step=600_000) for i in range(7)]
    edge = _unit(7 * D, 7 * D + H - 600_000, step=600_000)
    # Weighed: calls of about two days each; unweighed, one call would hold 2 days + the hour.
    fetches = coalesce_units([*days, edge], 4, cell_ms=H)
    assert [len(f.units) for f in fetches] == [2, 2, 2, 2]
    assert fetches[-1].units[-1] == edge
    # A run of hours alone is cut exactly as without weights.
    hours = [_unit(i * H, (i + 1) * H - 60_000) for i in range(25)]
    assert [len(f.units) for f in coalesce_units(hours, 4, cell_ms=H)] == [7, 7, 7, 4]
    assert [f.span for f in coalesce_units(hours, 4, cell_ms=H)] == [f.span for f in coalesce_units(hours, 4)]


def test_coalesce_respects_max_points() -> None:
    units = [_unit(i * H, (i + 1) * H - 1_000, step=1_000) for i in range(6)]  # 3600 points each
    fetches = coalesce_units(units, 1, max_points=11_000)
    assert [len(f.units) for f in fetches] == [3, 3]
    for f in fetches:
        assert f.end_ms is not None and f.start_ms is not None
        assert (f.end_ms - f.start_ms) // 1_000 <= 11_000


def test_footprint_ranges_offsets_at_and_subqueries() -> None:
    lb = 300_000
    fp = footprint('rate(x{a="b"}[5m] offset 1m)', 10 * H, 12 * H, lookback_ms=lb)
    assert fp is not None and fp.metrics == ("x",)
    assert (fp.start_ms, fp.end_ms) == (10 * H - 60_000 - 300_000, 12 * H - 60_000)
    fp = footprint("x offset -1h", 10 * H, 10 * H, lookback_ms=lb)
    assert fp is not None and fp.end_ms == 11 * H  # a negative offset reads the future
    fp = footprint(f"x @ {20 * H / 1000:.3f} + y", 10 * H, 11 * H, lookback_ms=lb)
    assert fp is not None and fp.metrics == ("x", "y") and fp.end_ms == 20 * H
    fp = footprint("max_over_time(rate(z[1m])[1h:5m] offset 10m)", 10 * H, 10 * H, lookback_ms=lb)
    assert fp is not None and (fp.start_ms, fp.end_ms) == (10 * H - 600_000 - H - 60_000, 10 * H - 600_000)
    fp = footprint('{__name__=~"DCGM_.*"}', 0, H, lookback_ms=lb)
    assert fp is not None and fp.metrics == ()  # unknown metric: matches every invalidation
    fp = footprint("vector(1)", 0, H, lookback_ms=lb)
    assert fp is not None and fp.selectors == () and digest_query(fp) is None
    assert footprint("x @ start()", 0, H, lookback_ms=lb) is None  # unpinned: not cached
    assert footprint("sum(", 0, H, lookback_ms=lb) is None


def test_digest_query_shape() -> None:
    fp = footprint('sum(x{Hostname=~"a|b"}) / count(y offset 5m)', 10 * H, 11 * H, lookback_ms=300_000)
    assert fp is not None
    q = digest_query(fp)
    assert q is not None
    assert 'count_over_time(x{Hostname=~"a|b"}[' in q and "sum_over_time(y[" in q
    assert "offset" not in q


def test_empty_result_split() -> None:
    empty = QueryResult.empty("matrix")
    parts = split_time(empty, [(0, 10), (11, 20)])
    assert [p.n_series for p in parts] == [0, 0]
    assert np.all(parts[0].offsets == [0])
