"""Discovery: facts learnt from the backends and kept for a while -- the one component behind
shard-label values (`planning.ShardValues`), metric names (`names.MetricNames`), series
counts (`series_counts.SeriesCounts`) and what a backend says about itself
(`backend_facts.BackendFacts`: its Go version, its evaluation interval).

Each fact is kept per key (the caller puts the tenant scope in it: a tenant's facts are
learnt with its forwarded headers and never shape another tenant's queries):

- unknown: fetched, and concurrent askers share that one fetch (`proxy/primitives/singleflight.py`,
  `promaccel_coalesced_calls_total{flight=<name>}`); the fetch runs as a task of its own that
  inherits the asker's context (its tenant headers) and finishes even if the asker leaves;
- older than `ttl_ms`: still answered (a stale fact is what the callers can live with), and
  refreshed in the background; `max_age_s` (a caller that found the fact wrong: a metric name
  no list has) asks for a fresh one instead, when the one held is older than that;
- a fetch that failed (raised) is not tried again for `retry_after_failure_s` unless asked
  explicitly (`get`), so that every query of a sick backend does not add a discovery (and its
  retries) to its own call; a stale fact is kept through failures;
- at most `max_entries` facts, the least recently learnt dropped first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

from ..observe.metrics import METRICS
from ..primitives.singleflight import SingleFlight

__all__ = ["Discovered"]

log = logging.getLogger("promaccel.discovery")


def describe(exc: BaseException | None) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Fetch = Callable[[K], Awaitable[V]]


class Discovered(Generic[K, V]):
    def __init__(
        self,
        name: str,
        fetch: Fetch[K, V],
        ttl_ms: int,
        *,
        max_entries: int,
        retry_after_failure_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.ttl_s = ttl_ms / 1000
        self.max_entries = max(1, max_entries)
        self.retry_after_failure_s = retry_after_failure_s
        self._fetch = fetch
        self._clock = clock
        self._flight: SingleFlight[K, V] = SingleFlight(name, on_shared=METRICS.coalesced.labels(name).inc)
        self._known: dict[K, tuple[float, V]] = {}  # key -> (when learnt, value), oldest first
        self._failed: dict[K, float] = {}  # key -> when its last fetch failed
        self._background: set[asyncio.Task[V]] = set()

    def __len__(self) -> int:
        return len(self._known)

    def peek(self, key: K) -> V | None:
        """The value held for `key` (however old), without fetching."""
        entry = self._known.get(key)
        return None if entry is None else entry[1]

    async def _load(self, key: K, fetch: Fetch[K, V] | None = None) -> V:
        try:
            value = await (fetch or self._fetch)(key)
        except Exception:
            held = self._known.get(key)
            if held is None or self._clock() - held[0] > self.ttl_s:
                self._failed[key] = self._clock()
                while len(self._failed) > self.max_entries:
                    del self._failed[next(iter(self._failed))]
            raise
        self._failed.pop(key, None)
        self._known.pop(key, None)
        self._known[key] = (self._clock(), value)
        while len(self._known) > self.max_entries:
            del self._known[next(iter(self._known))]
        return value

    def _resting(self, key: K, now: float) -> bool:
        """A fetch of `key` failed less than `retry_after_failure_s` ago."""
        return now - self._failed.get(key, -math.inf) <= self.retry_after_failure_s

    def _refresh(self, key: K, fetch: Fetch[K, V] | None) -> None:
        """Fetch `key` again in the background unless that is under way (a failure is logged
        and leaves the value held)."""
        if key in self._flight:
            return
        task = asyncio.ensure_future(self._flight.do(key, functools.partial(self._load, key, fetch)))
        self._background.add(task)
        task.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task[V]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: a background refresh failed: %s", self.name, describe(task.exception()))

    async def get(self, key: K, *, max_age_s: float | None = None) -> V:
        """The value of `key`: fetched when unknown (or older than `max_age_s`), else the one
        held (refreshed in the background once older than the TTL). Raises what the fetch
        raised when it had to wait for it."""
        now = self._clock()
        entry = self._known.get(key)
        if entry is None or (max_age_s is not None and now - entry[0] > max_age_s):
            return await self._flight.do(key, functools.partial(self._load, key))
        if now - entry[0] > self.ttl_s and not self._resting(key, now):
            self._refresh(key, None)
        return entry[1]

    async def get_many(self, keys: Iterable[K], fetch: Fetch[K, V] | None = None) -> dict[K, V]:
        """The values of `keys` that are known or could be fetched now (concurrently); a key
        whose fetch fails, or failed less than `retry_after_failure_s` ago, is left out.
        `fetch`: how this caller's fetches are made (a fetch already under way is joined
        whoever started it), instead of the component's own."""
        wanted = list(dict.fromkeys(keys))
        now = self._clock()
        missing = [k for k in wanted if k not in self._known and not self._resting(k, now)]
        if missing:
            got = await asyncio.gather(*(self._flight.do(k, functools.partial(self._load, k, fetch)) for k in missing),
                                       return_exceptions=True)
            for k, g in zip(missing, got):
                # A shared fetch cancelled under us (shutdown) is a failure like any other;
                # this caller's own cancellation raises from the gather itself.
                if isinstance(g, BaseException):
                    log.warning("%s: could not discover %s: %s", self.name, k, describe(g))
        out: dict[K, V] = {}
        now = self._clock()
        for k in wanted:
            entry = self._known.get(k)
            if entry is None:
                continue
            if now - entry[0] > self.ttl_s and not self._resting(k, now):
                self._refresh(k, fetch)
            out[k] = entry[1]
        return out
