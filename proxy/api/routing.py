"""The route wrapper of Prometheus's API routes.

Each handler runs for its request's view (tenants.py: with auth on, the request is
authenticated first and a missing or wrong credential is a 401), with its caller set
(`tenants.caller_of`: its tenant's forwarded headers, which every backend call made for it
carries, and its cache scope: proxy/backends/tenancy.py), and a PromError it raises becomes Prometheus's error
answer. Admin routes (`tenant=False`) are not authenticated as a tenant: they check the admin
token themselves (admin.py).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backends.tenancy import Caller, Tenancy
from ..errors import PromError
from .responses import error
from .tenants import CALLER_STATE, Views, record_of

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
                who = self.tenancy.of(request.headers, view.tenant)
                request.scope.setdefault("state", {})[CALLER_STATE] = Caller(who, record_of(request))
                try:
                    return await fn(request)
                except PromError as exc:
                    return error(exc)
            # A plain Starlette route: the handler takes the Request and returns a Response, so
            # FastAPI's dependency solving and response handling around it only cost time
            # (~0.1 ms a request, issue 28's tiny panels). Only the methods asked for: a HEAD
            # (which Starlette adds beside GET) falls through to the 404 as before.
            r = Route(path, wrapped, methods=list(methods), include_in_schema=False)
            if r.methods is not None and "HEAD" not in methods:
                r.methods.discard("HEAD")
            self.app.router.routes.append(r)
            return fn
        return deco
