"""Background revalidation: cached pieces heal by themselves when late data arrives.

With `cache.revalidate_interval` > 0, every piece this process stores is paired with a
digest of the samples it reads (`footprint.digest_query`: per selector, count_over_time and
sum_over_time over the piece's whole read window, evaluated once). The digest is taken
*before* the piece's own backend call, so any sample that reaches the backend after the
piece was computed changes the digest. Every `revalidate_interval`, pieces stored within
the last `revalidate_max_age` are re-digested; when a digest changed, the affected entries
are dropped with `store.invalidate(metrics, start, end)` -- every entry of those metrics
over that window, not only this one, since all of them read the changed data.

What this does not catch: data that changes after `revalidate_max_age`; pieces stored by
another proxy (each proxy revalidates what it stored); a change that keeps both the count and
the sum of every selector's samples (a value moved between two series of one selector).
A digest that fails (backend down) leaves the entry alone until the next pass; a piece
whose baseline digest fails is not cached at all.

Tenancy (`tenancy.forward_headers`): a record remembers the forwarded headers of the
request that stored the piece (in memory, never persisted) and the background pass takes
its digests with them, so a tenant's piece is checked against that tenant's view; records
of different tenants are kept apart. A change drops the entries of every tenant over that
window (the invalidation is by metric and time), which costs hits, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import orjson
from prometheus_client import Counter

from ..backends import Backend, tenancy
from ..backends.tenancy import NOBODY, Caller
from ..errors import PromError
from ..observe.metrics import METRICS

log = logging.getLogger("promaccel.revalidate")

REVALIDATIONS = Counter(
    "promaccel_cache_revalidations_total",
    "Digest checks of cached pieces by outcome (unchanged, changed, failed)",
    ["result"],
    registry=METRICS.registry,
)

# How many digest queries run at once (baseline and background passes alike).
DIGEST_PARALLEL = 2


@dataclass
class Record:
    query: str
    time_ms: int
    baseline: bytes
    metrics: tuple[str, ...]
    start_ms: int
    end_ms: int
    recorded_at: float
    backend: str = ""  # "" : the default backend
    # The tenant the piece was fetched for (tenancy.forward_headers and their scope): its
    # digests are taken with the same headers. Kept in process memory only.
    tenant: tenancy.Tenant = tenancy.NO_TENANT


def _seconds(ms: int) -> str:
    sign = "-" if ms < 0 else ""
    whole, frac = divmod(abs(ms), 1000)
    return f"{sign}{whole}.{frac:03d}" if frac else f"{sign}{whole}"


def normalise(body: bytes | bytearray) -> bytes | None:
    """A digest answer as comparable bytes (series sorted), or None if it is not a success."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("status") != "success" or doc.get("warnings"):
        return None
    data = doc.get("data") or {}
    rows = sorted(
        (orjson.dumps(r.get("metric") or {}, option=orjson.OPT_SORT_KEYS), str((r.get("value") or [0, ""])[1]))
        for r in data.get("result") or []
        if isinstance(r, dict)
    )
    return orjson.dumps([[m.decode(), v] for m, v in rows])


# Drops the cached entries of these metrics (None: any) overlapping [start_ms, end_ms]; the
# number dropped (the service's `invalidate`, which every tenant's service shares).
Invalidate = Callable[[Sequence[str] | None, int, int], Awaitable[int]]


