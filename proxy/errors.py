"""One error type for the whole proxy; its kinds are Prometheus's `errorType` values.

    PromError                       (kind -> HTTP status, Prometheus-style JSON body)
     ├── kind "bad_data"      400   bad parameters, oversized bodies, unparsable times
     ├── kind "not_found"     404   unknown paths
     ├── kind "execution"     422   query limits (too many pieces/samples), planner refusals
     ├── kind "timeout"       503   the query's deadline passed
     ├── kind "canceled"      503
     ├── kind "unavailable"   503   no backend answered
     └── kind "internal"      500   a promaccel bug (never for bad input)

Errors from lower libraries (httpx, redis, pyarrow) are translated once, at the module that
imports them, with `raise PromError(...) from exc`. A backend's own error answer is not a
PromError: it is relayed as is (status and body), see `BackendReply`.
"""

from __future__ import annotations

import orjson

STATUS_BY_KIND: dict[str, int] = {
    "bad_data": 400,
    "not_found": 404,
    "execution": 422,
    "timeout": 503,
    "canceled": 503,
    "unavailable": 503,
    "internal": 500,
    "too_large": 413,
}


class PromError(Exception):
    def __init__(self, kind: str, message: str, *, status: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else STATUS_BY_KIND.get(kind, 500)
        self.headers = headers or {}  # e.g. Retry-After on a 429

    def body(self) -> bytes:
        # Prometheus's own field order: status, errorType, error.
        error_type = "bad_data" if self.kind == "too_large" else self.kind
        return orjson.dumps({"status": "error", "errorType": error_type, "error": self.message})

    def __repr__(self) -> str:
        return f"PromError({self.kind!r}, {self.message!r}, status={self.status})"


def bad_data(message: str) -> PromError:
    return PromError("bad_data", message)


def invalid_param(param: str, message: str) -> PromError:
    """Prometheus wraps parameter errors as: invalid parameter "start": <reason>."""
    return PromError("bad_data", f'invalid parameter "{param}": {message}')
