"""One quantile (proxy/engine/quantile.py) for the `quantile` aggregation and
quantile_over_time, and one error tree (proxy/engine/errors.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proxy.engine.aggregate import evaluate_aggregation
from proxy.engine.binop import evaluate_binary
from proxy.engine.errors import DUP_LABELSET, DuplicateLabelset, EvalCancelled, EvalError, EvalLimit
from proxy.engine.functions import evaluate_call
from proxy.engine.local_ops import check_distinct
from proxy.engine.quantile import quantile
from proxy.engine.windows import eval_range_function
from proxy.engine.work import WorkBudget
from proxy.errors import PromError
from proxy.result import QueryResult
from shardplanner.promql import parse

T0 = 1_700_000_000_000


def _go_quantile(q: float, values: list[float]) -> float:
    """promql/quantile.go quantile() of v2.42, line by line, over values already sorted."""
    if len(values) == 0 or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    n = float(len(values))
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return values[int(lower)] * (1 - weight) + values[int(upper)] * weight


@pytest.mark.parametrize("q", [-0.5, 0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0, 1.5, math.nan])
@pytest.mark.parametrize("nans", [0, 1, 3])
def test_quantile_is_quantile_go(q: float, nans: int) -> None:
    rng = np.random.default_rng(7)
    values = np.sort(rng.normal(size=9))
    got = quantile(q, nans, values)
    want = _go_quantile(q, [math.nan] * nans + values.tolist())
    assert (math.isnan(got) and math.isnan(want)) or got == want
    assert math.isnan(quantile(0.5, 0, np.zeros(0)))  # no values: NaN, as quantile.go


@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.95, 1.0, -1.0, 2.0])
def test_aggregation_and_quantile_over_time_agree(q: float) -> None:
    """The same values, once as one window of a series and once as a group at one step, give
    the same quantile: both go through quantile()."""
    values = [3.5, -1.0, 7.25, 0.0, 2.0, 11.0, -4.5]
    t = [T0 - 60_000 + i * 5_000 for i in range(len(values))]
    window = QueryResult.from_series("matrix", [({"__name__": "x"}, t, values)])
    over_time = eval_range_function("quantile_over_time", [q], window, [T0], 60_000)
    group = QueryResult.from_series("vector", [({"i": str(i)}, [T0], [v]) for i, v in enumerate(values)])
    agg = evaluate_aggregation(parse(f"quantile({q}, x)"), group, q, [T0], False)  # type: ignore[arg-type]
    assert over_time.value.tolist() == agg.value.tolist() == [_go_quantile(q, sorted(values))]


def test_error_tree_maps_to_prometheus_error_types() -> None:
    assert issubclass(DuplicateLabelset, EvalError) and issubclass(EvalError, PromError)
    assert (EvalError("x").kind, EvalError("x").status) == ("execution", 422)
    assert (EvalLimit("x").kind, EvalLimit("x").status) == ("execution", 422)
    cancelled = EvalCancelled("deadline")
    assert isinstance(cancelled, TimeoutError) and (cancelled.kind, cancelled.status) == ("timeout", 503)
    with pytest.raises(EvalCancelled):
        budget = WorkBudget()
        budget.cancel()
        budget.check()
    with pytest.raises(EvalLimit, match="limits.max_eval_work"):
        WorkBudget(max_work=10).charge(11, "x")


def test_one_same_labelset_error_everywhere() -> None:
    """Binary operators, functions, range functions and unions raise the same error."""
    two = QueryResult.from_series("vector", [({"__name__": "a"}, [T0], [1.0]), ({"__name__": "b"}, [T0], [2.0])])
    raw = QueryResult.from_series("matrix", [({"__name__": "a"}, [T0], [1.0]), ({"__name__": "b"}, [T0], [2.0])])
    one = QueryResult.from_series("vector", [({}, [T0], [1.0])])
    raisers = [
        lambda: evaluate_binary(parse("x * 2"), two, 2.0),  # type: ignore[arg-type]
        lambda: evaluate_call(parse("abs(x)"), [two], [T0], False),  # type: ignore[arg-type]
        lambda: eval_range_function("sum_over_time", [], raw, [T0], 60_000),
        lambda: check_distinct([one, one]),
    ]
    for raise_it in raisers:
        with pytest.raises(DuplicateLabelset) as err:
            raise_it()
        assert err.value.message == DUP_LABELSET and err.value.status == 422
