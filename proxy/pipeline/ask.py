"""One backend call for a piece, decoded: the Prometheus and AMP protocol quirks in one place.

AMP bills by samples processed: its calls carry `stats=all`, and the count is kept per
backend in /metrics and per answer (X-Promaccel-Samples-Processed). AMP refuses instant
queries that read 32 days or more: they are asked as a one-step range query. Every call is
charged to the query's budget (limits.max_backend_calls).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from shardplanner.analysis import is_scalar_expr
from shardplanner.plan import Span
from shardplanner.promql import CannotParse, parse

from ..backends import Backend, BackendReply
from ..backends.protocol import complete_json, sane_error
from ..backends.retries import Check
from ..codec.errors import CodecError, Undecodable
from ..codec.json_decode import decode_prometheus_json
from ..observe.metrics import METRICS
from ..result import QueryResult
from .context import RequestContext
from .values import Pairs, PieceFailed

_SAMPLES = re.compile(rb'"totalQueryableSamples":\s*(\d+)')
_RANGE_ONLY = b"only supported for range type queries"


def seconds(ms: int) -> str:
    """Milliseconds as the seconds Prometheus's API takes ("1700000000.5", exact)."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    whole, frac = divmod(ms, 1000)
    return f"{sign}{whole}.{frac:03d}" if frac else f"{sign}{whole}"


def query_call(query: str, span: Span, extra: Sequence[tuple[str, str]] = ()) -> tuple[str, Pairs]:
    """Path and form of a range or an instant query over `span`, times in seconds."""
    if span.step_ms is not None:
        return "/api/v1/query_range", [("query", query), ("start", seconds(span.start_ms)),
                                       ("end", seconds(span.end_ms)), ("step", seconds(span.step_ms)), *extra]
    return "/api/v1/query", [("query", query), ("time", seconds(span.time_ms)), *extra]


class Asker:
    """`await ask(backend, path, form, timeout_s, ctx)` -> the decoded answer; a backend's error
    answer raises PieceFailed (relayed as it is). `relay` is the same call, undecoded. Every
    call is made for the query of `ctx`: its caller, charged to its budget."""

    @staticmethod
    async def relay(backend: Backend, path: str, form: Pairs, timeout_s: float, ctx: RequestContext,
                    check: Check | None = None) -> BackendReply:
        """One query call as the backend answers it (retried as `Backend.request` retries);
        charged to the query's budget."""
        budget = ctx.budget
        budget.charge()
        return await backend.request("POST", path, form=form, timeout_s=timeout_s, limited=True, endpoint=path,
                                     check=check, extra_call=budget.try_charge, caller=ctx.caller)

    async def __call__(self, backend: Backend, path: str, form: Pairs, timeout_s: float,
                       ctx: RequestContext) -> QueryResult:
        amp = backend.cfg.kind == "amp" and not any(k == "stats" for k, _ in form)
        if amp:
            form = [*form, ("stats", "all")]
        reply, result = await self.sound(backend, path, form, timeout_s, ctx)
        if needs_range_form(backend, path, reply):
            return await self.range_form(backend, form, timeout_s, ctx)
        if not reply.ok:
            raise PieceFailed(reply)
        if result is None:
            raise Undecodable("an answer the merge does not model (e.g. native histograms)")
        if amp:
            self._count_samples(backend, reply.body, ctx)
        return result

    async def sound(self, backend: Backend, path: str, form: Pairs, timeout_s: float,
                    ctx: RequestContext) -> tuple[BackendReply, QueryResult | None]:
        """A query call whose reply is sound: an error as a Prometheus-style JSON error (an HTML
        page or any other body becomes one naming the backend), a 200 as a complete answer,
        decoded (None: valid JSON the merge does not model). A 200 whose body is cut short or
        garbled is asked again -- every read is idempotent -- within the backend's retries and
        the deadline, then a 502 naming the backend."""
        decoded: list[QueryResult | None] = [None]

        def check(reply: BackendReply) -> str | None:
            try:
                decoded[0] = decode_prometheus_json(reply.body)
            except Undecodable:  # valid JSON the merge does not model (native histograms)
                decoded[0] = None
                return None if complete_json(reply.body) else "not complete JSON"
            except CodecError as exc:
                return str(exc)[:200]
            return None

        reply = await self.relay(backend, path, form, timeout_s, ctx, check)
        if not reply.ok:
            return sane_error(reply, backend.name, path), None
        return reply, decoded[0]

    @staticmethod
    def _count_samples(backend: Backend, body: bytes | bytearray, ctx: RequestContext) -> None:
        m = _SAMPLES.search(body, max(0, len(body) - 4096))
        if m is not None:
            n = int(m.group(1))
            METRICS.samples_processed.labels(backend.name).inc(n)
            ctx.samples.add(n)

    async def range_form(self, backend: Backend, form: Pairs, timeout_s: float, ctx: RequestContext) -> QueryResult:
        """AMP refuses instant queries that read 32 days or more ("only supported for range
        type queries"): ask the same query as a range query over the single step `time`,
        whose answer at that step is the instant query's."""
        t = next(v for k, v in form if k == "time")
        query = next(v for k, v in form if k == "query")
        ranged = [(k, v) for k, v in form if k != "time"] + [("start", t), ("end", t), ("step", "60")]
        METRICS.planned.labels("amp_range_form", "").inc()
        result = await self(backend, "/api/v1/query_range", ranged, timeout_s, ctx)
        return instant_of(result, query, int(round(float(t) * 1000)))


def needs_range_form(backend: Backend, path: str, reply: BackendReply) -> bool:
    return (backend.cfg.kind == "amp" and path.endswith("/api/v1/query") and reply.status == 422
            and _RANGE_ONLY in reply.body)


def instant_of(result: QueryResult, query: str, t_ms: int) -> QueryResult:
    """A one-step range answer as the instant answer at `t_ms` (scalar-typed queries give a
    scalar)."""
    try:
        scalar = is_scalar_expr(parse(query))
    except CannotParse:
        scalar = False
    if scalar:
        v = float(result.value[0]) if len(result.value) else float("nan")
        return QueryResult.scalar(t_ms, v, warnings=list(result.warnings), infos=list(result.infos))
    return QueryResult("vector", result.labels, result.offsets, np.full(len(result.t_ms), t_ms, dtype=np.int64),
                       result.value, result.warnings, result.infos)
