"""Go 1.19's sort.Sort (pdqsort), container/heap and sort.Search, operation for operation.

Prometheus orders instant vectors (sort, sort_desc, topk, bottomk), quantile inputs and
histogram buckets with these. Go's sort is not stable and its `Less` for sample values treats
NaN as smaller than everything *including NaN* (not a strict weak order), so where equal
values or NaNs sit afterwards depends on the exact sequence of comparisons and swaps. A
Python `sorted` gives the same multiset but not Prometheus's order; these ports give its
order (Prometheus 2.42 as Debian ships it is built with Go 1.19.8).

    go_sort(items, less)            sort.Sort: `items` (a list) in place; less(a, b) on elements
    heap_push(h, x, less), heap_pop(h, less), heap_fix_root(h, x)  container/heap
    go_search(n, f)                 sort.Search
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["go_search", "go_sort", "heap_pop", "heap_push"]

T = TypeVar("T")
_U64 = (1 << 64) - 1


class _Data:
    """sort.Interface over a list: Less(i, j) and Swap(i, j) by index."""

    __slots__ = ("items", "lt")

    def __init__(self, items: list[T], less: Callable[[T, T], bool]) -> None:
        self.items = items
        self.lt = less

    def less(self, i: int, j: int) -> bool:
        return self.lt(self.items[i], self.items[j])

    def swap(self, i: int, j: int) -> None:
        it = self.items
        it[i], it[j] = it[j], it[i]


def go_sort(items: list[T], less: Callable[[T, T], bool]) -> None:
    """sort.Sort(data) with data.Less(i, j) = less(items[i], items[j]); in place. For
    sort.Sort(sort.Reverse(x)) pass `lambda a, b: x_less(b, a)`."""
    n = len(items)
    if n <= 1:
        return
    pdqsort(_Data(items, less), 0, n, n.bit_length())


def _insertion_sort(d: _Data, a: int, b: int) -> None:
    for i in range(a + 1, b):
        j = i
        while j > a and d.less(j, j - 1):
            d.swap(j, j - 1)
            j -= 1


def _sift_down(d: _Data, lo: int, hi: int, first: int) -> None:
    root = lo
    while True:
        child = 2 * root + 1
        if child >= hi:
            return
        if child + 1 < hi and d.less(first + child, first + child + 1):
            child += 1
        if not d.less(first + root, first + child):
            return
        d.swap(first + root, first + child)
        root = child


def _heap_sort(d: _Data, a: int, b: int) -> None:
    first, lo, hi = a, 0, b - a
    for i in range((hi - 1) // 2, -1, -1):
        _sift_down(d, i, hi, first)
    for i in range(hi - 1, -1, -1):
        d.swap(first, first + i)
        _sift_down(d, lo, i, first)


_UNKNOWN, _INCREASING, _DECREASING = 0, 1, 2


def pdqsort(d: _Data, a: int, b: int, limit: int) -> None:
    was_balanced = True
    was_partitioned = True
    while True:
        length = b - a
        if length <= 12:
            _insertion_sort(d, a, b)
            return
        if limit == 0:
            _heap_sort(d, a, b)
            return
        if not was_balanced:
            _break_patterns(d, a, b)
            limit -= 1
        pivot, hint = _choose_pivot(d, a, b)
        if hint == _DECREASING:
            _reverse_range(d, a, b)
            pivot = (b - 1) - (pivot - a)
            hint = _INCREASING
        if was_balanced and was_partitioned and hint == _INCREASING:
            if _partial_insertion_sort(d, a, b):
                return
        if a > 0 and not d.less(a - 1, pivot):
            a = _partition_equal(d, a, b, pivot)
            continue
        mid, was_partitioned = _partition(d, a, b, pivot)
        left_len, right_len = mid - a, b - mid
        balance_threshold = length // 8
        if left_len < right_len:
            was_balanced = left_len >= balance_threshold
            pdqsort(d, a, mid, limit)
            a = mid + 1
        else:
            was_balanced = right_len >= balance_threshold
            pdqsort(d, mid + 1, b, limit)
            b = mid


def _partition(d: _Data, a: int, b: int, pivot: int) -> tuple[int, bool]:
    d.swap(a, pivot)
    i, j = a + 1, b - 1
    while i <= j and d.less(i, a):
        i += 1
    while i <= j and not d.less(j, a):
        j -= 1
    if i > j:
        d.swap(j, a)
        return j, True
    d.swap(i, j)
    i += 1
    j -= 1
    while True:
        while i <= j and d.less(i, a):
            i += 1
        while i <= j and not d.less(j, a):
            j -= 1
        if i > j:
            break
        d.swap(i, j)
        i += 1
        j -= 1
    d.swap(j, a)
    return j, False


def _partition_equal(d: _Data, a: int, b: int, pivot: int) -> int:
    d.swap(a, pivot)
    i, j = a + 1, b - 1
    while True:
        while i <= j and not d.less(a, i):
            i += 1
        while i <= j and d.less(a, j):
            j -= 1
        if i > j:
            break
        d.swap(i, j)
        i += 1
        j -= 1
    return i


def _partial_insertion_sort(d: _Data, a: int, b: int) -> bool:
    max_steps, shortest_shifting = 5, 50
    i = a + 1
    for _ in range(max_steps):
        while i < b and not d.less(i, i - 1):
            i += 1
        if i == b:
            return True
        if b - a < shortest_shifting:
            return False
        d.swap(i, i - 1)
        if i - a >= 2:
            j = i - 1
            while j >= 1:
                if not d.less(j, j - 1):
                    break
                d.swap(j, j - 1)
                j -= 1
        if b - i >= 2:
            j = i + 1
            while j < b:
                if not d.less(j, j - 1):
                    break
                d.swap(j, j - 1)
                j += 1
    return False


def _break_patterns(d: _Data, a: int, b: int) -> None:
    length = b - a
    if length >= 8:
        r = length  # xorshift(length), Go 1.19's shifts 13, 17, 5 on a uint64
        modulus = 1 << length.bit_length()
        idx = a + (length // 4) * 2 - 1
        while idx <= a + (length // 4) * 2 + 1:
            r ^= (r << 13) & _U64
            r ^= r >> 17
            r ^= (r << 5) & _U64
            other = r & (modulus - 1)
            if other >= length:
                other -= length
            d.swap(idx, a + other)
            idx += 1


def _choose_pivot(d: _Data, a: int, b: int) -> tuple[int, int]:
    shortest_ninther, max_swaps = 50, 4 * 3
    n = b - a
    swaps = [0]
    i, j, k = a + n // 4 * 1, a + n // 4 * 2, a + n // 4 * 3
    if n >= 8:
        if n >= shortest_ninther:
            i = _median(d, i - 1, i, i + 1, swaps)
            j = _median(d, j - 1, j, j + 1, swaps)
            k = _median(d, k - 1, k, k + 1, swaps)
        j = _median(d, i, j, k, swaps)
    if swaps[0] == 0:
        return j, _INCREASING
    if swaps[0] == max_swaps:
        return j, _DECREASING
    return j, _UNKNOWN


def _order2(d: _Data, a: int, b: int, swaps: list[int]) -> tuple[int, int]:
    if d.less(b, a):
        swaps[0] += 1
        return b, a
    return a, b


def _median(d: _Data, a: int, b: int, c: int, swaps: list[int]) -> int:
    a, b = _order2(d, a, b, swaps)
    b, c = _order2(d, b, c, swaps)
    a, b = _order2(d, a, b, swaps)
    return b


def _reverse_range(d: _Data, a: int, b: int) -> None:
    i, j = a, b - 1
    while i < j:
        d.swap(i, j)
        i += 1
        j -= 1


# -- container/heap ------------------------------------------------------------------------


def heap_push(h: list[T], x: T, less: Callable[[T, T], bool]) -> None:
    """heap.Push: append, then up()."""
    h.append(x)
    j = len(h) - 1
    while True:
        i = (j - 1) // 2 if j > 0 else 0  # Go's (j-1)/2 truncates toward zero
        if i == j or not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        j = i


def heap_pop(h: list[T], less: Callable[[T, T], bool]) -> T:
    """heap.Pop: swap the root to the end, down() over the rest, remove the last."""
    n = len(h) - 1
    h[0], h[n] = h[n], h[0]
    i = 0
    while True:
        j1 = 2 * i + 1
        if j1 >= n:
            break
        j = j1
        j2 = j1 + 1
        if j2 < n and less(h[j2], h[j1]):
            j = j2
        if not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        i = j
    return h.pop()


def go_search(n: int, f: Callable[[int], bool]) -> int:
    """sort.Search: the smallest i in [0, n) with f(i), by Go's exact bisection."""
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not f(h):
            i = h + 1
        else:
            j = h
    return i
