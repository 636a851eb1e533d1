"""What a query reads: each selector's metric and sample window over an evaluation range
(shardplanner/read_windows.py)."""

from __future__ import annotations

import pytest

from shardplanner.holdings import BackendHolding
from shardplanner.promql import CannotParse, parse
from shardplanner.read_windows import Read, listed_names, reads
from shardplanner.routing import route_piece
from tests.shardplanner.times import D, H, M, S

READS = [
    # (query, eval start, eval end, expected reads)
    ("x", 10 * M, 20 * M, [("x", 5 * M, 20 * M)]),
    ("rate(x[1h])", 2 * H, 3 * H, [("x", 1 * H, 3 * H)]),
    ("x offset 1h", 2 * H, 3 * H, [("x", 1 * H - 5 * M, 2 * H)]),
    ("rate(x[10m] offset 1h)", 2 * H, 3 * H, [("x", 1 * H - 10 * M, 2 * H)]),
    ("x offset -10m", 2 * H, 3 * H, [("x", 2 * H + 5 * M, 3 * H + 10 * M)]),
    # `@` pins the read whatever the evaluation time.
    ("x @ 1000", 5 * H, 9 * H, [("x", 1000 * S - 5 * M, 1000 * S)]),
    ("x @ 1000 offset 1m", 5 * H, 9 * H, [("x", 1000 * S - 6 * M, 1000 * S - M)]),
    ("rate(x[5m] @ 3600)", 5 * H, 9 * H, [("x", H - 5 * M, H)]),
    ("x @ start()", 5 * H, 9 * H, [("x", 5 * H - 5 * M, 5 * H)]),
    ("x @ end()", 5 * H, 9 * H, [("x", 9 * H - 5 * M, 9 * H)]),
    # Subqueries: inner steps in [t - offset - range, t - offset], then the inner reads.
    ("max_over_time(x[1h:1m])", 2 * H, 3 * H, [("x", 1 * H - 5 * M, 3 * H)]),
    ("max_over_time(rate(x[10m])[1h:1m])", 2 * H, 3 * H, [("x", H - 10 * M, 3 * H)]),
    ("max_over_time(x[1h:] offset 1d)", D + 2 * H, D + 3 * H, [("x", H - 5 * M, 3 * H)]),
    (
        "max_over_time(rate(x[10m] offset 5m)[1h:1m] offset 1h)",
        3 * H, 4 * H,
        [("x", H - 15 * M, 3 * H - 5 * M)],
    ),
    # Nested subqueries add up.
    ("max_over_time(max_over_time(x[30m:1m])[1h:5m])", 3 * H, 4 * H,
     [("x", 3 * H - 90 * M - 5 * M, 4 * H)]),
    # `@` on a subquery pins the inner steps; a selector's own `@` wins over it.
    ("max_over_time(x[1h:1m] @ 7200)", 5 * H, 9 * H, [("x", H - 5 * M, 2 * H)]),
    ("max_over_time((x @ 100)[1h:1m] @ 7200)", 5 * H, 9 * H, [("x", 100 * S - 5 * M, 100 * S)]),
    # One read per selector, in print order; no name -> None.
    ("a / on(h) b", 0, H, [("a", -5 * M, H), ("b", -5 * M, H)]),
    ('{__name__=~"DCGM_.*"}', 0, H, [(None, -5 * M, H)]),
    ('{__name__="up"}', 0, H, [("up", -5 * M, H)]),
    ("vector(1) + time()", 0, H, []),
]


@pytest.mark.parametrize(("query", "start", "end", "expected"), READS, ids=[r[0] for r in READS])
def test_reads(
    query: str, start: int, end: int, expected: list[tuple[str | None, int, int]]
) -> None:
    assert reads(query, start, end) == [Read(*e) for e in expected]


def test_reads_lookback_and_instant() -> None:
    assert reads("x", H, H, lookback_ms=M) == [("x", H - M, H)]
    assert reads("x[5m]", H, H, lookback_ms=M) == [("x", H - 5 * M, H)]  # range, not lookback


def test_reads_rejects() -> None:
    with pytest.raises(CannotParse):
        reads("sum(", 0, 0)
    with pytest.raises(ValueError):
        reads("x", 10, 0)


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
