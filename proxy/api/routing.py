"""The route wrapper of Prometheus's API routes.

Each handler runs for its request's view (tenants.py: with auth on, the request is
authenticated first and a missing or wrong credential is a 401), with its tenant and
forwarded tenant headers set (they reach every backend call made for it and scope its cache
keys: proxy/backends/tenancy.py), and a PromError it raises becomes Prometheus's error
answer. Admin routes (`tenant=False`) are not authenticated as a tenant: they check the admin
token themselves (admin.py).
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
from .tenants import Views

Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """`routes(path, methods)` decorates a handler and adds it to the app."""

    def __init__(self, app: FastAPI, tenancy: Tenancy, views: Views) -> None:
        self.app = app
        self.tenancy = tenancy
        self.views = views

    def __call__(self, path: str, methods: tuple[str, ...] = ("GET", "POST"),
                 tenant: bool = True) -> Callable[[Handler], Handler]:
        def deco(fn: Handler) -> Handler:
            async def wrapped(request: Request) -> Response:
                try:
                    view = self.views.of(request) if tenant else self.views.default
                except PromError as exc:
                    return error(exc)
                request.state.promaccel_view = view
                if view.tenant:
                    request.state.promaccel_tenant = view.tenant  # for the access log
                with use_tenant(self.tenancy.of(request.headers, view.tenant)):
                    try:
                        return await fn(request)
                    except PromError as exc:
                        return error(exc)
            self.app.add_api_route(path, wrapped, methods=list(methods), include_in_schema=False)
            return fn
        return deco
