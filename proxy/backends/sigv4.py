"""SigV4 signing of backend requests for Amazon Managed Service for Prometheus (service `aps`).

Transport-agnostic: `SigV4Signer.sign(method, url, headers, body)` returns the URL to send and
the headers to add; `transports.py` applies them in an `httpx.Auth`. The signature itself is
requests-aws4auth's `AWS4Auth`, fed a stand-in for the requests `PreparedRequest` it expects.

Encoding, which is where SigV4 against PromQL goes wrong:
- The query string is re-encoded strictly (RFC 3986: only `A-Za-z0-9-_.~` left bare, space as
  `%20`, `+` as `%2B`) before signing, so what is signed is byte-for-byte what is sent and no
  `+` is left for the server to read as either a space (form decoding) or a plus (RFC 3986)
  when it recomputes the signature.
- A POST form body is hashed exactly as sent (`x-amz-content-sha256`); httpx form-encodes a
  PromQL `+` as `%2B` and a space as `+`, which is what Prometheus decodes.

Credentials come from botocore's default chain (environment, shared credentials/config file
and profile, web identity / IRSA, container and instance metadata), resolved on first use.
Temporary credentials are botocore `RefreshableCredentials`, refreshed before they expire;
`needs_refresh()` tells an async caller when fetching them may block on I/O, so it can do that
in a thread. Secrets are registered with `redaction.py` and errors name the backend and the
kind of problem only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from requests.structures import CaseInsensitiveDict
from requests_aws4auth import AWS4Auth

from ..errors import PromError
from .redaction import redact, register_secret

DEFAULT_SERVICE = "aps"
# What AWS4Auth signs: host, content-type, date and every x-amz-* header (x-amz-date,
# x-amz-content-sha256, x-amz-security-token).
DEFAULT_SIGNED_HEADERS = frozenset({"host", "content-type", "date", "x-amz-*"})
_UNRESERVED = "-_.~"


# --- credentials -------------------------------------------------------------------------


@dataclass(frozen=True)
class Frozen:
    """One consistent snapshot of credentials (botocore's ReadOnlyCredentials, without the
    secret in its repr)."""

    access_key: str
    secret_key: str
    token: str | None

    def __repr__(self) -> str:
        return f"Frozen(access_key={self.access_key[:4]}..., token={'yes' if self.token else 'no'})"


class CredentialSource:
    """AWS credentials through botocore's default chain, or given botocore credentials.

    `profile` selects a shared-config profile (which may itself assume a role through
    `role_arn`/`source_profile` or `web_identity_token_file`); None means botocore's default
    (`$AWS_PROFILE` or the chain). Nothing is fetched until the first `frozen()` call."""

    def __init__(self, *, profile: str | None = None, credentials: Any = None, backend: str = "amp") -> None:
        self._profile = profile
        self._creds: Any = credentials
        self._backend = backend
        self._lock = threading.Lock()

    def needs_refresh(self) -> bool:
        """True when `frozen()` may do I/O (first resolution, or temporary credentials near
        their expiry): an async caller should then call it in a thread."""
        creds = self._creds
        if creds is None:
            return True
        refresh_needed = getattr(creds, "refresh_needed", None)
        return bool(refresh_needed is not None and refresh_needed())

    def _resolve(self) -> Any:
        with self._lock:
            if self._creds is None:
                import botocore.exceptions
                import botocore.session

                try:
                    session = botocore.session.Session(profile=self._profile)
                    self._creds = session.get_credentials()
                except botocore.exceptions.BotoCoreError as exc:
                    raise PromError(
                        "unavailable",
                        f"AWS credentials for backend {self._backend!r} could not be loaded "
                        f"({type(exc).__name__}: {redact(str(exc))})",
                    ) from None
                if self._creds is None:
                    where = f"profile {self._profile!r}" if self._profile else "the default profile"
                    raise PromError(
                        "unavailable",
                        f"no AWS credentials for backend {self._backend!r}: botocore's chain "
                        f"(environment, shared credentials and config files with {where}, web "
                        "identity, container and instance metadata) found none",
                    )
            return self._creds

    def frozen(self) -> Frozen:
        """Current credentials, refreshed first if they are about to expire (may block)."""
        creds = self._resolve()
        try:
            ro = creds.get_frozen_credentials()
        except Exception as exc:  # botocore refresh errors (STS, metadata) -> one error kind
            raise PromError(
                "unavailable",
                f"AWS credentials for backend {self._backend!r} could not be refreshed "
                f"({type(exc).__name__}: {redact(str(exc))})",
            ) from None
        if not ro.access_key or not ro.secret_key:
            raise PromError("unavailable", f"AWS credentials for backend {self._backend!r} are incomplete")
        register_secret(ro.secret_key)
        register_secret(ro.token)
        return Frozen(ro.access_key, ro.secret_key, ro.token or None)

    def __repr__(self) -> str:
        return f"CredentialSource(profile={self._profile!r})"


# --- signing -----------------------------------------------------------------------------


def strict_query(query: str) -> str:
    """Re-encode a form-style query string (as httpx writes it: `+` is a space) with RFC 3986
    percent-encoding, keeping the parameters' order: space -> %20, `+` -> %2B."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    return "&".join(f"{quote(k, safe=_UNRESERVED)}={quote(v, safe=_UNRESERVED)}" for k, v in pairs)


