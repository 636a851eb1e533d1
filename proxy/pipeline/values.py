"""The values that flow down the pipeline: a client query as stages derive it, and its answer.

Stages never mutate a `Query`; they derive the next one with `dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from shardplanner.plan import Plan, QueryRequest

from ..backends import BackendReply
from .context import RequestContext

if TYPE_CHECKING:
    from shardplanner.routing import Route

    from ..result import QueryResult
    from .hybrid.router import Router

# A request's parameters in the order sent (the query string and the form body merged).
Pairs = list[tuple[str, str]]
# Parameters the plan sets per piece; everything else the client sent is passed along.
PLANNED_PARAMS = frozenset({"query", "start", "end", "step", "time"})
# Parameters whose answer cannot be merged from pieces (a query with one goes whole).
UNMERGEABLE_PARAMS = frozenset({"stats"})
# Passed-along parameters that never change an answer: not part of a cache key.
UNKEYED_PARAMS = frozenset({"timeout"})
ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class CacheCtx:
    """What a cache key needs beyond the piece: the tenant scope, the route (backend identity
    and the extra client parameters), now, and the lookback."""

    tenant: str
    route: tuple[str, ...]
    now_ms: int
    lookback_ms: int


@dataclass(frozen=True)
class Query:
    """One client query (or a subtree of one, for cross-store evaluation)."""

    req: QueryRequest
    pairs: Pairs  # the client's parameters as sent
    path: str  # /api/v1/query or /api/v1/query_range
    timeout_s: float
    headers: Mapping[str, str] = field(default_factory=dict)
    client: str = ""  # who asks (admission): the client's address
    want_arrow: bool = False
    # The client takes gzip (the answer's bytes may be kept: answer_memo.py); never set on a
    # cross-store subquery, whose answer is a result to evaluate over.
    gzip: bool = False
    plan: Plan | None = None  # set by the Plan stage
    cache: CacheCtx | None = None  # set by the Plan stage when the cache applies
    router: Router | None = None  # hybrid fleets: set by the Route stage
    whole: Route | None = None  # hybrid fleets: the route of the whole query
    # What the request carries (caller, budget, tally, deadline, reservation): context.py.
    ctx: RequestContext = field(default_factory=RequestContext)

    @property
    def extra(self) -> Pairs:
        """The client's parameters that every piece's call carries."""
        return [(k, v) for k, v in self.pairs if k not in PLANNED_PARAMS]

    @property
    def unmergeable(self) -> bool:
        return any(k in UNMERGEABLE_PARAMS for k, _ in self.pairs)


@dataclass(frozen=True, slots=True)
class Encoded:
    """An answer as sent: its body, and whether that is gzip (else the JSON itself)."""

    body: bytes
    gzipped: bool


class Keeps(Protocol):
    """Where a result's bytes are kept once written (pipeline/answer_memo.Ticket)."""

    def keep(self, body: bytes, gzipped: bool) -> None: ...


@dataclass
class Answer:
    """A query's answer: a merged result, a backend's reply relayed as it is, or the bytes of
    an answer kept whole."""

    result: QueryResult | None = None
    reply: BackendReply | None = None
    # The bytes of an answer kept whole (answer_memo.py), sent as they are.
    encoded: Encoded | None = None
    # The result's bytes are kept under this once written (responses.py).
    ticket: Keeps | None = None
    headers: dict[str, str] = field(default_factory=dict)
    arrow: bool = False  # encode `result` as an Arrow IPC stream
    # For the access log: the plan's shape (pieces, sharded, split, why not).
    info: dict[str, object] = field(default_factory=dict)
    # Gives back the answer's share of limits.max_inflight_answer_bytes: called by the
    # response once its body is sent (proxy/api/responses.py).
    release: Callable[[], None] | None = None


class AmbiguousTies(Exception):
    """A sharded topk/bottomk whose winners are not determined by value alone."""


class PieceFailed(Exception):
    """A backend answered a piece with an error: relay that answer."""

    def __init__(self, reply: BackendReply) -> None:
        super().__init__(reply.status)
        self.reply = reply
