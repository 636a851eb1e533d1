"""An AMP-compatible endpoint in front of a real Prometheus, for tests and the demo.

    python -m loadtests.amp_endpoint --upstream http://127.0.0.1:9090 --port 9095 \\
        [--region us-east-1] [--workspace ws-test] [--throttle-ratio 0.3] [--retry-after 1] \\
        [--latency-ms 50] [--error-ratio 0.1] [--error-status 503] [--seed 1]

What it does as Amazon Managed Service for Prometheus does:
- URL shape `/workspaces/<id>/api/v1/...`: query, query_range, series, labels,
  label/<name>/values, metadata (GET and POST). An unknown workspace is a 404, and so is
  `/api/v1/status/buildinfo` (AMP has none) and every other path.
- SigV4 verified for real: the signature is recomputed from the request as received (an
  implementation of its own, stdlib only, checked against AWS's published test vectors -
  independent of the requests-aws4auth signer promaccel uses). Checked: algorithm, access
  key, credential scope (date, region, service `aps`, terminator), x-amz-date within 5
  minutes, `host` among the signed headers, session token, and the payload hash of the body
  as received. Failures get AWS's 403 bodies (`{"message": ...}`, texts as AWS's front door
  words them) and `x-amzn-ErrorType` headers. The 404 texts are not AMP's verbatim.
- The query string is canonicalised strictly by RFC 3986: a raw `+` is a plus, not a space.
  A client that sends form-style `+` for spaces and signs them as spaces is rejected; one
  that percent-encodes (`%20`, `%2B`) is right under either reading.
- Fault injection, deterministic with --seed: a share of 429 ThrottlingException (with
  Retry-After), a share of 5xx, added latency. A decision depends on (seed, request, how many
  times this same request was seen), not on arrival order, so concurrent runs repeat exactly.

Credentials it accepts: AWS's documented example key (AKIDEXAMPLE /
wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY), or AMP_ENDPOINT_ACCESS_KEY_ID,
AMP_ENDPOINT_SECRET_ACCESS_KEY and AMP_ENDPOINT_SESSION_TOKEN from the environment.

`GET /__stats` reports what it served (by status, throttled, injected errors, rejections,
attempts per distinct request, parameter names forwarded); `POST /__reset` clears it.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import collections
import hashlib
import hmac
import logging
import os
import posixpath
import re
import socket
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence
from urllib.parse import quote, unquote_to_bytes

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

log = logging.getLogger("promaccel.amp_endpoint")

TEST_ACCESS_KEY = "AKIDEXAMPLE"
TEST_SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
MAX_SKEW_S = 300
ALGORITHM = "AWS4-HMAC-SHA256"
_UNRESERVED = "-_.~"
_API_PATHS = re.compile(r"^(query|query_range|series|labels|metadata|label/[^/]+/values)$")
_WORKSPACE_PATH = re.compile(r"^/workspaces/([^/]+)(/.*)?$")

SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your "
    "AWS Secret Access Key and signing method. Consult the service documentation for details."
)
INVALID_TOKEN = "The security token included in the request is invalid."


@dataclass(frozen=True)
class KnownCredential:
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # never print the secret
        return f"KnownCredential(token={'yes' if self.token else 'no'})"


def default_credentials() -> dict[str, KnownCredential]:
    ak = os.environ.get("AMP_ENDPOINT_ACCESS_KEY_ID")
    sk = os.environ.get("AMP_ENDPOINT_SECRET_ACCESS_KEY")
    if ak and sk:
        return {ak: KnownCredential(sk, os.environ.get("AMP_ENDPOINT_SESSION_TOKEN") or None)}
    return {TEST_ACCESS_KEY: KnownCredential(TEST_SECRET_KEY)}


@dataclass(frozen=True)
class AmpSettings:
    upstream: str
    region: str = "us-east-1"
    service: str = "aps"
    workspaces: tuple[str, ...] = ("ws-test",)
    credentials: Mapping[str, KnownCredential] = field(default_factory=default_credentials)
    throttle_ratio: float = 0.0
    retry_after_s: int | None = 1
    error_ratio: float = 0.0
    error_status: int = 503
    latency_ms: float = 0.0
    seed: int = 0
    # AMP answers instant queries that read 32 days or more with a 422 ("only supported for
    # range type queries"); range queries may read up to 95 days. 0: no such rule.
    instant_range_limit_ms: int = 32 * 86_400_000


# --- SigV4 verification ------------------------------------------------------------------


class AuthFailure(Exception):
    """A rejected request: AWS's status, x-amzn-ErrorType and message."""

    def __init__(self, error_type: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status


def _quote(raw: bytes) -> str:
    return quote(raw, safe=_UNRESERVED)


def canonical_uri(raw_path: str) -> str:
    """AWS's canonical URI for every service but S3: the path as sent, normalised (dot
    segments and repeated slashes removed) and URI-encoded once more."""
    if not raw_path:
        return "/"
    path = re.sub("/+", "/", posixpath.normpath(raw_path))
    if raw_path.endswith("/") and not path.endswith("/"):
        path += "/"
    return quote(path, safe="/~")


def canonical_query(raw_query: str) -> str:
    """Parameters percent-decoded (a raw `+` stays a plus), re-encoded by RFC 3986, sorted by
    encoded name then value."""
    pairs = []
    for part in raw_query.split("&") if raw_query else ():
        if not part:
            continue
        k, _, v = part.partition("=")
        pairs.append((_quote(unquote_to_bytes(k)), _quote(unquote_to_bytes(v))))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _parse_authorization(value: str) -> tuple[str, list[str], str]:
    if not value.startswith(ALGORITHM + " "):
        raise AuthFailure("IncompleteSignatureException",
                          f"Authorization header requires the '{ALGORITHM}' algorithm.")
    fields: dict[str, str] = {}
    for item in value[len(ALGORITHM) + 1:].split(","):
        k, sep, v = item.strip().partition("=")
        if sep:
            fields[k] = v
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if not fields.get(k)]
    if missing:
        raise AuthFailure("IncompleteSignatureException", " ".join(
            f"Authorization header requires '{k}' parameter." for k in missing))
    return fields["Credential"], fields["SignedHeaders"].split(";"), fields["Signature"]


