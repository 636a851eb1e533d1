"""Piece store, in process: keys, framing, the LRU store, TTL policy, invalidation."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cache import (
    CacheItem,
    CacheKey,
    CircuitBreaker,
    CorruptValue,
    MemoryStore,
    PieceMeta,
    RedisStore,
    decode_value,
    encode_value,
    make_store,
    ttl_for,
)
from proxy.cache.frame import frame_key
from proxy.config import CacheConfig
from proxy.observe.metrics import METRICS
from shardplanner.plan import Piece, ShardSpec, Span

SHARD = ShardSpec("Hostname", 1, 4, "=~", "node-1|node-5")
BASE = CacheKey(
    query='avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL{Hostname=~"node-1|node-5"})',
    span=Span.range(1_700_000_000_000, 1_700_003_600_000, 30_000),
    step_offset_ms=0,
    shard=SHARD,
    lookback_ms=300_000,
    route=("prometheus",),
    tenant="team-a",
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def meta(metrics: tuple[str, ...] = ("DCGM_FI_DEV_GPU_UTIL",), start_ms: int = 0, end_ms: int = 3_600_000,
         fetched_at_ms: int = 1_700_000_000_000) -> PieceMeta:
    return PieceMeta(metrics, start_ms, end_ms, fetched_at_ms)


def key(i: int, **kw: Any) -> CacheKey:
    return dataclasses.replace(BASE, span=BASE.span.with_bounds(i * 3_600_000, (i + 1) * 3_600_000), **kw)


def item(k: CacheKey, payload: bytes, ttl_ms: int | None = 60_000, m: PieceMeta | None = None) -> CacheItem:
    return CacheItem(k, payload, ttl_ms, m or meta())


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


# --------------------------------------------------------------------------------------
# Keys


def test_key_is_deterministic_and_has_the_documented_shape() -> None:
    same = CacheKey(**{f.name: getattr(BASE, f.name) for f in dataclasses.fields(BASE)})
    assert same.canonical() == BASE.canonical()
    assert same.redis_key(3) == BASE.redis_key(3)
    rk = BASE.redis_key(7)
    prefix, version, gen, digest = rk.split(":")
    assert (prefix, version, gen) == ("promaccel", "v1", "g7")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert "{" not in rk  # no cluster hash tag: keys spread over slots
    assert BASE.redis_key(7) != BASE.redis_key(8)


def test_key_golden() -> None:
    # Changing the canonical form silently would orphan every stored entry (and worse, a
    # form that maps two different pieces to one text would serve wrong answers): bump
    # FORMAT_VERSION / KEY_PREFIX instead and update this test.
    k = CacheKey(query="up", span=Span.range(0, 60_000, 15_000), route=("p",))
    assert k.canonical() == '["piece",2,"up",0,60000,15000,null,0,null,300000,["p"],""]'
    assert k.redis_key(0) == (
        "promaccel:v1:g0:" + __import__("hashlib").sha256(k.canonical().encode()).hexdigest()
    )


def test_for_piece_carries_every_piece_field() -> None:
    piece = Piece(query="sum(up)", span=Span.range(1_000_000, 2_000_000, 30_000), shard=SHARD)
    k = CacheKey.for_piece(piece, lookback_ms=60_000, route=["amp", "prom"], tenant="t")
    assert (k.query, k.span) == ("sum(up)", Span.range(1_000_000, 2_000_000, 30_000))
    assert k.shard == SHARD and k.lookback_ms == 60_000 and k.route == ("amp", "prom") and k.tenant == "t"
    assert k.step_offset_ms == 1_000_000 % 30_000
    inst = CacheKey.for_piece(Piece(query="up", span=Span.instant(5_000)), lookback_ms=300_000, route=["p"])
    assert inst.span == Span.instant(5_000) and inst.step_offset_ms == 0


_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_ints = st.integers(min_value=-(2**62), max_value=2**62)
_spans = st.builds(Span.instant, _ints) | st.builds(
    lambda a, n, step: Span.range(a, a + n * step, step), _ints, st.integers(0, 1000), st.integers(1, 10**6))
_shards = st.none() | st.builds(ShardSpec, _texts, _ints, _ints, st.sampled_from(["=~", "!~"]), _texts)
_keys = st.builds(
    CacheKey,
    query=_texts,
    span=_spans,
    step_offset_ms=_ints,
    shard=_shards,
    lookback_ms=_ints,
    route=st.lists(_texts, max_size=3).map(tuple),
    tenant=_texts,
    format_version=st.integers(min_value=0, max_value=1000),
)
_FIELDS = [f.name for f in dataclasses.fields(CacheKey)]
_SHARD_FIELDS = [f.name for f in dataclasses.fields(ShardSpec)]


@settings(max_examples=200, deadline=None)
@given(_keys, _keys, st.sampled_from(_FIELDS))
def test_every_key_field_changes_the_key(a: CacheKey, b: CacheKey, field: str) -> None:
    changed = dataclasses.replace(a, **{field: getattr(b, field)})
    if getattr(changed, field) == getattr(a, field):
        assert changed.redis_key(0) == a.redis_key(0)
    else:
        assert changed.canonical() != a.canonical()
        assert changed.redis_key(0) != a.redis_key(0)


@settings(max_examples=100, deadline=None)
@given(_keys, st.sampled_from(_SHARD_FIELDS), st.data())
def test_every_shard_field_changes_the_key(a: CacheKey, field: str, data: st.DataObject) -> None:
    base = dataclasses.replace(a, shard=SHARD)
    other = data.draw(_shards.filter(lambda s: s is not None))
    changed = dataclasses.replace(base, shard=dataclasses.replace(SHARD, **{field: getattr(other, field)}))
    assert (changed.redis_key(0) == base.redis_key(0)) == (changed.shard == base.shard)


@settings(max_examples=100, deadline=None)
@given(_keys, _keys)
def test_distinct_keys_have_distinct_canonical_forms(a: CacheKey, b: CacheKey) -> None:
    assert (a.canonical() == b.canonical()) == (a == b)


def test_adjacent_string_fields_cannot_be_confused() -> None:
    a = CacheKey(query="up", span=Span.instant(0), tenant="a,b")
    b = CacheKey(query='up",', span=Span.instant(0), tenant="b")
    assert a.canonical() != b.canonical()
    x = CacheKey(query="x", span=Span.instant(0))
    assert replace(x, route=("a", "b")).canonical() != replace(x, route=("a,b",)).canonical()


# --------------------------------------------------------------------------------------
# Framing


@settings(max_examples=100, deadline=None)
@given(_keys, st.binary(max_size=4096))
def test_frame_round_trip(k: CacheKey, payload: bytes) -> None:
    assert decode_value(k, encode_value(k, payload)) == payload


def test_frame_detects_every_kind_of_damage() -> None:
    payload = bytes(range(256)) * 8
    frame = encode_value(BASE, payload)
    assert decode_value(BASE, frame) == payload

    def reason(value: bytes, k: CacheKey = BASE, **kw: Any) -> str:
        with pytest.raises(CorruptValue) as info:
            decode_value(k, value, **kw)
        return info.value.reason

    assert reason(b"") == "truncated"
    assert reason(frame[:10]) == "truncated"
    assert reason(frame[:50]) == "truncated"  # header says the canonical key is longer
    assert reason(b"XXXX" + frame[4:]) == "magic"
    assert reason(frame[:4] + b"\x09" + frame[5:]) == "version"
    assert reason(frame[:4] + b"\x01" + frame[5:]) == "version"  # a version 1 (CRC only) frame
    assert reason(frame[:-1]) == "mac"
    assert reason(frame + b"\x00") == "mac"
    for pos in (6, 13, 45, len(frame) // 2, len(frame) - 1):  # in the length, the MAC, the key, the payload
        flipped = bytearray(frame)
        flipped[pos] ^= 0x40
        assert reason(bytes(flipped)) in ("mac", "truncated")
    # Another key, another storage key (generation) or another secret: not authentic.
    assert reason(frame, skey="promaccel:v1:g1:x") == "mac"
    assert reason(frame, mac_key=frame_key(b"another secret of 16+ bytes")) == "mac"
    other = dataclasses.replace(BASE, tenant="team-b")
    assert reason(frame, other) == "collision"
    # Without the MAC (in-process store) the frame and the key are still checked.
    assert decode_value(BASE, frame[:-1] + b"X", verify_mac=False) == payload[:-1] + b"X"
    with pytest.raises(CorruptValue):
        decode_value(other, frame, verify_mac=False)


# --------------------------------------------------------------------------------------
# MemoryStore


def test_memory_round_trip_and_batch_order() -> None:
    async def main() -> None:
        store = MemoryStore(10_000_000)
        await store.put_many([item(key(i), b"payload-%d" % i) for i in range(5)])
        got = await store.get_many([key(3), key(9), key(0), key(3)])
        assert got == [b"payload-3", None, b"payload-0", b"payload-3"]
        s = store.stats()
        assert (s["hits"], s["misses"], s["entries"]) == (3, 1, 5)
        assert s["bytes_read"] == 3 * len(b"payload-3")
        assert await store.get_many([]) == []

    run(main())


def test_memory_corrupt_value_is_a_miss_and_is_deleted() -> None:
    async def main() -> None:
        store = MemoryStore(10_000_000)
        await store.put_many([item(BASE, b"good")])
        skey = store.storage_key(BASE)
        frame = encode_value(BASE, b"good")
        before = counter(METRICS.cache_corrupt, "memory", "truncated")
        store._put_raw(skey, frame[:20], 60_000, meta())
        assert await store.get_many([BASE]) == [None]
        assert store.stats()["entries"] == 0
        assert counter(METRICS.cache_corrupt, "memory", "truncated") == before + 1
        store._put_raw(skey, b"not a frame at all", 60_000, meta())
        assert await store.get_many([BASE]) == [None]
        assert store.stats()["entries"] == 0
        assert store.stats()["corrupt"] == 2

    run(main())


def test_memory_colliding_value_is_a_miss() -> None:
    async def main() -> None:
        store = MemoryStore(10_000_000)
        other = dataclasses.replace(BASE, tenant="someone-else")
        # A sound frame for another key, stored under BASE's storage key (what a sha256
        # collision would look like).
        store._put_raw(store.storage_key(BASE), encode_value(other, b"their data"), 60_000, meta())
        assert await store.get_many([BASE]) == [None]
        assert store.stats()["corrupt"] == 1
        assert store.stats()["entries"] == 0

    run(main())


def test_memory_lru_is_bounded_in_bytes_and_evicts_least_recently_used() -> None:
    async def main() -> None:
        probe = MemoryStore(10_000_000)
        await probe.put_many([item(key(0), b"x" * 1000)])
        size = probe.stats()["bytes"]
        assert size > 1000

        store = MemoryStore(3 * size + size // 2)  # room for three entries
        evicted = counter(METRICS.cache_evictions, "size")
        await store.put_many([item(key(i), b"x" * 1000) for i in range(3)])
        assert store.stats()["entries"] == 3
        assert await store.get_many([key(0)]) == [b"x" * 1000]  # 0 is now the most recent
        await store.put_many([item(key(3), b"x" * 1000)])  # evicts 1, the least recent
        got = await store.get_many([key(i) for i in range(4)])
        assert [g is not None for g in got] == [True, False, True, True]
        assert store.stats()["bytes"] <= store.max_bytes
        assert store.stats()["evictions"] == 1
        assert counter(METRICS.cache_evictions, "size") == evicted + 1

        # A piece bigger than the whole cache is not stored and evicts nothing.
        await store.put_many([item(key(9), b"y" * (4 * size))])
        assert store.stats()["too_large"] == 1
        assert store.stats()["entries"] == 3

        # Rewriting a key replaces it without double counting.
        used = store.stats()["bytes"]
        await store.put_many([item(key(3), b"z" * 1000)])
        assert store.stats()["bytes"] == used
        assert await store.get_many([key(3)]) == [b"z" * 1000]

    run(main())


def test_memory_zero_bytes_disables_caching() -> None:
    async def main() -> None:
        store = MemoryStore(0)
        await store.put_many([item(BASE, b"x")])
        assert await store.get_many([BASE]) == [None]

    run(main())


def test_memory_ttl_expiry_with_injected_clock() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(10_000_000, clock=clock, sweep_interval_ms=1_000)
        await store.put_many([item(key(0), b"short", ttl_ms=30_000), item(key(1), b"long", ttl_ms=600_000)])
        await store.put_many([item(key(2), b"never", ttl_ms=None), item(key(3), b"never", ttl_ms=0)])
        assert store.stats()["entries"] == 2
        assert store.stats()["not_cached"] == 2
        clock.now_ms += 29_999
        assert await store.get_many([key(0), key(1)]) == [b"short", b"long"]
        clock.now_ms += 1
        assert await store.get_many([key(0), key(1)]) == [None, b"long"]
        assert store.stats()["entries"] == 1
        # Expired entries nobody asks for are swept on a later write.
        clock.now_ms += 600_000
        await store.put_many([item(key(5), b"new", ttl_ms=1_000)])
        assert store.stats()["entries"] == 1

    run(main())


# --------------------------------------------------------------------------------------
# TTL policy

NOW = 1_700_000_000_000
# Config durations are Prometheus durations (or seconds); CacheConfig holds milliseconds.
CFG = CacheConfig(max_freshness="10m", recent_ttl="30s", ttl="7d")


@pytest.mark.parametrize(
    ("cfg", "end_ms", "expected"),
    [
        (CFG, NOW - 3_600_000, 7 * 86_400_000),  # an hour old: long TTL
        (CFG, NOW - 600_000, 7 * 86_400_000),  # exactly at the freshness boundary: settled
        (CFG, NOW - 599_999, 30_000),  # inside the freshness window: recent TTL
        (CFG, NOW, 30_000),
        (CFG, NOW + 60_000, 30_000),  # ends in the future
        (CacheConfig(max_freshness="10m", recent_ttl=0), NOW - 1, None),  # recent: not cached
        (CacheConfig(max_freshness="10m", recent_ttl=0), NOW - 600_000, 7 * 86_400_000),
        (CacheConfig(max_freshness=0, recent_ttl=0), NOW, 7 * 86_400_000),  # no window
        (CacheConfig(ttl=0), NOW - 86_400_000, None),  # long TTL 0: nothing cached
    ],
)
def test_ttl_for(cfg: CacheConfig, end_ms: int, expected: int | None) -> None:
    assert ttl_for(end_ms, NOW, cfg) == expected


def test_ttl_for_out_of_order_window_when_configured() -> None:
    class OooConfig:
        max_freshness = 600_000
        recent_ttl = 0
        ttl = 7 * 86_400_000
        out_of_order_window = 3_600_000
        out_of_order_ttl = 300_000

    cfg: Any = OooConfig()
    assert ttl_for(NOW - 1_800_000, NOW, cfg) == 300_000
    assert ttl_for(NOW - 3_600_000, NOW, cfg) == 7 * 86_400_000
    assert ttl_for(NOW - 60_000, NOW, cfg) is None


# --------------------------------------------------------------------------------------
# Invalidation and generations


def _invalidation_fixture(store: MemoryStore) -> dict[str, CacheKey]:
    h = 3_600_000
    pieces = {
        "util-0-1h": (key(0), meta(("DCGM_FI_DEV_GPU_UTIL",), 0, h)),
        "util-1-2h": (key(1), meta(("DCGM_FI_DEV_GPU_UTIL",), h, 2 * h)),
        "util-2-3h": (key(2), meta(("DCGM_FI_DEV_GPU_UTIL",), 2 * h, 3 * h)),
        "temp-1-2h": (key(11), meta(("DCGM_FI_DEV_GPU_TEMP",), h, 2 * h)),
        "both-1-2h": (key(12), meta(("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"), h, 2 * h)),
        "unknown-5h": (key(13), meta((), 5 * h, 6 * h)),
    }
    run(store.put_many([item(k, name.encode(), m=m) for name, (k, m) in pieces.items()]))
    return {name: k for name, (k, _m) in pieces.items()}


def _alive(store: MemoryStore, keys: dict[str, CacheKey]) -> set[str]:
    got = run(store.get_many(list(keys.values())))
    return {name for name, g in zip(keys, got) if g is not None}


@pytest.mark.parametrize(
    ("metrics", "start_ms", "end_ms", "dropped"),
    [
        # metric only: every time range of it, and the piece whose metrics are unknown
        (["DCGM_FI_DEV_GPU_UTIL"], None, None, {"util-0-1h", "util-1-2h", "util-2-3h", "unknown-5h"}),
        # metric and time range: pieces overlapping [1.5h, 2h] (boundaries inclusive)
        (["DCGM_FI_DEV_GPU_UTIL"], 5_400_000, 7_200_000, {"util-1-2h", "util-2-3h"}),
        (["DCGM_FI_DEV_GPU_UTIL"], 3_600_001, 7_199_999, {"util-1-2h"}),
        # a piece reading several metrics is dropped for any of them
        (["DCGM_FI_DEV_FB_USED"], 0, 7_200_000, {"both-1-2h"}),
        (["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL"], 0, 3_600_000,
         {"util-0-1h", "util-1-2h", "temp-1-2h", "both-1-2h"}),
        # all metrics, one range
        (None, 5 * 3_600_000, None, {"unknown-5h"}),
        (None, None, None, {"util-0-1h", "util-1-2h", "util-2-3h", "temp-1-2h", "both-1-2h", "unknown-5h"}),
        (["no_such_metric"], 0, 100, set()),
    ],
)
def test_invalidate_by_metric_and_time_range(
    metrics: list[str] | None, start_ms: int | None, end_ms: int | None, dropped: set[str]
) -> None:
    store = MemoryStore(10_000_000, clock=Clock())
    keys = _invalidation_fixture(store)
    n = run(store.invalidate(metrics, start_ms, end_ms))
    assert n == len(dropped)
    assert _alive(store, keys) == set(keys) - dropped


def test_put_of_a_piece_fetched_before_an_invalidation_is_dropped() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(10_000_000, clock=clock)
        clock.now_ms += 1_000
        await store.invalidate(["DCGM_FI_DEV_GPU_UTIL"])
        await store.put_many([
            item(key(0), b"old", m=meta(fetched_at_ms=clock.now_ms - 1)),
            item(key(1), b"new", m=meta(fetched_at_ms=clock.now_ms)),
        ])
        assert await store.get_many([key(0), key(1)]) == [None, b"new"]
        assert store.stats()["raced"] == 1

    run(main())


def test_generation_bump_makes_old_entries_unreachable() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(10_000_000, clock=clock)
        await store.put_many([item(key(0), b"v1")])
        old = store.storage_key(key(0))
        assert await store.bump_generation() == 1
        assert store.storage_key(key(0)) != old
        assert await store.get_many([key(0)]) == [None]
        assert store.stats()["entries"] == 0 and store.stats()["bytes"] == 0
        clock.now_ms += 1
        await store.put_many([item(key(0), b"v2", m=meta(fetched_at_ms=clock.now_ms))])
        assert await store.get_many([key(0)]) == [b"v2"]

    run(main())


# --------------------------------------------------------------------------------------
# Breaker and factory


def test_circuit_breaker_opens_backs_off_and_recovers() -> None:
    now = [0.0]
    b = CircuitBreaker(failures=3, backoff_ms=1_000, max_backoff_ms=4_000, clock=lambda: now[0])
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert not b.is_open
    b.failure()
    assert b.is_open and not b.allow()
    now[0] = 1.0
    assert b.allow()  # the probe
    assert not b.allow()  # only one probe at a time
    b.failure()  # probe failed: twice the back-off
    now[0] = 2.5
    assert not b.allow()
    now[0] = 3.0
    assert b.allow()
    b.failure()
    now[0] = 6.9
    assert not b.allow()
    now[0] = 7.0
    assert b.allow()
    b.success()
    assert not b.is_open and b.allow() and b.allow()
    # After recovery the back-off starts small again.
    for _ in range(3):
        b.failure()
    now[0] = 8.0
    assert b.allow()


def test_make_store() -> None:
    assert isinstance(make_store(CacheConfig()), MemoryStore)
    assert make_store(CacheConfig(max_bytes=1234)).stats()["max_bytes"] == 1234

    async def main() -> None:
        for url, cluster in [
            ("redis://127.0.0.1:1/0", False),
            ("rediss://user:secret@127.0.0.1:1", False),
            ("redis+cluster://127.0.0.1:1", True),
            ("redis+cluster://127.0.0.1:1,127.0.0.1:2", True),
        ]:
            store = make_store(CacheConfig(redis_url=url))
            assert isinstance(store, RedisStore) and store.cluster is cluster
            assert "secret" not in str(store.stats())
            await store.aclose()

    run(main())
    with pytest.raises(ValueError, match="redis_url"):
        make_store(CacheConfig(redis_url="http://127.0.0.1:6379"))


def test_redis_store_with_nothing_listening_answers_misses_and_never_raises() -> None:
    async def main() -> None:
        store = RedisStore("redis://127.0.0.1:1/0", timeout_ms=100)
        assert await store.get_many([BASE, key(1)]) == [None, None]
        await store.put_many([item(BASE, b"x")])
        for _ in range(3):
            await store.get_many([BASE])
        assert store.stats()["breaker_open"]
        assert await store.get_many([BASE]) == [None]
        assert store.stats()["bypassed"] >= 1
        from proxy.errors import PromError

        with pytest.raises(PromError) as info:
            await store.invalidate(["up"])
        assert info.value.kind == "unavailable"
        await store.aclose()

    run(main())
