"""Backend calls: the only module that talks HTTP to backends.

One pooled client per backend (keep-alive, HTTP/1.1). httpx's default transport managed
300-500 small requests/s on 2 cores where the aiohttp transport of `httpx-aiohttp` managed
1,550-1,700 (DESIGN.md), so aiohttp is the default and `transport: httpx` is the fallback.
Plain Prometheus backends on `transport: aiohttp` are called through aiohttp's own
`ClientSession`: httpx's request building on top of it cost 0.9 ms of CPU per call against
0.35 ms without it, measured against a local Prometheus, which is most of a tiny query's
added latency. AMP backends keep httpx's API (its auth flow signs every request).

Errors are translated here, once: connection failures -> PromError "unavailable" (503),
timeouts -> PromError "timeout" (503). A backend's own HTTP answer, error or not, is returned
as a `BackendReply` for the caller to relay (4xx/422 relayed as is) -- except a redirect:
redirects are never followed (a backend's 301 for a path with `..` once led a relay to
/debug/pprof), and a 3xx is PromError "unavailable" (502) naming the backend, never its URL.
Paths are checked before they go out (`check_path`): callers build them from fixed text and
validated parts only, and a dot segment or an encoded slash is refused here as well.

Backend credentials: `backends[].basic_auth` is sent as an Authorization header by both
transports (its password is registered for log redaction); a backend URL never holds
credentials (config refuses them). The client headers named in `tenancy.forward_headers`
(proxy/tenancy.py, set per request by the HTTP surface) are added to every call to a
`kind: prometheus` backend, never to AMP.

AMP backends (`kind: amp`): every request is SigV4-signed (`_SigV4Auth` over
`sigv4.SigV4Signer`), and AMP's throttling answers (429, and 503) are retried after
Retry-After plus exponential backoff with full jitter, at most `throttle_retries` times and
never past the call's deadline; when the budget or the deadline runs out, the 429/503 is
returned for the caller to relay.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import random
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Generator, Mapping, Sequence

import aiohttp
import httpx

from .config import BackendConfig
from .errors import PromError
from .metrics import METRICS
from .sigv4 import SigV4Signer, install_log_redaction, register_secret, signer_for
from .tenancy import current as forwarded_headers

RETRY_STATUSES = frozenset({502, 503, 504})
# AMP answers 429 (ThrottlingException) when a workspace's query rate is exceeded and 503
# when it sheds load; both mean "same request, later".
THROTTLE_STATUSES = frozenset({429, 503})
THROTTLE_BACKOFF_S = 0.1
THROTTLE_BACKOFF_CAP_S = 5.0


@dataclass
class BackendReply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class _SigV4Auth(httpx.Auth):
    """Signs each request as sent (after httpx has built its URL, headers and body)."""

    requires_request_body = True

    def __init__(self, signer: SigV4Signer) -> None:
        self.signer = signer

    def _apply(self, request: httpx.Request) -> None:
        signed = self.signer.sign(request.method, str(request.url), request.headers.multi_items(),
                                  request.content)
        request.url = httpx.URL(signed.url)
        request.headers.update(signed.headers)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self._apply(request)
        yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        await request.aread()
        if self.signer.needs_refresh():
            # First resolution or a refresh may call STS or instance metadata: not on the loop.
            await asyncio.to_thread(self.signer.credentials.frozen)
        self._apply(request)
        yield request


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After as seconds: delay-seconds or an HTTP-date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def check_path(path: str) -> None:
    """Refuse a backend path that could leave the endpoint it names: every caller builds its
    path from fixed text and validated parts, so this is a second line, and a bug if it fires."""
    lowered = path.lower()
    segments = urllib.parse.unquote(path).split("/")
    if (not path.startswith("/") or "?" in path or "#" in path or "\\" in path or "%2f" in lowered
            or "%5c" in lowered or "%25" in path or "." in segments or ".." in segments or "" in segments[1:]):
        raise PromError("internal", f"promaccel refused to send the backend path {path!r}")


def _default_headers(cfg: BackendConfig) -> dict[str, str]:
    """Headers on every call: identity encoding, our User-Agent, and basic auth if configured
    (its password and the header value are registered for log redaction)."""
    headers = {"Accept-Encoding": "identity", "User-Agent": "promaccel"}
    if cfg.basic_auth is not None:
        password = cfg.basic_auth.read_password()
        value = "Basic " + base64.b64encode(f"{cfg.basic_auth.username}:{password}".encode()).decode()
        register_secret(password)
        register_secret(value.split(" ", 1)[1])
        install_log_redaction()
        headers["Authorization"] = value
    return headers


def _make_client(cfg: BackendConfig) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=cfg.max_connections,
        max_keepalive_connections=cfg.max_keepalive,
        keepalive_expiry=30.0,
    )
    timeout = httpx.Timeout(cfg.timeout / 1000, connect=cfg.connect_timeout / 1000)
    transport: httpx.AsyncBaseTransport
    if cfg.transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits, trust_env=False)
    else:
        transport = httpx.AsyncHTTPTransport(limits=limits, http1=True, http2=False)
    auth: httpx.Auth | None = None
    if cfg.kind == "amp":
        assert cfg.region is not None  # config fills it from the workspace URL or fails
        auth = _SigV4Auth(signer_for(cfg.name, cfg.region, cfg.service, cfg.profile))
        install_log_redaction()
    return httpx.AsyncClient(
        base_url=cfg.url,
        transport=transport,
        timeout=timeout,
        auth=auth,
        # Loopback and in-cluster backends: compression costs more CPU than it saves.
        headers=_default_headers(cfg),
        trust_env=False,
        follow_redirects=False,  # httpx's default; explicit: a 3xx is an error (module docstring)
    )


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return True
    if isinstance(exc, httpx.ConnectTimeout):
        # httpx-aiohttp maps every aiohttp connection error to ConnectTimeout; a refused
        # connection is "unavailable", not a timeout.
        cause = exc.__cause__
        return cause is None or "Timeout" in type(cause).__name__
    return isinstance(exc, httpx.TimeoutException)


class _DirectAiohttp:
    """aiohttp's ClientSession without httpx on top, for backends that need no request
    signing. Made on first use, in the running event loop (and again if that changed)."""

    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        self.base = cfg.url.rstrip("/")
        self._headers = _default_headers(cfg)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.cfg.max_connections, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, headers=self._headers,
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, path: str, params: Sequence[tuple[str, str]] | None, body: bytes | None,
                      headers: Mapping[str, str] | None, timeout_s: float) -> BackendReply:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.cfg.connect_timeout / 1000)
        async with self.session().request(method, self.base + path, params=list(params) if params else None,
                                          data=body, headers=headers, timeout=timeout,
                                          allow_redirects=False) as resp:
            content = await resp.read()
            retry_after = resp.headers.get("retry-after")
            return BackendReply(
                status=resp.status,
                body=content,
                content_type=resp.headers.get("content-type", "application/json"),
                headers={"retry-after": retry_after} if retry_after is not None else {},
            )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            try:
                await self._session.close()
            except RuntimeError:  # its event loop is gone (a test's asyncio.run ended)
                pass
        self._session = None


class Backend:
    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._client = _make_client(cfg)
        self._direct = _DirectAiohttp(cfg) if cfg.transport == "aiohttp" and cfg.kind != "amp" else None
        self._sem = asyncio.Semaphore(cfg.max_parallel)
        # tenancy.forward_headers go to Prometheus-compatible backends only, never to AMP.
        self._forwards = cfg.kind != "amp"

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._direct is not None:
            await self._direct.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        form: Sequence[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        limited: bool = False,
        endpoint: str = "other",
    ) -> BackendReply:
        """One call with retries on connection errors and 502/503/504 (never on 4xx); for AMP,
        429/503 are retried on their own budget (`throttle_retries`) within the deadline."""
        check_path(path)
        throttle = self.cfg.kind == "amp"
        budget_s = timeout_s if timeout_s is not None else self.cfg.timeout / 1000
        deadline = time.monotonic() + budget_s
        attempt = 0
        throttled = 0
        call_timeout = timeout_s
        while True:
            try:
                reply = await self._once(method, path, params, form, headers, call_timeout, limited, endpoint)
            except PromError as exc:
                if exc.kind == "timeout" or attempt >= self.cfg.retries:
                    raise
            else:
                if 300 <= reply.status < 400:
                    raise PromError(
                        "unavailable", f"backend {self.name!r} answered {endpoint} with a redirect (HTTP "
                        f"{reply.status}); promaccel does not follow backend redirects", status=502)
                if throttle and reply.status in THROTTLE_STATUSES:
                    delay = self._throttle_delay(throttled, reply)
                    left = deadline - time.monotonic()
                    if throttled >= self.cfg.throttle_retries or delay >= left:
                        METRICS.backend_throttled.labels(self.name, str(reply.status), "gave_up").inc()
                        return reply
                    throttled += 1
                    METRICS.backend_throttled.labels(self.name, str(reply.status), "retried").inc()
                    METRICS.backend_retries.labels(self.name).inc()
                    METRICS.backend_throttle_wait.labels(self.name).inc(delay)
                    await asyncio.sleep(delay)
                    # The next try gets what is left of the deadline, not a fresh timeout.
                    call_timeout = max(0.001, deadline - time.monotonic())
                    continue
                if reply.status not in RETRY_STATUSES or attempt >= self.cfg.retries:
                    return reply
                METRICS.backend_retries.labels(self.name).inc()
            attempt += 1
            # Exponential backoff with full jitter: 50 ms, 100 ms, 200 ms ...
            await asyncio.sleep(random.uniform(0, 0.05 * (2 ** (attempt - 1))))

    @staticmethod
    def _throttle_delay(throttled: int, reply: BackendReply) -> float:
        """Retry-After (when given) plus full-jitter exponential backoff: the server's floor,
        spread so that pieces throttled together do not come back together."""
        backoff = random.uniform(0, min(THROTTLE_BACKOFF_CAP_S, THROTTLE_BACKOFF_S * 2 ** throttled))
        return (_retry_after_s(reply.headers.get("retry-after")) or 0.0) + backoff

    async def _once(
        self,
        method: str,
        path: str,
        params: Sequence[tuple[str, str]] | None,
        form: Sequence[tuple[str, str]] | None,
        headers: Mapping[str, str] | None,
        timeout_s: float | None,
        limited: bool,
        endpoint: str,
    ) -> BackendReply:
        body: bytes | None = None
        forwarded = forwarded_headers() if self._forwards else ()
        if form is not None or forwarded:
            hdrs = dict(headers or {})
            hdrs.update(forwarded)  # the client's tenancy.forward_headers (proxy/tenancy.py)
            if form is not None:
                body = urllib.parse.urlencode(list(form)).encode()
                hdrs["Content-Type"] = "application/x-www-form-urlencoded"
            headers = hdrs
        t0 = time.perf_counter()
        try:
            if limited:
                async with self._sem:
                    return await self._send(method, path, params, body, headers, timeout_s, endpoint)
            return await self._send(method, path, params, body, headers, timeout_s, endpoint)
        except Exception as exc:  # translated once, here
            METRICS.backend_errors.labels(self.name, type(exc).__name__).inc()
            if _is_timeout(exc):
                raise PromError(
                    "timeout", f"backend {self.name!r} did not answer in time ({endpoint})"
                ) from exc
            if isinstance(exc, (httpx.TransportError, aiohttp.ClientError, OSError)):
                raise PromError(
                    "unavailable",
                    f"backend {self.name!r} is unreachable ({type(exc).__name__})",
                ) from exc
            raise
        finally:
            METRICS.backend_latency.labels(self.name, endpoint).observe(time.perf_counter() - t0)

    async def _send(self, method: str, path: str, params: Sequence[tuple[str, str]] | None, body: bytes | None,
                    headers: Mapping[str, str] | None, timeout_s: float | None, endpoint: str) -> BackendReply:
        if self._direct is not None:
            reply = await self._direct.request(method, path, params, body, headers,
                                               timeout_s if timeout_s is not None else self.cfg.timeout / 1000)
        else:
            kwargs: dict[str, Any] = {}
            if params:
                kwargs["params"] = list(params)
            if body is not None:
                kwargs["content"] = body
            if headers:
                kwargs["headers"] = dict(headers)
            if timeout_s is not None:
                kwargs["timeout"] = httpx.Timeout(timeout_s, connect=self.cfg.connect_timeout / 1000)
            resp = await self._client.request(method, path, **kwargs)
            retry_after = resp.headers.get("retry-after")
            reply = BackendReply(
                status=resp.status_code,
                body=resp.content,
                content_type=resp.headers.get("content-type", "application/json"),
                headers={"retry-after": retry_after} if retry_after is not None else {},
            )
        METRICS.backend_calls.labels(self.name, endpoint, str(reply.status)).inc()
        return reply
