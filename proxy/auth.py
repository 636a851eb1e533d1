"""Client authentication and tenants (`auth:` in the config; off unless tenants are listed).

A client proves who it is the way Grafana's Prometheus data source can: a bearer token
(`Authorization: Bearer <token>`, a custom header in the data source) or HTTP basic auth
(`Authorization: Basic ...`, the data source's "Basic auth"). Each credential belongs to one
tenant; a tenant sees only its `backends` (proxy/api/tenants.py builds one query pipeline per
tenant over them) and its name is part of every cache and coalescing key
(proxy/backends/tenancy.py).

Secrets are kept hashed: the config holds SHA-256 hex digests (`tokens_sha256`,
`password_sha256`); tokens and passwords given in plain text through a file or an environment
variable are hashed when the config is loaded and the plain text is dropped. A presented
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
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Plain-text secrets shorter than this are refused: the digests are unsalted SHA-256, only as
# strong as the secret is long (generate them: `openssl rand -hex 24`).
MIN_SECRET_CHARS = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# RFC 6750 token68 characters; anything else cannot be a bearer token.
_TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# A pinned forwarded header value: visible ASCII and spaces, no control characters.
_HEADER_VALUE = re.compile(r"[\x20-\x7e]{1,1024}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
# What `Authenticator.viewer_of` returns for the admin token (not a valid tenant name).
ADMIN = "(admin)"


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _digest_list(values: list[str]) -> list[str]:
    out = []
    for v in values:
        d = v.strip().lower().removeprefix("sha256:")
        if not _HEX64.fullmatch(d):
            raise ValueError("expected SHA-256 hex digests (64 hex digits: printf %s \"$TOKEN\" | sha256sum)")
        out.append(d)
    return out


def _plain(secret: str, what: str) -> str:
    """A plain-text secret's digest; too short ones refused (the message never shows it)."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{what} is shorter than {MIN_SECRET_CHARS} characters")
    return sha256_hex(secret)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path!r}: {exc.strerror}") from None


def _env(name: str, what: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"{what}: environment variable {name} is not set")
    return value


class BasicUserConfig(_Strict):
    """One basic-auth user of a tenant: the password as a SHA-256 digest, or in plain text in
    a file (`password_file`, trailing newline stripped: a mounted secret) or an environment
    variable (`password_env`), hashed at load."""

    user: str = Field(min_length=1)
    password_sha256: str | None = None
    password_file: str | None = None
    password_env: str | None = None

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if ":" in v:
            raise ValueError("user must not contain ':' (basic auth separates it from the password)")
        return v

    @model_validator(mode="after")
    def _one(self) -> "BasicUserConfig":
        given = [x for x in (self.password_sha256, self.password_file, self.password_env) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of password_sha256, password_file and password_env")
        if self.password_sha256 is not None:
            _digest_list([self.password_sha256])
        self.digest()  # a clear error at start-up (unreadable file, unset variable, too short)
        return self

    def digest(self) -> str:
        if self.password_sha256 is not None:
            return _digest_list([self.password_sha256])[0]
        what = f"password of basic-auth user {self.user!r}"
        if self.password_file is not None:
            return _plain(_read(self.password_file, f"{what}: password_file").rstrip("\r\n"), what)
        assert self.password_env is not None
        return _plain(_env(self.password_env, what), what)


class TenantConfig(_Strict):
    """A tenant: its credentials and the backends it sees (names of `backends`; all of them
    when not given). Bearer tokens as SHA-256 digests (`tokens_sha256`), or in plain text in
    `tokens_file` (one per line; `#` comments, blank lines and `sha256:<hex>` digests allowed)
    or `tokens_env` (an environment variable holding tokens separated by spaces or commas),
    hashed at load."""

    name: str
    tokens_sha256: list[str] = Field(default_factory=list)
    tokens_file: str | None = None
    tokens_env: str | None = None
    basic: list[BasicUserConfig] = Field(default_factory=list)
    backends: list[str] | None = None
    # Header name (one of tenancy.forward_headers) -> the value(s) this tenant forwards: one
    # value (always sent), or a list the client may choose from with the header (the first
    # when it sends none). A header it has none for is never forwarded for it; a client value
    # outside them: 403.
    forward_headers: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"tenant name {v!r}: letters, digits, '_', '.', '-' (at most 63)")
        return v

    @field_validator("tokens_sha256")
    @classmethod
    def _tokens(cls, v: list[str]) -> list[str]:
        return _digest_list(v)

    @field_validator("forward_headers", mode="before")
    @classmethod
    def _forward(cls, v: object) -> object:
        if not isinstance(v, dict):
            return v  # pydantic says what is wrong
        out: dict[str, list[str]] = {}
        for name, values in v.items():
            low = str(name).strip().lower()
            if not _HEADER_NAME.fullmatch(low):
                raise ValueError(f"forward_headers: {name!r} is not an HTTP header name")
            if low in out:
                raise ValueError(f"forward_headers: {name!r} given twice")
            vals = [values] if isinstance(values, str) else values
            if not isinstance(vals, list) or not vals:
                raise ValueError(f"forward_headers: {name!r} needs a value or a non-empty list of values")
            for x in vals:
                if not isinstance(x, str) or not _HEADER_VALUE.fullmatch(x) or x != x.strip():
                    raise ValueError(f"forward_headers: a value of {name!r} is not a header value "
                                     "(1-1024 visible ASCII characters, no leading/trailing space)")
            out[low] = list(dict.fromkeys(vals))
        return out

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("a tenant needs at least one backend (leave backends out for all of them)")
        return v

    @model_validator(mode="after")
    def _credentials(self) -> "TenantConfig":
        if not self.token_digests() and not self.basic:
            raise ValueError(f"tenant {self.name!r} has no credentials (tokens or basic users)")
        return self

    def token_digests(self) -> list[str]:
        """Every token of the tenant as a digest (files and variables read now)."""
        out = list(self.tokens_sha256)
        what = f"a token of tenant {self.name!r}"
        if self.tokens_file is not None:
            for line in _read(self.tokens_file, f"tokens_file of tenant {self.name!r}").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                out.extend(_digest_list([line]) if line.startswith("sha256:") else [_plain(line, what)])
        if self.tokens_env is not None:
            out.extend(_plain(t, what) for t in re.split(r"[\s,]+", _env(self.tokens_env, what)) if t)
        return out


class AuthConfig(_Strict):
    """Authentication of clients; on when `tenants` is not empty. `realm` names promaccel in
    the `WWW-Authenticate` challenge of a 401."""

    tenants: list[TenantConfig] = Field(default_factory=list)
    realm: str = Field(default="promaccel", pattern=r"^[A-Za-z0-9 _.-]{1,64}$")

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def pins(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """Per tenant, the forwarded header values it may use (proxy/backends/tenancy.py)."""
        return {t.name: {h: tuple(v) for h, v in t.forward_headers.items()} for t in self.tenants}

    @model_validator(mode="after")
    def _unique(self) -> "AuthConfig":
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        users = [u.user for t in self.tenants for u in t.basic]
        if len(set(users)) != len(users):
            raise ValueError("a basic-auth user may belong to one tenant only")
        digests = [d for t in self.tenants for d in set(t.token_digests())]
        if len(set(digests)) != len(digests):
            raise ValueError("a token may belong to one tenant only")
        return self


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
