"""Pure parts of exact hybrid evaluation: the steps no single store answers
(`served_segments`), a window's samples cut among the stores (`partition_window`), literal name
lists in routing (`listed_names`). Selectors without a fixed name resolved against the stores'
names: tests/shardplanner/test_names.py."""

from __future__ import annotations

import pytest

from shardplanner.holdings import BackendHolding
from shardplanner.promql import parse
from shardplanner.routing import listed_names, partition_window, reads, route_piece, served_segments

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


def test_listed_names_reads_each_name() -> None:
    sel = parse('{__name__=~"DCGM_A|node_b", gpu="1"}')
    assert listed_names(sel) == ("DCGM_A", "node_b")
    assert [r.metric for r in reads(sel, 0, 0)] == ["DCGM_A", "node_b"]
    for text in ('{__name__=~"DCGM_.*"}', '{__name__=~"a|b", __name__!="a"}', 'x{job=~"a|b"}',
                 '{__name__!~"a|b", job="j"}'):
        assert listed_names(parse(text)) == (), text  # a pattern, two matchers, a fixed name, a negation
    holdings = [BackendHolding("amp", ("DCGM_.*",)), BackendHolding("local", ("node_.*",), primary=True)]
    assert route_piece('{__name__=~"DCGM_A|DCGM_B"}', 0, 0, holdings).backends == ("amp",)
    assert route_piece('{__name__=~"DCGM_A|node_b"}', 0, 0, holdings).kind == "unroutable"


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
