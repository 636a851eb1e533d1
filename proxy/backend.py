"""Backend calls: the only module that imports httpx.

One pooled `httpx.AsyncClient` per backend (keep-alive, HTTP/1.1) over a fast transport:
httpx's default transport managed 300-500 small requests/s on 2 cores where the aiohttp
transport of `httpx-aiohttp` managed 1,550-1,700 (DESIGN.md), so aiohttp is the default and
`transport: httpx` is the fallback.

Errors are translated here, once: connection failures -> PromError "unavailable" (503),
timeouts -> PromError "timeout" (503). A backend's own HTTP answer, error or not, is returned
as a `BackendReply` for the caller to relay (4xx/422 relayed as is).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import httpx

from .config import BackendConfig
from .errors import PromError
from .metrics import METRICS

RETRY_STATUSES = frozenset({502, 503, 504})


@dataclass
class BackendReply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


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
    return httpx.AsyncClient(
        base_url=cfg.url,
        transport=transport,
        timeout=timeout,
        # Loopback and in-cluster backends: compression costs more CPU than it saves.
        headers={"Accept-Encoding": "identity", "User-Agent": "promaccel"},
        trust_env=False,
    )


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, httpx.ConnectTimeout):
        # httpx-aiohttp maps every aiohttp connection error to ConnectTimeout; a refused
        # connection is "unavailable", not a timeout.
        cause = exc.__cause__
        return cause is None or "Timeout" in type(cause).__name__
    return isinstance(exc, httpx.TimeoutException)


class Backend:
    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._client = _make_client(cfg)
        self._sem = asyncio.Semaphore(cfg.max_parallel)

    async def aclose(self) -> None:
        await self._client.aclose()

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
        """One call with retries on connection errors and 502/503/504 (never on 4xx)."""
        attempts = self.cfg.retries + 1
        last_exc: PromError | None = None
        for attempt in range(attempts):
            if attempt:
                # Exponential backoff with full jitter: 50 ms, 100 ms, 200 ms ...
                await asyncio.sleep(random.uniform(0, 0.05 * (2 ** (attempt - 1))))
            try:
                reply = await self._once(method, path, params, form, headers, timeout_s, limited, endpoint)
            except PromError as exc:
                last_exc = exc
                if exc.kind == "timeout":
                    raise
                continue
            if reply.status in RETRY_STATUSES and attempt + 1 < attempts:
                METRICS.backend_retries.labels(self.name).inc()
                continue
            return reply
        assert last_exc is not None
        raise last_exc

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
        kwargs: dict[str, Any] = {}
        if params:
            kwargs["params"] = list(params)
        if form is not None:
            kwargs["content"] = httpx.QueryParams(list(form)).__str__().encode()
            hdrs = dict(headers or {})
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
            headers = hdrs
        if headers:
            kwargs["headers"] = dict(headers)
        if timeout_s is not None:
            kwargs["timeout"] = httpx.Timeout(timeout_s, connect=self.cfg.connect_timeout / 1000)
        t0 = time.perf_counter()
        try:
            if limited:
                async with self._sem:
                    resp = await self._client.request(method, path, **kwargs)
            else:
                resp = await self._client.request(method, path, **kwargs)
        except Exception as exc:  # translated once, here
            METRICS.backend_errors.labels(self.name, type(exc).__name__).inc()
            if _is_timeout(exc):
                raise PromError(
                    "timeout", f"backend {self.name!r} did not answer in time ({endpoint})"
                ) from exc
            if isinstance(exc, (httpx.TransportError, OSError)):
                raise PromError(
                    "unavailable",
                    f"backend {self.name!r} is unreachable ({type(exc).__name__})",
                ) from exc
            raise
        finally:
            METRICS.backend_latency.labels(self.name, endpoint).observe(time.perf_counter() - t0)
        METRICS.backend_calls.labels(self.name, endpoint, str(resp.status_code)).inc()
        return BackendReply(
            status=resp.status_code,
            body=resp.content,
            content_type=resp.headers.get("content-type", "application/json"),
        )
