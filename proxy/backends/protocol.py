"""What a backend call sends and gets back, independent of any HTTP client library.

`BackendReply` is a backend's own HTTP answer (status, body, content type, the headers a caller
needs); `check_path` refuses a path that could leave the endpoint it names; `retry_after_s`
reads a Retry-After header; the status sets say which answers are worth another try.
"""

from __future__ import annotations

import email.utils
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ..errors import PromError

# Connection-level failures of a backend or its load balancer: retried (never 4xx/422).
RETRY_STATUSES = frozenset({502, 503, 504})
# AMP answers 429 (ThrottlingException) when a workspace's query rate is exceeded and 503
# when it sheds load; both mean "same request, later".
THROTTLE_STATUSES = frozenset({429, 503})


@dataclass
class BackendReply:
    status: int
    body: bytes | bytearray
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    # The body as JSON, when a check already parsed it (Backend.request_sound).
    parsed: Any = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class BackendFault(Exception):
    """An answer promaccel refuses to read (issue 26): a body over `backends[].max_body_bytes`
    (the read stops there) or a Content-Encoding it did not ask for (it asks for identity and
    never inflates). Not retried (the same answer would come again): `Backend.request` counts
    it as the backend's failure and raises it as PromError "unavailable" (502) naming the
    backend. `why` completes "backend 'name' ..."; it carries no secret."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def retry_after_s(value: str | None) -> float | None:
    """Retry-After as seconds: delay-seconds or an HTTP-date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def check_path(path: str) -> None:
    """Refuse a backend path that could leave the endpoint it names: every caller builds its
    path from fixed text and validated parts, so this is a second line, and a bug if it fires."""
    lowered = path.lower()
    segments = urllib.parse.unquote(path).split("/")
    if (not path.startswith("/") or "?" in path or "#" in path or "\\" in path or "%2f" in lowered
            or "%5c" in lowered or "%25" in path or "." in segments or ".." in segments or "" in segments[1:]):
        raise PromError("internal", f"promaccel refused to send the backend path {path!r}")


# A Prometheus-style JSON error: `{"status":"error","errorType":...,"error":...}` (2.42 writes
# these fields first, in this order).
_ERROR_START = b'{"status":"error"'
# errorType for a status when the backend's own body says nothing usable.
_TYPE_BY_STATUS = {400: "bad_data", 401: "unavailable", 403: "unavailable", 404: "not_found", 422: "execution",
                   429: "unavailable", 503: "unavailable", 504: "timeout"}


def is_prom_error(reply: BackendReply) -> bool:
    """Is this a complete Prometheus-style JSON error body?"""
    body = reply.body.strip()
    if not body.startswith(_ERROR_START) or not body.endswith(b"}"):
        return False
    try:
        import orjson

        data = orjson.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("errorType"), str) and isinstance(data.get("error"), str)


def sane_error(reply: BackendReply, backend: str, endpoint: str) -> BackendReply:
    """An error reply as a client may see it: the backend's own Prometheus-style JSON error as
    it is; anything else (an HTML page from a load balancer, AWS's `{"message": ...}`, a body
    cut short) becomes Prometheus's error JSON naming the backend -- 5xx as 502/503/504."""
    if reply.ok or is_prom_error(reply):
        return reply
    status = reply.status if reply.status in (502, 503, 504) or 400 <= reply.status < 500 else 502
    error_type = _TYPE_BY_STATUS.get(status, "unavailable" if status >= 500 else "bad_data")
    detail = _readable_detail(reply)
    message = f"backend {backend!r} answered {endpoint} with HTTP {reply.status}" + (f": {detail}" if detail else "")
    return BackendReply(status, PromError(error_type, message, status=status).body(), "application/json",
                        dict(reply.headers))


def _readable_detail(reply: BackendReply) -> str:
    """A short, safe description of an error body: AWS's JSON `message`, else nothing (an HTML
    page or arbitrary bytes are not echoed)."""
    if b"json" not in reply.content_type.encode("latin-1", "replace").lower():
        return ""
    try:
        import orjson

        data = orjson.loads(reply.body)
    except ValueError:
        return ""
    if isinstance(data, dict):
        for k in ("message", "Message", "error"):
            v = data.get(k)
            if isinstance(v, str):
                return v[:300]
    return ""


def parsed_json(body: bytes | bytearray) -> dict[str, Any] | None:
    """`body` as one complete JSON object (what every Prometheus API answer is), else None."""
    try:
        import orjson

        data = orjson.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def complete_json(body: bytes | bytearray) -> bool:
    return parsed_json(body) is not None


def broken_answer(backend: str, endpoint: str, why: str) -> PromError:
    """A 200 whose body is not a complete Prometheus answer, after the retries."""
    return PromError("unavailable", f"backend {backend!r} answered {endpoint} with a broken body ({why}); "
                     "retried, without a sound answer", status=502)