def _amz_epoch(value: str) -> float:
    return float(calendar.timegm(time.strptime(value, "%Y%m%dT%H%M%SZ")))


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    k = hmac.new(("AWS4" + secret_key).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def verify_request(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    credentials: Mapping[str, KnownCredential],
    region: str,
    service: str,
    now: float | None = None,
    max_skew_s: float = MAX_SKEW_S,
) -> str:
    """Verify a header-signed SigV4 request as received; the access key, or AuthFailure."""
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for k, v in headers:
        by_name[k.lower()].append(v)
    authz = by_name.get("authorization")
    if not authz:
        raise AuthFailure("MissingAuthenticationTokenException", "Missing Authentication Token")
    credential, signed_headers, signature = _parse_authorization(authz[0])

    scope = credential.split("/")
    if len(scope) != 5:
        raise AuthFailure("IncompleteSignatureException",
                          "Credential must have exactly 5 slash-delimited elements, e.g. "
                          "keyid/date/region/service/term.")
    access_key, scope_date, scope_region, scope_service, terminator = scope
    cred = credentials.get(access_key)
    if cred is None:
        raise AuthFailure("UnrecognizedClientException", INVALID_TOKEN)
    if scope_region != region:
        raise AuthFailure("InvalidSignatureException", "Credential should be scoped to a valid region. ")
    if scope_service != service:
        raise AuthFailure("InvalidSignatureException",
                          f"Credential should be scoped to correct service: '{service}'. ")
    if terminator != "aws4_request":
        raise AuthFailure("InvalidSignatureException",
                          "Credential should be scoped with a valid terminator: 'aws4_request'. ")

    date_values = by_name.get("x-amz-date")
    if not date_values:
        raise AuthFailure("IncompleteSignatureException",
                          "Authorization header requires existence of either a 'X-Amz-Date' or a "
                          "'Date' header.")
    amz_date = date_values[0].strip()
    try:
        signed_at = _amz_epoch(amz_date)
    except ValueError:
        raise AuthFailure("IncompleteSignatureException",
                          f"Date must be in ISO-8601 'basic format'. Got '{amz_date}'.") from None
    if scope_date != amz_date[:8]:
        raise AuthFailure("InvalidSignatureException",
                          "Date in Credential scope does not match YYYYMMDD from ISO-8601 version "
                          f"of date from HTTP: '{scope_date}' != '{amz_date[:8]}', from '{amz_date}'.")
    now = time.time() if now is None else now
    fmt = "%Y%m%dT%H%M%SZ"
    if signed_at < now - max_skew_s:
        raise AuthFailure("InvalidSignatureException",
                          f"Signature expired: {amz_date} is now earlier than "
                          f"{time.strftime(fmt, time.gmtime(now - max_skew_s))} "
                          f"({time.strftime(fmt, time.gmtime(now))} - 5 min.)")
    if signed_at > now + max_skew_s:
        raise AuthFailure("InvalidSignatureException",
                          f"Signature not yet current: {amz_date} is still later than "
                          f"{time.strftime(fmt, time.gmtime(now + max_skew_s))} "
                          f"({time.strftime(fmt, time.gmtime(now))} + 5 min.)")
    if "host" not in signed_headers:
        raise AuthFailure("InvalidSignatureException",
                          "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.")

    token = by_name.get("x-amz-security-token", [None])[0]
    if cred.token is not None or token is not None:
        if token is None or cred.token is None or not hmac.compare_digest(token, cred.token):
            raise AuthFailure("UnrecognizedClientException", INVALID_TOKEN)

    canonical_headers = "".join(
        f"{h}:{','.join(' '.join(v.split()) for v in by_name.get(h, []))}\n" for h in signed_headers
    )
    canonical_request = "\n".join([
        method.upper(),
        canonical_uri(raw_path),
        canonical_query(raw_query),
        canonical_headers,
        ";".join(signed_headers),
        hashlib.sha256(body).hexdigest(),  # the body as received, whatever header claims
    ])
    string_to_sign = "\n".join([
        ALGORITHM, amz_date, f"{scope_date}/{region}/{service}/aws4_request",
        hashlib.sha256(canonical_request.encode()).hexdigest(),
    ])
    key = signing_key(cred.secret_key, scope_date, region, service)
    expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise AuthFailure("InvalidSignatureException", SIGNATURE_MISMATCH)
    return access_key


# --- the app -----------------------------------------------------------------------------


def _aws_error(status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"message": message}),
        status_code=status,
        media_type="application/json",
        headers={"x-amzn-ErrorType": error_type, "x-amzn-RequestId": str(uuid.uuid4()), **(headers or {})},
    )


