"""proxy/pipeline/raw_fetch.py: a straddling window's raw samples, read from the stores that
hold its stretches, in chunks cut on absolute hours (days for long stretches), concatenated per
series; chunks cached (old ones only, none with a warning, each within the query's allowance
of new entries) so a refresh reads again only what is missing; the samples gathered bounded.
Fake stores answer the matrix selectors from a known series; an in-process piece store."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
import pytest

from proxy.cache import MemoryStore
from proxy.config import Config, load_config
from proxy.errors import PromError
from proxy.pipeline.context import Budget, RequestContext
from proxy.pipeline.raw_fetch import DAY_MS, HOUR_MS, RawCache, fetch_raw, window_parts
from proxy.result import QueryResult
from shardplanner.holdings import BackendHolding
from shardplanner.promql import parse
from tests.codec.reference import ref_ts, ref_value

SCRAPE = 15_000
T = 1_600_000_000_000 // HOUR_MS * HOUR_MS + 20 * 60_000  # 20 min past an hour, in 2020: old data
AMP = BackendHolding("amp", ("*",), until_ms=T + 30 * 60_000)
LOCAL = BackendHolding("local", ("*",), since_ms=T, primary=True)
HOLDINGS = [LOCAL, AMP]
SEL = parse('DCGM_FI_DEV_GPU_UTIL{Hostname="node-1"}')


def value_at(store: str, t: int) -> float:
    """The stores' copies differ by a half, so each sample tells which store it came from."""
    return t / 1000 + (0.5 if store == "local" else 0.0)


@dataclass
class FakeStore:
    """A backend holding one series scraped every 15 s; answers `sel[range]` at `time` with the
    samples in [time - range, time] (both ends, as Prometheus 2), as Prometheus's JSON."""

    name: str
    url: str
    delay_s: float = 0.0
    result_type: str = "matrix"
    warnings: list[str] = field(default_factory=list)
    asked: list[tuple[str, int]] = field(default_factory=list)
    cancelled: int = 0

    def __post_init__(self) -> None:
        self.cfg = load_config(None, backends=[self.url]).backends[0]

    async def request(self, method: str, path: str, *, form: Any, check: Any = None, **kw: Any) -> Any:
        from proxy.backends.protocol import BackendReply

        f = dict(form)
        t = int(Decimal(f["time"]) * 1000)
        self.asked.append((f["query"], t))
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        sel = parse(f["query"])
        lo = t - sel.range_ms
        ts = range(math.ceil(lo / SCRAPE) * SCRAPE, t + 1, SCRAPE)
        values = ",".join(f'[{ref_ts(x)},"{ref_value(value_at(self.name, x))}"]' for x in ts)
        if self.result_type == "matrix":
            result = '[{"metric":{"Hostname":"node-1","__name__":"DCGM_FI_DEV_GPU_UTIL"},"values":[' + values + "]}]"
        else:
            result = "[]"
        body = ('{"status":"success","data":{"resultType":"' + self.result_type + '","result":' + result + "}"
                + (',"warnings":' + orjson.dumps(self.warnings).decode() if self.warnings else "") + "}").encode()
        reply = BackendReply(200, body, "application/json")
        if check is not None:
            assert check(reply) is None
        return reply


def stores(**kw: Any) -> dict[str, FakeStore]:
    return {"local": FakeStore("local", "http://127.0.0.1:1", **kw), "amp": FakeStore("amp", "http://127.0.0.1:2", **kw)}


@dataclass
class FakeWriter:
    """The cache writer's background tasks (awaited by the test)."""

    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def spawn(self, coro: Any, ctx: Any = None) -> bool:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))
        return True


def config() -> Config:
    return load_config(None, backends=["http://127.0.0.1:1"])


def fetch(lo: int, hi: int, backends: dict[str, FakeStore], *, max_samples: int = 0, cache: RawCache | None = None,
          ctx: RequestContext | None = None, tally: dict[str, int] | None = None,
          holdings: list[BackendHolding] = HOLDINGS) -> QueryResult:
    async def main() -> QueryResult:
        parts = window_parts(holdings, SEL, lo, hi)
        out = await fetch_raw(SEL, parts, backends, 5.0, max_samples, ctx or RequestContext(),  # type: ignore[arg-type]
                              cache, tally)
        if cache is not None:
            await asyncio.gather(*cache.writer.tasks)  # type: ignore[attr-defined]
        return out

    return asyncio.run(main())


