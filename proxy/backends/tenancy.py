"""Tenancy: which client headers reach the backends, and the cache scope they make.

`tenancy.forward_headers` (proxy/config.py `TenancyConfig`) names the client headers passed
through to `kind: prometheus` backends (e.g. `X-Scope-OrgID` for Cortex/Mimir). The route
wrapper of the HTTP surface (proxy/api/routing.py) picks them out of each request with
`Tenancy.of`; the request's `Caller` (its tenant and its activity record) is then carried
explicitly -- on the query's `RequestContext` (proxy/pipeline/context.py) down the query path,
as an argument elsewhere -- and every backend call made on the request's behalf is given it
(`Backend.request(caller=)`), which forwards `caller.tenant.headers`.

`Tenant.scope` is the cache and coalescing scope of a request: "" when no forwarded
header is present (always, when none is configured) and auth is off, else a keyed BLAKE2b
hash of the authenticated tenant's name (`auth`, proxy/config/auth.py) and the forwarded names and
values (microseconds; cached). Cache keys, the single-flight keys and
the recent-call keys in proxy/pipeline/ include it, so two tenants never share an entry or
a backend call; the raw values are never stored.

With auth on (proxy/config/auth.py, proxy/api/auth.py), the forwarded values are the tenant's, not the client's: each
tenant pins its values in the config (`auth.tenants[].forward_headers`: one value, or a list
of allowed ones whose first is the default). `pin` applies them: a header the client did not
send gets the tenant's default; one it sent must be among the tenant's values, else
`HeaderNotAllowed` (the route wrapper answers 403 before anything runs: proxy/api/tenants.py);
a header the tenant has no values for is never forwarded for it. So tenant A can never reach a
backend, a shard-value discovery or a cache key with tenant B's `X-Scope-OrgID`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..observe.activity import QueryRecord

Forwarded = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Tenant:
    headers: Forwarded
    scope: str

    def __repr__(self) -> str:  # the headers may hold a credential
        return f"Tenant(scope={self.scope!r}, headers={[n for n, _ in self.headers]})"


NO_TENANT = Tenant((), "")
# Per tenant: header name (lower case) -> the values it may forward, the first the default.
Pins = Mapping[str, Mapping[str, tuple[str, ...]]]


class HeaderNotAllowed(Exception):
    """A client sent a forwarded header with a value its tenant may not use (`name` only:
    the value may be anything, it is never put in a message)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def pin(names: tuple[str, ...], headers: Mapping[str, str], allowed: Mapping[str, tuple[str, ...]]) -> Forwarded:
    """The forwarded headers of an authenticated tenant's request: for each configured name,
    the client's value when it is one of `allowed[name]`, the first of them when the client
    sent none, nothing when the tenant has none; a client value outside them raises
    HeaderNotAllowed."""
    out = []
    for n in names:
        values = allowed.get(n, ())
        sent = headers.get(n)
        if sent:
            if sent not in values:
                raise HeaderNotAllowed(n)
            out.append((n, sent))
        elif values:
            out.append((n, values[0]))
    return tuple(out)


class Tenancy:
    """The configured forwarded headers and the key of their hash."""

    def __init__(self, forward_headers: tuple[str, ...] | list[str] = (), key: bytes = b"promaccel-tenancy-v2",
                 pins: Pins | None = None) -> None:
        self.names = tuple(h.lower() for h in forward_headers)
        # Auth on: every tenant's pinned values (a tenant missing here forwards nothing).
        self.pins = pins
        self._key = key[:64]
        self._scope = functools.lru_cache(maxsize=4096)(self._hash)

    def _hash(self, headers: Forwarded) -> str:
        h = hashlib.blake2b(key=self._key, digest_size=16, person=b"promaccel-tenant")
        for name, value in headers:
            h.update(name.encode("latin-1") + b"\0" + value.encode("utf-8", "surrogateescape") + b"\0\0")
        return "t2:" + h.hexdigest()

    def of(self, headers: Mapping[str, str], tenant: str = "") -> Tenant:
        """The forwarded headers of a request's headers (lower-case names, configured order),
        and its scope: of them and of `tenant`, the name of the tenant it authenticated as
        (hashed as a header with an empty name, which no real header has). With `pins` (auth
        on) and a tenant, its pinned values (`pin`); a value it may not send is dropped here
        (the route wrapper has already refused such a request with a 403)."""
        if tenant and self.pins is not None:
            allowed = self.pins.get(tenant, {})
            try:
                picked = pin(self.names, headers, allowed)
            except HeaderNotAllowed:
                picked = pin(self.names, {}, allowed)
        else:
            picked = tuple((n, v) for n in self.names if (v := headers.get(n))) if self.names else ()
        if not picked and not tenant:
            return NO_TENANT
        keyed = (("", tenant), *picked) if tenant else picked
        return Tenant(picked, self._scope(keyed))


@dataclass(frozen=True, eq=False)
class Caller:
    """Who a backend call is made for: the request's tenant (its forwarded headers go with the
    call) and its record on the operator page (the call is counted there), if any."""

    tenant: Tenant = NO_TENANT
    record: QueryRecord | None = None

    @property
    def scope(self) -> str:
        return self.tenant.scope


# Calls made for no request (readiness probes, the process's own discovery without a tenant).
NOBODY = Caller()
