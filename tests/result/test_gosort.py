"""proxy/result/gosort.py: Go 1.19's sort.Sort (pdqsort), container/heap and sort.Search,
operation for operation. Prometheus 2.42 sorts samples with a Less that is not a strict weak
order (vectorByValueHeap: NaN is less than everything, NaN included) and sort.Sort is not
stable, so which equal value or NaN lands where is decided by the exact sequence of
comparisons and swaps -- only a port gives Prometheus's order.

GOLDEN holds orders printed by Go 1.19.8 itself (Debian bookworm's golang-1.19-go, the Go that
Debian's Prometheus 2.42 is built with). For each input (values, "n" for NaN) the permutation
of indexes after:
  sort      sort.Sort over Less(i, j) = IsNaN(v[i]) || v[i] < v[j]     (vectorByValueHeap)
  reverse   sort.Sort(sort.Reverse(that))                             (funcSortDesc)
  promsort  sort.Sort(sort.Reverse(vectorByReverseValueHeap)), Less = IsNaN(v[i]) || v[i] > v[j]
            (funcSort: ascending, NaN last)
The inputs cover insertion sort (13 values is just past it), ninther pivots, the reverse
hint of a descending run, partialInsertionSort on a nearly sorted run, breakPatterns, ties and
all-NaN inputs. HEAP is container/heap: Push of every value (index order), then Pop until
empty, with vectorByValueHeap's Less."""

from __future__ import annotations

import math

import pytest

from proxy.engine.functions import evaluate_call
from proxy.result import QueryResult
from proxy.result.gosort import go_search, go_sort, heap_pop, heap_push
from shardplanner.ast import Call
from shardplanner.promql import parse

T0 = 1_700_000_000_000

