"""The operator page: GET /ui (one self-contained HTML file, ui.html) and GET /ui/data.json.

The page fetches data.json every few seconds and draws it with its own script (no CDN, no
library): the queries in flight and the last `ui.recent_queries` finished ones, the last
hour's cache hit ratio and backend latency per minute, and the health of Redis and of each
backend. Everything from a client (query texts, Grafana's ids, error messages) is written
into the page as text (`textContent`), never as HTML; the Content-Security-Policy allows only
the page's own inline script and style (by hash) and fetches to its own origin.

Auth off: public like /metrics (read-only; shows no headers, credentials or backend URLs).
Auth on (`auth.tenants`): both need credentials (else 401, Prometheus-style JSON, with a Basic
challenge first so that a browser prompts): the admin token (`cache.admin_token` /
PROMACCEL_ADMIN_TOKEN) sees everything, each query with its tenant; a tenant's credentials see
only its own queries (texts, errors, Grafana ids), its own per-minute tallies, its own
backends' names, kind, readiness and breaker state (not their calls, errors or last error,
which count every tenant's traffic) and the cache's kind, reachability and breaker (not Redis's
address or its errors). A token (a tenant's or the admin's) may be given as the password of
basic auth, so a browser's own prompt serves token holders; the page's script fetches
data.json from the same origin, which the browser sends those credentials with.
Off with `ui.enabled: false`. These routes are added to the app directly (not through the
route wrapper: the admin is no tenant).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..backends import Backend
from ..config import Config
from ..errors import PromError
from ..observe.activity import ACTIVITY
from ..observe.metrics import METRICS
from ..pipeline import QueryService
from .auth import ADMIN, Authenticator, AuthFailure
from .responses import JSON, error

PAGE = (Path(__file__).parent / "ui.html").read_text(encoding="utf-8")


def _csp(page: str) -> str:
    """Only this page's inline <script> and <style> (by their SHA-256), fetches to self."""
    def hashes(tag: str) -> str:
        return " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
            for body in re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S))
    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


HEADERS = {
    "Content-Security-Policy": _csp(PAGE),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def add_ui_routes(app: FastAPI, executor: QueryService, backends: Sequence[Backend], config: Config) -> None:
    if not config.ui.enabled:
        return
    ACTIVITY.resize(config.ui.recent_queries)
    auth: Authenticator | None = None
    tenant_backends: dict[str, set[str]] = {}
    if config.auth.enabled:
        auth = Authenticator(config.auth, config.cache.admin_token or os.environ.get("PROMACCEL_ADMIN_TOKEN") or None)
        every = {b.name for b in backends}
        tenant_backends = {t.name: set(t.backends) if t.backends is not None else every for t in config.auth.tenants}

    def viewer(request: Request) -> str | None:
        """None with auth off; else ADMIN or the tenant's name; a 401 PromError otherwise."""
        if auth is None:
            return None
        try:
            return auth.viewer_of(request.headers.get("authorization"))
        except AuthFailure as exc:
            METRICS.auth_failures.labels(exc.reason).inc()
            raise PromError("unauthorized", exc.message, status=401) from None

    def refused(exc: PromError) -> Response:
        r = error(exc)
        r.headers["Cache-Control"] = "no-store"
        assert auth is not None
        # Basic first, in a header of its own: browsers prompt for it (and skip Bearer).
        r.headers.append("WWW-Authenticate", f'Basic realm="{auth.realm}", charset="UTF-8"')
        r.headers.append("WWW-Authenticate", f'Bearer realm="{auth.realm}"')
        return r

    @app.get("/ui", include_in_schema=False)
    async def ui_page(request: Request) -> Response:
        try:
            viewer(request)
        except PromError as exc:
            return refused(exc)
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/ui/data.json", include_in_schema=False)
    async def ui_data(request: Request) -> Response:
        try:
            who = viewer(request)
        except PromError as exc:
            return refused(exc)
        if who is None:
            data = await state(executor, backends)
        elif who == ADMIN:
            data = {**await state(executor, backends), "viewer": {"admin": True}}
        else:
            data = await tenant_state(executor, who, tenant_backends.get(who, set()))
        return Response(orjson.dumps({"status": "success", "data": data}), media_type=JSON,
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


async def state(executor: QueryService, backends: Sequence[Backend]) -> dict[str, Any]:
    """What the page shows: the activity snapshot, plus health (Redis, each backend)."""
    health = await executor.health()  # first: its readiness probes' failures are in the snapshot
    snap = ACTIVITY.snapshot()
    seen = snap.pop("backends")
    snap["version"] = __version__
    snap["cache"] = health["cache"]
    snap["backends"] = [{**b, **seen.get(b["name"], {})} for b in health["backends"]]
    return snap


# What a tenant sees of the health of the store and of its backends (everything else there
# is shared by every tenant: Redis's address, error counts and last errors, call tallies).
TENANT_CACHE_FIELDS = ("kind", "reachable", "breaker_open")
TENANT_BACKEND_FIELDS = ("name", "kind", "ready", "primary", "breaker")


async def tenant_state(executor: QueryService, tenant: str, names: set[str]) -> dict[str, Any]:
    """What the page shows a tenant: its own queries and minutes (activity.py), and the health
    of the cache and of its own backends, without what other tenants' traffic made."""
    health = await executor.health()
    snap = ACTIVITY.snapshot(tenant)
    snap["version"] = __version__
    snap["viewer"] = {"tenant": tenant}
    snap["cache"] = {k: health["cache"][k] for k in TENANT_CACHE_FIELDS if k in health["cache"]}
    snap["backends"] = [{k: b[k] for k in TENANT_BACKEND_FIELDS if k in b}
                        for b in health["backends"] if b["name"] in names]
    return snap
