"""Client authentication and tenants (`auth:` in the config; off unless tenants are listed).

A client proves who it is the way Grafana's Prometheus data source can: a bearer token
(`Authorization: Bearer <token>`, a custom header in the data source) or HTTP basic auth
(`Authorization: Basic ...`, the data source's "Basic auth"). Each credential belongs to one
tenant; a tenant sees only its `backends` (proxy/api/tenants.py builds one query pipeline per
tenant over them) and its name is part of every cache and coalescing key
(proxy/backends/tenancy.py).

The tenants and their hashed secrets come from the config (proxy/config/auth.py). A presented
credential is hashed and compared with every stored digest with `hmac.compare_digest`.
Nothing here ever puts a presented or stored secret into a message.

A tenant's `forward_headers` pin the values of `tenancy.forward_headers` it forwards to the
backends (one value, or a list whose first is the default): with auth on, a client cannot
choose another tenant's `X-Scope-OrgID` (proxy/backends/tenancy.py `pin`; a value outside the
list is a 403).

The operator page (/ui, proxy/api/ui.py) asks `Authenticator.viewer_of`: the same credentials,
plus the admin token (`cache.admin_token`, which sees every tenant's records), and a tenant's
token or the admin token given as the *password* of basic auth (any user name), so that a
browser's own basic-auth prompt works for token holders too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass

from ..config.auth import AuthConfig

# RFC 6750 token68 characters; anything else cannot be a bearer token.
_TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# What `Authenticator.viewer_of` returns for the admin token (not a valid tenant name).
ADMIN = "(admin)"


class AuthFailure(Exception):
    """No or wrong credentials. `reason` (missing | invalid) is a /metrics label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class _Entry:
    tenant: str
    digest: bytes
    user: bytes = b""


class Authenticator:
    """Who an `Authorization` header is: `tenant_of(header)` gives the tenant's name or raises
    AuthFailure. Every stored digest is compared (constant time each), so the time taken does
    not depend on which entry matched."""

    def __init__(self, cfg: AuthConfig, admin_token: str | None = None) -> None:
        """`admin_token` (plain): also accepted by `viewer_of` (never by `tenant_of`)."""
        self.realm = cfg.realm
        self._tokens = [_Entry(t.name, bytes.fromhex(d)) for t in cfg.tenants for d in dict.fromkeys(t.token_digests())]
        self._basic = [_Entry(t.name, bytes.fromhex(u.digest()), u.user.encode()) for t in cfg.tenants for u in t.basic]
        self._viewer_tokens = self._tokens + ([_Entry(ADMIN, hashlib.sha256(admin_token.encode()).digest())]
                                              if admin_token else [])

    @property
    def challenge(self) -> str:
        return f'Bearer realm="{self.realm}", Basic realm="{self.realm}", charset="UTF-8"'

    def tenant_of(self, authorization: str | None) -> str:
        if not authorization:
            raise AuthFailure("missing", "authentication required: send 'Authorization: Bearer <token>' "
                              "or basic auth")
        scheme, _, rest = authorization.strip().partition(" ")
        rest = rest.strip()
        if scheme.lower() == "bearer" and rest:
            return self._bearer(rest)
        if scheme.lower() == "basic" and rest:
            return self._basic_auth(rest)
        raise AuthFailure("invalid", "unsupported Authorization scheme: use Bearer or Basic")

    def viewer_of(self, authorization: str | None) -> str:
        """Who may look at the operator page: a tenant's name (its credentials as for the API),
        ADMIN for the admin token, or AuthFailure. A token (a tenant's or the admin's) is also
        accepted as the password of basic auth under any user name: a browser's prompt."""
        if not authorization:
            raise AuthFailure("missing", "authentication required: send 'Authorization: Bearer <token>' "
                              "or basic auth (a token may be given as the password)")
        scheme, _, rest = authorization.strip().partition(" ")
        rest = rest.strip()
        if scheme.lower() == "bearer" and rest:
            return self._bearer(rest, self._viewer_tokens)
        if scheme.lower() == "basic" and rest:
            user, password = self._decode_basic(rest)
            as_user = self._match_basic(user, password)
            as_token = self._match_token(password, self._viewer_tokens) if _TOKEN68.fullmatch(password) else ""
            if as_user or as_token:
                return as_user or as_token
            raise AuthFailure("invalid", "invalid basic auth user or password")
        raise AuthFailure("invalid", "unsupported Authorization scheme: use Bearer or Basic")

    @staticmethod
    def _match_token(token: str, entries: list[_Entry]) -> str:
        digest = hashlib.sha256(token.encode()).digest()
        found = ""
        for e in entries:
            if hmac.compare_digest(digest, e.digest) and not found:
                found = e.tenant
        return found

    def _bearer(self, token: str, entries: list[_Entry] | None = None) -> str:
        if not _TOKEN68.fullmatch(token):
            raise AuthFailure("invalid", "invalid bearer token")
        found = self._match_token(token, self._tokens if entries is None else entries)
        if not found:
            raise AuthFailure("invalid", "invalid bearer token")
        return found

    @staticmethod
    def _decode_basic(encoded: str) -> tuple[str, str]:
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise AuthFailure("invalid", "malformed basic auth credentials") from None
        if not sep:
            raise AuthFailure("invalid", "malformed basic auth credentials")
        return user, password

    def _basic_auth(self, encoded: str) -> str:
        found = self._match_basic(*self._decode_basic(encoded))
        if not found:
            raise AuthFailure("invalid", "invalid basic auth user or password")
        return found

    def _match_basic(self, user: str, password: str) -> str:
        digest = hashlib.sha256(password.encode("utf-8")).digest()
        name = user.encode("utf-8")
        found = ""
        for e in self._basic:
            # Both compared for every entry: neither a wrong user nor a wrong password is faster.
            ok = hmac.compare_digest(name, e.user) & hmac.compare_digest(digest, e.digest)
            if ok and not found:
                found = e.tenant
        return found