@dataclass(frozen=True)
class Signed:
    url: str
    headers: dict[str, str]

    def __repr__(self) -> str:  # the headers hold the signature and the session token
        return f"Signed(url={self.url!r}, headers={sorted(self.headers)})"


class _Prepared:
    """The part of a requests `PreparedRequest` that AWS4Auth reads and writes."""

    def __init__(self, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.method = method
        self.url = url
        self.headers: CaseInsensitiveDict[str] = CaseInsensitiveDict()
        for k, v in headers:
            self.headers[k] = v
        self.body = body


def amz_date(epoch_s: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_s))


class SigV4Signer:
    """Signs requests for one backend (region and service fixed, credentials refreshable)."""

    def __init__(
        self,
        region: str,
        service: str = DEFAULT_SERVICE,
        credentials: CredentialSource | None = None,
        *,
        signed_headers: Iterable[str] = DEFAULT_SIGNED_HEADERS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.region = region
        self.service = service
        self.credentials = credentials or CredentialSource()
        self._include = set(signed_headers)
        self._clock = clock
        self._auth: AWS4Auth | None = None
        self._auth_for: Frozen | None = None

    def needs_refresh(self) -> bool:
        return self.credentials.needs_refresh()

    def _aws4auth(self, creds: Frozen) -> AWS4Auth:
        # One AWS4Auth per credential set: it derives the signing key once per day and scope.
        if self._auth is None or self._auth_for != creds:
            self._auth = AWS4Auth(
                creds.access_key, creds.secret_key, self.region, self.service,
                session_token=creds.token, include_hdrs=set(self._include),
            )
            self._auth_for = creds
        return self._auth

    def sign(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]],
        body: bytes,
        creds: Frozen | None = None,
    ) -> Signed:
        """The URL to send (query re-encoded strictly) and the headers to set on the request:
        x-amz-date, x-amz-content-sha256, x-amz-security-token (temporary credentials) and
        Authorization. `headers` must hold the Host header that will be sent."""
        creds = creds or self.credentials.frozen()
        parts = urlsplit(url)
        url = urlunsplit(parts._replace(query=strict_query(parts.query)))
        items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        drop = {"authorization", "x-amz-date", "date", "x-amz-content-sha256", "x-amz-security-token"}
        items = [(k, v) for k, v in items if k.lower() not in drop]
        items.append(("x-amz-date", amz_date(self._clock())))
        req = _Prepared(method.upper(), url, items, body or b"")
        try:
            self._aws4auth(creds)(req)
        except Exception as exc:  # never let a message built from the request escape unredacted
            raise PromError("internal", f"SigV4 signing failed ({type(exc).__name__})") from None
        out = {
            "x-amz-date": req.headers["x-amz-date"],
            "x-amz-content-sha256": req.headers["x-amz-content-sha256"],
            "authorization": req.headers["Authorization"],
        }
        if creds.token:
            out["x-amz-security-token"] = creds.token
        return Signed(url, out)

    def __repr__(self) -> str:
        return f"SigV4Signer(region={self.region!r}, service={self.service!r})"


def signer_for(name: str, region: str, service: str = DEFAULT_SERVICE, profile: str | None = None) -> SigV4Signer:
    """The signer of one configured AMP backend (credentials from botocore's chain)."""
    return SigV4Signer(region, service, CredentialSource(profile=profile, backend=name))
