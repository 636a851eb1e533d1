"""Whole answers kept as the bytes sent, for a window asked again (issue 28).

Grafana aligns a panel's range to its step, so everyone looking at one dashboard asks the same
windows, and a panel re-rendered asks its window again. Such an ask finds every piece in the
cache and would merge, splice and gzip the same bytes again (~2.5 ms of a 2 MB panel's ~4).
So the body of an answer made of cached cells is kept, keyed by the request, with the cells
it was made from; a later ask whose lookup found *the same cell objects* for the same pieces
is answered with those bytes.

Why that is exact: the body is a function of the request and the cells' contents, and a
cell object stands for its content. A lookup hands out a cell decoded earlier only after
the store said its tag is unchanged (`CacheReader.read`: what another process wrote again
or invalidated is read anew, a new object), and the landing zone's cells are the ones being
stored. Any other answer of a piece is a new object (a cut of a cell not kept, a fetch), so
an entry is used only when every piece of the plan is the same object as then; the entry
holds the cells weakly, and a cell gone from memory takes its entries' use with it. Nothing
is kept for cold answers (their pieces come from the backends) or for a query the cache
does not apply to; only the gzip-able JSON of the planned path (not Arrow, not a cross-store
subquery, not explain). At most `cache.answer_memo_bytes`, least recently used first out.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shardplanner.plan import Piece

from ..cache import CacheKey, PieceStore
from ..observe.activity import ACTIVITY
from ..observe.metrics import METRICS
from ..result import QueryResult
from .stage import Stage
from .values import Answer, Encoded, Query

# One entry may take at most this share of the bound (a larger answer is not kept).
ENTRY_SHARE = 8

# Per planned piece: its merge order, its span, the key digest it was read from, its cell.
_Part = tuple[tuple[int, str, int], object, str, QueryResult]
# The cell a reader keeps decoded for a key digest, with its frame's tag (CacheReader.decoded).
Tagged = Callable[[str], "tuple[bytes, QueryResult] | None"]


class Answered(Protocol):
    """A planned piece and the cell that answers it (units.Slot, or one as the next lookup
    will find it: pipeline/lookup.py)."""

    @property
    def piece(self) -> Piece: ...
    @property
    def keys(self) -> tuple[CacheKey, ...]: ...
    @property
    def order(self) -> tuple[int, str, int]: ...
    @property
    def result(self) -> QueryResult | None: ...
    @property
    def answered_by(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Deps:
    """The store entries an answer was made of and their frames' tags, when every piece was a
    cell kept with its tag: the answer is still right while each entry is still that frame."""

    keys: tuple[CacheKey, ...]
    tags: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Ticket:
    """A query whose pieces were all found in the cache: what its answer is kept under once
    it is written (`keep`), or was kept under (`AnswerMemo.get`)."""

    memo: AnswerMemo
    key: tuple[object, ...]
    parts: tuple[_Part, ...]
    deps: Deps | None = None
    headers: dict[str, str] = field(default_factory=dict)
    keys: tuple[CacheKey, ...] | None = None  # the store keys of its pieces (unsharded plans)

    def keep(self, body: bytes, gzipped: bool) -> None:
        self.memo.put(self, Encoded(body, gzipped))


class _Entry:
    __slots__ = ("cells", "encoded", "size", "deps", "headers", "keys")

    def __init__(self, t: Ticket, encoded: Encoded) -> None:
        self.cells = tuple((order, span, digest, weakref.ref(cell)) for order, span, digest, cell in t.parts)
        self.encoded = encoded
        self.deps = t.deps
        self.headers = t.headers
        self.keys = t.keys
        self.size = len(encoded.body) + 200 * len(t.parts)

    def made_of(self, parts: Sequence[_Part]) -> bool:
        if len(parts) != len(self.cells):
            return False
        for (order, span, digest, cell), (o, s, d, ref) in zip(parts, self.cells):
            if order != o or digest != d or span != s or ref() is not cell:
                return False
        return True


class AnswerMemo:
    """The kept answers, at most `max_bytes` (0: none), least recently used first out. Shared
    by the pipelines of every tenant (their requests' keys differ by tenant)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lru: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()  # put runs where the body is written (the loop's thread, or not)

    def ticket(self, q: Query, slots: Sequence[Answered], tagged: Tagged | None = None) -> Ticket | None:
        """The ticket of a query whose every piece was found in the cache, else None (also for
        a query whose answer is not kept: no gzip asked, Arrow, explain, no cache). `tagged`:
        the reader's kept cells, for the entries' tags (`Deps`; not for a sharded plan, whose
        pieces follow the shard-label values discovered, nor for a cell kept without a tag)."""
        if not self.max_bytes or not eligible(q) or q.cache is None or q.plan is None:
            return None
        parts = []
        keys: list[CacheKey] | None = [] if not q.plan.sharded else None
        for s in slots:
            r = s.result
            if r is None or s.answered_by is None:
                return None
            origin = r.origin[0]() if r.origin is not None else r  # a lazy cut: its cell
            if origin is None:
                return None
            parts.append((s.order, s.piece.span, s.answered_by, origin))
            key = next((k for k in s.keys if k.digest == s.answered_by), None)
            if keys is not None and key is not None:
                keys.append(key)
            else:
                keys = None
        store_keys = tuple(keys) if keys else None
        deps = _deps(store_keys, parts, tagged) if tagged is not None else None
        return Ticket(self, memo_key(q, q.cache.route[0]), tuple(parts), deps,
                      {"X-Promaccel-Pieces": str(len(q.plan.pieces)), "X-Cache": "HIT"}, store_keys)

    def get(self, t: Ticket) -> Encoded | None:
        """The answer kept for `t`'s request when it was made of the same cells."""
        with self._lock:
            entry = self._lru.get(t.key)
            if entry is None:
                return None
            if not entry.made_of(t.parts):  # left for the LRU: a rerun unsharded may match it
                return None
            self._lru.move_to_end(t.key)
            if entry.deps is None:  # kept from landing-zone cells: now kept with their tags
                entry.deps = t.deps
        METRICS.answer_memo.labels("hit").inc()
        return entry.encoded

    def recallable(self, key: tuple[object, ...], tagged: Tagged | None = None) -> _Entry | None:
        """The entry of `key` if it can be checked by its tags alone (`Recall`): kept with
        them, or (kept from landing-zone cells) its cells now kept by the reader with tags."""
        with self._lock:
            entry = self._lru.get(key)
            if entry is None:
                return None
            if entry.deps is None and tagged is not None:
                parts = [(o, s, d, ref()) for o, s, d, ref in entry.cells]
                entry.deps = _deps(entry.keys, parts, tagged)
            if entry.deps is None:
                return None
            self._lru.move_to_end(key)
            return entry

    def put(self, t: Ticket, encoded: Encoded) -> None:
        entry = _Entry(t, encoded)
        if entry.size > self.max_bytes // ENTRY_SHARE:
            return
        with self._lock:
            self._drop(t.key)
            self._lru[t.key] = entry
            self.used += entry.size
            while self.used > self.max_bytes:
                self._drop(next(iter(self._lru)))
        METRICS.answer_memo.labels("kept").inc()

    def _drop(self, key: tuple[object, ...]) -> None:
        entry = self._lru.pop(key, None)
        if entry is not None:
            self.used -= entry.size

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self.used = 0


