"""Metadata endpoints over a hybrid fleet: series, labels, label values, metadata.

Each call goes to every backend that may hold what it asks about: a backend is asked when one
of its holdings names a metric of the `match[]` selectors (any metric, for a selector without
a plain metric name, or when there is no `match[]`) and its time window meets the request's
`[start, end]` (unbounded when not given). The answers are merged and deduplicated:

    /api/v1/series              union of label sets, sorted as Prometheus sorts series
    /api/v1/labels              sorted union of names
    /api/v1/label/<n>/values    sorted union of values
    /api/v1/metadata            per metric, the union of entries (first seen order); `limit`
                                and `limit_per_metric` applied after the merge

A backend that fails (unreachable, timed out, 5xx, throttled, an answer that is not JSON or
whose data has another shape: a 502 naming it) is left out with the query path's warning
naming it (`proxy/pipeline/hybrid/warnings.py`, one rule and one text for both); when every
backend fails, the first failure is relayed. Any other
failure (a 4xx: a bad `match[]`) is relayed as is: it is the client's error, not a missing
backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from starlette.responses import Response

from shardplanner.ast import Selector
from shardplanner.holdings import BackendHolding
from shardplanner.promql import CannotParse, parse

from ..backends import Backend, BackendReply
from ..backends.tenancy import NOBODY, Caller
from ..errors import PromError
from ..pipeline.hybrid.router import holdings_of
from ..pipeline.hybrid.warnings import ALL_LOST, missing_warning, unavailable
from .forms import Pairs
from .responses import JSON, relay


def metric_names(pairs: Pairs) -> list[str | None] | None:
    """The metric names of the `match[]` selectors (None for a selector without a plain
    name); None when there is no match[] (anything may be asked about)."""
    matches = [v for k, v in pairs if k == "match[]"]
    if not matches:
        return None
    out: list[str | None] = []
    for m in matches:
        try:
            node = parse(m)
        except CannotParse:
            out.append(None)  # the backends give the client its parse error
            continue
        out.append(node.metric_name if isinstance(node, Selector) else None)
    return out


def backends_for(backends: Sequence[Backend], holdings: Sequence[BackendHolding],
                 names: list[str | None] | None, start_ms: int | None, end_ms: int | None) -> list[Backend]:
    """The backends that may hold something the call asks about, in configured order."""
    lo = start_ms if start_ms is not None else -(2**62)
    hi = end_ms if end_ms is not None else 2**62
    wanted: list[Backend] = []
    for b in backends:
        for h in holdings:
            if h.name != b.name:
                continue
            if h.since_ms is not None and h.since_ms > hi or h.until_ms is not None and h.until_ms < lo:
                continue
            if names is None or any(n is None or h.holds_metric(n) for n in names):
                wanted.append(b)
                break
    return wanted or list(backends[:1])


def _series_key(d: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(d.items()))


def merge_data(kind: str, datas: Sequence[Any], params: Mapping[str, str]) -> Any:
    if kind == "series":
        seen: dict[tuple[tuple[str, str], ...], Any] = {}
        for data in datas:
            for d in data or ():
                seen.setdefault(_series_key(d), d)
        return [seen[k] for k in sorted(seen)]
    if kind in ("labels", "values"):
        return sorted({v for data in datas for v in (data or ())})
    if kind == "metadata":
        out: dict[str, list[Any]] = {}
        for data in datas:
            for metric, entries in (data or {}).items():
                have = out.setdefault(metric, [])
                for e in entries:
                    if e not in have:
                        have.append(e)
        per = _int(params.get("limit_per_metric"))
        if per is not None and per > 0:
            out = {m: e[:per] for m, e in out.items()}
        limit = _int(params.get("limit"))
        if limit is not None and limit >= 0 and len(out) > limit:
            out = dict(list(out.items())[:limit])
        return out
    raise ValueError(kind)


def _strings(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, str) for v in x)


def _label_sets(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(d, dict) and all(isinstance(v, str) for v in d.values()) for d in x)


def _metadata(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(e, list) and all(isinstance(m, dict) for m in e) for e in x.values())


# What each kind's `data` must be for merge_data (null is nothing, as some backends answer):
# the check, and what the error says the data is not.
_SHAPES = {
    "series": (_label_sets, "a list of label sets"),
    "labels": (_strings, "a list of strings"),
    "values": (_strings, "a list of strings"),
    "metadata": (_metadata, "an object of metadata lists"),
}


def _answer(kind: str, reply: BackendReply) -> tuple[Any, list[str]] | str:
    """The data and warnings of a backend's 200, or what is wrong with them (a 200 whose
    data has another shape would otherwise fail the merge: a 500)."""
    try:
        body = reply.parsed if reply.parsed is not None else orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return "invalid JSON"
    if not isinstance(body, dict):
        return "JSON that is not an object"
    data, warnings = body.get("data"), body.get("warnings") or []
    if not _strings(warnings):
        return "warnings that are not a list of strings"
    shape = _SHAPES.get(kind)
    if data is not None and shape is not None and not shape[0](data):
        return f"data that is not {shape[1]}"
    return data, warnings


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


async def fan_out(backends: Sequence[Backend], method: str, path: str, pairs: Pairs, kind: str,
                  names: list[str | None] | None, start_ms: int | None, end_ms: int | None,
                  now_ms: int, endpoint: str, caller: Caller = NOBODY) -> Response:
    asked = backends_for(backends, holdings_of(backends, now_ms), names, start_ms, end_ms)

    async def one(b: Backend) -> BackendReply:
        if method == "POST":
            return await b.request_sound("POST", path, form=pairs, endpoint=endpoint, caller=caller)
        return await b.request_sound("GET", path, params=pairs, endpoint=endpoint, caller=caller)

    outcomes = await asyncio.gather(*(one(b) for b in asked), return_exceptions=True)
    datas: list[Any] = []
    warnings: list[str] = []
    failed: list[BackendReply | BaseException] = []
    for b, out in zip(asked, outcomes):
        if not isinstance(out, BaseException) and out.ok:
            got = _answer(kind, out)
            if isinstance(got, str):
                # Garbage from the backend, not the client's error: a 502 naming it, which
                # leaves it out like a backend that failed (and is the answer if all did).
                out = PromError("unavailable", f"backend {b.name!r} answered {endpoint} with {got}", status=502)
            else:
                datas.append(got[0])
                warnings.extend(got[1])
                continue
        # The query path's rule (`unavailable`): a backend that is down or throttled is left
        # out with the one warning; any other failure (a bad `match[]`) is the answer.
        why = unavailable(out)
        if why is None:
            if isinstance(out, BaseException):
                raise out
            return relay(out)
        failed.append(out)
        warnings.append(missing_warning((b.name,), why, ALL_LOST))
    if not datas:
        first = failed[0]
        if isinstance(first, BaseException):
            raise first
        return relay(first)
    params = {k: v for k, v in pairs}
    answer: dict[str, Any] = {"status": "success", "data": merge_data(kind, datas, params)}
    if warnings:
        answer["warnings"] = warnings
    return Response(orjson.dumps(answer), media_type=JSON)

