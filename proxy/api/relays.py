"""Endpoints relayed to the backends: rules, alerts, targets, status pages, label values,
series/labels/metadata (fanned out over a hybrid fleet by metadata.py), and buildinfo.

Relays never put client text into a backend path unchecked (a double-encoded `..%252F` once
reached /debug/pprof through a backend's redirect): /api/v1/status/<what> relays only
Prometheus 2.42's own pages (buildinfo has its own handler), and /api/v1/label/<name>/values
only names Prometheus accepts (model.LabelNameRE), with the same 400 Prometheus gives.

Relays run under the queries' limits (issue 26: twenty concurrent 6.5 MB series answers took
RSS from 342 to 761 MB): admission (limits.max_queries_in_flight, max_queries_per_client,
their queue) and the answer-bytes budget (limits.max_inflight_answer_bytes), reserving what
the endpoint's last answer held and giving it back once the response is sent. Their answers
are always `application/json` with `X-Content-Type-Options: nosniff` (responses.relay), and a
backend's body is read at most up to `backends[].max_body_bytes` (transports.py).
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any, Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..errors import PromError
from ..result.golang import go_quote
from .access_log import endpoint_label
from .forms import first_values, read_pairs
from .metadata import fan_out, metric_names
from .params import parse_optional_time
from .responses import JSON, releasing, unknown_path
from .responses import relay as relay_reply
from .routing import Handler, Routes
from .tenants import View, caller_of, view_of

PROMETHEUS_COMPAT_VERSION = "2.42.0"
STATUS_PAGES = frozenset({"config", "flags", "runtimeinfo", "tsdb", "walreplay"})
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# Relayed as they are, or fanned out (the kind names the merge of metadata.py).
RELAYED: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("/api/v1/series", ("GET", "POST"), "series"),
    ("/api/v1/labels", ("GET", "POST"), "labels"),
    ("/api/v1/query_exemplars", ("GET", "POST"), None),
    ("/api/v1/format_query", ("GET", "POST"), None),
    ("/api/v1/metadata", ("GET",), "metadata"),
    ("/api/v1/rules", ("GET",), None),
    ("/api/v1/alerts", ("GET",), None),
    ("/api/v1/targets", ("GET",), None),
    ("/api/v1/targets/metadata", ("GET",), None),
    ("/api/v1/alertmanagers", ("GET",), None),
)


# What a relay holds of its answer while it is made and sent, in bytes of its body: the body,
# the parse of the soundness check (Backend.request_sound) and the response's copy.
RELAY_HELD = 3
# The least a relay reserves before its endpoint's answers are known.
RELAY_MIN_BYTES = 64 * 1024
# The last answer's body size by endpoint label: what the next relay reserves (x RELAY_HELD).
_last_size: dict[str, int] = {}


async def within_limits(request: Request, view: View, endpoint: str,
                        run: Callable[[], Awaitable[Response]]) -> Response:
    """`run()` under the queries' admission (the same client key: the tenant's forwarded
    headers, else the address) and answer-bytes budget (shared by every tenant): a relay
    waits, or gets the same 429 as a query, and holds its answer's bytes until it is sent."""
    parts = view.service.parts
    client = caller_of(request).scope or (request.client.host if request.client is not None else "") or "-"
    await parts.admission.acquire(client)
    held = None
    try:
        if parts.answers.limit:
            guess = RELAY_HELD * max(RELAY_MIN_BYTES, _last_size.get(endpoint, 0))
            held = await parts.answers.reserve(guess, view.service.config.limits.query_timeout / 1000)
        response = await run()
    except BaseException:
        if held is not None:
            held.release()
        raise
    finally:
        parts.admission.release(client)
    size = len(response.body)
    _last_size[endpoint] = size
    if held is None:
        return response
    held.resize(RELAY_HELD * size)
    return releasing(response, held.release)


def add_relay_routes(route: Routes, max_body: int) -> None:
    """Relays over the request's view (tenants.py): its backends only, its primary for what
    one backend answers."""

    async def relay(request: Request, path: str, kind: str | None = None) -> Response:
        pairs = await read_pairs(request, max_body)
        view = view_of(request)
        primary = view.primary
        endpoint = endpoint_label(path)
        caller = caller_of(request)

        async def run() -> Response:
            if kind is not None and view.service.hybrid:
                form = first_values(pairs)
                start_ms, end_ms = parse_optional_time(form, "start"), parse_optional_time(form, "end")
                names: list[str | None] | None = (
                    [form["metric"]] if kind == "metadata" and form.get("metric") else metric_names(pairs))
                return await fan_out(view.backends, request.method, path, pairs, kind, names,
                                     start_ms, end_ms, int(time.time() * 1000), endpoint, caller)
            if request.method == "POST":
                reply = await primary.request_sound("POST", path, form=pairs, endpoint=endpoint, caller=caller)
            else:
                reply = await primary.request_sound("GET", path, params=pairs, endpoint=endpoint, caller=caller)
            reply.parsed = None  # the check's parse: relayed as it came, not needed any more
            return relay_reply(reply)

        return await within_limits(request, view, endpoint, run)

    def relaying(p: str, kind: str | None) -> Handler:
        async def handler(request: Request) -> Response:
            return await relay(request, p, kind)
        return handler

    for path, methods, kind in RELAYED:
        route(path, methods)(relaying(path, kind))

    @route("/api/v1/label/{name}/values", ("GET",))
    async def label_values(request: Request) -> Response:
        name = request.path_params["name"]  # percent-decoded once, as Go's router does
        if not LABEL_NAME.fullmatch(name):
            raise PromError("bad_data", f"invalid label name: {go_quote(name)}")
        return await relay(request, f"/api/v1/label/{urllib.parse.quote(name, safe='')}/values", "values")

    @route("/api/v1/status/buildinfo", ("GET",))
    async def buildinfo(request: Request) -> Response:
        # AMP has no buildinfo (404); Grafana reads `version` to pick PromQL features, so
        # promaccel answers with the backend's if it has one, and its own otherwise.
        data: dict[str, Any] = {
            "version": PROMETHEUS_COMPAT_VERSION,
            "revision": f"promaccel-{__version__}",
            "branch": "promaccel",
            "buildUser": "promaccel",
            "buildDate": "",
            "goVersion": "promaccel (python)",
        }
        try:
            reply = await view_of(request).primary.request("GET", "/api/v1/status/buildinfo", endpoint="buildinfo",
                                                           timeout_s=5, caller=caller_of(request))
            if reply.ok:
                backend_data = orjson.loads(reply.body).get("data") or {}
                if isinstance(backend_data, dict) and backend_data.get("version"):
                    data.update(backend_data)
        except (PromError, orjson.JSONDecodeError, AttributeError):
            pass
        data["promaccel"] = __version__
        return Response(orjson.dumps({"status": "success", "data": data}), media_type=JSON)

    @route("/api/v1/status/{what}", ("GET",))
    async def status(request: Request) -> Response:
        what = request.path_params["what"]
        if what not in STATUS_PAGES:
            return unknown_path(request.url.path)
        return await relay(request, f"/api/v1/status/{urllib.parse.quote(what, safe='')}")