def _deps(keys: tuple[CacheKey, ...] | None, parts: Sequence[tuple[object, object, str, QueryResult | None]],
          tagged: Tagged) -> Deps | None:
    """The pieces' store keys and tags, when the reader keeps each piece's very cell with
    its frame's tag (else None: a cell from the landing zone not yet read back, or gone)."""
    if keys is None or len(keys) != len(parts):
        return None
    tags = []
    for (_, _, digest, cell), key in zip(parts, keys):
        held = tagged(digest)
        if cell is None or held is None or held[1] is not cell or key.digest != digest:
            return None
        tags.append(held[0])
    return Deps(keys, tuple(tags))


def eligible(q: Query) -> bool:
    """Whether `q`'s answer may be kept whole or answered from one kept: JSON for a client
    that takes gzip, not explain (a cross-store subquery is asked with gzip off)."""
    return q.gzip and not q.want_arrow and q.ctx.explain is None and not q.unmergeable


def memo_key(q: Query, ident: str) -> tuple[object, ...]:
    """What an answer is kept under, known before planning: the path, the request (query,
    times, lookback), the client's other parameters, the tenant's scope, the primary backend."""
    return (q.path, q.req, tuple(q.extra), q.ctx.scope, ident)


class Recall:
    """Stage: a request answered before with bytes kept whole, whose every piece was a cell
    kept with its frame's tag (`Deps`), and every such entry still that frame in the store
    (one read of their 32-byte tags, as a warm lookup makes): those bytes, before planning,
    reserving or merging anything. Anything else (no entry, an entry changed or gone, the
    store failing) goes down the path as if nothing were kept."""

    def __init__(self, memo: AnswerMemo, store: Callable[[], PieceStore], ident: str,
                 next: Stage[Query, Answer], tagged: Tagged | None = None) -> None:
        self.memo = memo
        self.store = store
        self.ident = ident
        self.next = next
        self.tagged = tagged  # the cells the reader holds with tags (CacheReader.tagged)

    async def __call__(self, q: Query) -> Answer:
        if not self.memo.max_bytes or not eligible(q):
            return await self.next(q)
        entry = self.memo.recallable(memo_key(q, self.ident), self.tagged)
        if entry is None or entry.deps is None:
            return await self.next(q)
        deps, encoded = entry.deps, entry.encoded
        if not await self.store().unchanged(deps.keys, deps.tags):
            return await self.next(q)
        METRICS.answer_memo.labels("recalled").inc()
        METRICS.cache.labels("hit").inc()
        ACTIVITY.pieces_looked_up(len(deps.keys), 0, q.ctx.caller.record)
        return Answer(encoded=encoded, headers=dict(entry.headers), info={"answer_memo": "recalled"})
