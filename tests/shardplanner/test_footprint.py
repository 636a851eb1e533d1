"""What data a piece reads (shardplanner/footprint.py): its metric names and the time range of
its samples, for invalidation, freshness and revalidation digests."""

from __future__ import annotations

import pytest

from shardplanner.footprint import Footprint, digest_query, footprint
from shardplanner.promql import parse

S, M = 1_000, 60_000
LB = 5 * M  # lookback delta
LO, HI = 100 * M, 200 * M


def test_the_docstring_example() -> None:
    fp = footprint('rate(x{a="b"}[5m] offset 1m)', 1_000_000, 2_000_000, lookback_ms=300_000)
    assert fp == Footprint(("x",), 1_000_000 - 60_000 - 300_000, 2_000_000 - 60_000, ('x{a="b"}',))


# Windows follow Prometheus 2.42's reads (promql/engine.go, getTimeRangesForSelector): an
# instant selector at t reads back the lookback delta, a range selector its range, offset
# shifts both back, `@ T` replaces t by T, and a subquery evaluates its inner expression at
# steps within [t - offset - range, t - offset].
@pytest.mark.parametrize(("query", "start", "end"), [
    ("x", LO - LB, HI),
    ("x offset 10m", LO - 10 * M - LB, HI - 10 * M),
    ("x offset -10m", LO + 10 * M - LB, HI + 10 * M),
    ("x[1h]", LO - 60 * M, HI),
    ("x @ 50", 50 * S - LB, 50 * S),  # pinned: the same samples whatever the piece's times
    ("x[1h] @ 50 offset 1m", 50 * S - M - 60 * M, 50 * S - M),
    ("max_over_time(x[10m:1m] offset 2m)", LO - 12 * M - LB, HI - 2 * M),
    ("max_over_time(rate(x[5m])[1h:1m] @ 6000)", 6000 * S - 65 * M, 6000 * S),
    ("x + y offset 1h", LO - 60 * M - LB, HI),  # the union of the selectors' windows
])
def test_windows(query: str, start: int, end: int) -> None:
    fp = footprint(query, LO, HI, lookback_ms=LB)
    assert fp is not None and (fp.start_ms, fp.end_ms) == (start, end)


def test_metrics_sorted_unique_and_unknown_for_a_nameless_selector() -> None:
    fp = footprint("b + a + rate(b[5m])", LO, HI, lookback_ms=LB)
    assert fp is not None and fp.metrics == ("a", "b")
    # A selector picking its metric by regex may read any metric: () means "match every
    # invalidation", never "reads nothing".
    nameless = footprint('a + {__name__=~"b.*"}', LO, HI, lookback_ms=LB)
    assert nameless is not None and nameless.metrics == ()
    assert footprint('{__name__="a"}', LO, HI, lookback_ms=LB).metrics == ("a",)  # type: ignore[union-attr]


def test_selectors_are_distinct_and_without_offset_or_at() -> None:
    fp = footprint('x offset 5m - x @ 100 + x{a="1"}', LO, HI, lookback_ms=LB)
    assert fp is not None and fp.selectors == ("x", 'x{a="1"}')


def test_no_known_footprint() -> None:
    # `@ start()` not pinned by the planner and unparsable text: not cacheable.
    assert footprint("x @ start()", LO, HI, lookback_ms=LB) is None
    assert footprint("max_over_time(x[5m:] @ end())", LO, HI, lookback_ms=LB) is None
    assert footprint("sum(rate(", LO, HI, lookback_ms=LB) is None


def test_no_selector_reads_nothing() -> None:
    assert footprint("vector(1) + time()", LO, HI, lookback_ms=LB) == Footprint((), LO, HI, ())


def test_digest_query_counts_and_sums_each_selector_over_the_window() -> None:
    fp = footprint('rate(x{a="b"}[5m]) / y', LO, HI, lookback_ms=LB)
    assert fp is not None
    q = digest_query(fp)
    assert q is not None
    parse(q)  # valid PromQL for the backend
    window = HI - (LO - LB)
    for i, sel in enumerate(('x{a="b"}', "y")):
        for fn, tag in (("count_over_time", "c"), ("sum_over_time", "s")):
            assert f'label_replace(sum({fn}({sel}[{window}ms])), "promaccel_digest", "{tag}{i}", "", "")' in q
    assert q.count(" or ") == 3  # 2 selectors x (count, sum), one series each
    assert digest_query(Footprint((), LO, HI, ())) is None
    # A zero-length window (an instant piece with no lookback) still reads 1 ms.
    assert "[1ms]" in (digest_query(Footprint(("x",), LO, LO, ("x",))) or "")
