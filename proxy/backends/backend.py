"""`Backend`: one configured backend, the object the rest of promaccel calls.

`Backend.request` checks the path, adds the forwarded tenant headers (`tenancy.py`; to
`kind: prometheus` backends only, never to AMP), encodes a form body, holds the backend's
semaphore for `limited` calls, sends through the backend's transport (`transports.py`), and
retries and hedges (`retries.py`), behind the backend's circuit breaker (`circuit.py`).

Errors are translated here, once: connection failures -> PromError "unavailable" (503),
timeouts -> PromError "timeout" (503). A backend's own HTTP answer, error or not, is returned
as a `BackendReply` for the caller to relay (4xx/422 relayed as is), except a redirect, which
is PromError "unavailable" (502). An answer promaccel refuses to read (a body over
`backends[].max_body_bytes` or over the call's own `max_body_bytes`, a Content-Encoding it did not ask for: `BackendFault`) is the
backend's failure, not retried, and PromError "unavailable" (502) naming the backend.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Callable, Mapping, Sequence

from ..config import BackendConfig
from ..errors import PromError
from ..observe import tracing
from ..observe.activity import ACTIVITY
from ..observe.metrics import METRICS
from .circuit import BackendBreaker, LatencyWindow
from .protocol import BackendFault, BackendReply, check_path, parsed_json, sane_error
from .retries import Check, Hedge, RetryBudget, with_retries
from .tenancy import NOBODY, Caller
from .transports import CONNECTION_ERRORS, DirectAiohttp, is_timeout, make_client, send_httpx


class Backend:
    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._client = make_client(cfg)
        self._direct = DirectAiohttp(cfg) if cfg.transport == "aiohttp" and cfg.kind != "amp" else None
        self._sem = asyncio.Semaphore(cfg.max_parallel)
        self.retry_budget = RetryBudget(cfg.retry_ratio, cfg.retry_floor)
        self.breaker = BackendBreaker(cfg.name, cfg.breaker.failures, cfg.breaker.cooldown)
        self.latency = LatencyWindow()  # answered calls, for hedge_after: p95
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
        check: Check | None = None,
        extra_call: Callable[[], bool] | None = None,
        max_body_bytes: int | None = None,
        caller: Caller = NOBODY,
    ) -> BackendReply:
        """One call, made for `caller` (its tenant's forwarded headers go with it), with retries on connection errors and 502/503/504 (never on 4xx), and on a
        200 whose body `check` finds broken; for AMP, 429/503 are retried on their own budget
        (`throttle_retries`) within the deadline. With `hedge_after` a slow try is hedged when
        `extra_call()` (the query's call budget) and the retry budget allow. While the circuit
        breaker is open, fails at once (PromError "unavailable", 503, naming the backend).
        `max_body_bytes`: the most of the answer this call reads, when smaller than
        `backends[].max_body_bytes` (a small answer expected: a larger one is cut as it
        streams in, never read whole, and refused like an oversized one)."""
        check_path(path)
        probe = self.breaker.admit()

        async def attempt(call_timeout: float | None, sent: asyncio.Event | None) -> BackendReply:
            return await self._once(method, path, params, form, headers, call_timeout, limited, endpoint, sent,
                                    max_body_bytes, caller)

        hedge = None
        if self.cfg.hedge_after is not None:
            def allow() -> bool:
                return (extra_call is None or extra_call()) and self.retry_budget.spend()

            hedge = Hedge(self._hedge_delay, allow)
        try:
            reply = await with_retries(attempt, self.cfg, endpoint, timeout_s, self.retry_budget, check, hedge)
        except PromError as exc:
            self.breaker.settle_error(exc, probe)  # counts only faults the backend caused
            raise
        except BackendFault as fault:  # the same answer would come again: not retried
            message = f"backend {self.name!r} {fault.why} ({endpoint}); promaccel refused its answer"
            self.breaker.failure(message, probe)
            raise PromError("unavailable", message, status=502) from None
        except BaseException:  # cancelled: no outcome
            self.breaker.release(probe)
            raise
        self.breaker.settle_reply(reply, endpoint, probe)  # a query's own timeout: no outcome
        return reply

    def _hedge_delay(self) -> float | None:
        after = self.cfg.hedge_after
        if after == "p95":
            return self.latency.p95()
        return None if after is None else after / 1000

    async def request_sound(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        form: Sequence[tuple[str, str]] | None = None,
        endpoint: str = "other",
        timeout_s: float | None = None,
        caller: Caller = NOBODY,
    ) -> BackendReply:
        """`request`, with a reply a client may be given: an error as Prometheus-style JSON
        (an HTML page or any other body becomes one naming the backend), a 200 only with a
        complete JSON body (`parsed` holds it) -- else asked again, then a 502."""
        reply = await self.request(method, path, params=params, form=form, endpoint=endpoint, timeout_s=timeout_s,
                                   check=_complete_json_check, caller=caller)
        return reply if reply.ok else sane_error(reply, self.name, endpoint)

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
        sent: asyncio.Event | None = None,
        max_body_bytes: int | None = None,
        caller: Caller = NOBODY,
    ) -> BackendReply:
        body: bytes | None = None
        forwarded = caller.tenant.headers if self._forwards else ()
        if form is not None or forwarded:
            hdrs = dict(headers or {})
            hdrs.update(forwarded)  # the client's tenancy.forward_headers (tenancy.py)
            if form is not None:
                body = urllib.parse.urlencode(list(form)).encode()
                hdrs["Content-Type"] = "application/x-www-form-urlencoded"
            headers = hdrs
        t0 = time.perf_counter()
        reply: BackendReply | None = None
        try:
            # One span per call (each retry its own): the backend's name, kind and endpoint (a
            # fixed vocabulary), never its URL or a header; the time waiting for a slot counts.
            with tracing.span(f"backend {endpoint}", {"promaccel.backend": self.name, "promaccel.backend_kind":
                                                      self.cfg.kind, "promaccel.endpoint": endpoint}) as s:
                if limited:
                    async with self._sem:
                        reply = await self._timed(method, path, params, body, headers, timeout_s, endpoint, sent,
                                                  max_body_bytes)
                else:
                    reply = await self._timed(method, path, params, body, headers, timeout_s, endpoint, sent,
                                              max_body_bytes)
                tracing.set_attrs(s, {"http.response.status_code": reply.status, "promaccel.bytes": len(reply.body)})
            return reply
        except Exception as exc:  # translated once, here
            METRICS.backend_errors.labels(self.name, type(exc).__name__).inc()
            ACTIVITY.backend_call(self.name, endpoint, time.perf_counter() - t0, None, type(exc).__name__,
                                  record=caller.record)
            if is_timeout(exc):
                raise PromError(
                    "timeout", f"backend {self.name!r} did not answer in time ({endpoint})"
                ) from exc
            if isinstance(exc, CONNECTION_ERRORS):
                raise PromError(
                    "unavailable",
                    f"backend {self.name!r} is unreachable ({type(exc).__name__})",
                ) from exc
            raise
        finally:
            elapsed = time.perf_counter() - t0
            METRICS.backend_latency.labels(self.name, endpoint).observe(elapsed)
            if reply is not None:
                ACTIVITY.backend_call(self.name, endpoint, elapsed, reply.status, record=caller.record)

    async def _timed(self, method: str, path: str, params: Sequence[tuple[str, str]] | None, body: bytes | None,
                     headers: Mapping[str, str] | None, timeout_s: float | None, endpoint: str,
                     sent: asyncio.Event | None, max_body_bytes: int | None = None) -> BackendReply:
        """`_send`, its time from the moment it is on its way kept when answered (hedging)."""
        if sent is not None:
            sent.set()
        t0 = time.perf_counter()
        reply = await self._send(method, path, params, body, headers, timeout_s, endpoint, max_body_bytes)
        if reply.ok:
            self.latency.add(time.perf_counter() - t0)
        return reply

    async def _send(self, method: str, path: str, params: Sequence[tuple[str, str]] | None, body: bytes | None,
                    headers: Mapping[str, str] | None, timeout_s: float | None, endpoint: str,
                    max_body_bytes: int | None = None) -> BackendReply:
        if self._direct is not None:
            reply = await self._direct.request(method, path, params, body, headers,
                                               timeout_s if timeout_s is not None else self.cfg.timeout / 1000,
                                               max_body_bytes)
        else:
            reply = await send_httpx(self._client, self.cfg, method, path, params, body, headers, timeout_s,
                                     max_body_bytes)
        METRICS.backend_calls.labels(self.name, endpoint, str(reply.status)).inc()
        return reply


def _complete_json_check(reply: BackendReply) -> str | None:
    if reply.status == 204 and not reply.body:
        # No Content: Prometheus's /api/v1/query_exemplars for a query without selectors.
        return None
    reply.parsed = parsed_json(reply.body)
    return None if reply.parsed is not None else "not complete JSON"
