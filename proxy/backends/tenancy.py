"""Tenancy: which client headers reach the backends, and the cache scope they make.

`tenancy.forward_headers` (proxy/config.py `TenancyConfig`) names the client headers passed
through to `kind: prometheus` backends (e.g. `X-Scope-OrgID` for Cortex/Mimir). The route
wrapper of the HTTP surface (proxy/api/routing.py) picks them out of each request with
`Tenancy.of` and sets them for the request with `use`: a `contextvars.ContextVar`, so every
backend call made on the request's behalf -- including tasks it spawns (pieces, shards,
puts, a shard-value refresh) -- carries them without the executor passing them around.
`Backend` (backend.py) reads `current()` when sending.

`scope()` is the cache and coalescing scope of the current request: "" when no forwarded
header is present (always, when none is configured) and auth is off, else a keyed BLAKE2b
hash of the authenticated tenant's name (`auth`, proxy/auth.py) and the forwarded names and
values (microseconds; cached). Cache keys, the single-flight keys and
the recent-call keys in proxy/pipeline/ include it, so two tenants never share an entry or
a backend call; the raw values are never stored.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

Forwarded = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Tenant:
    headers: Forwarded
    scope: str

    def __repr__(self) -> str:  # the headers may hold a credential
        return f"Tenant(scope={self.scope!r}, headers={[n for n, _ in self.headers]})"


NO_TENANT = Tenant((), "")
_CURRENT: contextvars.ContextVar[Tenant] = contextvars.ContextVar("promaccel_tenant", default=NO_TENANT)


class Tenancy:
    """The configured forwarded headers and the key of their hash."""

    def __init__(self, forward_headers: tuple[str, ...] | list[str] = (), key: bytes = b"promaccel-tenancy-v2") -> None:
        self.names = tuple(h.lower() for h in forward_headers)
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
        (hashed as a header with an empty name, which no real header has)."""
        picked = tuple((n, v) for n in self.names if (v := headers.get(n))) if self.names else ()
        if not picked and not tenant:
            return NO_TENANT
        keyed = (("", tenant), *picked) if tenant else picked
        return Tenant(picked, self._scope(keyed))


def current() -> Forwarded:
    """The headers to forward on backend calls made for the current request."""
    return _CURRENT.get().headers


def scope() -> str:
    """The current request's cache/coalescing scope ("" : no forwarded header)."""
    return _CURRENT.get().scope


def set_current(value: Tenant) -> contextvars.Token[Tenant]:
    return _CURRENT.set(value)


@contextlib.contextmanager
def use(value: Tenant) -> Iterator[None]:
    token = _CURRENT.set(value)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def snapshot() -> Tenant:
    """The current value, to run background work (revalidation) for the same tenant later."""
    return _CURRENT.get()
