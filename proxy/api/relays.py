"""Endpoints relayed to the backends: rules, alerts, targets, status pages, label values,
series/labels/metadata (fanned out over a hybrid fleet by metadata.py), and buildinfo.

Relays never put client text into a backend path unchecked (a double-encoded `..%252F` once
reached /debug/pprof through a backend's redirect): /api/v1/status/<what> relays only
Prometheus 2.42's own pages (buildinfo has its own handler), and /api/v1/label/<name>/values
only names Prometheus accepts (model.LabelNameRE), with the same 400 Prometheus gives.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

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
from .responses import JSON, unknown_path
from .responses import relay as relay_reply
from .routing import Handler, Routes
from .tenants import view_of

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


def add_relay_routes(route: Routes, max_body: int) -> None:
    """Relays over the request's view (tenants.py): its backends only, its primary for what
    one backend answers."""

    async def relay(request: Request, path: str, kind: str | None = None) -> Response:
        pairs = await read_pairs(request, max_body)
        view = view_of(request)
        primary = view.primary
        if kind is not None and view.service.hybrid:
            form = first_values(pairs)
            start_ms, end_ms = parse_optional_time(form, "start"), parse_optional_time(form, "end")
            names: list[str | None] | None = (
                [form["metric"]] if kind == "metadata" and form.get("metric") else metric_names(pairs))
            return await fan_out(view.backends, request.method, path, pairs, kind, names,
                                 start_ms, end_ms, int(time.time() * 1000), endpoint_label(path))
        if request.method == "POST":
            reply = await primary.request_sound("POST", path, form=pairs, endpoint=endpoint_label(path))
        else:
            reply = await primary.request_sound("GET", path, params=pairs, endpoint=endpoint_label(path))
        return relay_reply(reply)

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
                                                           timeout_s=5)
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
