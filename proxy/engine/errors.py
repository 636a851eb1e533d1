"""The engine's errors: one tree under `proxy.errors.PromError`, whose kind is Prometheus's
`errorType` and gives the HTTP status (proxy/errors.py STATUS_BY_KIND).

    PromError
     ├── EvalError              "execution" 422  Prometheus refuses to evaluate the expression;
     │    │                                      the message is its own text (engine.go,
     │    │                                      functions.go), so the client sees what the
     │    │                                      backend would have said
     │    └── DuplicateLabelset "execution" 422  rangeEval's "vector cannot contain metrics
     │                                           with the same labelset" (one text, one class)
     ├── EvalLimit              "execution" 422  a promaccel bound, not Prometheus's
     │                                           (limits.max_eval_work, max_eval_series,
     │                                           max_points of a subquery's grid,
     │                                           max_window_samples); names the limit
     └── EvalCancelled          "timeout"   503  the query's deadline passed, or it was
                                                 cancelled, while a kernel ran; also a
                                                 TimeoutError, so `asyncio.timeout` callers
                                                 treat both alike

A misuse of a kernel by promaccel's own code (a wrong argument type) is a ValueError or
TypeError, never one of these: it is a bug, and answers 500.
"""

from __future__ import annotations

from proxy.errors import PromError

__all__ = ["DUP_LABELSET", "DuplicateLabelset", "EvalCancelled", "EvalError", "EvalLimit"]

DUP_LABELSET = "vector cannot contain metrics with the same labelset"


class EvalError(PromError):
    """Prometheus refused to evaluate the expression; `message` is its error text."""

    def __init__(self, message: str) -> None:
        super().__init__("execution", message)


class DuplicateLabelset(EvalError):
    """One output label set twice at one step (engine.go rangeEval, and funcs that check it)."""

    def __init__(self) -> None:
        super().__init__(DUP_LABELSET)


class EvalLimit(PromError):
    """A query over one of promaccel's evaluation bounds; the message names the limit."""

    def __init__(self, message: str) -> None:
        super().__init__("execution", message)


class EvalCancelled(PromError, TimeoutError):
    """The query's deadline passed, or its request was cancelled, during evaluation."""

    def __init__(self, message: str) -> None:
        PromError.__init__(self, "timeout", message)
