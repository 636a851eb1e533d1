"""The one warning for a backend that did not answer, and the one rule for when it is given.

A hybrid answer (a query over several backends, or a metadata call fanned out to them) may be
given without a backend whose failure only makes its data missing: it was unreachable, timed
out, answered 5xx, or stayed throttled (429) past the retries. Any other failure (a bad query,
a 4xx) is every backend's answer and is relayed as the error. `unavailable` is that rule, for
the query path (`fetch.py`) and for metadata (`proxy/api/metadata.py`) alike;
`missing_warning` is the one text, naming the backend(s), why, and what the answer lacks.
An answer with such a warning is never cached.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...backends import BackendReply
from ...errors import PromError
from ..ask import seconds
from ..values import PieceFailed

# What an answer lacks without the backend: an overlap's other backends answered the same times,
# a metadata call's (or a time part's) data is simply not there.
OVERLAP_LOST = "this answer holds only the data of the other backends for the times both hold"
ALL_LOST = "its data is missing"


def unavailable(failure: BaseException | BackendReply) -> str | None:
    """Why a backend's failure (an exception, or an error reply) only makes its data missing:
    "HTTP 503", "HTTP 429", "unavailable", "timeout"; None for a failure every backend would
    give (a bad query: relayed as is)."""
    if isinstance(failure, PieceFailed):
        failure = failure.reply
    if isinstance(failure, BackendReply):
        status = failure.status
        return f"HTTP {status}" if status >= 500 or status == 429 else None
    if isinstance(failure, PromError) and failure.kind in ("unavailable", "timeout"):
        return failure.kind
    return None


def lost_between(start_ms: int, end_ms: int) -> str:
    """What an answer lacks without the only holder(s) of `[start_ms, end_ms]`."""
    return f"the data from {seconds(start_ms)} to {seconds(end_ms)} is missing"


def missing_warning(backends: Sequence[str], why: str, lost: str) -> str:
    """The Prometheus warning for an answer given without `backends` (`why`: `unavailable`'s
    reason; `lost`: what the answer lacks, `OVERLAP_LOST`, `ALL_LOST` or `lost_between`)."""
    return f"promaccel: backend {'+'.join(map(repr, backends))} did not answer ({why}); {lost}"
