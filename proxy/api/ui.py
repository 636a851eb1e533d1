"""The operator page: GET /ui (one self-contained HTML file, ui.html) and GET /ui/data.json.

The page fetches data.json every few seconds and draws it with its own script (no CDN, no
library): the queries in flight and the last `ui.recent_queries` finished ones, the last
hour's cache hit ratio and backend latency per minute, and the health of Redis and of each
backend. Everything from a client (query texts, Grafana's ids, error messages) is written
into the page as text (`textContent`), never as HTML; the Content-Security-Policy allows only
the page's own inline script and style (by hash) and fetches to its own origin.

Public like /metrics (read-only; shows no headers, credentials or backend URLs); off with
`ui.enabled: false`. These routes carry no tenant, so they are added to the app directly.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.responses import Response

from .. import __version__
from ..activity import ACTIVITY
from ..backends import Backend
from ..config import Config
from ..pipeline import QueryService
from .responses import JSON

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

    @app.get("/ui", include_in_schema=False)
    async def ui_page() -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/ui/data.json", include_in_schema=False)
    async def ui_data() -> Response:
        data = await state(executor, backends)
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