# name: (values, sort, reverse, promsort)
GOLDEN: dict[str, tuple[str, str, str, str]] = {
    "pattern40": (
        "1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2 1 n 3 2",
        ("9 17 21 37 5 33 25 29 1 13 36 20 12 0 28 32 16 8 24 4 19 7 11 23 35 3 15 27 31 39 10 30 "
         "26 22 34 18 14 6 38 2"),
        ("30 34 2 38 26 22 18 6 14 10 31 11 39 3 35 15 19 27 7 23 12 0 16 32 4 8 36 28 24 20 9 37 "
         "1 5 25 17 21 33 13 29"),
        ("0 24 36 16 4 20 32 28 8 12 35 11 31 7 27 15 3 39 23 19 10 26 34 6 38 30 2 18 14 22 5 37 "
         "1 9 25 21 17 13 33 29"),
    ),
    "ties100": (
        ("1 2 1 1 1 3 4 5 0 1 0 2 4 0 5 1 0 5 3 0 2 3 0 0 3 0 4 2 3 5 5 5 3 2 0 0 3 0 1 3 5 3 1 2 "
         "1 3 5 3 0 5 2 2 2 4 0 2 0 0 3 2 2 3 4 0 4 5 4 3 5 5 5 0 1 0 2 0 0 5 5 0 1 2 2 2 2 0 0 3 "
         "5 1 1 5 0 2 2 2 2 3 1 5"),
        ("63 57 37 19 35 92 34 48 76 54 10 86 85 13 56 71 16 79 8 75 25 73 22 23 0 9 15 38 98 72 "
         "42 80 90 44 89 4 3 2 51 96 1 74 81 43 33 82 83 84 20 59 50 95 52 11 94 55 93 27 60 32 58 "
         "61 5 28 87 39 47 67 97 45 36 18 24 21 41 53 66 62 6 26 64 12 88 91 69 70 65 14 17 7 78 "
         "68 77 29 30 31 49 46 40 99"),
        ("65 7 40 46 88 49 31 30 29 78 77 70 99 69 14 68 91 17 53 26 6 12 64 62 66 24 32 21 67 58 "
         "97 87 61 18 5 47 36 41 28 39 45 50 52 43 74 81 1 82 11 96 83 51 20 33 95 55 84 94 27 59 "
         "60 93 0 90 89 3 4 42 15 9 2 98 72 38 44 80 56 10 76 79 75 73 71 13 16 85 86 8 19 22 63 "
         "23 92 25 57 54 34 48 35 37"),
        ("63 57 37 19 35 92 34 48 76 54 10 86 85 13 56 71 16 79 8 75 25 73 22 23 0 9 15 38 98 72 "
         "42 80 90 44 89 4 3 2 51 96 1 74 81 43 33 82 83 84 20 59 50 95 52 11 94 55 93 27 60 32 58 "
         "61 5 28 87 39 47 67 97 45 36 18 24 21 41 53 66 62 6 26 64 12 88 91 69 70 65 14 17 7 78 "
         "68 77 29 30 31 49 46 40 99"),
    ),
    "nan13": (
        "n 12 11 10 n 8 7 6 n 4 3 2 n",
        "0 4 12 8 11 10 9 7 6 5 3 2 1",
        "1 2 3 5 6 7 9 10 11 12 8 0 4",
        "11 10 9 7 6 5 3 2 1 12 8 4 0",
    ),
    "nearly60": (
        ("0 1 2 3 4 5 6 7 8 9 40 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 "
         "33 34 35 36 37 38 39 10 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59"),
        ("0 1 2 3 4 5 6 7 8 9 40 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 "
         "33 34 35 36 37 38 39 10 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59"),
        ("59 58 57 56 55 54 53 52 51 50 49 48 47 46 45 44 43 42 41 10 39 38 37 36 35 34 33 32 31 "
         "30 29 28 27 26 25 24 23 22 21 20 19 18 17 16 15 14 13 12 11 40 9 8 7 6 5 4 3 2 1 0"),
        ("0 1 2 3 4 5 6 7 8 9 40 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 "
         "33 34 35 36 37 38 39 10 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59"),
    ),
    "nan200": (
        ("25 22 n 19 n 9 20 4 14 n 0 26 6 6 19 23 11 n 9 3 16 10 17 12 n 27 22 6 27 12 10 6 17 13 "
         "23 23 6 27 9 19 7 14 19 n 21 n 19 26 16 15 n 18 7 26 10 n 0 20 n 29 18 24 22 5 20 0 7 19 "
         "n 15 4 24 16 3 18 n 20 2 n 27 12 12 1 21 12 10 n 10 28 4 11 30 n 2 11 n 16 13 n 3 n 22 4 "
         "27 19 16 28 3 17 27 28 24 15 1 7 n 0 12 7 29 23 8 30 3 0 n 0 n 21 n 30 12 1 7 22 n 5 11 "
         "13 n 20 n 6 20 29 17 24 n 5 17 4 n 28 26 13 28 4 15 15 9 28 1 20 17 n 5 27 23 22 n 25 5 "
         "14 n n n 26 1 12 20 15 27 15 12 2 6 n n 28 28 26 18 14 n n 6 n 6 n 5"),
        ("98 147 55 198 135 4 50 115 24 186 175 86 187 75 92 78 9 151 194 141 68 139 2 174 173 196 "
         "43 125 45 127 58 100 193 169 17 95 164 129 56 116 10 65 124 126 177 113 132 82 161 93 77 "
         "184 19 73 123 107 99 150 70 102 89 7 156 199 136 148 171 63 165 185 195 12 27 13 197 142 "
         "36 31 66 114 133 40 118 52 121 5 38 18 159 21 54 87 85 30 90 94 137 16 81 183 80 84 29 "
         "131 117 23 178 33 97 154 138 41 172 8 192 158 69 157 180 182 112 49 20 105 96 72 48 32 "
         "22 145 149 163 108 51 74 191 60 42 3 46 104 67 39 14 64 140 179 76 143 6 162 57 83 128 "
         "44 168 26 134 62 101 1 34 35 15 167 120 111 71 146 61 0 170 153 47 53 190 176 11 37 103 "
         "28 181 109 25 166 79 88 155 188 189 106 110 152 160 119 59 144 91 130 122"),
        ("130 122 91 119 144 59 106 155 152 188 110 88 160 189 109 166 103 28 181 79 25 37 176 11 "
         "47 153 53 190 0 170 111 71 61 146 167 34 35 15 120 101 1 134 62 168 26 44 83 128 162 57 "
         "140 76 64 143 6 179 104 42 3 14 46 67 39 51 60 74 191 145 108 32 163 22 149 105 72 20 96 "
         "48 182 158 49 157 69 112 180 192 8 172 41 97 33 154 138 131 84 178 80 81 23 29 183 117 "
         "90 94 137 16 85 30 21 87 54 38 159 5 18 121 40 66 118 133 114 52 12 185 36 197 27 195 13 "
         "142 31 165 148 63 171 199 136 150 102 156 70 7 89 123 99 19 107 73 184 93 77 82 161 113 "
         "177 132 126 65 56 10 116 124 175 86 194 55 115 141 58 196 68 151 198 147 139 173 2 43 50 "
         "174 92 75 24 186 98 193 78 95 100 125 4 164 129 9 169 17 187 127 135 45"),
        ("126 56 124 65 10 116 82 161 132 177 113 184 93 77 19 123 107 73 99 89 7 150 70 102 156 "
         "63 171 148 165 199 136 31 13 12 195 197 36 142 185 27 118 133 66 40 52 114 121 38 18 159 "
         "5 21 85 87 54 30 137 94 90 16 117 131 183 29 84 23 81 80 178 138 33 97 154 192 8 41 172 "
         "180 158 69 157 112 49 182 105 96 48 20 72 22 149 32 145 108 163 51 74 60 191 3 46 67 14 "
         "42 104 39 162 6 57 140 143 64 179 76 128 83 44 62 168 26 1 134 101 15 120 34 167 35 111 "
         "61 146 71 0 170 47 176 190 11 53 153 103 181 25 79 109 166 28 37 88 189 106 188 110 160 "
         "152 155 59 119 144 91 122 130 50 92 194 141 95 24 17 43 147 164 127 45 175 196 86 139 "
         "125 169 75 9 187 98 4 198 78 115 68 129 193 186 55 151 58 135 173 100 2 174"),
    ),
    "desc50": (
        ("50 49 48 47 46 45 44 43 42 41 40 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 "
         "21 20 19 18 17 16 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1"),
        ("49 48 47 46 45 44 43 42 41 40 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 "
         "20 19 18 17 16 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0"),
        ("0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 "
         "33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49"),
        ("49 48 47 46 45 44 43 42 41 40 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 "
         "20 19 18 17 16 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0"),
    ),
    "descnan50": (
        ("50 49 48 n 46 45 44 43 42 41 40 39 38 n 36 35 34 33 32 31 30 29 28 n 26 25 24 23 22 21 "
         "20 19 18 n 16 15 14 13 12 11 10 9 8 n 6 5 4 3 2 1"),
        ("43 13 33 3 23 49 48 47 46 45 44 42 41 40 39 38 37 36 35 34 32 31 30 29 28 27 26 25 24 22 "
         "21 20 19 18 17 16 15 14 12 11 10 9 8 7 6 5 4 2 1 0"),
        ("0 1 2 4 5 6 7 8 9 10 11 12 14 15 16 17 18 19 20 21 22 24 25 26 27 28 29 30 31 32 34 35 "
         "36 37 38 39 40 41 42 44 45 46 47 48 49 23 3 33 13 43"),
        ("49 48 47 46 45 44 42 41 40 39 38 37 36 35 34 32 31 30 29 28 27 26 25 24 22 21 20 19 18 "
         "17 16 15 14 12 11 10 9 8 7 6 5 4 2 1 0 3 43 23 33 13"),
    ),
    "allnan20": (
        "n n n n n n n n n n n n n n n n n n n n",
        "1 6 4 19 12 7 9 8 11 15 14 0 2 13 5 3 18 17 16 10",
        "1 6 4 19 12 7 9 8 11 15 14 0 2 13 5 3 18 17 16 10",
        "1 6 4 19 12 7 9 8 11 15 14 0 2 13 5 3 18 17 16 10",
    ),
}
HEAP = (
    "4 4 3 5 5 0 1 3 6 2 1 6 5 6 3 1 4 4 1 4 4 6 5 2 5 6 1 2 2 5 n 2 n",
    "32 30 5 10 15 18 26 6 31 9 23 28 27 2 14 7 20 1 16 17 19 0 29 22 24 4 3 12 8 11 21 25 13",
)