def expected(lo: int, hi: int) -> list[tuple[int, float]]:
    """The samples in [lo, hi], each from the store window_parts gives its stretch."""
    out = []
    for store, a, b in window_parts(HOLDINGS, SEL, lo, hi):
        out += [(t, value_at(store, t)) for t in range(math.ceil(a / SCRAPE) * SCRAPE, b + 1, SCRAPE)]
    return out


def samples(r: QueryResult) -> list[tuple[int, float]]:
    [(labels, ts, vs)] = r.to_pylist()
    assert labels == {"Hostname": "node-1", "__name__": "DCGM_FI_DEV_GPU_UTIL"}
    return list(zip(ts, vs))


# --- window_parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(("lo", "hi"), [(T - 3 * HOUR_MS, T + 2 * HOUR_MS), (T - 1, T), (T + 1, T + 10),
                                        (T - 5 * DAY_MS, T + HOUR_MS), (T - HOUR_MS - 7, T - 7)])
def test_window_parts_partition_the_window_on_absolute_hours(lo: int, hi: int) -> None:
    parts = window_parts(HOLDINGS, SEL, lo, hi)
    assert parts[0][1] == lo and parts[-1][2] == hi
    for (_, _, b), (_, c, _) in zip(parts, parts[1:]):
        assert c == b + 1  # disjoint and nothing left out
    for store, a, b in parts:
        # A chunk never crosses an absolute hour (a day, for a stretch longer than a day).
        size = HOUR_MS if hi - lo <= DAY_MS else DAY_MS
        assert a // size == b // size
        holding = LOCAL if store == "local" else AMP
        assert (holding.since_ms or -math.inf) <= a and b <= (holding.until_ms or math.inf)
    # The primary answers where both hold the data.
    assert all(store == "local" for store, a, _ in parts if a >= T)


