"""Which backend holds which metric when (shardplanner/coverage.py): the fleet's merged windows
and preference order, who serves an evaluation time, and a sample window cut among the stores
(`partition_window`). Routing built on it: tests/shardplanner/test_routing.py."""

from __future__ import annotations

import pytest

from shardplanner.coverage import Fleet, partition_window
from shardplanner.holdings import BackendHolding
from shardplanner.promql import parse
from shardplanner.read_windows import read_shapes

H, M = 3_600_000, 60_000
T = 100 * H
INF = float("inf")
# amp holds everything until T + 30m; local (primary) everything since T.
AMP = BackendHolding("amp", ("*",), until_ms=T + 30 * M)
LOCAL = BackendHolding("local", ("*",), since_ms=T, primary=True)
BY_TIME = [LOCAL, AMP]


def test_order_is_primary_then_priority_then_list_order() -> None:
    fleet = Fleet([BackendHolding("a"), BackendHolding("b", priority=2), BackendHolding("c", primary=True),
                   BackendHolding("d", priority=2)])
    assert fleet.order == ("c", "b", "d", "a")
    # A backend's best holding ranks it.
    assert Fleet([BackendHolding("a"), BackendHolding("b"), BackendHolding("b", primary=True)]).order == ("b", "a")
    with pytest.raises(ValueError):
        Fleet([])


def test_windows_merge_per_backend_and_metric() -> None:
    fleet = Fleet([
        BackendHolding("amp", ("DCGM_.*",), since_ms=0, until_ms=H),
        BackendHolding("amp", ("DCGM_.*",), since_ms=H + 1, until_ms=2 * H),  # adjacent: one window
        BackendHolding("amp", ("kube_.*",), since_ms=5 * H),
        BackendHolding("local", ("*",), since_ms=3 * H),
    ])
    assert fleet.windows("DCGM_A", "amp") == ((0, 2 * H),)
    assert fleet.windows("kube_x", "amp") == ((5 * H, INF),)
    assert fleet.windows("DCGM_A") == ((0, 2 * H), (3 * H, INF))  # any backend
    # A nameless selector's series may be anywhere: held wherever any backend holds anything,
    # but only a "*" holder can answer it.
    assert fleet.windows(None) == ((0, 2 * H), (3 * H, INF))
    assert fleet.windows(None, "amp") == ()
    assert fleet.windows(None, "local") == ((3 * H, INF),)
    # Only the held part of a window must be covered; nobody holds [2h+1, 3h-1].
    assert fleet.clip("DCGM_A", 2 * H - M, 2 * H + M) == (2 * H - M, 2 * H)
    assert fleet.clip("DCGM_A", 2 * H + 1, 3 * H - 1) is None
    assert fleet.holders("DCGM_A", 2 * H - M, 2 * H + M) == ("amp",)
    assert fleet.holders("DCGM_A", H, 4 * H) == ()  # held in parts by both: nobody alone


def test_serving_and_the_times_it_may_change() -> None:
    fleet = Fleet(BY_TIME)
    shapes = read_shapes(parse("increase(x[1h])"), 0, 0, 5 * M)
    assert fleet.serving(shapes, T + 30 * M) == ("amp",)  # [T-30m, T+30m]: local lacks T-30m..T
    assert fleet.serving(shapes, T + 45 * M) == ()  # straddles: amp ends at T+30m, local starts at T
    assert fleet.serving(shapes, T + 2 * H) == ("local",)
    # Before every retention nobody holds anything read: the preferred backend among those
    # whose patterns name the metric, not nobody.
    late = Fleet([BackendHolding("dcgm", ("DCGM_.*",), since_ms=T, primary=True), BackendHolding("all", since_ms=T)])
    assert late.serving(shapes, 0) == ("all",)
    assert late.serving(read_shapes(parse("DCGM_A"), 0, 0, 5 * M), 0) == ("dcgm",)
    # `serving` is constant between critical times (and after the last one).
    crit = sorted(set(fleet.critical_times(shapes)))
    for t in range(T - H, T + 3 * H, 5 * M):
        nxt = next((c for c in crit if c > t), t + 10 * H)
        assert fleet.serving(shapes, t) == fleet.serving(shapes, nxt - 1), t


@pytest.mark.parametrize(("lo", "hi", "want"), [
    # the overlap [T, T+30m] goes to the primary (local); amp gets what local lacks
    (T - H, T + H, [("amp", T - H, T - 1), ("local", T, T + H)]),
    (T - H, T - M, [("amp", T - H, T - M)]),
    (T + M, T + 2 * H, [("local", T + M, T + 2 * H)]),
])
def test_partition_window_prefers_the_primary(lo: int, hi: int, want: list[tuple[str, int, int]]) -> None:
    assert partition_window(BY_TIME, "x", lo, hi) == want


def test_partition_window_leaves_out_time_nobody_holds() -> None:
    gap = [BackendHolding("old", ("*",), until_ms=T), BackendHolding("new", ("*",), since_ms=T + H, primary=True)]
    assert partition_window(gap, "x", T - H, T + 2 * H) == [("old", T - H, T), ("new", T + H, T + 2 * H)]
    by_metric = [BackendHolding("amp", ("DCGM_.*",)), BackendHolding("local", ("node_.*",), primary=True)]
    assert partition_window(by_metric, "DCGM_A", 0, H) == [("amp", 0, H)]
    assert partition_window(by_metric, "other", 0, H) == []
