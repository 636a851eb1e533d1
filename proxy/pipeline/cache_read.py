"""Reading cached pieces: one batched lookup per query (landing zone first, then the store),
decoded once for lookups that joined one read, off the event loop when large; zooming out
from a finer step's cells."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

try:
    from isal.isal_zlib import adler32 as _adler32
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover -- zlib's are the same checksums, slower
    from zlib import adler32 as _adler32
    from zlib import crc32 as _crc32

from shardplanner.plan import Span
from shardplanner.timesplit import day_cell, day_cells_fit

from ..cache import CacheKey, Payload, PieceStore
from ..codec import arrow
from ..config import Config
from ..errors import PromError
from ..observe.activity import ACTIVITY, QueryRecord
from ..observe.metrics import METRICS
from ..result import QueryResult
from ..result.pieces import slice_time, subsample
from .hybrid.router import Router
from .landing import Landing
from .slots import SlotMaker
from .units import Slot, cell_of
from .values import CacheCtx

log = logging.getLogger("promaccel.cache")

# Cached payloads of one lookup above this many bytes are decoded in a worker thread.
DECODE_IN_THREAD_BYTES = 256 * 1024
# Decoded cells kept for the next lookup of the same payload, at most this many samples in
# all (cache.decoded_max_samples's default; the reader takes the configured value): a
# dashboard's refresh reads the same cells again.
DECODED_MAX_SAMPLES = 2_500_000
# Room above 24 bytes a sample for a kept cell's payload (its labels, Arrow's framing).
MEMO_SLACK_BYTES = 1 << 20
# Cells this process stored, kept after they left the landing zone for the first read of
# their key (`DecodedCells.adopt`): at most this many samples in all (~4 MiB of columns,
# as the landing zone's grace), for at most this long (a dashboard refreshes every 10 s to
# a few minutes).
ADOPT_MAX_SAMPLES = 1 << 18
ADOPT_WITHIN_S = 300.0


# What tells a kept cell's payload from one that changed: its frame's tag (the frame MAC,
# from a store that authenticates frames: reading the tag alone tells, store.get_tagged) or
# the payload's length and checksum (`payload_signature`).
Signature = bytes | tuple[int, int]


def payload_signature(payload: Payload) -> tuple[int, int]:
    """A payload's length and a 64-bit checksum of it (CRC-32 and Adler-32): what tells a
    cell read again from one that changed (both were authenticated by the store). ~5x
    cheaper than hash() with ISA-L's checksums: a warm 24 h panel reads megabytes a refresh."""
    return len(payload), (_crc32(payload) << 32) | _adler32(payload)


