"""The `auth:` section of the config: tenants, their credentials and pinned headers.

Secrets are kept hashed: the config holds SHA-256 hex digests (`tokens_sha256`,
`password_sha256`); tokens and passwords given in plain text through a file or an environment
variable are hashed when the config is loaded and the plain text is dropped. Nothing here ever
puts a secret into a message. Checking a presented credential against these digests is the
api's business (proxy/api/auth.py).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from .base import StrictModel

# Plain-text secrets shorter than this are refused: the digests are unsalted SHA-256, only as
# strong as the secret is long (generate them: `openssl rand -hex 24`).
MIN_SECRET_CHARS = 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# A pinned forwarded header value: visible ASCII and spaces, no control characters.
_HEADER_VALUE = re.compile(r"[\x20-\x7e]{1,1024}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


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


class BasicUserConfig(StrictModel):
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


class TenantConfig(StrictModel):
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


class AuthConfig(StrictModel):
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
