"""proxy/result/ties.py: is a sharded topk/bottomk answer exactly Prometheus's?

Prometheus 2.42 (promql/engine.go aggregation()) keeps a k-sized container/heap per group and
step; among series of equal value at the k-th place, which survive depends on the heap's
layout over the whole input, which no sharded plan replays. So the merged answer is exact
only when no tie crosses the k-th place: (a) the first candidate past the k-th ties with it,
or (b) a shard returned exactly k series whose last ties with the global k-th (its cut-off
series may hold that value too). NaN ranks last for both topk and bottomk and ties with NaN.
tests/result/test_merge.py checks the rule against a heap simulation over random inputs;
here each case is worked out by hand."""

from __future__ import annotations

import math

from proxy.result import QueryResult
from proxy.result.ties import topk_ambiguous
from shardplanner.plan import MergeRecipe

T0 = 1_700_000_000_000
NAN = math.nan


def _shard(*series: tuple[dict[str, str], float]) -> QueryResult:
    return QueryResult.from_series("vector", [(d, [T0], [v]) for d, v in series])


def _topk(k: float, **kw: object) -> MergeRecipe:
    return MergeRecipe(kind="aggregate", op="topk", param=k, **kw)  # type: ignore[arg-type]


def _bottomk(k: float, **kw: object) -> MergeRecipe:
    return MergeRecipe(kind="aggregate", op="bottomk", param=k, **kw)  # type: ignore[arg-type]


def test_distinct_values_are_exact() -> None:
    pieces = [(0, _shard(({"h": "a"}, 9.0), ({"h": "b"}, 7.0))), (1, _shard(({"h": "c"}, 8.0), ({"h": "d"}, 1.0)))]
    assert not topk_ambiguous(pieces, _topk(2))
    assert not topk_ambiguous(pieces, _bottomk(2))


def test_a_tie_just_past_the_kth_place() -> None:
    # topk 2 over 5, 3 | 3: the 2nd and 3rd candidates are both 3 -- rule (a).
    pieces = [(0, _shard(({"h": "a"}, 5.0), ({"h": "b"}, 3.0))), (1, _shard(({"h": "c"}, 3.0)))]
    assert topk_ambiguous(pieces, _topk(2))
    # A tie above the cut changes nothing: 5, 5 | 3 with k = 2 keeps both 5s whatever the heap.
    above = [(0, _shard(({"h": "a"}, 5.0), ({"h": "b"}, 3.0))), (1, _shard(({"h": "c"}, 5.0)))]
    assert not topk_ambiguous(above, _topk(2))


def test_a_full_shard_ending_on_the_kth_value() -> None:
    # topk 2: shard 0 answered 6, 5 (k series: a hidden series of it may hold 5 as well);
    # shard 1 answered 1. Global: 6, 5, 1 -> v_k = 5 = shard 0's last -- rule (b).
    pieces = [(0, _shard(({"h": "a"}, 6.0), ({"h": "b"}, 5.0))), (1, _shard(({"h": "c"}, 1.0)))]
    assert topk_ambiguous(pieces, _topk(2))
    # k = 3: shard 0's two series are fewer than k, nothing was cut off there; 3 candidates: no cut.
    assert not topk_ambiguous(pieces, _topk(3))
    # The full shard's last is below the global k-th: its hidden series are lower still.
    lower = [(0, _shard(({"h": "a"}, 6.0), ({"h": "b"}, 4.0))), (1, _shard(({"h": "c"}, 9.0)))]
    assert not topk_ambiguous(lower, _topk(2))  # global 9, 6 | 4


def test_bottomk_ranks_the_other_way() -> None:
    pieces = [(0, _shard(({"h": "a"}, 1.0), ({"h": "b"}, 2.0))), (1, _shard(({"h": "c"}, 9.0)))]
    # bottomk 2: shard 0 is full (1, 2) and its last is the global 2nd (1, 2 | 9): rule (b).
    assert topk_ambiguous(pieces, _bottomk(2))
    assert not topk_ambiguous(pieces, _bottomk(3))
    exact = [(0, _shard(({"h": "a"}, 1.0), ({"h": "b"}, 3.0))), (1, _shard(({"h": "c"}, 2.0)))]
    assert not topk_ambiguous(exact, _bottomk(2))  # 1, 2 | 3: shard 0's last (3) is past the cut


