"""Gzip for answers, with ISA-L's deflate when it is installed.

Grafana asks for gzip on every request, so every answer is compressed; ISA-L (`isal`) writes
the same gzip format several times faster than zlib at level 1, and smaller (figures in
docs/ARCHITECTURE.md, "The hot path").

Starlette's middleware does the HTTP side (Vary, Content-Length, streaming, skipping small
or already encoded bodies, compressing chunks of 128 KiB or more in a worker thread); only
the compressor differs.
"""

from __future__ import annotations

import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware, GZipResponder, IdentityResponder
from starlette.types import Receive, Scope, Send

try:
    from isal import isal_zlib as _deflate  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover -- a platform without an isal wheel: zlib's output is the same format
    _deflate = zlib  # type: ignore[assignment,misc]

# ISA-L's levels are 0-3; its level 1 beats zlib's level 1 on both speed and size.
LEVEL = 1
WBITS_GZIP = 16 + zlib.MAX_WBITS


# Bodies under this many bytes are sent as they are (api/app.py gives the middleware this).
MINIMUM_SIZE = 1024


# Bodies of this many bytes or more are compressed in two halves at once (a 3 MB answer:
# ~6 ms of one core at LEVEL on the bench machine).
PARALLEL_ABOVE = 1 << 20
_HALVES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promaccel-gzip")
# A gzip member's header: deflate, no name, no time, unknown OS (RFC 1952).
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def gzip_bytes(data: bytes | memoryview) -> bytes:
    """`data` as one gzip member, at LEVEL (answers compressed before the middleware sees
    them: responses.py). A large body is deflated in two halves at once, like pigz: the
    first ends with a full flush (byte-aligned, and the second refers to nothing before it),
    the second is the last block; one member, one CRC-32, so every gzip reader reads it."""
    n = len(data)
    if n < PARALLEL_ABOVE:
        out: bytes = _deflate.compress(data, LEVEL, WBITS_GZIP)
        return out
    view = memoryview(data).cast("B")
    mid = n // 2
    second = _HALVES.submit(_raw_deflate, view[mid:], True)
    first = _raw_deflate(view[:mid], False)
    trailer = struct.pack("<II", _deflate.crc32(view), n & 0xFFFFFFFF)
    return b"".join((_GZIP_HEADER, first, second.result(), trailer))


def _raw_deflate(data: memoryview, last: bool) -> bytes:
    c = _deflate.compressobj(LEVEL, _deflate.DEFLATED, -zlib.MAX_WBITS)
    out: bytes = c.compress(data) + c.flush(_deflate.Z_FINISH if last else _deflate.Z_FULL_FLUSH)
    return out


def compressor() -> Any:
    """A streaming gzip compressor (the object `zlib.compressobj` returns, or ISA-L's)."""
    return _deflate.compressobj(LEVEL, _deflate.DEFLATED, WBITS_GZIP)


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
