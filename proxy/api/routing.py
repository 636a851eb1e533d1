"""The route wrapper of Prometheus's API routes.

Each handler runs with its request's forwarded tenant headers set (they reach every backend
call made for it and scope its cache keys: proxy/backends/tenancy.py), and a PromError it
raises becomes Prometheus's error answer.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from ..backends.tenancy import Tenancy
from ..backends.tenancy import use as use_tenant
from ..errors import PromError
from .responses import error

Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """`routes(path, methods)` decorates a handler and adds it to the app."""

    def __init__(self, app: FastAPI, tenancy: Tenancy) -> None:
        self.app = app
        self.tenancy = tenancy

    def __call__(self, path: str, methods: tuple[str, ...] = ("GET", "POST")) -> Callable[[Handler], Handler]:
        def deco(fn: Handler) -> Handler:
            async def wrapped(request: Request) -> Response:
                with use_tenant(self.tenancy.of(request.headers)):
                    try:
                        return await fn(request)
                    except PromError as exc:
                        return error(exc)
            self.app.add_api_route(path, wrapped, methods=list(methods), include_in_schema=False)
            return fn
        return deco