_ERROR_BODIES = {
    500: ("InternalServerException", "Internal Server Error"),
    502: ("BadGatewayException", "Bad Gateway"),
    503: ("ServiceUnavailableException", "Service Unavailable"),
    504: ("GatewayTimeoutException", "Endpoint request timed out"),
}


class Stats:
    # Attempts are remembered for the most recent distinct requests only, so a long demo run
    # stays bounded; a retry comes back within seconds.
    MAX_REMEMBERED = 100_000

    def __init__(self) -> None:
        self.by_status: collections.Counter[int] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.params: collections.Counter[str] = collections.Counter()
        self._attempts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.distinct_requests = 0
        self.max_attempts = 0
        self.throttled = 0
        self.errors_injected = 0
        self.forwarded = 0

    def attempt(self, fingerprint: str) -> int:
        """Count one arrival of a request; how many times it has arrived, this one included."""
        n = self._attempts.pop(fingerprint, 0) + 1
        if n == 1:
            self.distinct_requests += 1
            if len(self._attempts) >= self.MAX_REMEMBERED:
                self._attempts.popitem(last=False)
        self._attempts[fingerprint] = n
        self.max_attempts = max(self.max_attempts, n)
        return n

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": sum(self.by_status.values()),
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "forwarded": self.forwarded,
            "throttled": self.throttled,
            "errors_injected": self.errors_injected,
            "rejected": dict(self.rejected),
            "distinct_requests": self.distinct_requests,
            "max_attempts": self.max_attempts,
            "params": dict(self.params),
        }


