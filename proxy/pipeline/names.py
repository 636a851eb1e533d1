"""The metric names every store has, for resolving selectors without a fixed name
(`shardplanner/names.py`) in a hybrid fleet.

Names come from each backend's `/api/v1/label/__name__/values`, kept per tenant scope for
`planner.shard_values_ttl` and refreshed in the background after that (`discovery.py`: the
component shard-label values and series counts use too). A stale list is safe
only if a miss refreshes it: a name the query reads that no list has (or a regex that matches
none) makes the lists be fetched again, unless they are younger than MISS_REFRESH_S. A store
whose names cannot be listed fails the resolution (a 503 naming it): an incomplete list could
drop its series silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from ..backends import Backend
from ..backends.tenancy import NO_TENANT, Caller, Tenant
from ..errors import PromError
from .discovery import Discovered

MISS_REFRESH_S = 10.0
MAX_SCOPES = 256


class MetricNames:
    """Every store's metric names, per tenant scope: a user of `discovery.Discovered`."""

    def __init__(self, backends: Sequence[Backend], ttl_ms: int) -> None:
        self.backends = backends
        self.ttl_s = ttl_ms / 1000
        self._names: Discovered[Tenant, frozenset[str]] = Discovered(
            "metric_names", self._fetch, ttl_ms, max_entries=MAX_SCOPES)

    async def _list(self, backend: Backend, tenant: Tenant) -> list[str]:
        reply = await backend.request("GET", "/api/v1/label/__name__/values", timeout_s=10,
                                      endpoint="/api/v1/label/:name/values", caller=Caller(tenant))
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

    async def _fetch(self, tenant: Tenant) -> frozenset[str]:
        lists = await asyncio.gather(*(self._list(b, tenant) for b in self.backends))
        return frozenset(n for lst in lists for n in lst)

    async def known(self, tenant: Tenant = NO_TENANT, *, missed: bool = False) -> frozenset[str]:
        """Every store's metric names that `tenant` sees; `missed`: the last answer lacked a name the query reads
        (then lists older than MISS_REFRESH_S are fetched again). A failure to list them raises
        (a 503 naming the store) unless a list is held."""
        return await self._names.get(tenant, max_age_s=MISS_REFRESH_S if missed else None)
