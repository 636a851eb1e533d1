"""proxy/cache/memory.py: the in-process store is an LRU bounded in bytes (entry overhead
included, so many tiny entries cannot exceed it), honours TTLs on a clock it is given,
drops what an invalidation covers (and puts of pieces fetched before it), and never stores
what its readers would refuse. Everything through the PieceStore API."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from proxy.cache import CacheItem, CacheKey, MemoryStore, Payload, PieceMeta
from proxy.cache.bound import PayloadLimits
from proxy.codec.arrow import to_ipc_bytes
from proxy.result import QueryResult
from shardplanner.plan import Span

H = 3_600_000
BASE = CacheKey(query="sum(rate(DCGM_FI_DEV_GPU_UTIL[5m]))", span=Span.range(0, H - 30_000, 30_000),
                route=("prometheus",))


class Clock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def key(i: int, **kw: Any) -> CacheKey:
    return dataclasses.replace(BASE, span=BASE.span.with_bounds(i * H, (i + 1) * H - 30_000), **kw)


def meta(clock: Clock, metrics: tuple[str, ...] = ("DCGM_FI_DEV_GPU_UTIL",), start: int = 0, end: int = H,
         fetched_at: int | None = None) -> PieceMeta:
    return PieceMeta(metrics, start, end, clock.now if fetched_at is None else fetched_at)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def get(store: MemoryStore, keys: Sequence[CacheKey]) -> list[bytes | None]:
    got: list[Payload | None] = run(store.get_many(keys))
    return [None if p is None else bytes(p) for p in got]


def put(store: MemoryStore, *items: CacheItem) -> None:
    run(store.put_many(items))


def payload(i: int, size: int = 100) -> bytes:
    return (f"payload-{i}-".encode() * size)[:size]


def test_a_stored_piece_is_read_back_byte_for_byte_under_its_own_key_only() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0), 60_000, meta(clock)), CacheItem(key(1), payload(1), 60_000, meta(clock)))
    assert get(store, [key(1), key(0), key(2), dataclasses.replace(key(0), tenant="other")]) == [
        payload(1), payload(0), None, None]
    stats = store.stats()
    assert (stats["hits"], stats["misses"], stats["stored"], stats["entries"]) == (2, 2, 2, 2)


def test_ttl_is_honoured_to_the_millisecond_on_the_given_clock() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0), 10_000, meta(clock)))
    clock.now += 9_999
    assert get(store, [key(0)]) == [payload(0)]
    clock.now += 1
    assert get(store, [key(0)]) == [None]
    assert store.stats()["entries"] == 0  # an expired entry found on read is gone


@pytest.mark.parametrize("ttl", [None, 0, -5])
def test_a_piece_without_a_positive_ttl_is_not_stored(ttl: int | None) -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0), ttl, meta(clock)))
    assert get(store, [key(0)]) == [None]
    assert store.stats()["not_cached"] == 1 and store.stats()["entries"] == 0


def test_max_bytes_zero_disables_the_store() -> None:
    clock = Clock()
    store = MemoryStore(0, clock=clock)
    put(store, CacheItem(key(0), payload(0), 60_000, meta(clock)))
    assert get(store, [key(0)]) == [None]
    assert store.stats()["bytes"] == 0


def test_the_byte_bound_holds_and_evicts_the_least_recently_used() -> None:
    clock = Clock()
    store = MemoryStore(20_000, clock=clock)
    for i in range(5):
        put(store, CacheItem(key(i), payload(i, 1_000), 600_000, meta(clock)))
    assert store.stats()["entries"] == 5
    per_entry = store.stats()["bytes"] / 5
    assert per_entry > 1_000  # the key and the entry's overhead count too
    # Read 0 (now the most recently used), then add until the bound is passed.
    assert get(store, [key(0)]) == [payload(0, 1_000)]
    i = 5
    while store.stats()["evictions"] == 0 and i < 1_000:
        put(store, CacheItem(key(i), payload(i, 1_000), 600_000, meta(clock)))
        i += 1
    assert store.stats()["evictions"] == 1
    assert store.stats()["bytes"] <= 20_000
    # The oldest unread entry went, not the one just read.
    assert get(store, [key(1), key(0)]) == [None, payload(0, 1_000)]


def test_many_tiny_entries_cannot_exceed_the_bound() -> None:
    clock = Clock()
    store = MemoryStore(50_000, clock=clock)
    for i in range(2_000):
        put(store, CacheItem(key(i), b"x", 600_000, meta(clock)))
        assert store.stats()["bytes"] <= 50_000
    # Each entry costs more than its one byte: far fewer than 2,000 fit.
    assert store.stats()["entries"] < 500
    hits = sum(p is not None for p in get(store, [key(i) for i in range(2_000)]))
    assert hits == store.stats()["entries"]


def test_a_piece_larger_than_the_whole_store_is_refused_without_evicting_anything() -> None:
    clock = Clock()
    store = MemoryStore(10_000, clock=clock)
    put(store, CacheItem(key(0), payload(0), 600_000, meta(clock)))
    put(store, CacheItem(key(1), payload(1, 10_000), 600_000, meta(clock)))
    assert get(store, [key(0), key(1)]) == [payload(0), None]
    assert store.stats()["too_large"] == 1 and store.stats()["evictions"] == 0


def test_storing_a_key_again_replaces_it_without_counting_it_twice() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0, 500), 600_000, meta(clock)))
    once = store.stats()["bytes"]
    put(store, CacheItem(key(0), payload(7, 500), 600_000, meta(clock)))
    assert store.stats()["bytes"] == once and store.stats()["entries"] == 1
    assert get(store, [key(0)]) == [payload(7, 500)]


def test_expired_entries_are_swept_on_a_later_put() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock, sweep_interval_ms=1_000)
    for i in range(10):
        put(store, CacheItem(key(i), payload(i), 5_000, meta(clock)))
    clock.now += 6_000
    put(store, CacheItem(key(100), payload(100), 5_000, meta(clock)))
    stats = store.stats()
    assert stats["entries"] == 1 and stats["evictions"] == 10
    assert stats["bytes"] < 1_000


def test_invalidate_drops_entries_of_those_metrics_over_that_range_and_those_of_unknown_metrics() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    items = {
        "gpu_early": CacheItem(key(0), payload(0), 600_000, meta(clock, ("gpu",), 0, H)),
        "gpu_late": CacheItem(key(1), payload(1), 600_000, meta(clock, ("gpu",), 2 * H, 3 * H)),
        "net_early": CacheItem(key(2), payload(2), 600_000, meta(clock, ("net",), 0, H)),
        "unknown_early": CacheItem(key(3), payload(3), 600_000, meta(clock, (), 0, H)),
        "both_early": CacheItem(key(4), payload(4), 600_000, meta(clock, ("net", "gpu"), 0, H)),
    }
    put(store, *items.values())
    clock.now += 1
    dropped = run(store.invalidate(["gpu"], H, H + 1))  # touches the early ones' end
    left = dict(zip(items, get(store, [i.key for i in items.values()])))
    assert {name for name, p in left.items() if p is None} == {"gpu_early", "unknown_early", "both_early"}
    assert dropped == 3
    # None: every metric; an unbounded range.
    assert run(store.invalidate(None)) == 2
    assert get(store, [i.key for i in items.values()]) == [None] * 5
    assert store.stats()["bytes"] == 0


def test_a_piece_fetched_before_an_invalidation_is_not_stored_after_it() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock, skew_ms=100)
    fetched = clock.now
    clock.now += 1_000
    run(store.invalidate(["other_metric"], 0, 1))  # any invalidation: the data may have changed
    put(store, CacheItem(key(0), payload(0), 600_000, meta(clock, fetched_at=fetched)))
    # Within the clock skew allowed between proxies: still refused.
    put(store, CacheItem(key(1), payload(1), 600_000, meta(clock, fetched_at=clock.now + 99)))
    put(store, CacheItem(key(2), payload(2), 600_000, meta(clock, fetched_at=clock.now + 100)))
    assert get(store, [key(0), key(1), key(2)]) == [None, None, payload(2)]
    assert store.stats()["raced"] == 2


def test_a_new_generation_makes_every_entry_unreachable_and_frees_it() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0), 600_000, meta(clock)))
    gen = run(store.bump_generation())
    assert run(store.bump_generation()) == gen + 1
    assert get(store, [key(0)]) == [None]
    assert store.stats()["bytes"] == 0
    # Pieces fetched before the bump are refused; new ones are stored.
    put(store, CacheItem(key(0), payload(0), 600_000, meta(clock, fetched_at=clock.now - 1)))
    clock.now += 1
    put(store, CacheItem(key(1), payload(1), 600_000, meta(clock)))
    assert get(store, [key(0), key(1)]) == [None, payload(1)]


def test_pieces_over_the_payload_limits_are_not_stored() -> None:
    clock = Clock()
    limits = PayloadLimits(max_rows=100, max_label_bytes=1 << 20)
    store = MemoryStore(1 << 22, clock=clock, limits=limits)
    series = [({"i": str(i)}, [k * 30_000 for k in range(50)], [1.0] * 50) for i in range(3)]
    small = to_ipc_bytes(QueryResult.from_series("matrix", series[:2]))  # 100 samples
    large = to_ipc_bytes(QueryResult.from_series("matrix", series))  # 150 samples
    put(store, CacheItem(key(0), small, 600_000, meta(clock)), CacheItem(key(1), large, 600_000, meta(clock)),
        CacheItem(key(2), b"not an arrow stream", 600_000, meta(clock)))
    assert get(store, [key(0), key(1), key(2)]) == [small, None, None]
    assert store.stats()["too_large"] == 2


def test_aclose_empties_the_store() -> None:
    clock = Clock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, CacheItem(key(0), payload(0), 600_000, meta(clock)))
    run(store.aclose())
    assert store.stats()["entries"] == 0 and store.stats()["bytes"] == 0
    assert store.leases is None  # private to the process: no shared fetch leases
