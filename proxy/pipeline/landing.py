"""Request coalescing state: what this process has fetched or is fetching right now.

Three layers, so N clients refreshing one dashboard cost one client's backend calls:
- the landing zone: units fetched whose put to the store has not landed yet (plus a short
  grace), served from memory meanwhile;
- in flight: units some request is fetching right now; others await that call;
- recent calls: a finished forwarded call (a query not cut into pieces) answers an identical
  call for a few seconds, closing the gap between a request's lookup and its own call (a
  fetch of units finds their cells in the landing zone instead: `Fetcher._landed`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..primitives.clock import wall_ms
from ..result import QueryResult

# How long fetched units stay in the landing zone after their put finished (a request that
# missed them in the store just before the put landed still finds them here) ...
LANDING_GRACE_S = 2.0
# ... except large ones, which leave at once: a heavy query's pieces are tens of megabytes,
# held past its answer and its put only to spare a rare duplicate call (issue 15) ...
GRACE_MAX_SAMPLES = 1 << 16
# ... and any beyond this many bytes of samples (16 a sample) in grace at once: 20 heavy 24 h
# queries at once kept 10-20 MiB of small cells in grace through the burst (their median peak
# over idle: +96 MiB; +88-93 without any grace, +96 with this bound, 5 runs each: within the
# noise; a dashboard's refresh lands far less than this).
GRACE_MAX_BYTES = 4 << 20
# How long a finished backend call over old data answers identical calls.
RECENT_CALL_S = 5.0
RECENT_CALLS_MAX = 64
RECENT_CALL_MAX_BYTES = 4 << 20
# All recent calls together: 64 calls of up to 4 MB each, kept until something evicted them,
# held ~40 MiB long after a burst of heavy queries (issue 15); expired ones now go at once.
RECENT_CALLS_MAX_BYTES = 16 << 20


class Landing:
    def __init__(self) -> None:
        # digest -> (answer, fetched_at_ms), until the put landed (plus the grace).
        self.landing: dict[str, tuple[QueryResult, int]] = {}
        # digest -> the answer of the call fetching it right now.
        self.inflight: dict[str, asyncio.Future[QueryResult]] = {}
        # flight key -> (answer, fetched_at_ms, expiry, bytes)
        self._recent: dict[tuple[Any, ...], tuple[Any, int, float, int]] = {}
        self._recent_bytes = 0
        self._expiry: asyncio.TimerHandle | None = None
        # Anything fetched before this must not be served or stored any more.
        self.invalidated_at_ms = 0
        self._grace_bytes = 0  # of the units kept for the grace after their put landed
        # Told of each unit leaving the landing zone (the cache reader's decoded cells adopt it).
        self.on_unland: Callable[[str, QueryResult], None] | None = None
        # The frames' tags of landed units stored (RedisStore.put_many): what an answer made
        # of them is recalled by (pipeline/answer_memo.py) before they are read back.
        self._tags: dict[str, bytes] = {}

    def landed(self, digest: str | None) -> QueryResult | None:
        """A unit fetched by this process whose put has not landed yet (or just did)."""
        entry = self.landing.get(digest) if digest is not None else None
        if entry is None or entry[1] < self.invalidated_at_ms:
            return None
        return entry[0]

    def land(self, digest: str, result: QueryResult, fetched_at_ms: int) -> None:
        self.landing[digest] = (result, fetched_at_ms)
        self._tags.pop(digest, None)

    def stored(self, digest: str, tag: bytes, result: QueryResult) -> None:
        """`result`, landed under `digest`, was stored as the frame of `tag`."""
        if self.landed(digest) is result:
            self._tags[digest] = tag

    def tagged(self, digest: str) -> tuple[bytes, QueryResult] | None:
        """A landed unit stored as the frame of a known tag: (tag, unit)."""
        tag = self._tags.get(digest)
        landed = self.landed(digest) if tag is not None else None
        return (tag, landed) if tag is not None and landed is not None else None

    def unland_later(self, landed: list[tuple[str, QueryResult]]) -> None:
        """Units whose put landed: they leave after the grace, large ones (and any beyond
        GRACE_MAX_BYTES in grace) at once."""
        now, later = [], []
        for e in landed:
            size = 16 * e[1].n_samples
            if e[1].n_samples > GRACE_MAX_SAMPLES or self._grace_bytes + size > GRACE_MAX_BYTES:
                now.append(e)
            else:
                self._grace_bytes += size
                later.append(e)
        if now:
            self._unland(now)
        if later:
            asyncio.get_running_loop().call_later(LANDING_GRACE_S, self._graced, later)

    def _graced(self, landed: list[tuple[str, QueryResult]]) -> None:
        self._grace_bytes -= sum(16 * r.n_samples for _, r in landed)
        self._unland(landed)

    def _unland(self, landed: list[tuple[str, QueryResult]]) -> None:
        for digest, r in landed:
            entry = self.landing.get(digest)
            if entry is not None and entry[0] is r:
                del self.landing[digest]
                self._tags.pop(digest, None)
                if self.on_unland is not None and entry[1] >= self.invalidated_at_ms:
                    self.on_unland(digest, r)

    def recent_call(self, key: tuple[Any, ...]) -> Any:
        entry = self._recent.get(key)
        if entry is None:
            return None
        if entry[2] < time.monotonic() or entry[1] < self.invalidated_at_ms:
            self._forget(key)
            return None
        return entry[0]

    def _forget(self, key: tuple[Any, ...]) -> None:
        entry = self._recent.pop(key, None)
        if entry is not None:
            self._recent_bytes -= entry[3]

    def remember_call(self, key: tuple[Any, ...], answer: Any, fetched_at_ms: int) -> None:
        # Big answers are not kept: holding a 50 MB answer for seconds after its query is
        # done costs more memory (20 heavy queries at once) than the duplicate call it
        # might save; dashboard panels' calls are far smaller.
        first = answer[0] if isinstance(answer, tuple) else answer
        body = getattr(first, "body", None)
        size = len(body) if body is not None else 16 * getattr(first, "n_samples", 0)
        if size > RECENT_CALL_MAX_BYTES:
            return
        now = time.monotonic()
        self._drop_expired(now)  # now, not when full: each may hold a few megabytes
        if len(self._recent) >= RECENT_CALLS_MAX or self._recent_bytes + size > RECENT_CALLS_MAX_BYTES:
            return
        self._forget(key)
        self._recent[key] = (answer, fetched_at_ms, now + RECENT_CALL_S, size)
        self._recent_bytes += size
        if self._expiry is None:  # and when no call comes after them, they go all the same
            self._expire_in(RECENT_CALL_S)

    def _expire_in(self, delay_s: float) -> None:
        try:
            self._expiry = asyncio.get_running_loop().call_later(delay_s, self._expire)
        except RuntimeError:  # no event loop (a test driving this by hand)
            self._expiry = None

    def _drop_expired(self, now: float) -> None:
        for k in [k for k, e in self._recent.items() if e[2] <= now]:
            self._forget(k)

    def _expire(self) -> None:
        self._expiry = None
        now = time.monotonic()
        self._drop_expired(now)
        if self._recent:
            self._expire_in(max(min(e[2] for e in self._recent.values()) - now, 0.01))

    def forget_all(self) -> None:
        """An invalidation: nothing fetched before now is served or stored any more."""
        self.invalidated_at_ms = wall_ms()
        self.landing.clear()
        self._tags.clear()
        self._recent.clear()
        self._recent_bytes = 0
