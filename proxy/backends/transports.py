"""Pooled HTTP clients to the backends: the only module that imports aiohttp and httpx.

One pooled client per backend (keep-alive, HTTP/1.1). aiohttp is the default transport and
httpx's own the fallback (`transport: httpx`). Plain Prometheus backends on `transport:
aiohttp` are called through aiohttp's own `ClientSession` (`DirectAiohttp`), without httpx's
request building on top; AMP backends keep httpx's API, over httpx-aiohttp's transport, since
its auth flow signs every request (`SigV4Auth`). Redirects are never followed by either.

Every call asks for identity encoding (loopback and in-cluster backends: compression costs
more CPU than it saves) and sends `backends[].basic_auth` as an Authorization header, whose
password is registered for log redaction.

A hostile or broken backend cannot make promaccel hold more than it means to (issue 26): a
body is never inflated (an answer with any Content-Encoding but identity is refused before its
body is read: a 2 MB gzip body once inflated to 5.3 GB on the event loop) and is read up to
`backends[].max_body_bytes` -- or the smaller limit a call names (`max_body_bytes=`: a series
count, a backend's buildinfo or config, answers of a few KB) --, counted as it streams in (a
Content-Length over it is refused before reading); past it the connection is dropped and the
call fails (`BackendFault`).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, AsyncGenerator, Generator, Mapping, Sequence

import aiohttp
import httpx

from ..config import BackendConfig
from .protocol import BackendFault, BackendReply
from .redaction import install_log_redaction, register_secret
from .sigv4 import SigV4Signer, signer_for

# What a failed connection raises, whichever transport made the call.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (httpx.TransportError, aiohttp.ClientError, OSError)


class SigV4Auth(httpx.Auth):
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


def default_headers(cfg: BackendConfig) -> dict[str, str]:
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


def make_client(cfg: BackendConfig) -> httpx.AsyncClient:
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
        auth = SigV4Auth(signer_for(cfg.name, cfg.region, cfg.service, cfg.profile))
        install_log_redaction()
    return httpx.AsyncClient(
        base_url=cfg.url,
        transport=transport,
        timeout=timeout,
        auth=auth,
        # Loopback and in-cluster backends: compression costs more CPU than it saves.
        headers=default_headers(cfg),
        trust_env=False,
        follow_redirects=False,  # httpx's default; explicit: a 3xx is an error (backend.py)
    )


def refuse_unasked(headers: Mapping[str, str], limit: int, per_call: bool = False) -> None:
    """Before a body is read: a Content-Encoding other than identity (promaccel asked for
    identity and never inflates) or a Content-Length over `limit` is a `BackendFault`."""
    encoding = (headers.get("content-encoding") or "").strip().lower()
    if encoding and encoding != "identity":
        shown = "".join(c for c in encoding[:40] if c.isprintable())
        raise BackendFault(f"sent Content-Encoding {shown} that was not asked for (promaccel asks for "
                           "identity and does not decompress)")
    length = (headers.get("content-length") or "").strip()
    if length.isdigit() and int(length) > limit:
        raise too_large(limit, per_call)


def too_large(limit: int, per_call: bool = False) -> BackendFault:
    if per_call:
        return BackendFault(f"sent a body larger than the {limit} bytes promaccel reads of this answer")
    return BackendFault(f"sent a body larger than backends[].max_body_bytes ({limit} bytes)")


def body_limit(cfg: BackendConfig, max_body_bytes: int | None) -> tuple[int, bool]:
    """The bytes a call reads at most: the call's own limit when it names a smaller one than
    `backends[].max_body_bytes`; and whether that limit is the call's."""
    if max_body_bytes is not None and max_body_bytes < cfg.max_body_bytes:
        return max(0, max_body_bytes), True
    return cfg.max_body_bytes, False


