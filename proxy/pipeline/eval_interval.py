"""A backend's `global.evaluation_interval`: the step of a subquery written without one.

`EvaluationIntervals.of(backend)` is the interval in ms, read once per backend from
`/api/v1/status/config` by the backend facts component (`backend_facts.py`: bounded reads,
the documented default of 1m when the backend does not say or cannot be asked, shared calls,
a retry after a failure). Kept as its own small interface for the cross-store evaluator.
"""

from __future__ import annotations

from ..backends import Backend
from .backend_facts import DEFAULT_EVALUATION_INTERVAL_MS, BackendFacts, evaluation_interval_ms

__all__ = ["DEFAULT_EVALUATION_INTERVAL_MS", "EvaluationIntervals", "evaluation_interval_ms"]


class EvaluationIntervals:
    """Evaluation intervals per backend, from `facts` (a component of its own when None)."""

    def __init__(self, facts: BackendFacts | None = None) -> None:
        self.facts = facts if facts is not None else BackendFacts()

    async def of(self, backend: Backend) -> int:
        return await self.facts.evaluation_interval_ms(backend)
