"""The query service the HTTP surface talks to: the request path (`path.py`) for queries, plus
explain, cache administration and backend readiness."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardplanner.plan import QueryRequest

from ..backends import Backend
from ..backends.tenancy import NOBODY, Caller
from ..cache import PieceStore, make_store
from ..config import Config
from ..errors import PromError
from .context import RequestContext
from .explain import Explanation
from .path import Parts, build
from .revalidate import Revalidator
from .stage import Stage
from .values import ARROW_STREAM, Answer, Pairs, Query


@dataclass(frozen=True)
class Drained:
    """What a service's shutdown drained: background cache writes that landed and that were
    cancelled at the 2 s bound, fetch leases let go."""

    cache_writes_flushed: int = 0
    cache_writes_dropped: int = 0
    leases_released: int = 0

    def __add__(self, other: Drained) -> Drained:
        return Drained(self.cache_writes_flushed + other.cache_writes_flushed,
                       self.cache_writes_dropped + other.cache_writes_dropped,
                       self.leases_released + other.leases_released)


class QueryService:
    """The query path over `backends` (backends[0] the primary). With `shared` (auth: one
    service per tenant, over the tenant's backends), the store, admission and cache
    administration are `shared`'s: invalidation and generation bumps reach every service."""

    def __init__(self, config: Config, backends: list[Backend], shared: QueryService | None = None) -> None:
        self.config = config
        self.backends = backends
        self.primary = backends[0]
        # Route per piece when there is anything to choose: several backends, or one whose
        # holdings are declared (a metric it does not hold gets a clear 422).
        self.hybrid = len(backends) > 1 or any(b.cfg.holds is not None for b in backends)
        self._store: PieceStore | None = None
        self._ready_cache: dict[str, tuple[float, bool]] = {}
        self.root: QueryService = shared.root if shared is not None else self
        self.children: list[QueryService] = []
        self.drained = Drained()  # set by aclose
        self.run: Stage[Query, Answer]
        self.parts: Parts
        self.run, self.parts = build(config, backends, self.store,
                                     self.root.parts.admission if shared is not None else None,
                                     self.root.parts.answers if shared is not None else None,
                                     invalidate=self.invalidate,
                                     memo=self.root.parts.memo if shared is not None else None)
        if shared is not None:
            self.root.children.append(self)

    @property
    def revalidator(self) -> Revalidator | None:
        return self.parts.revalidator

    @property
    def cache_enabled(self) -> bool:
        return self.config.cache.enabled

    def store(self) -> PieceStore:
        if self.root is not self:
            return self.root.store()
        if self._store is None:
            self._store = make_store(self.config.cache)
        return self._store

    async def start(self) -> None:
        """Create the store and start background revalidation (inside the event loop)."""
        cc = self.config.cache
        if not cc.enabled:
            return
        self.store()
        if self.revalidator is not None:
            self.revalidator.start()

    async def aclose(self) -> None:
        """Shutdown, once the requests in flight are done: revalidation stopped, fetches nobody
        waits for any more cancelled, background cache writes given up to 2 s to land (then
        cancelled), fetch leases let go, the store closed. What it drained is counted in
        `self.drained` (the root's: with its children's, which close first); the CLI logs it."""
        writes = [t for t in self.parts.writer.tasks if not t.done()]
        leases = len(self.parts.leases.held)
        if self.revalidator is not None:
            await self.revalidator.aclose()
        self.parts.fetcher.flight.cancel_all()
        await self.parts.writer.aclose()
        await self.parts.leases.aclose()
        if self._store is not None:  # the root's only
            await self._store.aclose()
        flushed = sum(1 for t in writes if t.done() and not t.cancelled())
        self.drained = Drained(flushed, len(writes) - flushed, leases)
        for child in self.children:
            self.drained = self.drained + child.drained

    # --- queries ----------------------------------------------------------------------------

    async def query(self, req: QueryRequest, pairs: Pairs, headers: Mapping[str, str],
                    ctx: RequestContext, client: str = "") -> Answer:
        """An instant (req.time_ms) or range query; `pairs` are the client's parameters as
        sent, `ctx` what the request carries (its caller, allowances and deadline:
        `RequestContext.start`), `client` its address. Admission counts a client by its tenant
        (tenancy.forward_headers) when there is one, else by its address."""
        path = "/api/v1/query_range" if req.is_range else "/api/v1/query"
        q = Query(req=req, pairs=pairs, path=path, timeout_s=ctx.timeout_s, headers=headers,
                  client=ctx.scope or client, want_arrow=ARROW_STREAM in headers.get("accept", ""),
                  gzip="gzip" in headers.get("accept-encoding", ""), ctx=ctx)
        return await self.run(q)

    async def explain(self, req: QueryRequest, headers: Mapping[str, str] | None = None,
                      pairs: Sequence[tuple[str, str]] = (), caller: Caller = NOBODY) -> dict[str, Any]:
        """The plan of a query as the query path runs it -- by running the path (explain.py):
        its pieces, their cache status and route; for a hybrid fleet the route, and for a
        query evaluated across stores the tree (`cross_store`: the subqueries each backend
        answers, the operators promaccel evaluates above them). A query the path refuses for
        its route has `route.kind` "unroutable" and the reason."""
        explanation = Explanation(self.cache_enabled)
        ctx = replace(RequestContext.start(caller, self.config.limits), explain=explanation)
        path = "/api/v1/query_range" if req.is_range else "/api/v1/query"
        await self.run(Query(req=req, pairs=list(pairs), path=path, timeout_s=ctx.timeout_s, headers=headers or {},
                             client=caller.scope, ctx=ctx))
        return explanation.document()

    # --- cache administration -----------------------------------------------------------------

    def _family(self) -> list[QueryService]:
        return [self.root, *self.root.children]

    async def invalidate(self, metric_names: Sequence[str] | None, start_ms: int | None,
                         end_ms: int | None) -> int:
        if not self.cache_enabled:
            raise PromError("unavailable", "the cache is disabled (cache.enabled: false)")
        for s in self._family():
            s.parts.landing.forget_all()
            s.parts.reader.decoded.clear()
        self.root.parts.memo.clear()
        return await self.store().invalidate(metric_names, start_ms, end_ms)

    async def bump_generation(self) -> int:
        if not self.cache_enabled:
            raise PromError("unavailable", "the cache is disabled (cache.enabled: false)")
        for s in self._family():
            s.parts.landing.forget_all()
            s.parts.reader.decoded.clear()
            if s.revalidator is not None:
                s.revalidator.forget_all()
        self.root.parts.memo.clear()
        return await self.store().bump_generation()

    def cache_stats(self) -> dict[str, Any]:
        if not self.cache_enabled:
            return {"enabled": False}
        family = self._family()
        out: dict[str, Any] = {"enabled": True, **self.store().stats(),
                               "landing": sum(len(s.parts.landing.landing) for s in family),
                               "pending_tasks": sum(len(s.parts.writer.tasks) for s in family),
                               "split_interval_ms": self.parts.planner.settings.split_interval_ms}
        revalidators = [s.revalidator for s in family if s.revalidator is not None]
        if revalidators:
            stats: dict[str, int] = {}
            for r in revalidators:
                for k, v in r.stats.items():
                    stats[k] = stats.get(k, 0) + v
            out["revalidation"] = {"records": sum(len(r) for r in revalidators), **stats}
        return out

    async def health(self) -> dict[str, Any]:
        """The store (Redis: reachable, breaker) and each backend's readiness, for the operator
        page; names and kinds only, never URLs or credentials."""
        cache: dict[str, Any] = await self.store().health() if self.cache_enabled else {"kind": "disabled"}
        ready = await asyncio.gather(*(self.backend_ready(b) for b in self.backends))
        return {"cache": cache, "backends": [
            {"name": b.name, "kind": b.cfg.kind, "ready": ok, "primary": b is self.primary,
             "breaker": b.breaker.state}
            for b, ok in zip(self.backends, ready)]}

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
