"""The planner's data types (shardplanner/plan.py): a Span is a valid evaluation grid, and the
optional views requests and pieces give of it."""

from __future__ import annotations

import pytest

from shardplanner.plan import Piece, QueryRequest, Span


@pytest.mark.parametrize(("span", "points"), [
    # Prometheus 2.42 evaluates a range at start, start + step, ... while <= end
    # (promql/engine.go, rangeEval: numSteps := int((end-start)/interval) + 1).
    (Span.range(0, 3_600_000, 60_000), 61),
    (Span.range(0, 3_599_999, 60_000), 60),  # the last step would pass end
    (Span.range(5, 5, 1_000), 1),
    (Span.instant(5_000), 1),
])
def test_points(span: Span, points: int) -> None:
    assert span.points == points


@pytest.mark.parametrize(("start", "end", "step"), [
    (0, 1, None),  # an instant has one time
    (10, 0, 1_000),  # end before start
    (0, 10, 0),  # no step
    (0, 10, -5),
])
def test_bad_spans_are_refused(start: int, end: int, step: int | None) -> None:
    with pytest.raises(ValueError):
        Span(start, end, step)


def test_step_of_an_instant_is_an_error_and_bounds_keep_the_grid() -> None:
    with pytest.raises(ValueError):
        Span.instant(0).step  # noqa: B018 -- the property raises
    r = Span.range(0, 600_000, 60_000)
    assert r.step == 60_000 and r.with_bounds(120_000, 300_000) == Span(120_000, 300_000, 60_000)
    assert Span.instant(7).with_bounds(9, 9) == Span.instant(9)


def test_timed_views_say_none_where_they_do_not_apply() -> None:
    rng = QueryRequest.range("up", 0, 600_000, 60_000)
    assert (rng.is_range, rng.start_ms, rng.end_ms, rng.step_ms, rng.time_ms) == (True, 0, 600_000, 60_000, None)
    inst = Piece("up", Span.instant(42))
    assert (inst.is_range, inst.start_ms, inst.end_ms, inst.step_ms, inst.time_ms) == (False, None, None, None, 42)
    assert QueryRequest.instant("up", 1, lookback_ms=60_000).lookback_ms == 60_000
    assert QueryRequest.instant("up", 1).lookback_ms == 300_000  # Prometheus's default lookback delta (5m)
