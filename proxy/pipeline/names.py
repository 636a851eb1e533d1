"""The metric names every store has, for resolving selectors without a fixed name
(`shardplanner/names.py`) in a hybrid fleet.

Names come from each backend's `/api/v1/label/__name__/values`, kept per tenant scope for
`planner.shard_values_ttl` and refreshed in the background after that. A stale list is safe
only if a miss refreshes it: a name the query reads that no list has (or a regex that matches
none) makes the lists be fetched again, unless they are younger than MISS_REFRESH_S. A store
whose names cannot be listed fails the resolution (a 503 naming it): an incomplete list could
drop its series silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import orjson

from ..backends import Backend
from ..backends.tenancy import scope as tenant_scope
from ..errors import PromError

MISS_REFRESH_S = 10.0
MAX_SCOPES = 256


class MetricNames:
    def __init__(self, backends: Sequence[Backend], ttl_ms: int) -> None:
        self.backends = backends
        self.ttl_s = ttl_ms / 1000
        self._names: dict[str, tuple[float, frozenset[str]]] = {}
        self._inflight: dict[str, asyncio.Task[frozenset[str]]] = {}

    async def _list(self, backend: Backend) -> list[str]:
        reply = await backend.request("GET", "/api/v1/label/__name__/values", timeout_s=10,
                                      endpoint="/api/v1/label/:name/values")
        data = None
        if reply.ok:
            try:
                data = orjson.loads(reply.body).get("data")
            except (ValueError, AttributeError):
                data = None
        if not isinstance(data, list):
            raise PromError("unavailable", f"could not list the metric names of backend {backend.name!r} "
                            f"(HTTP {reply.status}), needed to route a selector without a fixed metric name")
        return [str(n) for n in data]

    async def _fetch(self, scope: str) -> frozenset[str]:
        lists = await asyncio.gather(*(self._list(b) for b in self.backends))
        names = frozenset(n for lst in lists for n in lst)
        self._names.pop(scope, None)
        self._names[scope] = (time.monotonic(), names)
        while len(self._names) > MAX_SCOPES:
            del self._names[next(iter(self._names))]
        return names

    async def _fetch_once(self, scope: str) -> frozenset[str]:
        task = self._inflight.get(scope)
        if task is None:
            task = asyncio.ensure_future(self._fetch(scope))  # inherits the tenant (contextvar)
            self._inflight[scope] = task
            task.add_done_callback(lambda _t: self._inflight.pop(scope, None))
        return await asyncio.shield(task)

    async def known(self, *, missed: bool = False) -> frozenset[str]:
        """Every store's metric names; `missed`: the last answer lacked a name the query reads."""
        scope = tenant_scope()
        entry = self._names.get(scope)
        now = time.monotonic()
        if entry is None or (missed and now - entry[0] > MISS_REFRESH_S):
            return await self._fetch_once(scope)
        if now - entry[0] > self.ttl_s and scope not in self._inflight:
            task = asyncio.ensure_future(self._fetch_once(scope))
            task.add_done_callback(lambda t: t.exception())  # a failed refresh keeps the old list
        return entry[1]
