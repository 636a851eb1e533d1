"""Time pieces of a range query that keep its exact evaluation grid.

A range query is evaluated at ``start + k*step`` for every ``k >= 0`` with the timestamp
``<= end``. Splitting must keep that grid: every grid timestamp lands in exactly one piece,
and each piece is itself a range query ``(piece_start, piece_end, step)`` whose own grid is
the slice of the original grid it covers (``piece_start`` and ``piece_end`` are grid points).

Piece boundaries are *absolute*: the split points are multiples of the split interval
counted from the Unix epoch (``j * interval_ms``), moved forward onto the grid — a piece
starts at the first grid point ``>= j * interval_ms``. They never depend on the request's
start or on "now", so when a dashboard window slides (start and end both move by 30 s, or
by one step) every interior piece is byte-for-byte the same range query as before and the
cache hits; only the two edge pieces change.

    split_range(start_ms=3_550_000, end_ms=7_300_000, step_ms=60_000, interval_ms=3_600_000)
    -> [(3_550_000, 3_550_000), (3_610_000, 7_150_000), (7_210_000, 7_270_000)]

When ``step_ms`` does not divide ``interval_ms`` the pieces are still exact: each one starts
at the first grid point at or after its boundary, so consecutive pieces of one grid share
no timestamp and skip none. Reuse across refreshes then needs the *same grid*, i.e. the
same ``start_ms % step_ms`` (the step offset): a window that slides by a multiple of the step
keeps its offset and reuses the interior pieces; one that slides by anything else evaluates
at other timestamps, and its answers are genuinely different numbers. That is why a cache key
for a piece carries the step and the step offset, not just its start and end. When the step
is larger than the interval some intervals hold no grid point; they produce no piece.
"""

from __future__ import annotations

import itertools

__all__ = [
    "DAY_MS",
    "count_pieces",
    "day_cell",
    "day_cells_fit",
    "count_windows",
    "first_grid_point_at_or_after",
    "split_range",
    "split_range_days",
    "split_window",
]

# Day cells: old stretches of a range query are cut by UTC day (epoch-aligned) instead of
# by the split interval, so a 7-day panel is ~7 pieces (and cache cells), not 168.
DAY_MS = 86_400_000


def _check(start_ms: int, end_ms: int, step_ms: int, interval_ms: int) -> None:
    if step_ms <= 0:
        raise ValueError(f"step_ms must be positive, got {step_ms}")
    if interval_ms <= 0:
        raise ValueError(f"interval_ms must be positive, got {interval_ms}")
    if end_ms < start_ms:
        raise ValueError(f"end_ms {end_ms} is before start_ms {start_ms}")