class AmpEndpoint:
    """The endpoint's state (settings, upstream client, stats) and its ASGI `app`."""

    def __init__(self, settings: AmpSettings, *, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Any = time.time) -> None:
        self.settings = settings
        self.stats = Stats()
        self._clock = clock
        self._client = httpx.AsyncClient(
            base_url=settings.upstream.rstrip("/"), transport=transport, timeout=120.0, trust_env=False
        )

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await self.aclose()

        self.app = Starlette(
            routes=[
                Route("/__stats", self._stats, methods=["GET"]),
                Route("/__reset", self._reset, methods=["POST"]),
                Route("/{path:path}", self._handle,
                      methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
            ],
            lifespan=lifespan,
        )
        self.app.state.amp = self

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _stats(self, request: Request) -> Response:
        return Response(orjson.dumps(self.stats.as_json()), media_type="application/json")

    async def _reset(self, request: Request) -> Response:
        self.stats = Stats()
        return Response(b"{}", media_type="application/json")

    def _draw(self, what: str, fingerprint: str, n: int) -> float:
        h = hashlib.sha256(f"{self.settings.seed}|{what}|{fingerprint}|{n}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64

    def _count(self, response: Response) -> Response:
        self.stats.by_status[response.status_code] += 1
        return response

    async def _handle(self, request: Request) -> Response:
        s = self.settings
        raw_path = (request.scope.get("raw_path") or request.scope["path"].encode()).split(b"?")[0].decode("latin-1")
        raw_query = request.scope.get("query_string", b"").decode("latin-1")
        body = await request.body()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            verify_request(request.method, raw_path, raw_query, headers, body, credentials=s.credentials,
                           region=s.region, service=s.service, now=self._clock())
        except AuthFailure as fail:
            self.stats.rejected[fail.error_type] += 1
            log.info("rejected %s %s: %s", request.method, request.scope["path"], fail.error_type)
            return self._count(_aws_error(fail.status, fail.error_type, fail.message))

        m = _WORKSPACE_PATH.match(request.scope["path"])
        if not m:
            return self._count(_aws_error(404, "NotFoundException", "Not Found"))
        workspace, rest = m.group(1), m.group(2) or ""
        if workspace not in s.workspaces:
            return self._count(_aws_error(404, "ResourceNotFoundException", f"Workspace {workspace} not found."))
        api = rest[len("/api/v1/"):] if rest.startswith("/api/v1/") else None
        if api is None or not _API_PATHS.match(api) or request.method not in ("GET", "POST"):
            # Includes /api/v1/status/buildinfo, which AMP does not serve.
            return self._count(_aws_error(404, "NotFoundException", "Not Found"))

        fingerprint = hashlib.sha256(
            b"\n".join([request.method.encode(), raw_path.encode(), canonical_query(raw_query).encode(), body])
        ).hexdigest()
        n = self.stats.attempt(fingerprint)
        if s.throttle_ratio > 0 and self._draw("throttle", fingerprint, n) < s.throttle_ratio:
            self.stats.throttled += 1
            extra = {"Retry-After": str(s.retry_after_s)} if s.retry_after_s is not None else {}
            return self._count(_aws_error(429, "ThrottlingException", "Rate exceeded", extra))
        if s.latency_ms > 0:
            await asyncio.sleep(s.latency_ms / 1000)
        if s.error_ratio > 0 and self._draw("error", fingerprint, n) < s.error_ratio:
            self.stats.errors_injected += 1
            error_type, message = _ERROR_BODIES.get(s.error_status, ("InternalServerException", "Internal Server Error"))
            return self._count(_aws_error(s.error_status, error_type, message))
        if api == "query" and s.instant_range_limit_ms and \
                _longest_read_ms(raw_query, body) >= s.instant_range_limit_ms:
            return self._count(Response(
                b'{"status":"error","errorType":"execution","error":"queries with long day range (32d to '
                b'95d) are currently only supported for range type queries"}',
                status_code=422, media_type="application/json"))
        return self._count(await self._forward(request.method, "/api/v1/" + api, raw_query, body,
                                               request.headers.get("content-type")))

    async def _forward(self, method: str, path: str, raw_query: str, body: bytes, content_type: str | None) -> Response:
        for name in _param_names(raw_query, body if content_type and content_type.startswith(
                "application/x-www-form-urlencoded") else b""):
            self.stats.params[name] += 1
        url = path + ("?" + raw_query if raw_query else "")
        headers = {"Content-Type": content_type} if content_type else {}
        try:
            resp = await self._client.request(method, url, content=body or None, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("upstream failed: %s", type(exc).__name__)
            return _aws_error(502, "BadGatewayException", "Bad Gateway")
        self.stats.forwarded += 1
        return Response(resp.content, status_code=resp.status_code,
                        headers={"Content-Type": resp.headers.get("content-type", "application/json")})


def _longest_read_ms(raw_query: str, body: bytes) -> int:
    """The longest range window or subquery span the `query` parameter reads (0 if none or
    unparsable)."""
    from urllib.parse import parse_qsl

    from shardplanner.ast import MatrixSel, Subquery, walk
    from shardplanner.promql import CannotParse, parse

    pairs = parse_qsl(raw_query) + parse_qsl(body.decode("utf-8", "replace"))
    query = next((v for k, v in pairs if k == "query"), "")
    try:
        expr = parse(query)
    except CannotParse:
        return 0
    return max((n.range_ms for n in walk(expr) if isinstance(n, MatrixSel | Subquery)), default=0)


def _param_names(raw_query: str, body: bytes) -> set[str]:
    names = set()
    for part in (raw_query.split("&") if raw_query else []) + (body.decode("latin-1").split("&") if body else []):
        if part:
            names.add(unquote_to_bytes(part.partition("=")[0].replace("+", " ")).decode("utf-8", "replace"))
    return names


def create_app(settings: AmpSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    return AmpEndpoint(settings, transport=transport).app


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port in a daemon thread; yields its
    base URL and stops it on exit."""
    import uvicorn

    import loadtests.load  # its free_port honours $PROMACCEL_TEST_PORTS (and the suite's port blocks)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, loadtests.load.free_port()))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("AMP endpoint did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.amp_endpoint", description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="Prometheus base URL to forward to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--workspace", action="append", help="workspace id (repeatable; default ws-test)")
    p.add_argument("--throttle-ratio", type=float, default=0.0, help="share of requests answered 429")
    p.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds on 429 (-1: none)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added to every forwarded request")
    p.add_argument("--error-ratio", type=float, default=0.0, help="share of requests answered 5xx")
    p.add_argument("--error-status", type=int, default=503, choices=sorted(_ERROR_BODIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instant-range-limit", default="32d",
                   help="instant queries reading this long or longer get AMP's 422 (0: off)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    a = p.parse_args(argv)
    for name in ("throttle_ratio", "error_ratio"):
        if not 0 <= getattr(a, name) <= 1:
            p.error(f"--{name.replace('_', '-')} must be between 0 and 1")
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from shardplanner.holdings import parse_duration_ms

    settings = AmpSettings(
        upstream=a.upstream, region=a.region, workspaces=tuple(a.workspace or ["ws-test"]),
        throttle_ratio=a.throttle_ratio, retry_after_s=None if a.retry_after < 0 else a.retry_after,
        latency_ms=a.latency_ms, error_ratio=a.error_ratio, error_status=a.error_status, seed=a.seed,
        instant_range_limit_ms=0 if a.instant_range_limit in ("0", "") else parse_duration_ms(a.instant_range_limit),
    )
    import uvicorn

    print(f"AMP endpoint on http://{a.host}:{a.port}/workspaces/{settings.workspaces[0]} "
          f"(region {a.region}) -> {a.upstream}", flush=True)
    uvicorn.run(create_app(settings), host=a.host, port=a.port, log_level=a.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
