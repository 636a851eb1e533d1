"""Day cells: old whole days of a range query are one time piece each, on the query's own step
grid; everything else is cut exactly as `split_range` cuts it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.planner import plan
from shardplanner.timesplit import (
    DAY_MS,
    day_cell,
    day_cells_fit,
    split_range,
    split_range_days,
)

HOUR = 3_600_000
MIN = 60_000
DAY = DAY_MS
T0 = 1_792_800_000_000 - 1_792_800_000_000 % DAY  # a UTC midnight (2026-10-25)


def grid(start: int, end: int, step: int) -> list[int]:
    return list(range(start, end + 1, step))


def test_docstring_example() -> None:
    pieces = split_range_days(0, 3 * DAY - MIN, MIN, HOUR, until_ms=2 * DAY, max_pieces=100)
    assert pieces is not None
    assert pieces[:3] == [(0, DAY - MIN), (DAY, 2 * DAY - MIN), (2 * DAY, 2 * DAY + HOUR - MIN)]
    assert len(pieces) == 2 + 24


def test_seven_days_are_seven_pieces_plus_the_edges() -> None:
    # A 7-day window at 10 min, sliding: mid-day start, mid-day end, all old.
    start = T0 + 13 * HOUR + 20 * MIN
    end = start + 7 * DAY
    pieces = split_range_days(start, end, 10 * MIN, HOUR, until_ms=end + DAY, max_pieces=2000)
    assert pieces is not None
    days = [p for p in pieces if p[1] - p[0] > HOUR]
    assert len(days) == 6  # the six whole days; the two partial days are hour pieces
    assert len(pieces) == 6 + 11 + 14  # 10h40 of the first day: 11 hours; 13h20 of the last: 14
    # Days after `until` stay hours: the last whole day of the window is recent.
    recent = split_range_days(start, end, 10 * MIN, HOUR, until_ms=T0 + 6 * DAY, max_pieces=2000)
    assert recent is not None and len([p for p in recent if p[1] - p[0] > HOUR]) == 5


def test_too_many_pieces_gives_none() -> None:
    assert split_range_days(T0, T0 + 3 * DAY, MIN, HOUR, until_ms=T0, max_pieces=10) is None
    assert split_range_days(T0, T0 + 30 * DAY, MIN, HOUR, until_ms=T0 + 40 * DAY, max_pieces=40) is not None


def test_day_cells_fit() -> None:
    assert day_cells_fit(MIN, HOUR, 11_000)
    assert day_cells_fit(47_000, HOUR, 11_000)
    assert not day_cells_fit(5_000, HOUR, 11_000)  # 17,280 points a day: not one call
    assert not day_cells_fit(MIN, 7 * HOUR, 11_000)  # 7 h does not divide a day
    assert not day_cells_fit(MIN, DAY, 11_000)


steps = st.sampled_from([15_000, 47_000, MIN, 7 * MIN, 10 * MIN, 25 * MIN, HOUR, 90 * MIN, 5 * HOUR, DAY, 2 * DAY])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=4 * DAY),
    st.integers(min_value=0, max_value=9 * DAY),
    steps,
    st.integers(min_value=-2 * DAY, max_value=12 * DAY),
    st.sampled_from([HOUR, 2 * HOUR, 30 * MIN, 8 * HOUR]),
)
def test_day_pieces_partition_the_grid_and_are_unions_of_interval_pieces(
    offset: int, length: int, step: int, until_rel: int, interval: int
) -> None:
    start = T0 + offset
    end = start + length
    until = T0 + (until_rel // DAY) * DAY
    pieces = split_range_days(start, end, step, interval, until, max_pieces=100_000)
    assert pieces is not None
    # The grid, exactly: every point once, in order.
    points = [t for a, b in pieces for t in range(a, b + 1, step)]
    assert points == grid(start, end, step)
    plain = split_range(start, end, step, interval)
    plain_set = set(plain)
    for a, b in pieces:
        if (a, b) in plain_set:
            continue
        # A day piece: the day's whole cell on this grid, in an old day, made of interval pieces.
        assert day_cell(a, start, step) == (a, b)
        assert (a // DAY + 1) * DAY <= until
        inside = [p for p in plain if a <= p[0] and p[1] <= b]
        assert inside[0][0] == a and inside[-1][1] == b
        assert [t for x, y in inside for t in range(x, y + 1, step)] == list(range(a, b + 1, step))
    # Every old day the query holds whole is one piece.
    for d in range((start // DAY) * DAY, end + 1, DAY):
        first, last = day_cell(d, start, step)
        if d + DAY <= until and first <= last and start <= first and last <= end:
            assert (first, last) in pieces


def test_sliding_window_reuses_day_pieces() -> None:
    step = 10 * MIN
    start = T0 + 5 * HOUR
    a = split_range_days(start, start + 7 * DAY, step, HOUR, T0 + 10 * DAY, 2000)
    b = split_range_days(start + step, start + step + 7 * DAY, step, HOUR, T0 + 10 * DAY, 2000)
    assert a is not None and b is not None
    days_a = {p for p in a if p[1] - p[0] > HOUR}
    days_b = {p for p in b if p[1] - p[0] > HOUR}
    assert days_a == days_b and len(days_a) == 6


def test_planner_cuts_old_days_only_when_asked() -> None:
    s = PlannerSettings(split_interval_ms=HOUR)
    req = QueryRequest.range("avg(DCGM_FI_DEV_GPU_UTIL)", T0 + 7 * MIN, T0 + 3 * DAY, 7 * MIN)
    hourly = plan(req, s, {})
    assert len(hourly.pieces) == 72 and hourly.day_cells_until_ms is None
    daily = plan(req, s, {}, day_cells_until_ms=T0 + 2 * DAY)
    assert daily.day_cells_until_ms == T0 + 2 * DAY
    spans = [(p.span.start_ms, p.span.end_ms) for p in daily.pieces]
    # Day 0 holds its first point (T0) outside the query: hours; day 1 is whole; day 2 recent.
    assert len(spans) == 24 + 1 + 24
    assert spans[24] == day_cell(T0 + DAY, req.span.start_ms, 7 * MIN)
    assert [t for a, b in spans for t in range(a, b + 1, 7 * MIN)] == grid(T0 + 7 * MIN, T0 + 3 * DAY, 7 * MIN)
    # A step whose day holds more points than one call may ask for: hours as before.
    fine = plan(QueryRequest.range("up", T0, T0 + 2 * DAY, 5_000), s, {}, day_cells_until_ms=T0 + 2 * DAY)
    assert fine.day_cells_until_ms is None and len(fine.pieces) == 49


def test_a_query_that_is_one_whole_day_stays_in_hours() -> None:
    # One piece would be forwarded whole, in one backend call: hours keep the parallel calls.
    s = PlannerSettings(split_interval_ms=HOUR)
    req = QueryRequest.range("sum(DCGM_FI_DEV_POWER_USAGE)", T0, T0 + DAY - MIN, MIN)
    p = plan(req, s, {}, day_cells_until_ms=T0 + 5 * DAY)
    assert len(p.pieces) == 24 and p.day_cells_until_ms is None
    longer = plan(QueryRequest.range("sum(DCGM_FI_DEV_POWER_USAGE)", T0, T0 + DAY, MIN), s, {},
                  day_cells_until_ms=T0 + 5 * DAY)
    assert len(longer.pieces) == 2 and longer.day_cells_until_ms == T0 + 5 * DAY
