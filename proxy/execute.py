"""Query execution: plan, fan out, merge, answer.

Pass-through when the planner leaves a query whole: the client's parameters go to the
backend unchanged and its answer (status and bytes) is relayed untouched.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from starlette.responses import Response

from .backend import Backend, BackendReply
from .config import Config
from .errors import PromError
from .forms import Pairs
from .params import InstantParams, RangeParams


def relay(reply: BackendReply, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=reply.body,
        status_code=reply.status,
        headers={"Content-Type": reply.content_type, **(headers or {})},
    )


class Executor:
    def __init__(self, config: Config, backends: list[Backend]) -> None:
        self.config = config
        self.backends = backends
        self.primary = backends[0]
        self._ready_cache: dict[str, tuple[float, bool]] = {}

    async def aclose(self) -> None:
        return None

    def _timeout_s(self, timeout_ms: int | None) -> float:
        limit = self.config.limits.query_timeout
        ms = min(timeout_ms, limit) if timeout_ms else limit
        return max(ms, 1) / 1000

    async def instant(self, p: InstantParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        reply = await self.primary.request(
            "POST", "/api/v1/query", form=pairs, timeout_s=self._timeout_s(p.timeout_ms),
            limited=True, endpoint="/api/v1/query",
        )
        return relay(reply, {"X-Promaccel-Pieces": "1"})

    async def range(self, p: RangeParams, pairs: Pairs, headers: Mapping[str, str]) -> Response:
        reply = await self.primary.request(
            "POST", "/api/v1/query_range", form=pairs, timeout_s=self._timeout_s(p.timeout_ms),
            limited=True, endpoint="/api/v1/query_range",
        )
        return relay(reply, {"X-Promaccel-Pieces": "1"})

    def explain_range(self, p: RangeParams) -> dict[str, Any]:
        return {"mode": "passthrough", "pieces": 1, "query": p.query}

    def explain_instant(self, p: InstantParams) -> dict[str, Any]:
        return {"mode": "passthrough", "pieces": 1, "query": p.query}

    async def backend_ready(self, backend: Backend) -> bool:
        now = time.monotonic()
        cached = self._ready_cache.get(backend.name)
        if cached and now - cached[0] < 2.0:
            return cached[1]
        try:
            if backend.cfg.kind == "prometheus":
                reply = await backend.request("GET", "/-/ready", timeout_s=3, endpoint="ready")
            else:
                reply = await backend.request(
                    "GET", "/api/v1/query", params=[("query", "vector(1)")], timeout_s=3, endpoint="ready"
                )
            ok = reply.ok
        except PromError:
            ok = False
        self._ready_cache[backend.name] = (now, ok)
        return ok