def test_nan_ranks_last_and_ties_with_nan() -> None:
    two_nans = [(0, _shard(({"h": "a"}, NAN))), (1, _shard(({"h": "b"}, NAN)))]
    assert topk_ambiguous(two_nans, _topk(1))
    assert topk_ambiguous(two_nans, _bottomk(1))
    assert not topk_ambiguous(two_nans, _topk(2))  # both kept: no cut
    # NaN | 4 | 4 from three shards (none full at k = 2): NaN last, 4, 4 | NaN, is exact for
    # topk and for bottomk; ranked first it would be NaN, 4 | 4, a tie.
    nan_first = [(0, _shard(({"h": "a"}, NAN))), (1, _shard(({"h": "b"}, 4.0))), (2, _shard(({"h": "c"}, 4.0)))]
    assert not topk_ambiguous(nan_first, _topk(2))
    assert not topk_ambiguous(nan_first, _bottomk(2))


def test_k_of_one_is_always_in_doubt() -> None:
    # With k = 1 the winner's shard always answered exactly k series ending on the winner's
    # value: a series it cut off may equal it, so rule (b) always holds.
    pieces = [(0, _shard(({"h": "a"}, 4.0))), (1, _shard(({"h": "b"}, NAN)))]
    assert topk_ambiguous(pieces, _topk(1))
    assert topk_ambiguous(pieces, _bottomk(1))


def test_groups_and_times_are_separate_cells() -> None:
    # Three shards of one series each (none full at k = 2).
    pieces = [(0, _shard(({"g": "1", "h": "a"}, 5.0))), (1, _shard(({"g": "2", "h": "b"}, 5.0))),
              (2, _shard(({"g": "1", "h": "c"}, 5.0)))]
    assert topk_ambiguous(pieces, _topk(2))  # one group: 5, 5 | 5
    assert not topk_ambiguous(pieces, _topk(2, grouping=("g",)))  # by (g): 5, 5 and 5, no cut
    assert not topk_ambiguous(pieces, _topk(2, grouping=("h",), without=True))  # without (h) keeps g
    assert topk_ambiguous(pieces, _topk(2, grouping=("nosuch",)))  # by an absent label: one group {}


def test_without_groups_by_the_other_labels() -> None:
    pieces = [(0, _shard(({"__name__": "m", "g": "1", "h": "a"}, 5.0))),
              (1, _shard(({"__name__": "n", "g": "1", "h": "b"}, 5.0))),
              (2, _shard(({"__name__": "m", "g": "1", "h": "c"}, 5.0)))]
    # without (h): drop h and the metric name -> all in group {g="1"}: 5, 5 | 5.
    assert topk_ambiguous(pieces, _topk(2, grouping=("h",), without=True))
    # without (g): the groups differ by h -> one candidate each.
    assert not topk_ambiguous(pieces, _topk(2, grouping=("g",), without=True))


def test_range_pieces_tie_only_at_one_time() -> None:
    t1, t2 = T0, T0 + 60_000
    a = QueryResult.from_series("matrix", [({"h": "a"}, [t1], [5.0])])
    b = QueryResult.from_series("matrix", [({"h": "b"}, [t2], [5.0])])
    c = QueryResult.from_series("matrix", [({"h": "c"}, [t1], [5.0])])
    assert not topk_ambiguous([(0, a), (1, b), (2, c)], _topk(2))  # t1: 5, 5; t2: 5
    d = QueryResult.from_series("matrix", [({"h": "d"}, [t1, t2], [5.0, 1.0])])
    assert topk_ambiguous([(0, a), (1, b), (2, c), (3, d)], _topk(2))  # t1: 5, 5 | 5


def test_no_cut_no_question() -> None:
    pieces = [(0, _shard(({"h": "a"}, 1.0), ({"h": "b"}, 1.0)))]
    assert not topk_ambiguous(pieces, _topk(0))  # k < 1: Prometheus answers nothing
    assert not topk_ambiguous(pieces, MergeRecipe(kind="aggregate", op="topk"))  # no parameter
    assert not topk_ambiguous([], _topk(1))
    assert not topk_ambiguous([(0, QueryResult.empty("vector"))], _topk(1))
    assert topk_ambiguous(pieces, _topk(1.9))  # int(1.9) = 1: 1 | 1
