"""What a request sees: its tenant's query service and backends (`View`).

Auth off (the default): one view, every backend, the service `create_app` built. Auth on
(`auth.tenants`, proxy/auth.py): one view per tenant, built at start-up: a `QueryService` over
the tenant's backends (in the config's order; the first is the tenant's primary, for shard
values, relays and buildinfo) sharing the root service's store and admission. A request is
authenticated by the route wrapper (routing.py) and served by its tenant's view only: its
queries, the metadata fan-out and the relays reach no other backend. Backend URLs come from
the config alone; nothing in a request names one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import Request

from ..auth import AuthConfig, Authenticator, AuthFailure
from ..backends import Backend
from ..config import Config
from ..errors import PromError
from ..metrics import METRICS
from ..pipeline import QueryService


@dataclass(frozen=True)
class View:
    tenant: str  # "" when auth is off
    service: QueryService
    backends: Sequence[Backend]

    @property
    def primary(self) -> Backend:
        return self.backends[0]


class Views:
    """The views of the process and who a request is."""

    def __init__(self, config: Config, root: QueryService, backends: Sequence[Backend]) -> None:
        self.default = View("", root, backends)
        self.auth: Authenticator | None = None
        self.by_tenant: dict[str, View] = {}
        cfg: AuthConfig = config.auth
        if cfg.enabled:
            self.auth = Authenticator(cfg)
            for t in cfg.tenants:
                wanted = set(t.backends) if t.backends is not None else {b.name for b in backends}
                subset = [b for b in backends if b.name in wanted]
                self.by_tenant[t.name] = View(t.name, QueryService(config, subset, shared=root), subset)

    @property
    def services(self) -> list[QueryService]:
        return [v.service for v in self.by_tenant.values()]

    def of(self, request: Request) -> View:
        """The view of an authenticated request; a 401 (Prometheus-style JSON, with the
        challenge) when auth is on and its credentials are missing or wrong."""
        if self.auth is None:
            return self.default
        try:
            return self.by_tenant[self.auth.tenant_of(request.headers.get("authorization"))]
        except AuthFailure as exc:
            METRICS.auth_failures.labels(exc.reason).inc()
            raise PromError("unauthorized", exc.message, status=401,
                            headers={"WWW-Authenticate": self.auth.challenge}) from None


def view_of(request: Request) -> View:
    """The view the route wrapper set for this request."""
    view: View = request.state.promaccel_view
    return view