def _values(text: str) -> list[float]:
    return [math.nan if x == "n" else float(x) for x in text.split()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split()]


def _less(v: list[float]):  # type: ignore[no-untyped-def]
    return lambda i, j: math.isnan(v[i]) or v[i] < v[j]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_sort_is_go_sort(name: str) -> None:
    text, want, _, _ = GOLDEN[name]
    v = _values(text)
    idx = list(range(len(v)))
    go_sort(idx, _less(v))
    assert idx == _ints(want)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_reverse_is_go_sort_reverse(name: str) -> None:
    text, _, want, _ = GOLDEN[name]
    v = _values(text)
    less = _less(v)
    idx = list(range(len(v)))
    go_sort(idx, lambda a, b: less(b, a))  # sort.Reverse: Less(j, i)
    assert idx == _ints(want)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_promql_sort_and_sort_desc_order(name: str) -> None:
    """The order the PromQL sort()/sort_desc() answers come in, labels standing for indexes."""
    text, _, desc, asc = GOLDEN[name]
    v = _values(text)
    vec = QueryResult.from_series("vector", [({"i": str(i)}, [T0], [x]) for i, x in enumerate(v)])
    for expr, want in (("sort(x)", asc), ("sort_desc(x)", desc)):
        node = parse(expr)
        assert isinstance(node, Call)
        out = evaluate_call(node, [vec], [T0], False)
        assert [int(d["i"]) for d in out.labels] == _ints(want), expr


