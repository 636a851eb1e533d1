"""promaccel's app served in this process (httpx's ASGI transport, its lifespan run): the
api tests' one way to make requests against a config without a server or a port."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from proxy.api.app import create_app
from proxy.config import build_config


def serve(config: dict[str, Any], body: Callable[[httpx.AsyncClient], Awaitable[Any]],
          base_url: str = "http://p", timeout: float = 60) -> Any:
    """`body(client)`'s result, with `client` talking to an app made from `config`."""
    async def run() -> Any:
        app = create_app(build_config(config))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url,
                                         timeout=timeout) as c:
                return await body(c)
    return asyncio.run(run())
