"""Time pieces keep the exact step grid and epoch-aligned boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplanner.timesplit import (
    count_pieces,
    count_windows,
    first_grid_point_at_or_after,
    split_range,
    split_window,
)

HOUR = 3_600_000
MIN = 60_000


def grid(start: int, end: int, step: int) -> list[int]:
    return list(range(start, end + 1, step))


def test_docstring_example() -> None:
    assert split_range(3_550_000, 7_300_000, MIN, HOUR) == [
        (3_550_000, 3_550_000),
        (3_610_000, 7_150_000),
        (7_210_000, 7_270_000),
    ]


def test_aligned_day_in_hours() -> None:
    pieces = split_range(0, 24 * HOUR, MIN, HOUR)
    assert len(pieces) == 25  # the final grid point 24h opens the 25th hour
    assert pieces[0] == (0, HOUR - MIN)
    assert pieces[-1] == (24 * HOUR, 24 * HOUR)


def test_single_point_and_no_split_needed() -> None:
    assert split_range(5, 5, 1000, HOUR) == [(5, 5)]
    assert split_range(0, 30 * MIN, MIN, HOUR) == [(0, 30 * MIN)]


def test_end_not_on_grid_is_cropped_to_last_grid_point() -> None:
    assert split_range(0, 150_000, MIN, HOUR) == [(0, 120_000)]


def test_sliding_dashboard_window_reuses_interior_pieces() -> None:
    step = 30_000
    now = 1_700_000_000_000 - (1_700_000_000_000 % step)
    a = split_range(now - 6 * HOUR, now, step, HOUR)
    b = split_range(now - 6 * HOUR + 30_000, now + 30_000, step, HOUR)  # refresh 30 s later
    assert a[1:-1] == b[1:-1]
    c = split_range(now - 6 * HOUR + step, now + step, step, HOUR)  # slid by one step
    assert set(a[1:-1]) <= set(c)


def test_step_not_dividing_interval_stays_on_grid() -> None:
    # 7-minute step, 1-hour interval: boundaries move onto the grid, no point lost or doubled.
    step = 7 * MIN
    pieces = split_range(0, 5 * HOUR, step, HOUR)
    assert pieces[0] == (0, 56 * MIN)
    assert pieces[1] == (63 * MIN, 119 * MIN)  # first grid point >= 1h is 63m
    points = [t for s, e in pieces for t in grid(s, e, step)]
    assert points == grid(0, 5 * HOUR, step)


def test_step_larger_than_interval_skips_empty_intervals() -> None:
    assert split_range(0, 3 * HOUR, 90 * MIN, HOUR) == [
        (0, 0),
        (90 * MIN, 90 * MIN),
        (180 * MIN, 180 * MIN),
    ]


def test_offset_grid_is_a_different_cache_grid() -> None:
    # Same window shifted by half a step: other evaluation timestamps, other pieces.
    a = split_range(0, 3 * HOUR, MIN, HOUR)
    b = split_range(30_000, 3 * HOUR + 30_000, MIN, HOUR)
    assert not set(a) & set(b)
    assert {s % MIN for s, _ in b} == {30_000}


@pytest.mark.parametrize(
    ("start", "end", "step", "interval"),
    [(0, 10, 0, 5), (0, 10, 1, 0), (10, 0, 1, 5), (0, 10, -1, 5)],
)
def test_rejects_bad_arguments(start: int, end: int, step: int, interval: int) -> None:
    with pytest.raises(ValueError):
        split_range(start, end, step, interval)


def test_first_grid_point() -> None:
    assert first_grid_point_at_or_after(10, 7, 0) == 10
    assert first_grid_point_at_or_after(10, 7, 10) == 10
    assert first_grid_point_at_or_after(10, 7, 11) == 17
    assert first_grid_point_at_or_after(-10, 7, 0) == 4


ranges = st.tuples(
    st.integers(-(10**12), 10**13),  # start
    st.integers(1, 10**7),  # step
    st.integers(0, 3000),  # steps in range
    st.integers(0, 10**7),  # extra past the last grid point (cropped)
    st.integers(1, 10**8),  # interval
)


@settings(max_examples=400, deadline=None)
@given(ranges)
def test_pieces_partition_the_grid(args: tuple[int, int, int, int, int]) -> None:
    start, step, n, extra, interval = args
    end = start + n * step + extra % step
    pieces = split_range(start, end, step, interval)
    assert len(pieces) == count_pieces(start, end, step, interval)
    points: list[int] = []
    for s, e in pieces:
        assert s <= e
        assert (s - start) % step == 0 and (e - start) % step == 0  # on the grid
        assert s // interval == e // interval  # inside one epoch-aligned interval
        points.extend(range(s, e + 1, step))
    assert points == grid(start, end, step)  # each grid point exactly once, in order
    buckets = [s // interval for s, _ in pieces]
    assert buckets == sorted(set(buckets))  # ordered, one piece per interval


@settings(max_examples=300, deadline=None)
@given(ranges, st.integers(-200, 200), st.integers(-200, 200))
def test_interior_pieces_do_not_depend_on_start(
    args: tuple[int, int, int, int, int], shift_start: int, shift_end: int
) -> None:
    """Two windows on the same grid (start moved by whole steps) agree on every piece whose
    interval lies strictly inside both."""
    start, step, n, _, interval = args
    end = start + n * step
    start2 = start + shift_start * step
    end2 = end + shift_end * step
    if end2 < start2:
        return
    a = split_range(start, end, step, interval)
    b = split_range(start2, end2, step, interval)
    lo = max(a[0][0], b[0][0]) // interval
    hi = min(a[-1][1], b[-1][1]) // interval
    inner_a = [p for p in a if lo < p[0] // interval < hi]
    inner_b = [p for p in b if lo < p[0] // interval < hi]
    assert inner_a == inner_b


def test_split_window_example() -> None:
    assert split_window(10_000_000, 0, 2 * HOUR, HOUR) == [
        (HOUR, 800_000),
        (2 * HOUR, HOUR),
        (10_000_000, 2_800_000),
    ]
    assert split_window(2 * HOUR, 0, 2 * HOUR, HOUR) == [(HOUR, HOUR), (2 * HOUR, HOUR)]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-(10**12), 10**13),
    st.integers(-(10**8), 10**8),
    st.integers(1, 10**9),
    st.integers(1, 10**8),
)
def test_split_window_tiles_the_window(t: int, offset: int, rng: int, interval: int) -> None:
    if rng // interval > 5000:
        return
    windows = split_window(t, offset, rng, interval)
    assert len(windows) == count_windows(t, offset, rng, interval)
    ends = [e - offset for e, _ in windows]
    starts = [e - offset - r for e, r in windows]
    assert starts[0] == t - offset - rng and ends[-1] == t - offset
    assert starts[1:] == ends[:-1]  # adjacent, sharing the boundary instant
    assert all(r > 0 for _, r in windows)
    assert all(e % interval == 0 for e in ends[:-1])  # epoch-aligned interior boundaries
