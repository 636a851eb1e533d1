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
from ..codec.errors import CodecError, Undecodable
from ..codec.json_decode import decode_prometheus_json
from ..errors import PromError
from ..metrics import METRICS
from ..result import QueryResult
from .budget import BUDGET, SAMPLES_TALLY
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
    """`await ask(backend, path, form, timeout_s)` -> the decoded answer; a backend's error
    answer raises PieceFailed (relayed as it is). `relay` is the same call, undecoded."""

    @staticmethod
    async def relay(backend: Backend, path: str, form: Pairs, timeout_s: float) -> BackendReply:
        """One query call as the backend answers it; charged to the query's budget (every call
        counts, retries of a route's parts included)."""
        budget = BUDGET.get()
        if budget is not None:
            budget.charge()
        return await backend.request("POST", path, form=form, timeout_s=timeout_s, limited=True, endpoint=path)

    async def __call__(self, backend: Backend, path: str, form: Pairs, timeout_s: float) -> QueryResult:
        amp = backend.cfg.kind == "amp" and not any(k == "stats" for k, _ in form)
        if amp:
            form = [*form, ("stats", "all")]
        reply = await self.relay(backend, path, form, timeout_s)
        if needs_range_form(backend, path, reply):
            return await self.range_form(backend, form, timeout_s)
        if not reply.ok:
            raise PieceFailed(reply)
        if amp:
            m = _SAMPLES.search(reply.body, max(0, len(reply.body) - 4096))
            if m is not None:
                n = int(m.group(1))
                METRICS.samples_processed.labels(backend.name).inc(n)
                tally = SAMPLES_TALLY.get()
                if tally is not None:
                    tally[0] += n
        try:
            return decode_prometheus_json(reply.body)
        except Undecodable:
            raise
        except CodecError as exc:
            raise PromError("internal", f"could not decode a backend answer: {exc}") from exc

    async def range_form(self, backend: Backend, form: Pairs, timeout_s: float) -> QueryResult:
        """AMP refuses instant queries that read 32 days or more ("only supported for range
        type queries"): ask the same query as a range query over the single step `time`,
        whose answer at that step is the instant query's."""
        t = next(v for k, v in form if k == "time")
        query = next(v for k, v in form if k == "query")
        ranged = [(k, v) for k, v in form if k != "time"] + [("start", t), ("end", t), ("step", "60")]
        METRICS.planned.labels("amp_range_form", "").inc()
        result = await self(backend, "/api/v1/query_range", ranged, timeout_s)
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
