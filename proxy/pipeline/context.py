"""What one request carries down the query path, explicitly: its `RequestContext`.

The api layer makes it when a query arrives (proxy/api/queries.py: `RequestContext.start`),
the `Query` carries it (`q.ctx`), and every stage and component below reads what it needs
from there -- nothing is found through context variables:

    caller    who the query is for: its tenant (forwarded headers, cache and coalescing
              scope) and its record on the operator page; every backend call gets it
    budget    its allowance of backend calls and new cache entries (`Budget`), charged by
              every call and every new entry made for it
    samples   the samples AMP processed for it (`SampleTally`, X-Promaccel-Samples-Processed)
    deadline  when its answer is due (time.monotonic()), from its `timeout` and
              limits.query_timeout
    held      its share of limits.max_inflight_answer_bytes, set by the Reserve stage
              (answer_bytes.py): the cache writer and the fan-out size their work by it
    refused   a whole query a backend refused for its size or time, set by Forward for the
              planned rerun that cuts it finer (refusals.py), so the same call is not made again
    explain   /api/v1/explain: the recorder the stages note their decisions in (explain.py);
              the leaf then makes no backend call

A context is frozen; a stage that adds to it derives a new one (`dataclasses.replace`), as it
derives the `Query`. Its budget and tally are shared by everything the query starts: a fetch
shared with other queries (single-flight) is charged to the query that made it.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..backends.tenancy import NOBODY, Caller
from ..config import LimitsConfig
from ..errors import PromError

if TYPE_CHECKING:
    from shardplanner.plan import Span

    from .explain import Explanation


class Budget:
    """One query's allowance of backend calls (limits.max_backend_calls) and of new cache
    entries (limits.max_new_cache_keys); 0 means no limit."""

    def __init__(self, max_calls: int = 0, max_keys: int = 0) -> None:
        self.max_calls, self.max_keys = max_calls, max_keys
        self.calls = self.keys = 0

    def check(self, more: int) -> None:
        """422 if `more` calls would go over the limit (nothing is charged)."""
        if self.max_calls and self.calls + more > self.max_calls:
            raise PromError(
                "execution",
                f"this query needs more than {self.max_calls} backend calls "
                f"({self.calls} made, {more} more planned; limits.max_backend_calls): "
                "narrow the time range or simplify the query",
            )

    def affords(self, more: int) -> bool:
        """Whether `more` calls fit in what is left (nothing is charged)."""
        return not self.max_calls or self.calls + more <= self.max_calls

    def charge(self) -> None:
        self.check(1)
        self.calls += 1

    def try_charge(self) -> bool:
        """One more call if the limit allows (a hedge: never a 422, just no hedge)."""
        if not self.affords(1):
            return False
        self.calls += 1
        return True

    def new_key(self) -> bool:
        """Whether one more new cache entry may be written."""
        if self.max_keys and self.keys >= self.max_keys:
            return False
        self.keys += 1
        return True


class SampleTally:
    """The samples AMP reported processing for one query's calls (`stats=all`)."""

    def __init__(self) -> None:
        self.samples = 0

    def add(self, n: int) -> None:
        self.samples += n


class Held(Protocol):
    """A query's share of limits.max_inflight_answer_bytes (answer_bytes.Reservation), as the
    stages below Reserve use it: its size, and keeping it until a background put is done."""

    size: int

    def hold(self, task: asyncio.Future[object]) -> None: ...


@dataclass(frozen=True)
class Refused:
    """A query a backend refused whole (Forward): the piece with this query text and span
    starts cut finer instead of being asked again."""

    query: str
    span: Span
    error: BaseException


@dataclass(frozen=True, eq=False)
class RequestContext:
    caller: Caller = NOBODY
    budget: Budget = field(default_factory=Budget)
    samples: SampleTally = field(default_factory=SampleTally)
    timeout_s: float = math.inf  # the query's whole time, as its deadline was set
    deadline: float = math.inf  # time.monotonic() when the answer is due
    held: Held | None = None
    refused: Refused | None = None
    explain: Explanation | None = None

    @classmethod
    def start(cls, caller: Caller, limits: LimitsConfig, timeout_ms: int | None = None) -> RequestContext:
        """A query's context as it arrives: its caller, the allowances of `limits`, and its
        deadline -- its `timeout` parameter (`timeout_ms`) capped by limits.query_timeout."""
        limit = limits.query_timeout
        ms = min(timeout_ms, limit) if timeout_ms else limit
        timeout_s = max(ms, 1) / 1000
        return cls(caller, Budget(limits.max_backend_calls, limits.max_new_cache_keys), SampleTally(),
                   timeout_s, time.monotonic() + timeout_s)

    @property
    def scope(self) -> str:
        """The tenant's cache and coalescing scope ("" for none)."""
        return self.caller.tenant.scope

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - time.monotonic()