class DecodedCells:
    """Decoded cache payloads by key digest, reused while the payload is byte for byte the same
    (its frame's tag, or its length and checksum, match: hashing is ~100x cheaper than
    decoding Arrow IPC, and comparing a 32-byte tag needs no payload at all). Bounded by
    samples, least recently used first out."""

    def __init__(self, max_samples: int = DECODED_MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._cells: OrderedDict[str, tuple[Signature, QueryResult]] = OrderedDict()
        self._samples = 0
        # digest -> (when, cell): cells this process fetched and stored, for the first read
        # of their key (`adopt`).
        self._adopted: OrderedDict[str, tuple[float, QueryResult]] = OrderedDict()
        self._adopted_samples = 0

    def tagged(self, digest: str) -> tuple[bytes, QueryResult] | None:
        """The kept cell of `digest` and its frame's tag, when it was kept with one: a store
        that tags frames is asked whether the entry still is that frame (store.get_tagged)."""
        cell = self._cells.get(digest)
        if cell is None or not isinstance(cell[0], bytes):
            return None
        return cell[0], cell[1]

    def hit(self, digest: str) -> None:
        """The kept cell of `digest` was used (store.get_tagged found its frame unchanged)."""
        if digest in self._cells:
            self._cells.move_to_end(digest)

    def get(self, digest: str, payload: Payload, tag: bytes | None = None) -> QueryResult | None:
        """The kept cell of `digest` if it was decoded from this payload (`tag`: the payload's
        frame tag, when the store gave one). A cell kept by checksum and found again by it
        is kept by `tag` from then on."""
        cell = self._cells.get(digest)
        if cell is None:
            return self._adopt_for(digest, payload, tag)
        kept = cell[0]
        if isinstance(kept, bytes) and tag is not None:
            if kept != tag:
                return None
        elif isinstance(kept, bytes) or not self.keeps(payload) or kept != payload_signature(payload):
            return None  # a tag and no tag to compare it with: decoded again, kept by checksum
        elif tag is not None:
            self._cells[digest] = (tag, cell[1])
        self._cells.move_to_end(digest)
        return cell[1]

    def adopt(self, digest: str, result: QueryResult) -> None:
        """A cell this process fetched and stored, leaving the landing zone: the first read
        of its key within ADOPT_WITHIN_S takes it as that payload's decoded cell (the payload
        was encoded from it, and the landing zone served it until now on the same terms)
        rather than decoding the payload again -- and writing its JSON again (the encoder
        keeps a cell's encoded samples on the cell: codec/json_splice.py). Without this, the
        first warm refresh after a miss paid both for every cell it read (issue 28)."""
        n = result.n_samples
        if n > min(self.max_samples // 4, ADOPT_MAX_SAMPLES // 4) or result.result_type != "matrix":
            return
        self._unadopt(digest)
        self._adopted[digest] = (time.monotonic(), result)
        self._adopted_samples += n
        while self._adopted_samples > ADOPT_MAX_SAMPLES:
            self._unadopt(next(iter(self._adopted)))

    def _unadopt(self, digest: str) -> tuple[float, QueryResult] | None:
        entry = self._adopted.pop(digest, None)
        if entry is not None:
            self._adopted_samples -= entry[1].n_samples
        return entry

    def _adopt_for(self, digest: str, payload: Payload, tag: bytes | None) -> QueryResult | None:
        entry = self._unadopt(digest) if self._adopted else None
        if entry is None or time.monotonic() - entry[0] > ADOPT_WITHIN_S or not self.keeps(payload):
            return None
        self.put(digest, tag if tag is not None else payload_signature(payload), entry[1])
        return entry[1]

    def keeps(self, payload: Payload) -> bool:
        """Whether the cell of `payload` may be kept: not when the payload is too large for a
        cell of at most a quarter of `max_samples` (an Arrow payload holds at most 20 bytes a
        sample, uncompressed, plus its labels), whose signature is then not worth hashing."""
        return len(payload) <= 24 * (self.max_samples // 4) + MEMO_SLACK_BYTES

    def put(self, digest: str, signature: Signature, result: QueryResult) -> None:
        """Keep `result`, decoded from a payload of `signature` (its frame's tag, or
        `payload_signature()`)."""
        n = result.n_samples
        if n > self.max_samples // 4:
            return  # a large cell would push out a whole dashboard's worth of small ones
        old = self._cells.pop(digest, None)
        if old is not None:
            self._samples -= old[1].n_samples
        result.keeps_json = True  # read again by later answers: its encoded samples are kept
        self._cells[digest] = (signature, result)
        self._samples += n
        while self._samples > self.max_samples:
            _, (_, gone) = self._cells.popitem(last=False)
            self._samples -= gone.n_samples

    def clear(self) -> None:
        self._cells.clear()
        self._samples = 0
        self._adopted.clear()
        self._adopted_samples = 0


class CacheReader:
    def __init__(self, config: Config, store: Callable[[], PieceStore], landing: Landing, slots: SlotMaker) -> None:
        self.config = config
        self.store = store
        self.landing = landing
        self.slots = slots
        # Decoded payloads: lookups that joined one read (50 users on one dashboard), and the
        # next refresh's lookups of the same cells, decode each payload once; the cells this
        # process stored are not decoded at all (`DecodedCells.adopt`).
        self.decoded = DecodedCells(config.cache.decoded_max_samples)
        landing.on_unland = self._adopt

    def tagged(self, digest: str) -> tuple[bytes, QueryResult] | None:
        """The cell this process holds for `digest` with its frame's tag: kept decoded, or
        landed and stored (the landing zone knows the tag the store wrote)."""
        return self.decoded.tagged(digest) or self.landing.tagged(digest)

    def _adopt(self, digest: str, result: QueryResult) -> None:
        pack_from = self.config.cache.pack_min_samples
        if pack_from and result.n_samples >= pack_from:
            return  # read back packed (cache.pack_min_samples), as before
        self.decoded.adopt(digest, result)

    async def lookup(self, slots: Sequence[Slot]) -> None:
        """Fill the slots that the landing zone or the store can answer (one get_many)."""
        wanted: dict[str, CacheKey] = {}
        for s in slots:
            if s.keys:
                s.status = "miss"
                for k in s.keys:
                    wanted.setdefault(k.digest, k)
        if not wanted:
            return
        found: dict[str, QueryResult] = {}
        for digest in wanted:
            landed = self.landing.landed(digest)
            if landed is not None:
                found[digest] = landed
        rest = [k for d, k in wanted.items() if d not in found]
        if rest:
            found.update(await self.read(rest))
        for s in slots:
            for k in s.keys:
                r = found.get(k.digest)
                if r is None:
                    continue
                span = s.piece.span
                if span.is_range:
                    if r.result_type != "matrix":
                        continue
                    if k.span != span:
                        # A kept cell (held by self.decoded anyway) is cut lazily: the
                        # answer is spliced from its bytes, the cut's samples never read.
                        # Any other is cut now, so that it can go: a lazy cut holds its cell
                        # until the answer is written (scenario (e)'s cold heavy queries
                        # would hold their landed cells through their answers).
                        r = slice_time(r, span.start_ms, span.end_ms, lazy=r.keeps_json)
                s.result, s.status, s.answered_by = r, "hit", k.digest
                break

    async def read(self, keys: Sequence[CacheKey]) -> dict[str, QueryResult]:
        """The cells of `keys` in the store, decoded (misses and undecodable entries left
        out), by key digest. A cell kept decoded with its frame's tag is only checked to be
        unchanged (store.get_tagged: 32 bytes read, no MAC to verify, nothing to decode);
        an entry that is gone or changed is a miss or is read whole, so what another process
        invalidated or wrote again is never served from here."""
        held = [self.decoded.tagged(k.digest) for k in keys]
        reads = await self.store().get_tagged(keys, [h[0] if h is not None else None for h in held])
        found: dict[str, QueryResult] = {}
        todo_keys: list[CacheKey] = []
        payloads: list[Payload | None] = []
        tags: list[bytes | None] = []
        for k, h, t in zip(keys, held, reads):
            if t.same and h is not None and t.tag == h[0]:
                found[k.digest] = h[1]
                self.decoded.hit(k.digest)
            elif t.payload is not None:
                todo_keys.append(k)
                payloads.append(t.payload)
                tags.append(t.tag)
        reads.clear()
        found.update(await self.decode(todo_keys, payloads, tags))
        return found

    async def decode(self, keys: Sequence[CacheKey], payloads: Sequence[Payload | None],
                     tags: Sequence[bytes | None] | None = None) -> dict[str, QueryResult]:
        """Payloads read from the store for `keys` (`tags`: their frames' tags, when the
        store gave them), decoded (None and undecodable ones left out), by key digest."""
        found: dict[str, QueryResult] = {}
        todo_keys: list[tuple[CacheKey, Signature | None]] = []
        todo: list[Payload | None] = []
        for i, (k, payload) in enumerate(zip(keys, payloads)):
            if payload is None:
                continue
            tag = tags[i] if tags is not None else None
            memo = self.decoded.get(k.digest, payload, tag)
            if memo is not None:
                found[k.digest] = memo
            elif not self.decoded.keeps(payload):
                todo_keys.append((k, None))
                todo.append(payload)
            else:
                todo_keys.append((k, tag if tag is not None else payload_signature(payload)))
                todo.append(payload)
        if isinstance(payloads, list):
            payloads.clear()  # consumed: each payload goes once decoded (see decode_payloads)
        outcomes = await decode_off_loop(todo, consume=True, pack_from=self.config.cache.pack_min_samples)
        for (k, signature), out in zip(todo_keys, outcomes):
            if isinstance(out, Exception):  # an undecodable entry is a miss
                METRICS.cache_errors.labels("decode").inc()
                log.warning("cached piece %s does not decode (%s): treated as a miss", k.digest[:16], out)
                continue
            found[k.digest] = out
            if signature is not None:
                self.decoded.put(k.digest, signature, out)
        return found

    async def lookup_finer(self, slots: Sequence[Slot], ctx: CacheCtx, router: Router | None) -> None:
        """Zooming out: a missing range piece at step S is answered by the cached cell of the
        same query at a finer step s (s divides S; `cache.reuse_finer_steps`), subsampled.
        Exact: a range query's value at t does not depend on its step (the planner pins
        `@ start()`/`end()` into the query text, which is part of the key), and the finer
        grid `start mod s` holds every point `start + k*S`. One extra batched lookup, only
        for pieces that missed."""
        interval = self.slots.split_interval_ms
        if not interval:
            return
        wanted: dict[str, CacheKey] = {}
        candidates: list[tuple[Slot, list[CacheKey]]] = []
        for s in slots:
            p = s.piece
            span = p.span
            if s.result is not None or not s.keys or not span.is_range:
                continue
            keys: list[CacheKey] = []
            for fine in self.config.cache.reuse_finer_steps:
                if fine >= span.step or span.step % fine:
                    continue
                cells = [cell_of(span.start_ms, fine, interval)]
                if s.day is not None and day_cells_fit(fine, interval, self.config.limits.max_points):
                    cells.insert(0, day_cell(span.start_ms, span.start_ms, fine))  # the finer day cell first
                for c0, c1 in cells:
                    if span.start_ms < c0 or span.end_ms > c1:
                        continue
                    try:
                        u = self.slots.unit(p, Span.range(c0, c1, fine), ctx, router)
                    except PromError:
                        continue
                    if u.key is not None and u.storable:
                        keys.append(u.key)
                        wanted.setdefault(u.key.digest, u.key)
            if keys:
                candidates.append((s, keys))
        if not wanted:
            return
        found: dict[str, QueryResult] = {}
        rest = []
        for digest, k in wanted.items():
            landed = self.landing.landed(digest)
            if landed is not None:
                found[digest] = landed
            else:
                rest.append(k)
        if rest:
            got = [(k, p) for k, p in zip(rest, await self.store().get_many(rest)) if p is not None]
            for (k, _), out in zip(got, decode_payloads([p for _, p in got])):
                if isinstance(out, Exception):  # an undecodable entry is a miss
                    METRICS.cache_errors.labels("decode").inc()
                else:
                    found[k.digest] = out
        for s, keys in candidates:
            for k in keys:
                r = found.get(k.digest)
                if r is None or r.result_type != "matrix":
                    continue
                span = s.piece.span
                s.result, s.status = subsample(r, span.start_ms, span.end_ms, span.step), "hit"
                METRICS.cache_finer_step.inc()
                break

    def count(self, slots: Sequence[Slot], record: QueryRecord | None = None) -> str:
        """X-Cache value for an answer; counts the query in promaccel_cache_lookups_total (and on
        the operator page, in `record`: the query's)."""
        keyed = sum(1 for s in slots if s.keys)
        hits = sum(1 for s in slots if s.status == "hit")
        status = "HIT" if slots and hits == len(slots) else "PARTIAL" if hits else "MISS"
        if keyed:
            METRICS.cache.labels(status.lower()).inc()
            ACTIVITY.pieces_looked_up(hits, keyed - hits, record)
        return status


async def decode_off_loop(payloads: list[Payload | None], consume: bool = False,
                          pack_from: int = 0) -> list[QueryResult | Exception]:
    """`decode_payloads`, in a worker thread when they are large: a warm 24 h panel (or a
    long straddling window's raw samples) reads megabytes, and Arrow's decompression
    releases the GIL, so other requests go on meanwhile."""
    if sum(len(p) for p in payloads if p is not None) > DECODE_IN_THREAD_BYTES:
        return await asyncio.to_thread(decode_payloads, payloads, consume, pack_from)
    return decode_payloads(payloads, consume, pack_from)


def decode_payloads(payloads: list[Payload | None], consume: bool = False,
                    pack_from: int = 0) -> list[QueryResult | Exception]:
    """Cached pieces back to results; a payload that does not decode gives its exception.
    `consume`: each payload is let go (its slot set to None) as soon as it is decoded, so
    a heavy panel's compressed cells (~30 MB for 24 h of 2,048 GPUs) do not all stay beside
    their decoded arrays until the last one is done (issue 15). `pack_from` > 0: cells of
    that many samples or more stay packed (`cache.pack_min_samples`)."""
    out: list[QueryResult | Exception] = []
    for i, payload in enumerate(payloads):
        if consume:
            payloads[i] = None
        try:
            if payload is None:
                raise ValueError("no payload")
            r = arrow.from_ipc_bytes(payload, pack_from=pack_from)
            if pack_from and r.packed_samples() is not None:
                METRICS.cells_packed.labels("read").inc()
            out.append(r)
        except Exception as exc:  # noqa: BLE001 -- reported by the caller as a miss
            out.append(exc)
    return out
