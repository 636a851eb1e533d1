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

from ..errors import PromError

# Connection-level failures of a backend or its load balancer: retried (never 4xx/422).
RETRY_STATUSES = frozenset({502, 503, 504})
# AMP answers 429 (ThrottlingException) when a workspace's query rate is exceeded and 503
# when it sheds load; both mean "same request, later".
THROTTLE_STATUSES = frozenset({429, 503})


@dataclass
class BackendReply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


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
