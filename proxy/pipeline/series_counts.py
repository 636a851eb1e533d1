"""Series counts: how many series a metric has, learnt from the backend, so that `shards: auto`
and `limits.max_samples` estimate from the real count instead of the configured guess
(`planner.series_per_node` per node, issue 28 item 3).

One instant query per metric, `count({__name__="<metric>"})`, at the query's end (never after
now): Prometheus answers it from the series' last samples (no range of samples is read),
and the answer is one number, however many series there are -- an answer that is more than
that (over COUNT_BODY_MAX bytes: the call reads no more, `Backend.request(max_body_bytes=)`;
several samples; a value that is not a finite count) is refused as a failed discovery. Counts are kept per tenant scope and metric for
`planner.shard_values_ttl` by the discovery component (`discovery.py`: shared fetches,
background refresh, no retry for RETRY_AFTER_FAILURE_S after a failure). At most
MAX_PER_QUERY metrics are counted for one query (the rest, and any count that failed or found
no series at that instant, fall back to the guess), under COUNT_TIMEOUT_S each.

The count is taken at one instant and reused for other times until it expires: an estimate
(series churn over a long range is bounded by the series present at once, as the planner's
docstring says), never a correctness matter -- shards partition the series whatever their
number.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable

import orjson

from ..backends import Backend
from ..backends.tenancy import NO_TENANT, Caller, Tenant
from ..errors import PromError
from ..primitives.clock import wall_ms
from .discovery import Discovered

__all__ = ["COUNT_BODY_MAX", "MAX_PER_QUERY", "SeriesCounts", "count_query", "parse_count"]

MAX_PER_QUERY = 8
COUNT_TIMEOUT_S = 5.0
COUNT_BODY_MAX = 4096  # `{"status":"success","data":{"resultType":"vector","result":[...]}}`: ~100 bytes
MAX_COUNT = 1_000_000_000
MAX_ENTRIES = 4096
RETRY_AFTER_FAILURE_S = 30.0
# Prometheus's metric name grammar (model.IsValidMetricName): only such names are asked for,
# so the query text needs no escaping.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def count_query(metric: str) -> str:
    return f'count({{__name__="{metric}"}})'


def parse_count(status: int, body: bytes | bytearray) -> int:
    """The count an instant `count(...)` answered; ValueError for anything else (an error,
    an oversized or malformed answer, no series at that instant, a value that is not a
    count)."""
    if status != 200:
        raise ValueError(f"HTTP {status}")
    if len(body) > COUNT_BODY_MAX:
        raise ValueError(f"an answer of {len(body)} bytes to a count (at most {COUNT_BODY_MAX})")
    doc = orjson.loads(body)
    data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
    result = data.get("result") if isinstance(data, dict) and data.get("resultType") == "vector" else None
    if not isinstance(result, list) or len(result) != 1:
        raise ValueError("no series at that instant" if result == [] else "not one sample")
    sample = result[0].get("value") if isinstance(result[0], dict) else None
    if not isinstance(sample, list) or len(sample) != 2 or not isinstance(sample[1], str):
        raise ValueError("not a sample")
    value = float(sample[1])
    if not math.isfinite(value) or value < 0 or value != int(value) or value > MAX_COUNT:
        raise ValueError(f"not a series count: {sample[1][:32]!r}")
    return int(value)


class SeriesCounts:
    """Series counts per (tenant scope, metric), learnt from `backend` (the one shard-label
    values come from: the estimate spreads a count over those nodes)."""

    def __init__(self, backend: Backend, ttl_ms: int) -> None:
        self.backend = backend
        self.counts: Discovered[tuple[Tenant, str], int] = Discovered(
            "series_counts", self._fetch, ttl_ms, max_entries=MAX_ENTRIES,
            retry_after_failure_s=RETRY_AFTER_FAILURE_S)

    async def _fetch(self, key: tuple[Tenant, str], at_ms: int | None = None) -> int:
        tenant, metric = key  # the call carries the tenant's headers
        at = min(at_ms, wall_ms()) if at_ms is not None else wall_ms()
        reply = await self.backend.request(
            "GET", "/api/v1/query", params=[("query", count_query(metric)), ("time", f"{at / 1000:.3f}")],
            timeout_s=COUNT_TIMEOUT_S, endpoint="/api/v1/query", max_body_bytes=COUNT_BODY_MAX,
            caller=Caller(tenant))
        try:
            return parse_count(reply.status, reply.body)
        except ValueError as exc:
            raise PromError("unavailable", f"could not count the series of {metric} on backend "
                            f"{self.backend.name!r}: {exc}") from None

    async def get(self, metrics: Iterable[str], at_ms: int, tenant: Tenant = NO_TENANT) -> dict[str, int]:
        """The series counts `tenant` sees of (at most MAX_PER_QUERY of) these metrics, counted
        at `at_ms` (never after now) when not known yet; metrics without one are left out."""
        names = [m for m in dict.fromkeys(metrics) if _METRIC_NAME.fullmatch(m)][:MAX_PER_QUERY]
        if not names:
            return {}
        got = await self.counts.get_many(((tenant, m) for m in names), functools.partial(self._fetch, at_ms=at_ms))
        return {m: n for (_, m), n in got.items()}