def test_golden_orders_sort_the_values() -> None:
    """The golden data itself: each order is a permutation that sorts its values, NaN first
    (sort) or last (promsort) -- so only the placement of ties and NaNs is Go's choice."""
    for text, asc_nan_first, desc, asc in GOLDEN.values():
        v = _values(text)
        for order, key, nan_first in ((asc_nan_first, 1, True), (desc, -1, False), (asc, 1, False)):
            idx = _ints(order)
            assert sorted(idx) == list(range(len(v)))
            nums = [v[i] for i in idx if not math.isnan(v[i])]
            assert nums == sorted(nums, key=lambda x: key * x)
            nan_at = [k for k, i in enumerate(idx) if math.isnan(v[i])]
            n = len(nan_at)
            assert nan_at == (list(range(n)) if nan_first else list(range(len(v) - n, len(v))))


def test_small_and_stable_cases() -> None:
    for n in (0, 1):
        items = list(range(n))
        go_sort(items, lambda a, b: a > b)
        assert items == list(range(n))
    # Up to 12 elements Go runs insertion sort: stable for a strict weak order.
    keys = [2, 1, 2, 1, 0, 2, 1, 0, 0, 1, 2, 0]
    idx = list(range(12))
    go_sort(idx, lambda a, b: keys[a] < keys[b])
    assert idx == sorted(range(12), key=lambda i: keys[i])
    words = ["pear", "fig", "apple", "kiwi"]
    go_sort(words, lambda a, b: a < b)
    assert words == ["apple", "fig", "kiwi", "pear"]


def test_heap_is_container_heap() -> None:
    v = _values(HEAP[0])
    less = _less(v)
    h: list[int] = []
    for i in range(len(v)):
        heap_push(h, i, less)
    assert [heap_pop(h, less) for _ in range(len(v))] == _ints(HEAP[1])
    assert h == []


def test_heap_keeps_the_heap_property() -> None:
    h: list[float] = []
    lt = float.__lt__
    for x in [5.0, 3.0, 8.0, 1.0, 9.0, 2.0, 2.0]:
        heap_push(h, x, lt)
        assert all(not lt(h[i], h[(i - 1) // 2]) for i in range(1, len(h)))
    assert heap_pop(h, lt) == 1.0 and heap_pop(h, lt) == 2.0 and len(h) == 5
    one = [4.0]
    assert heap_pop(one, lt) == 4.0 and one == []


def test_search() -> None:
    assert go_search(0, lambda i: True) == 0
    assert go_search(10, lambda i: i >= 7) == 7
    assert go_search(10, lambda i: True) == 0
    assert go_search(10, lambda i: False) == 10
    # Bisection probes (Go's h = int(uint(i+j) >> 1)): with a predicate that is not monotonic the
    # answer is where the probes lead, as in bucketQuantile over a NaN count.
    probes: list[int] = []
    # i=0, j=8: f(4) false -> i=5; f(6) true -> j=6; f(5) false -> i=6 (the true f(1) is never seen).
    assert go_search(8, lambda i: probes.append(i) or i in (1, 6)) == 6
    assert probes == [4, 6, 5]