def test_a_long_stretch_is_cut_in_days() -> None:
    old = [BackendHolding("amp", ("*",))]
    parts = window_parts(old, SEL, T - 10 * DAY_MS, T)
    assert 10 <= len(parts) <= 11
    assert all(b - a + 1 <= DAY_MS and a // DAY_MS == b // DAY_MS for _, a, b in parts)


def test_names_held_by_different_stores_over_the_window_are_refused() -> None:
    holdings = [BackendHolding("amp", ("DCGM_.*",), until_ms=T), BackendHolding("local", ("node_.*",), primary=True)]
    sel = parse('{__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"}')
    with pytest.raises(PromError, match="held by different stores"):
        window_parts(holdings, sel, T - HOUR_MS, T)


# --- fetch_raw ---------------------------------------------------------------------------------


def test_the_windows_samples_come_from_the_stores_that_hold_each_stretch() -> None:
    lo, hi = T - 2 * HOUR_MS - 7_000, T + HOUR_MS + 3_000
    backends = stores()
    got = samples(fetch(lo, hi, backends))
    assert got == expected(lo, hi)
    assert {p[0] for p in window_parts(HOLDINGS, SEL, lo, hi)} == {"amp", "local"}
    # Every sample once, in time order, none outside [lo, hi] (a stretch's edges are closed).
    ts = [t for t, _ in got]
    assert ts == sorted(set(ts)) and lo <= ts[0] and ts[-1] <= hi
    # One call per chunk, each at the chunk's end.
    asked = sorted(t for b in backends.values() for _, t in b.asked)
    assert asked == sorted(b for _, _, b in window_parts(HOLDINGS, SEL, lo, hi))


def test_the_selectors_offset_and_at_are_not_sent() -> None:
    sel = parse('DCGM_FI_DEV_GPU_UTIL{Hostname="node-1"} offset 1h @ 100')
    backends = stores()

    async def main() -> QueryResult:
        return await fetch_raw(sel, window_parts(HOLDINGS, sel, T - HOUR_MS, T), backends, 5.0, 0,  # type: ignore[arg-type]
                               RequestContext())

    asyncio.run(main())
    queries = [q for b in backends.values() for q, _ in b.asked]
    assert queries and all("offset" not in q and "@" not in q for q in queries)


def test_no_parts_no_calls() -> None:
    backends = stores()

    async def main() -> QueryResult:
        return await fetch_raw(SEL, [], backends, 5.0, 0, RequestContext())  # type: ignore[arg-type]

    r = asyncio.run(main())
    assert r.result_type == "matrix" and r.n_samples == 0
    assert all(not b.asked for b in backends.values())


def test_a_store_answering_with_something_else_than_a_matrix_is_an_error() -> None:
    with pytest.raises(PromError, match="not a matrix"):
        fetch(T - HOUR_MS, T, stores(result_type="vector"))


def test_the_samples_gathered_are_bounded_and_the_calls_in_flight_cancelled() -> None:
    lo, hi = T - 6 * HOUR_MS, T + 2 * HOUR_MS
    n = len(expected(lo, hi))
    assert samples(fetch(lo, hi, stores(), max_samples=n)) == expected(lo, hi)  # exactly the bound: fine
    slow = stores()
    slow["amp"].delay_s = 30.0  # the older chunks never come back in time
    # local's chunks alone are over the bound: the call fails at once, amp's calls cancelled.
    local_samples = sum(1 for t, _ in expected(lo, hi) if t >= T)
    assert local_samples > 100
    t0 = time.monotonic()
    with pytest.raises(PromError, match="limits.max_window_samples"):
        fetch(lo, hi, slow, max_samples=local_samples - 1)
    assert time.monotonic() - t0 < 10
    assert slow["amp"].asked and slow["amp"].cancelled == len(slow["amp"].asked)


# --- the chunk cache ---------------------------------------------------------------------------


def cache_for(store: MemoryStore) -> RawCache:
    return RawCache(config(), lambda: store, FakeWriter())  # type: ignore[arg-type]


def test_a_refresh_reads_cached_chunks_and_asks_nothing_again() -> None:
    store = MemoryStore(1 << 26)
    lo, hi = T - 20 * 60_000 - 3 * HOUR_MS, T + HOUR_MS  # from an hour boundary
    first_tally: dict[str, int] = {}
    backends = stores()
    first = samples(fetch(lo, hi, backends, cache=cache_for(store), tally=first_tally))
    n_parts = len(window_parts(HOLDINGS, SEL, lo, hi))
    assert first_tally == {"hit": 0, "miss": n_parts}
    again = stores()
    tally: dict[str, int] = {}
    second = samples(fetch(lo, hi, again, cache=cache_for(store), tally=tally))
    assert second == first == expected(lo, hi)
    assert tally == {"hit": n_parts, "miss": 0}
    assert all(not b.asked for b in again.values())
    # Two more hours before it: only their two chunks are asked for.
    wider = stores()
    tally = {}
    samples(fetch(lo - 2 * HOUR_MS, hi, wider, cache=cache_for(store), tally=tally))
    assert tally == {"hit": n_parts, "miss": 2}


def test_chunks_of_other_tenants_or_stores_are_not_shared() -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{Hostname="node-1"}[59m59s999ms]'
    base = RawCache.key(text, "amp#1", T, "")
    others = [RawCache.key(text, "amp#1", T, "tenant-a"), RawCache.key(text, "local#2", T, ""),
              RawCache.key(text, "amp#1", T + 1, ""), RawCache.key(text.replace("node-1", "node-2"), "amp#1", T, "")]
    assert len({k.digest for k in [base, *others]}) == 5


def test_recent_chunks_and_chunks_with_warnings_are_not_cached() -> None:
    now = int(time.time() * 1000)
    recent = [BackendHolding("local", ("*",), primary=True)]
    store = MemoryStore(1 << 26)

    async def main(backends: dict[str, FakeStore], lo: int, hi: int, holdings: list[BackendHolding]) -> None:
        cache = cache_for(store)
        await fetch_raw(SEL, window_parts(holdings, SEL, lo, hi), backends, 5.0, 0, RequestContext(), cache)  # type: ignore[arg-type]
        await asyncio.gather(*cache.writer.tasks)  # type: ignore[attr-defined]

    asyncio.run(main(stores(), now - 5 * 60_000, now, recent))  # the last 5 minutes: still changing
    asyncio.run(main(stores(warnings=["partial data"]), T - HOUR_MS, T - 1, HOLDINGS))
    assert store.stats()["stored"] == 0
    asyncio.run(main(stores(), T - HOUR_MS, T - 1, HOLDINGS))  # the control: old and clean
    assert store.stats()["stored"] == 2


def test_each_new_chunk_counts_against_the_querys_allowance_of_new_entries() -> None:
    store = MemoryStore(1 << 26)
    ctx = RequestContext(budget=Budget(max_keys=2))
    fetch(T - 4 * HOUR_MS, T - 1, stores(), cache=cache_for(store), ctx=ctx)
    assert store.stats()["stored"] == 2 and ctx.budget.keys == 2
