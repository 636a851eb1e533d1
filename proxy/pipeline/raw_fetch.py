"""Raw samples of one selector over a sample window, from the stores that hold its parts.

A range function whose window straddles two stores (AMP until 2 h ago, the local Prometheus
since 3 h ago) cannot be asked of either. Its samples can: the window is cut among the
stores that hold the metric (`shardplanner.coverage.partition_window`: each stretch to the
preferred holder, the primary where they overlap), each stretch is asked as a matrix
selector at an instant (`x[3599999ms]` at the stretch's end returns the samples in
[end - 3599999ms, end], both ends included as in Prometheus 2), and the stretches are
concatenated per series. Stale markers never appear in a range vector, so none is lost.

Stretches are asked in chunks cut on absolute hours (days for a stretch longer than a day:
AMP refuses instant queries that read 32 days or more, and a chunk keeps each answer
bounded). Each chunk is cached like a piece (`RawCache`: keyed by its selector, times,
backend and tenant; old data for `cache.ttl`, recent data for `cache.recent_ttl`), so a
dashboard refresh reads again only the chunks at the live edge. The samples gathered are
bounded by `limits.max_window_samples` (or `limits.max_samples` if lower).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from shardplanner.ast import MatrixSel, Selector
from shardplanner.coverage import partition_window
from shardplanner.holdings import BackendHolding
from shardplanner.plan import Span
from shardplanner.read_windows import listed_names
from shardplanner.serialize import to_promql

from ..backends import Backend
from ..cache import CacheItem, CacheKey, Payload, PieceMeta, PieceStore, ttl_for
from ..codec import arrow
from ..config import Config
from ..errors import PromError
from ..observe.metrics import METRICS
from ..primitives.clock import wall_ms
from ..result import QueryResult
from ..result.merge import concat
from ..result.pieces import slice_time
from .ask import Asker, query_call
from .cache_read import decode_off_loop
from .cache_write import CacheWriter
from .context import RequestContext

HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def window_parts(holdings: Sequence[BackendHolding], selector: Selector, lo_ms: int,
                 hi_ms: int) -> list[tuple[str, int, int]]:
    """The calls that fetch `selector`'s samples in `[lo_ms, hi_ms]`: (backend, from, to),
    cut on absolute hours (days for a stretch longer than a day), in time order."""
    names = listed_names(selector) or (selector.metric_name,)
    cuts = {tuple(partition_window(holdings, n, lo_ms, hi_ms)) for n in names}
    if len(cuts) > 1:
        raise PromError("execution", f"the metrics of {to_promql(selector)} are held by different stores over the "
                        "window of a range function: not supported")
    out: list[tuple[str, int, int]] = []
    for name, a, b in cuts.pop():
        size = HOUR_MS if b - a <= DAY_MS else DAY_MS
        while a <= b:
            end = min(b, a - a % size + size - 1)
            out.append((name, a, end))
            a = end + 1
    return out


class RawCache:
    """Raw-sample chunks in the piece store (see the module docstring)."""

    def __init__(self, config: Config, store: Callable[[], PieceStore], writer: CacheWriter) -> None:
        self.config = config
        self.store = store
        self.writer = writer

    @staticmethod
    def key(text: str, ident: str, end_ms: int, scope: str) -> CacheKey:
        """The key of a chunk of raw samples read by `text` up to `end_ms` from the backend
        `ident`, for the tenant `scope`."""
        return CacheKey(text, Span.instant(end_ms), lookback_ms=0, route=(ident,), tenant=scope)

    async def get(self, keys: Sequence[CacheKey]) -> list[QueryResult | None]:
        try:
            payloads = await self.store().get_many(keys)
        except Exception:  # noqa: BLE001 -- the store reports its own trouble; fetch instead
            return [None] * len(keys)
        found: list[Payload | None] = [p for p in payloads if p is not None]
        decoded = iter(await decode_off_loop(found))  # an undecodable entry is a miss
        out: list[QueryResult | None] = []
        for p in payloads:
            r = next(decoded) if p is not None else None
            out.append(r if isinstance(r, QueryResult) else None)
        return out

    def keep(self, entries: Sequence[tuple[CacheKey, QueryResult, str | None, int, int]], fetched_at_ms: int,
             ctx: RequestContext) -> None:
        """Store fetched chunks in the background (old ones for cache.ttl, recent ones for
        cache.recent_ttl; none with a warning; each counts against limits.max_new_cache_keys)."""
        now = wall_ms()
        kept = []
        budget = ctx.budget
        for key, result, metric, a, b in entries:
            ttl = ttl_for(b, now, self.config.cache)
            if not ttl or result.warnings or not budget.new_key():
                continue
            kept.append((key, result, ttl, PieceMeta((metric,) if metric else (), a, b, fetched_at_ms)))
        if kept and not self.writer.spawn(self._put(kept), ctx):
            METRICS.cache_puts.labels(self.store().kind, "dropped").inc(len(kept))

    async def _put(self, kept: list[tuple[CacheKey, QueryResult, int, PieceMeta]]) -> None:
        def encode() -> list[CacheItem]:
            return [CacheItem(k, arrow.to_ipc_view(r), ttl, meta) for k, r, ttl, meta in kept]

        big = sum(r.n_samples for _, r, _, _ in kept) > 50_000
        items = await asyncio.to_thread(encode) if big else encode()
        try:
            await self.store().put_many(items)
        except Exception:  # noqa: BLE001 -- the store reports its own trouble; the answer stands
            return


async def fetch_raw(selector: Selector, parts: Sequence[tuple[str, int, int]], backends: Mapping[str, Backend],
                    timeout_s: float, max_samples: int, ctx: RequestContext, cache: RawCache | None = None,
                    tally: dict[str, int] | None = None) -> QueryResult:
    """Every sample of `selector` (its offset and `@` ignored: the window is absolute) in the
    stretches `parts` (`window_parts`), per series, from the stores that hold them (or the
    cache), for the query of `ctx`. `tally`: counts the chunks read from the cache ("hit") and
    fetched ("miss")."""
    bare = replace(selector, offset_ms=0, at=None)
    if not parts:
        return QueryResult.empty("matrix")
    ask = Asker()
    texts = [to_promql(MatrixSel(bare, max(b - a, 1))) for _, a, b in parts]
    keys = [RawCache.key(t, backends[n].cfg.ident, b, ctx.scope) for t, (n, _, b) in zip(texts, parts)]
    results: list[QueryResult | None] = await cache.get(keys) if cache is not None else [None] * len(parts)
    fetched_at = wall_ms()

    async def one(i: int) -> QueryResult:
        name, a, b = parts[i]
        path, form = query_call(texts[i], Span.instant(b))
        got = await ask(backends[name], path, form, timeout_s, ctx)
        if got.result_type != "matrix":
            raise PromError("execution", f"backend {name!r} answered {texts[i]} with a {got.result_type}, not a matrix")
        return slice_time(got, a, b) if got.n_samples else got

    def over(total: int) -> PromError:
        return PromError("execution", f"the raw samples of {to_promql(bare)} over the window straddling the stores "
                         f"number {total} or more, more than the query may gather ({max_samples}: "
                         "limits.max_window_samples, or limits.max_samples if lower)")

    total = sum(r.n_samples for r in results if r is not None)
    if max_samples and total > max_samples:
        raise over(total)  # the cached chunks alone: nothing fetched
    missing = [i for i, r in enumerate(results) if r is None]
    if tally is not None:
        tally["hit"] = tally.get("hit", 0) + len(parts) - len(missing)
        tally["miss"] = tally.get("miss", 0) + len(missing)
    # The running total is checked as each chunk lands: over the bound, the chunks still in
    # flight are cancelled and nothing more is fetched or decoded.
    tasks = {asyncio.ensure_future(one(i)): i for i in missing}
    try:
        pending = set(tasks)
        while pending:
            done_now, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done_now:
                r = task.result()
                results[tasks[task]] = r
                total += r.n_samples
            if max_samples and total > max_samples:
                raise over(total)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        # Gathered with their errors kept: none is left "never retrieved".
        await asyncio.gather(*tasks, return_exceptions=True)
    fetched = [results[i] for i in missing]
    if cache is not None and missing:
        cache.keep([(keys[i], r, selector.metric_name, parts[i][1], parts[i][2])
                    for i, r in zip(missing, fetched) if r is not None], fetched_at, ctx)
    done = [r for r in results if r is not None]
    nonempty = [r for r in done if r.n_samples]
    if not nonempty:
        return QueryResult.empty("matrix")
    return concat(nonempty)  # stretches are disjoint in time: concat never sees a sample twice