async def send_httpx(client: httpx.AsyncClient, cfg: BackendConfig, method: str, path: str,
                     params: Sequence[tuple[str, str]] | None, body: bytes | None,
                     headers: Mapping[str, str] | None, timeout_s: float | None,
                     max_body_bytes: int | None = None) -> BackendReply:
    """One request through `client` (made by `make_client`); no timeout: the client's own.
    The body is read raw (never decoded), at most `cfg.max_body_bytes` of it (or
    `max_body_bytes`, when smaller)."""
    kwargs: dict[str, Any] = {}
    if params:
        kwargs["params"] = list(params)
    if body is not None:
        kwargs["content"] = body
    if headers:
        kwargs["headers"] = dict(headers)
    if timeout_s is not None:
        kwargs["timeout"] = httpx.Timeout(timeout_s, connect=cfg.connect_timeout / 1000)
    limit, per_call = body_limit(cfg, max_body_bytes)
    async with client.stream(method, path, **kwargs) as resp:
        refuse_unasked(resp.headers, limit, per_call)
        buf = bytearray()
        async for chunk in resp.aiter_raw():  # as sent: httpx decodes only in aiter_bytes
            if len(buf) + len(chunk) > limit:
                raise too_large(limit, per_call)  # leaving the block closes the connection unread
            buf += chunk
        retry_after = resp.headers.get("retry-after")
        return BackendReply(
            status=resp.status_code,
            body=buf if len(buf) >= KEEP_BYTEARRAY_BYTES else bytes(buf),
            content_type=resp.headers.get("content-type", "application/json"),
            headers={"retry-after": retry_after} if retry_after is not None else {},
        )


def is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return True
    if isinstance(exc, httpx.ConnectTimeout):
        # httpx-aiohttp maps every aiohttp connection error to ConnectTimeout; a refused
        # connection is "unavailable", not a timeout.
        cause = exc.__cause__
        return cause is None or "Timeout" in type(cause).__name__
    return isinstance(exc, httpx.TimeoutException)


# A body of at least this many bytes is handed on as the bytearray it was read into.
KEEP_BYTEARRAY_BYTES = 1 << 20


async def read_body(resp: aiohttp.ClientResponse, limit: int, per_call: bool = False) -> bytes | bytearray:
    """The whole body, read into one growing buffer: aiohttp's own `read` keeps every chunk
    until it joins them, so a heavy answer (~15 MB for 6 h of 2,048 GPUs) was held twice at
    its end, for each call in flight (issue 15). A large body stays a bytearray (the decoder
    and the checks take either; a relay copies it to bytes); a small one becomes bytes.
    Past `limit` bytes: `BackendFault`, the rest unread."""
    buf = bytearray()
    async for chunk in resp.content.iter_any():  # raises as `read` does on a body cut short
        if len(buf) + len(chunk) > limit:
            raise too_large(limit, per_call)
        buf += chunk
    return buf if len(buf) >= KEEP_BYTEARRAY_BYTES else bytes(buf)


class DirectAiohttp:
    """aiohttp's ClientSession without httpx on top, for backends that need no request
    signing. Made on first use, in the running event loop (and again if that changed)."""

    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        self.base = cfg.url.rstrip("/")
        self._headers = default_headers(cfg)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.cfg.max_connections, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, headers=self._headers,
                auto_decompress=False,  # identity was asked for; anything else is refused
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, path: str, params: Sequence[tuple[str, str]] | None, body: bytes | None,
                      headers: Mapping[str, str] | None, timeout_s: float,
                      max_body_bytes: int | None = None) -> BackendReply:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self.cfg.connect_timeout / 1000)
        async with self.session().request(method, self.base + path, params=list(params) if params else None,
                                          data=body, headers=headers, timeout=timeout,
                                          allow_redirects=False) as resp:
            try:
                limit, per_call = body_limit(self.cfg, max_body_bytes)
                refuse_unasked(resp.headers, limit, per_call)
                content = await read_body(resp, limit, per_call)
            except BackendFault:
                resp.close()  # the connection, with the rest of the body, is not reused
                raise
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
