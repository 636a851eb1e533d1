"""Gzip for answers: Starlette's middleware with ISA-L's compressor (codec/deflate.py).

Grafana asks for gzip on every request, so every answer is compressed. Starlette's middleware
does the HTTP side (Vary, Content-Length, streaming, skipping small or already encoded bodies,
compressing chunks of 128 KiB or more in a worker thread); only the compressor differs.
Spliced warm answers are gzipped before the middleware sees them (responses.py).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware, GZipResponder, IdentityResponder
from starlette.types import Receive, Scope, Send

from ..codec.deflate import compressor

# Bodies under this many bytes are sent as they are (api/app.py gives the middleware this).
MINIMUM_SIZE = 1024
class _FastGZipResponder(GZipResponder):
    @property
    def compressor(self) -> Any:
        if self._compressor is None:
            self._compressor = compressor()
        return self._compressor


class FastGZipMiddleware(GZipMiddleware):
    """Starlette's GZipMiddleware with the compressor above."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # pragma: no cover
            await self.app(scope, receive, send)
            return
        responder: Any
        if "gzip" in Headers(scope=scope).get("Accept-Encoding", ""):
            responder = _FastGZipResponder(self.app, self.minimum_size, thread_minimum_size=self.thread_minimum_size,
                                           exclude_content_types=self.exclude_content_types)
        else:
            responder = IdentityResponder(self.app, self.minimum_size, exclude_content_types=self.exclude_content_types)
        await responder(scope, receive, send)
