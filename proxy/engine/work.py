"""The work budget of one query's in-process evaluation: a deadline, a bound on work, and a
cancel flag, checked between chunks by code that runs in a worker thread.

    budget = WorkBudget(deadline=time.monotonic() + 5, max_work=4_000_000_000)
    budget.charge(n_series * n_steps * per_window, "max_over_time(x[20h])")  # may refuse (422)
    for chunk in chunks:
        budget.check()  # past the deadline or cancelled: EvalCancelled
        ...

A unit of work is one sample visited by one evaluation step: a range function over a window
costs (series x steps x samples in a window); an operator or an aggregation costs its input
and output samples. On a 2-core machine the window kernels run at 1-2.5 ns a unit, so the
default `limits.max_eval_work` (4e9) is a few seconds of CPU. The bound is checked before a
kernel starts (the estimate needs only the input's shape), so a refused query costs nothing.

The evaluation runs in a thread, which asyncio cannot stop: when the query's deadline passes,
the awaiting coroutine gives up at once (the client gets its 503) and sets `cancel()`; the
thread stops at its next `check()`, a chunk later.
"""

from __future__ import annotations

import threading
import time

from proxy.engine.errors import EvalCancelled, EvalLimit

__all__ = ["EvalCancelled", "WorkBudget"]

class WorkBudget:
    def __init__(self, deadline: float | None = None, max_work: int = 0, max_series: int = 0) -> None:
        self.deadline = deadline  # time.monotonic() seconds; None: no deadline
        self.max_work = max_work  # 0: no bound
        self.max_series = max_series  # most series one evaluated node may produce; 0: no bound
        self.used = 0
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise EvalCancelled when the deadline has passed or the query was cancelled."""
        if self._cancelled.is_set():
            raise EvalCancelled("evaluation cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._cancelled.set()
            raise EvalCancelled("evaluation passed the query's deadline")

    def charge(self, units: int, what: str) -> None:
        """Count `units` of work for `what`; a 422 naming the limit when the query's total
        passes `limits.max_eval_work`."""
        self.check()
        self.used += max(0, int(units))
        if self.max_work and self.used > self.max_work:
            raise EvalLimit(
                f"evaluating {what} would take about {self.used:,} units of work (samples visited), more than "
                f"a query may use ({self.max_work:,}: limits.max_eval_work): narrow the time range, "
                "raise the step or shorten the window")

    def series(self, n: int, what: str) -> None:
        """A 422 naming `limits.max_eval_series` when one node's answer has more series."""
        if self.max_series and n > self.max_series:
            raise EvalLimit(
                f"evaluating {what} gives {n:,} series, more than a query may produce "
                f"({self.max_series:,}: limits.max_eval_series)")
