"""Cache administration: invalidate by selector and time range, bump the generation, stats.

Disabled unless `cache.admin_token` (or PROMACCEL_ADMIN_TOKEN) is set; every call needs
`Authorization: Bearer <token>`, compared in constant time. With auth on, these routes are not
a tenant's: a tenant's token gets 403 here, only the admin token passes.
"""

from __future__ import annotations

import hmac
import os

import orjson
from starlette.requests import Request
from starlette.responses import Response

from shardplanner.ast import Selector
from shardplanner.promql import CannotParse, parse

from ..config import Config
from ..errors import PromError
from ..pipeline import QueryService
from .forms import first_values, read_pairs
from .params import parse_optional_time
from .responses import JSON
from .routing import Routes


def add_admin_routes(route: Routes, executor: QueryService, config: Config) -> None:
    max_body = config.limits.max_body_bytes
    admin_token = config.cache.admin_token or os.environ.get("PROMACCEL_ADMIN_TOKEN") or None

    def check_admin(request: Request) -> None:
        if not admin_token:
            raise PromError("forbidden", "admin endpoints disabled: set cache.admin_token or "
                            "PROMACCEL_ADMIN_TOKEN", status=403)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise PromError("unauthorized", "admin endpoints need 'Authorization: Bearer <token>'", status=401)
        if not hmac.compare_digest(token.strip().encode(), admin_token.encode()):
            raise PromError("forbidden", "wrong admin token", status=403)

    @route("/api/v1/admin/cache/invalidate", ("POST",), tenant=False)
    async def cache_invalidate(request: Request) -> Response:
        check_admin(request)
        pairs = await read_pairs(request, max_body)
        matches = [v for k, v in pairs if k == "match[]"]
        if not matches:
            raise PromError("bad_data", "no match[] parameter provided (match[]={__name__=~\".+\"} drops "
                            "everything; so does POST /api/v1/admin/cache/generation)")
        names: set[str] | None = set()
        for m in matches:
            try:
                node = parse(m)
            except CannotParse as exc:
                raise PromError("bad_data", f'invalid parameter "match[]": {exc}') from None
            if not isinstance(node, Selector):
                raise PromError("bad_data", f'invalid parameter "match[]": {m!r} is not a series selector')
            if node.metric_name is None:
                names = None  # no plain metric name: every metric
            elif names is not None:
                names.add(node.metric_name)
        form = first_values(pairs)
        start_ms, end_ms = parse_optional_time(form, "start"), parse_optional_time(form, "end")
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise PromError("bad_data", "end timestamp must not be before start time")
        dropped = await executor.invalidate(None if names is None else sorted(names), start_ms, end_ms)
        return Response(orjson.dumps({"status": "success", "data": {
            "dropped": dropped, "metrics": None if names is None else sorted(names),
            "start_ms": start_ms, "end_ms": end_ms}}), media_type=JSON)

    @route("/api/v1/admin/cache/generation", ("POST",), tenant=False)
    async def cache_generation(request: Request) -> Response:
        check_admin(request)
        generation = await executor.bump_generation()
        return Response(orjson.dumps({"status": "success", "data": {"generation": generation}}), media_type=JSON)

    @route("/api/v1/admin/cache/stats", ("GET",), tenant=False)
    async def cache_stats(request: Request) -> Response:
        check_admin(request)
        return Response(orjson.dumps({"status": "success", "data": executor.cache_stats()}), media_type=JSON)
