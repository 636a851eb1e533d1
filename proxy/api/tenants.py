"""What a request sees: its tenant's query service and backends (`View`).

Auth off (the default): one view, every backend, the service `create_app` built. Auth on
(`auth.tenants`, proxy/config/auth.py): one view per tenant, built at start-up: a `QueryService` over
the tenant's backends (in the config's order; the first is the tenant's primary, for shard
values, relays and buildinfo) sharing the root service's store and admission. A request is
authenticated by the route wrapper (routing.py) and served by its tenant's view only: its
queries, the metadata fan-out and the relays reach no other backend. Backend URLs come from
the config alone; nothing in a request names one.

With auth on, the forwarded tenant headers (`tenancy.forward_headers`) are the tenant's
(`auth.tenants[].forward_headers`, proxy/backends/tenancy.py `pin`): a request sending one with
a value its tenant may not use is refused with a 403 (Prometheus-style JSON, naming the header,
never the value) before anything runs. The authenticated tenant is also noted on the query's
record for the operator page (proxy/observe/activity.py), which shows a tenant its own queries only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import Request

from ..backends import Backend
from ..backends.tenancy import NO_TENANT, Caller, HeaderNotAllowed, pin
from ..config import Config
from ..config.auth import AuthConfig
from ..errors import PromError
from ..observe.activity import QueryRecord
from ..observe.metrics import METRICS
from ..pipeline import QueryService
from .access_log import RECORD_STATE
from .auth import Authenticator, AuthFailure


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
        self.forward_names = tuple(config.tenancy.forward_headers)
        cfg: AuthConfig = config.auth
        self.pins = cfg.pins()
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
            view = self.by_tenant[self.auth.tenant_of(request.headers.get("authorization"))]
        except AuthFailure as exc:
            METRICS.auth_failures.labels(exc.reason).inc()
            raise PromError("unauthorized", exc.message, status=401,
                            headers={"WWW-Authenticate": self.auth.challenge}) from None
        record = record_of(request)
        if record is not None:
            record.tenant = view.tenant  # the operator page shows a tenant its own queries only
        if self.forward_names:
            try:
                pin(self.forward_names, request.headers, self.pins.get(view.tenant, {}))
            except HeaderNotAllowed as exc:
                raise PromError("forbidden", f"header {exc.name!r}: this value is not allowed for tenant "
                                f"{view.tenant!r} (auth.tenants[].forward_headers)", status=403) from None
        return view


def view_of(request: Request) -> View:
    """The view the route wrapper set for this request."""
    view: View = request.state.promaccel_view
    return view


# The request state's name of the caller the route wrapper made for every request.
CALLER_STATE = "promaccel_caller"


def record_of(request: Request) -> QueryRecord | None:
    """The query's record on the operator page (made by the access log middleware), if any."""
    record: QueryRecord | None = request.scope.get("state", {}).get(RECORD_STATE)
    return record


def caller_of(request: Request) -> Caller:
    """Who the backend calls made for this request are made for: its tenant (forwarded
    headers, cache scope) and its record; set by the route wrapper (routing.py)."""
    caller: Caller = request.scope.get("state", {}).get(CALLER_STATE, NO_CALLER)
    return caller


NO_CALLER = Caller(NO_TENANT)
