"""proxy/engine/work.py: the work budget of one in-process evaluation (a deadline, a bound on
work, a bound on series, a cancel flag). The bounds are promaccel's own (Prometheus 2.42's
nearest relative is engine.go's maxSamples, ErrTooManySamples, also counted as evaluation
goes); their errors are the engine's EvalLimit (execution, 422) and EvalCancelled (timeout,
503), see proxy/engine/errors.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from proxy.engine.errors import EvalCancelled, EvalLimit
from proxy.engine.windows import eval_range_function
from proxy.engine.work import WorkBudget
from proxy.result import QueryResult


def test_charges_add_up_and_the_bound_is_inclusive() -> None:
    budget = WorkBudget(max_work=100)
    budget.charge(60, "a")
    budget.charge(40, "b")  # exactly the bound: allowed (`used > max_work` refuses)
    assert budget.used == 100
    with pytest.raises(EvalLimit) as err:
        budget.charge(1, "sum(x)")
    assert (err.value.kind, err.value.status) == ("execution", 422)
    # The message names what was evaluated, the total so far and the setting to change.
    assert "sum(x)" in err.value.message and "101" in err.value.message
    assert "100: limits.max_eval_work" in err.value.message


def test_negative_or_fractional_units_are_never_a_credit() -> None:
    budget = WorkBudget(max_work=10)
    budget.charge(-1_000, "x")  # max(0, units): an estimate below zero counts as nothing
    assert budget.used == 0
    budget.charge(9.9, "x")  # type: ignore[arg-type]  # int() truncates
    assert budget.used == 9
    budget.charge(1, "x")
    with pytest.raises(EvalLimit):
        budget.charge(1, "x")


def test_zero_means_unbounded() -> None:
    budget = WorkBudget()
    budget.charge(10**15, "huge")
    budget.series(10**9, "wide")
    budget.check()
    assert budget.used == 10**15 and not budget.cancelled


def test_series_bound() -> None:
    budget = WorkBudget(max_series=3)
    budget.series(3, "x")  # at the bound: allowed
    with pytest.raises(EvalLimit, match=r"gives 4 series, more than a query may produce \(3: limits.max_eval_series\)"):
        budget.series(4, "x")
    assert budget.used == 0  # a series count is not work


def test_deadline_and_cancel() -> None:
    assert not WorkBudget(deadline=time.monotonic() + 60).cancelled
    WorkBudget(deadline=time.monotonic() + 60).check()
    late = WorkBudget(deadline=time.monotonic() - 0.001)
    with pytest.raises(EvalCancelled, match="deadline") as err:
        late.check()
    assert (err.value.kind, err.value.status) == ("timeout", 503) and isinstance(err.value, TimeoutError)
    assert late.cancelled  # a passed deadline stays passed: later checks fail at once
    stopped = WorkBudget()
    stopped.cancel()
    with pytest.raises(EvalCancelled, match="cancelled"):
        stopped.check()
    # charge() checks first: a cancelled query is not charged, even for no work at all.
    with pytest.raises(EvalCancelled):
        stopped.charge(0, "x")
    assert stopped.used == 0


def test_cancel_from_another_thread_stops_the_worker_at_its_next_check() -> None:
    budget = WorkBudget()
    started = threading.Event()
    outcome: list[object] = []

    def worker() -> None:
        try:
            for _ in range(100_000):  # bounded: ~100 s at most
                started.set()
                budget.check()
                time.sleep(0.001)
            outcome.append("finished")
        except EvalCancelled as exc:
            outcome.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(5)
    budget.cancel()
    thread.join(5)
    assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], EvalCancelled)


def test_a_range_function_over_the_bound_is_refused_before_its_kernel_runs() -> None:
    """The estimate needs only the input's shape, so a refused query leaves the budget as it
    was before the kernel, plus the refused charge (no partial evaluation is counted)."""
    per, n_series = 100, 4
    t = np.tile(np.arange(per, dtype=np.int64) * 10_000, n_series)
    raw = QueryResult("matrix", [{"i": str(i)} for i in range(n_series)],
                      np.arange(n_series + 1, dtype=np.int64) * per, t, np.ones(n_series * per), [], [])
    times = np.arange(60_000, per * 10_000, 10_000, dtype=np.int64)
    free = WorkBudget()
    eval_range_function("count_over_time", [], raw, times, 60_000, budget=free)
    needed = free.used
    assert needed > 0
    exact = WorkBudget(max_work=needed)
    out = eval_range_function("count_over_time", [], raw, times, 60_000, budget=exact)
    assert out.n_series == n_series and exact.used == needed
    short = WorkBudget(max_work=needed - 1)
    with pytest.raises(EvalLimit, match="count_over_time over a window of 60s"):
        eval_range_function("count_over_time", [], raw, times, 60_000, budget=short)
