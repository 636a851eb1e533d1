"""What one query may cost: its backend calls and new cache entries, and the samples AMP
processed for it. Shared by every task of the query through context variables."""

from __future__ import annotations

import contextvars

from ..config import LimitsConfig
from ..errors import PromError
from .stage import Stage
from .values import Answer, Query


class Budget:
    """One query's allowance of backend calls (limits.max_backend_calls) and of new cache
    entries (limits.max_new_cache_keys); 0 means no limit."""

    def __init__(self, max_calls: int, max_keys: int) -> None:
        self.max_calls, self.max_keys = max_calls, max_keys
        self.calls = self.keys = 0

    def check(self, more: int) -> None:
        """422 if `more` calls would go over the limit (nothing is charged)."""
        if self.max_calls and self.calls + more > self.max_calls:
            raise PromError(
                "execution",
                f"this query needs more than {self.max_calls} backend calls "
                f"({self.calls} made, {more} more planned; limits.max_backend_calls): "
                "narrow the time range or simplify the query",
            )

    def charge(self) -> None:
        self.check(1)
        self.calls += 1

    def new_key(self) -> bool:
        """Whether one more new cache entry may be written."""
        if self.max_keys and self.keys >= self.max_keys:
            return False
        self.keys += 1
        return True


BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("promaccel_budget", default=None)
# Samples processed by AMP for the current query (a one-element list per query).
SAMPLES_TALLY: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("samples_tally", default=None)


class Admit:
    """Stage: this query's allowances and its tally of samples processed."""

    def __init__(self, limits: LimitsConfig, next: Stage[Query, Answer]) -> None:
        self.limits = limits
        self.next = next

    async def __call__(self, q: Query) -> Answer:
        tally = [0]
        SAMPLES_TALLY.set(tally)
        BUDGET.set(Budget(self.limits.max_backend_calls, self.limits.max_new_cache_keys))
        answer = await self.next(q)
        if tally[0]:
            answer.headers["X-Promaccel-Samples-Processed"] = str(tally[0])
        return answer