def first_grid_point_at_or_after(start_ms: int, step_ms: int, t_ms: int) -> int:
    """The first timestamp ``start_ms + k*step_ms`` (k >= 0) that is ``>= t_ms``."""
    if t_ms <= start_ms:
        return start_ms
    k = -((start_ms - t_ms) // step_ms)  # ceil((t - start) / step)
    return start_ms + k * step_ms


def _last_grid_point(start_ms: int, end_ms: int, step_ms: int) -> int:
    return start_ms + ((end_ms - start_ms) // step_ms) * step_ms


def split_range(
    start_ms: int, end_ms: int, step_ms: int, interval_ms: int
) -> list[tuple[int, int]]:
    """Split the grid of ``[start_ms, end_ms]`` at epoch-aligned multiples of ``interval_ms``.

    Returns ``(piece_start_ms, piece_end_ms)`` pairs, both grid points, in time order. The
    pieces' grids (``piece_start + k*step <= piece_end``) partition the original grid. Work
    is proportional to the number of pieces, not to the number of (possibly empty) intervals.
    """
    _check(start_ms, end_ms, step_ms, interval_ms)
    last = _last_grid_point(start_ms, end_ms, step_ms)
    pieces: list[tuple[int, int]] = []
    t = start_ms
    while t <= last:
        next_boundary = (t // interval_ms + 1) * interval_ms
        # Last grid point strictly before the next boundary, clipped to the query's end.
        piece_end = min(
            last, first_grid_point_at_or_after(start_ms, step_ms, next_boundary) - step_ms
        )
        pieces.append((t, piece_end))
        t = piece_end + step_ms
    return pieces


def day_cells_fit(step_ms: int, interval_ms: int, max_points: int, day_ms: int = DAY_MS) -> bool:
    """Whether a range query at ``step_ms`` split at ``interval_ms`` may have day cells: the
    interval divides the day (a day cell is then exactly its interval pieces) and a day's
    grid points fit one backend call (``max_points``, Prometheus's 11,000)."""
    return 0 < interval_ms < day_ms and day_ms % interval_ms == 0 and -(-day_ms // step_ms) <= max_points


def day_cell(t_ms: int, grid_start_ms: int, step_ms: int, day_ms: int = DAY_MS) -> tuple[int, int]:
    """First and last point of the grid ``grid_start_ms + k*step_ms`` (k any integer) inside
    the day that holds ``t_ms``; the first is after the last when the day holds no point."""
    d = (t_ms // day_ms) * day_ms
    first = d + (grid_start_ms - d) % step_ms
    last = first + ((d + day_ms - 1 - first) // step_ms) * step_ms
    return first, last


def split_range_days(
    start_ms: int, end_ms: int, step_ms: int, interval_ms: int, until_ms: int, max_pieces: int,
    day_ms: int = DAY_MS,
) -> list[tuple[int, int]] | None:
    """:func:`split_range` at ``interval_ms`` (which divides ``day_ms``), except that every
    day ``[d, d + day_ms)`` that ends by ``until_ms`` and whose grid points all lie in
    ``[start_ms, end_ms]`` is one piece: its grid points. Partly covered days and days after
    ``until_ms`` are cut at ``interval_ms`` as usual, so those pieces are the very ones
    :func:`split_range` gives, and a day piece is exactly the union of its day's interval
    pieces. None when that makes more than ``max_pieces`` pieces.

        split_range_days(0, 3 * DAY - 60_000, 60_000, HOUR, until_ms=2 * DAY, max_pieces=100)
        -> [(0, DAY - 60_000), (DAY, 2 * DAY - 60_000), (2 * DAY, 2 * DAY + HOUR - 60_000), ...]
           (two day pieces, then 24 hour pieces)
    """
    _check(start_ms, end_ms, step_ms, interval_ms)
    if day_ms % interval_ms:
        raise ValueError(f"interval_ms {interval_ms} does not divide day_ms {day_ms}")
    last = _last_grid_point(start_ms, end_ms, step_ms)
    pieces: list[tuple[int, int]] = []
    t = start_ms
    while t <= last:
        if len(pieces) >= max_pieces:
            return None
        d = (t // day_ms) * day_ms
        if d + day_ms <= until_ms and t - step_ms < d:  # t is its day's first grid point
            day_last = first_grid_point_at_or_after(start_ms, step_ms, d + day_ms) - step_ms
            if day_last <= last:
                pieces.append((t, day_last))
                t = day_last + step_ms
                continue
        next_boundary = (t // interval_ms + 1) * interval_ms
        piece_end = min(last, first_grid_point_at_or_after(start_ms, step_ms, next_boundary) - step_ms)
        pieces.append((t, piece_end))
        t = piece_end + step_ms
    return pieces


def count_pieces(start_ms: int, end_ms: int, step_ms: int, interval_ms: int) -> int:
    """How many pieces :func:`split_range` returns, in O(1), without building them.

    The planner checks its piece budget with this before materialising a split.
    """
    _check(start_ms, end_ms, step_ms, interval_ms)
    last = _last_grid_point(start_ms, end_ms, step_ms)
    if step_ms >= interval_ms:
        # Consecutive grid points are at least one interval apart: one piece per grid point.
        return (last - start_ms) // step_ms + 1
    # Consecutive grid points are less than one interval apart, so every interval from the
    # first grid point's to the last one's holds a grid point.
    return last // interval_ms - start_ms // interval_ms + 1


def split_window(
    time_ms: int, offset_ms: int, range_ms: int, interval_ms: int, *, disjoint: bool = False
) -> list[tuple[int, int]]:
    """Cut the window of a range selector ``x[range] offset o`` evaluated at ``time_ms`` into
    adjacent sub-windows at epoch-aligned multiples of ``interval_ms`` (in sample time).

    Returns ``(eval_time_ms, sub_range_ms)`` pairs, oldest first: evaluating
    ``x[sub_range] offset o`` at ``eval_time_ms`` selects one sub-window. The outer edges are
    the query's own.

    ``disjoint=False``: adjacent sub-windows share their boundary instant. Under Prometheus
    2's closed windows ``[t-r, t]`` a sample exactly on a boundary is seen twice, under
    Prometheus 3's left-open ``(t-r, t]`` once; so this is exact only for idempotent
    recombinations (max of maxes, min of mins), whatever the backend's version.

        split_window(10_000_000, 0, 7_200_000, 3_600_000)
        -> [(3_600_000, 800_000), (7_200_000, 3_600_000), (10_000_000, 2_800_000)]

    ``disjoint=True`` (for Prometheus 2's closed windows, and sum/count): every sub-window
    but the oldest is 1 ms shorter, so it starts 1 ms after its older neighbour's end
    (timestamps are whole milliseconds): ``[w0, b1]``, ``[b1+1ms, b2]``, ..., ``[bn+1ms, w1]``
    partition ``[w0, w1]``, each sample in exactly one. A newest sub-window that would hold
    the single instant ``b+1ms`` (range 0, which PromQL rejects) is merged into its neighbour.

        split_window(10_000_000, 0, 7_200_000, 3_600_000, disjoint=True)
        -> [(3_600_000, 800_000), (7_200_000, 3_599_999), (10_000_000, 2_799_999)]
    """
    if range_ms <= 0 or interval_ms <= 0:
        raise ValueError("range_ms and interval_ms must be positive")
    if disjoint and interval_ms < 2:
        raise ValueError("disjoint sub-windows need interval_ms >= 2")
    w1 = time_ms - offset_ms
    w0 = w1 - range_ms
    first = (w0 // interval_ms + 1) * interval_ms  # first boundary strictly after w0
    points = [w0, *range(first, w1, interval_ms), w1]
    if disjoint and len(points) > 2 and w1 - points[-2] == 1:
        del points[-2]
    return [
        (b + offset_ms, b - a - (1 if disjoint and i > 0 else 0))
        for i, (a, b) in enumerate(itertools.pairwise(points))
    ]


def count_windows(
    time_ms: int, offset_ms: int, range_ms: int, interval_ms: int, *, disjoint: bool = False
) -> int:
    """``len(split_window(...))`` in O(1)."""
    w1 = time_ms - offset_ms
    w0 = w1 - range_ms
    first = (w0 // interval_ms + 1) * interval_ms
    n = 1 + max(0, -((first - w1) // interval_ms))  # boundaries in [first, w1)
    if disjoint and n > 1 and (w1 - 1) % interval_ms == 0:
        n -= 1  # the 1 ms newest sub-window is merged into its neighbour
    return n