class Revalidator:
    def __init__(
        self,
        backend: Backend,
        invalidate: Invalidate,
        *,
        interval_ms: int,
        max_age_ms: int,
        max_entries: int,
        backends: Mapping[str, Backend] | None = None,
    ) -> None:
        # Hybrid fleets: a piece's digest is taken on the backend that answered it.
        self.backend = backend
        self.backends = dict(backends or {})
        self._invalidate = invalidate
        self.interval_s = interval_ms / 1000
        self.max_age_s = max_age_ms / 1000
        self.max_entries = max_entries
        self._records: OrderedDict[tuple[str, int, str], Record] = OrderedDict()
        self._sem = asyncio.Semaphore(DIGEST_PARALLEL)
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[bool]] = set()
        self.stats = {"checked": 0, "changed": 0, "failed": 0, "passes": 0}

    def __len__(self) -> int:
        return len(self._records)

    # Digests -----------------------------------------------------------------------------

    async def digest(self, query: str, time_ms: int, timeout_s: float = 30.0, backend: str = "",
                     caller: Caller = NOBODY) -> bytes | None:
        """The digest of `query` at `time_ms`, asked of `backend` for `caller` (with its tenant's
        headers: the storing request's, or a record's own on a pass)."""
        target = self.backends.get(backend, self.backend) if backend else self.backend
        try:
            async with self._sem:
                reply = await target.request(
                    "POST", "/api/v1/query", form=[("query", query), ("time", _seconds(time_ms))],
                    timeout_s=timeout_s, endpoint="digest", caller=caller,
                )
        except PromError as exc:
            log.debug("digest query failed: %s", exc)
            return None
        return normalise(reply.body) if reply.ok else None

    async def baselines(self, wanted: Sequence[tuple[str, int]], timeout_s: float,
                        backend: str = "", caller: Caller = NOBODY) -> dict[tuple[str, int], bytes]:
        """Digests of `wanted` (query, time) pairs, taken now for `caller`; failed ones are
        left out."""
        unique = list(dict.fromkeys(wanted))
        answers = await asyncio.gather(*(self.digest(q, t, timeout_s, backend, caller) for q, t in unique))
        return {k: a for k, a in zip(unique, answers) if a is not None}

    def record(self, query: str, time_ms: int, baseline: bytes, metrics: tuple[str, ...],
               start_ms: int, end_ms: int, backend: str = "", tenant: tenancy.Tenant = tenancy.NO_TENANT) -> None:
        """A baseline digest taken for `tenant` (the storing request's: its passes ask as it)."""
        who = tenant
        key = (query, time_ms, who.scope)
        old = self._records.pop(key, None)
        if old is not None and old.baseline != baseline:
            # The same data digested twice with different answers: whatever was cached with
            # the older baseline is stale.
            REVALIDATIONS.labels("changed").inc()
            self.stats["changed"] += 1
            task = asyncio.get_running_loop().create_task(self._drop(old))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        self._records[key] = Record(query, time_ms, baseline, metrics, start_ms, end_ms, time.monotonic(), backend,
                                    who)
        while len(self._records) > self.max_entries:
            self._records.popitem(last=False)

    def forget_all(self) -> None:
        self._records.clear()

    # Passes ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="promaccel-revalidate")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop revalidation for good
                log.exception("revalidation pass failed")

    async def run_pass(self) -> int:
        """Re-digest every recent record; returns how many changed."""
        self.stats["passes"] += 1
        now = time.monotonic()
        for key in [k for k, r in self._records.items() if now - r.recorded_at > self.max_age_s]:
            del self._records[key]
        records = list(self._records.values())
        answers = await asyncio.gather(*(self._digest_as(r) for r in records))
        changed = 0
        for rec, answer in zip(records, answers):
            if answer is None:
                REVALIDATIONS.labels("failed").inc()
                self.stats["failed"] += 1
                continue
            self.stats["checked"] += 1
            if answer == rec.baseline:
                REVALIDATIONS.labels("unchanged").inc()
                continue
            REVALIDATIONS.labels("changed").inc()
            self.stats["changed"] += 1
            changed += 1
            key = (rec.query, rec.time_ms, rec.tenant.scope)
            if self._records.get(key) is rec and await self._drop(rec):
                # Dropped: the next fetch of these pieces records a new baseline. Kept when
                # the store could not be reached, so the next pass tries again.
                del self._records[key]
        return changed

    async def _digest_as(self, rec: Record) -> bytes | None:
        return await self.digest(rec.query, rec.time_ms, backend=rec.backend, caller=Caller(rec.tenant))

    async def _drop(self, rec: Record) -> bool:
        try:
            n = await self._invalidate(rec.metrics or None, rec.start_ms, rec.end_ms)
        except PromError as exc:
            log.warning("could not drop changed pieces: %s", exc)
            return False
        log.info("data under cached pieces changed (%s, %d..%d ms): dropped %d entries",
                 ",".join(rec.metrics) or "any metric", rec.start_ms, rec.end_ms, n)
        return True
