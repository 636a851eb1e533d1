"""Pure parts of exact hybrid evaluation: the steps no single store answers
(`served_segments`). A window's samples cut among the stores (`partition_window`):
tests/shardplanner/test_coverage.py; literal name lists (`listed_names`):
tests/shardplanner/test_read_windows.py; selectors without a fixed name resolved against the
stores' names: tests/shardplanner/test_names.py."""

from __future__ import annotations

from shardplanner.holdings import BackendHolding
from shardplanner.promql import parse
from shardplanner.routing import route_piece, served_segments

H, M = 3_600_000, 60_000
T = 100 * H
# amp holds everything until T + 30m; local (primary) everything since T.
AMP = BackendHolding("amp", ("*",), until_ms=T + 30 * M)
LOCAL = BackendHolding("local", ("*",), since_ms=T, primary=True)
BY_TIME = [LOCAL, AMP]


def test_served_segments_cut_the_grid_where_a_window_straddles() -> None:
    expr = parse("increase(x[1h])")
    segs = served_segments(expr, T - 60 * M, T + 120 * M, BY_TIME, step_ms=10 * M)
    # windows [t-1h, t]: inside amp up to T+30m; both stores' parts after; inside local from T+1h
    assert segs == [(T - 60 * M, T + 30 * M, ("amp",)), (T + 40 * M, T + 50 * M, ()),
                    (T + 60 * M, T + 120 * M, ("local",))]
    # The segments agree with route_piece step by step.
    for a, b, who in segs:
        for t in range(a, b + 1, 10 * M):
            r = route_piece(expr, t, t, BY_TIME)
            assert (r.kind == "unroutable") == (who == ()), (t, r)
            if who:
                assert r.backends[0] == who[0]


def test_served_segments_empty_for_a_metric_no_backend_names() -> None:
    holdings = [BackendHolding("amp", ("DCGM_.*",)), BackendHolding("local", ("node_.*",), primary=True)]
    assert served_segments(parse("rate(kube_x[5m])"), 0, H, holdings, step_ms=M) == []


def test_explain_names_the_time_no_store_holds() -> None:
    from proxy.engine.nodes import RawWindow, WindowNode
    from proxy.pipeline.crossstore import uncovered
    from proxy.pipeline.raw_fetch import window_parts
    from shardplanner.plan import QueryRequest

    gap = [BackendHolding("old", ("*",), until_ms=T), BackendHolding("new", ("*",), since_ms=T + H, primary=True)]
    sel = parse("x")
    lo, hi = T - H, T + 2 * H
    reads = tuple(window_parts(gap, sel, lo, hi))
    assert [r[0] for r in reads] == ["old", "old", "new", "new"]  # cut on absolute hours (T itself: old)
    op = WindowNode(parse("increase(x[3h])"), QueryRequest.instant("increase(x[3h])", hi), RawWindow(sel, reads, lo, hi))
    assert uncovered(op) == [(T + 1, T + H - 1)]
    whole = WindowNode(op.node, op.req, RawWindow(sel, tuple(window_parts(BY_TIME, sel, lo, hi)), lo, hi))
    assert uncovered(whole) == []
