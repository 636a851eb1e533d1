"""Reading cached cells (proxy/pipeline/cache_read.py): the decoded-cell memo (`DecodedCells`)
and `CacheReader.read` over a real Redis, where a kept cell is checked by its frame's MAC
alone (issue 28) -- and never served once another process changed, invalidated or forged
its entry."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from proxy.cache import CacheItem, CacheKey, MemoryStore, PieceMeta, PieceStore, RedisStore
from proxy.cache.frame import MAC_OFFSET, MAC_SIZE, encode_value, frame_key
from proxy.codec import arrow
from proxy.config import build_config
from proxy.pipeline import cache_read
from proxy.pipeline.cache_read import CacheReader, DecodedCells, payload_signature
from proxy.pipeline.landing import Landing
from proxy.pipeline.slots import SlotMaker
from proxy.result import QueryResult
from proxy.result.pieces import TimeCut
from shardplanner.plan import Span

H = 3_600_000
T0 = 1_700_000_000_000
SECRET = frame_key(b"shared by every replica")
BASE = CacheKey(query="max by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
                span=Span.range(T0, T0 + H - 10_000, 10_000), route=("prometheus",))


def key(i: int) -> CacheKey:
    return dataclasses.replace(BASE, span=BASE.span.with_bounds(T0 + i * H, T0 + (i + 1) * H - 10_000))


def cell(value: float, n_series: int = 4) -> QueryResult:
    t = [T0 + 10_000 * j for j in range(360)]
    return QueryResult.from_series("matrix", [({"Hostname": f"node-{s}"}, t, [value + s] * 360)
                                              for s in range(n_series)])


def payload(value: float) -> bytes:
    return bytes(arrow.to_ipc_bytes(cell(value)))


def item(k: CacheKey, data: bytes) -> CacheItem:
    # fetched now: a put of a piece fetched before an invalidation is refused (store.py)
    return CacheItem(k, data, 600_000, PieceMeta(("DCGM_FI_DEV_POWER_USAGE",), 0, 2 * T0, time.time_ns() // 1_000_000))


def values_of(r: QueryResult) -> list[float]:
    return [float(v) for v in r.value[:: 360]]


# --- DecodedCells ---------------------------------------------------------------------------------


def test_a_cell_kept_by_tag_is_found_by_that_tag_only() -> None:
    cells = DecodedCells()
    c = cell(1.0)
    data = payload(1.0)
    cells.put("d", b"t" * 32, c)
    assert cells.tagged("d") == (b"t" * 32, c) and cells.tagged("other") is None
    assert cells.get("d", data, b"t" * 32) is c
    assert cells.get("d", data, b"u" * 32) is None  # another frame: decoded again
    assert cells.get("d", data) is None  # no tag to compare: not taken on trust


def test_a_cell_kept_by_checksum_is_kept_by_tag_once_found_again() -> None:
    cells = DecodedCells()
    c = cell(2.0)
    data = payload(2.0)
    cells.put("d", payload_signature(data), c)
    assert cells.tagged("d") is None  # a store without tags (in process) gave no tag
    assert cells.get("d", payload(3.0)) is None  # other bytes
    assert cells.get("d", data, b"t" * 32) is c  # the same bytes, now with their frame's tag
    assert cells.tagged("d") == (b"t" * 32, c)


def test_adopted_cells_are_kept_with_the_tag_of_their_first_read() -> None:
    cells = DecodedCells()
    c = cell(4.0)
    cells.adopt("d", c)
    assert cells.tagged("d") is None
    assert cells.get("d", payload(4.0), b"a" * 32) is c
    assert cells.tagged("d") == (b"a" * 32, c)


def test_kept_cells_are_bounded_by_samples() -> None:
    cells = DecodedCells(max_samples=4 * 360 * 4)  # four cells of 1,440 samples
    for i in range(6):
        cells.put(f"d{i}", bytes([i]) * 32, cell(float(i)))
    assert [cells.tagged(f"d{i}") is not None for i in range(6)] == [False, False, True, True, True, True]
    cells.hit("d2")  # used: the last to go
    cells.put("d6", b"6" * 32, cell(6.0))
    assert cells.tagged("d2") is not None and cells.tagged("d3") is None


# --- CacheReader.read over stores -----------------------------------------------------------------


@pytest.fixture()
def rurl(redis_server: Any) -> Iterator[str]:
    url = str(redis_server.url).rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(url).flushdb()
    yield url


def reader_of(store: PieceStore, **cache: Any) -> CacheReader:
    config = build_config({"backends": [{"url": "http://127.0.0.1:1"}], "cache": cache})
    return CacheReader(config, lambda: store, Landing(), SlotMaker(config, H))


class Decodes:
    """Counts the payloads CacheReader decodes (cache_read.decode_payloads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = cache_read.decode_payloads

        def counted(payloads: list[Any], *args: Any) -> Any:
            self.n += sum(1 for p in payloads if p is not None)
            return real(payloads, *args)

        monkeypatch.setattr(cache_read, "decode_payloads", counted)


def test_a_kept_cell_is_read_as_its_mac_and_not_decoded_again(rurl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = Decodes(monkeypatch)

    async def main() -> None:
        store = RedisStore(rurl, mac_key=SECRET)
        reader = reader_of(store)
        try:
            keys = [key(i) for i in range(3)]
            await store.put_many([item(k, payload(float(10 * i))) for i, k in enumerate(keys)])
            first = await reader.read(keys)
            assert decodes.n == 3 and [values_of(first[k.digest]) for k in keys] == [
                [0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0]]
            read_before = store.stats()["bytes_read"]
            again = await reader.read(keys)
            assert decodes.n == 3  # nothing decoded
            assert all(again[k.digest] is first[k.digest] for k in keys)
            assert store.stats()["bytes_read"] - read_before == 3 * MAC_SIZE
        finally:
            await store.aclose()

    asyncio.run(main())


def test_cache_decoded_max_samples_bounds_what_is_kept(rurl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cache.decoded_max_samples: 0 keeps no cell decoded (every read decodes again); the
    default keeps them (the test above)."""
    decodes = Decodes(monkeypatch)

    async def main() -> None:
        store = RedisStore(rurl, mac_key=SECRET)
        reader = reader_of(store, decoded_max_samples=0)
        try:
            assert reader.decoded.max_samples == 0
            keys = [key(i) for i in range(3)]
            await store.put_many([item(k, payload(float(10 * i))) for i, k in enumerate(keys)])
            for n in (3, 6):
                got = await reader.read(keys)
                assert decodes.n == n and values_of(got[keys[2].digest]) == [20.0, 21.0, 22.0, 23.0]
        finally:
            await store.aclose()

    asyncio.run(main())
    assert reader_of(MemoryStore(1 << 20)).decoded.max_samples == 2_500_000  # the default


def test_what_another_process_did_to_an_entry_is_what_is_served(rurl: str) -> None:
    async def main() -> None:
        # skew_ms=0: puts right after the invalidation are not taken for racing it
        store = RedisStore(rurl, mac_key=SECRET, generation_refresh_ms=0, skew_ms=0)
        other = RedisStore(rurl, mac_key=SECRET, skew_ms=0)
        reader = reader_of(store)
        try:
            k0, k1, k2 = key(0), key(1), key(2)
            await store.put_many([item(k0, payload(1.0)), item(k1, payload(2.0)), item(k2, payload(3.0))])
            await reader.read([k0, k1, k2])
            await other.put_many([item(k0, payload(5.0))])  # written again, other content
            got = await reader.read([k0, k1, k2])
            assert [values_of(got[k.digest])[0] for k in (k0, k1, k2)] == [5.0, 2.0, 3.0]
            assert await other.invalidate(["DCGM_FI_DEV_POWER_USAGE"]) == 3  # admin, another process
            assert await reader.read([k0, k1, k2]) == {}
            await store.put_many([item(k0, payload(6.0)), item(k1, payload(7.0))])
            await reader.read([k0, k1])
            await other.put_many([item(k1, payload(8.0))])
            got = await reader.read([k0, k1])
            assert values_of(got[k0.digest])[0] == 6.0 and values_of(got[k1.digest])[0] == 8.0
            await other.bump_generation()  # admin: every entry unreachable
            assert await reader.read([k0, k1]) == {}
        finally:
            await store.aclose()
            await other.aclose()

    asyncio.run(main())


def test_forged_entries_are_never_served(rurl: str) -> None:
    async def main() -> None:
        store = RedisStore(rurl, mac_key=SECRET)
        reader = reader_of(store)
        r = redis.Redis.from_url(rurl)
        try:
            k = key(0)
            await store.put_many([item(k, payload(1.0))])
            kept = (await reader.read([k]))[k.digest]
            skey = store.storage_key(k)
            genuine = r.get(skey)
            assert genuine is not None
            # Other content under a copy of the genuine MAC: the MAC bytes match, so the entry
            # reads as unchanged -- and what is served is the cell authenticated before, never
            # the forged content.
            forged = encode_value(k, payload(666.0), mac_key=frame_key(b"a guess"), skey=skey)
            forged = forged[:MAC_OFFSET] + genuine[MAC_OFFSET:MAC_OFFSET + MAC_SIZE] + forged[MAC_OFFSET + MAC_SIZE:]
            r.set(skey, forged)
            got = await reader.read([k])
            assert got[k.digest] is kept and values_of(got[k.digest])[0] == 1.0
            # A fresh reader (no kept cell) reads it whole and refuses it.
            assert await reader_of(store).read([k]) == {}
            # A frame with its own (wrong) MAC: read whole by the reader that kept the cell,
            # refused, deleted: a miss.
            r.set(skey, encode_value(k, payload(666.0), mac_key=frame_key(b"a guess"), skey=skey))
            assert await reader.read([k]) == {}
            assert not r.exists(skey)
        finally:
            r.close()
            await store.aclose()

    asyncio.run(main())


def test_an_in_process_store_is_read_by_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = Decodes(monkeypatch)

    async def main() -> None:
        store = MemoryStore(64 << 20)
        reader = reader_of(store)
        k = key(0)
        await store.put_many([item(k, payload(1.0))])
        first = (await reader.read([k]))[k.digest]
        assert (await reader.read([k]))[k.digest] is first and decodes.n == 1
        await store.put_many([item(k, payload(2.0))])
        assert values_of((await reader.read([k]))[k.digest])[0] == 2.0 and decodes.n == 2

    asyncio.run(main())


def test_a_kept_cell_is_cut_lazily_for_a_window_and_any_other_at_once() -> None:
    """CacheReader.lookup cuts a cell to the piece's window: lazily (`TimeCut`, its samples
    never copied when the answer is spliced from the cell's bytes) when the reader keeps the
    cell decoded anyway, at once otherwise (a cold cell must be free to go: scenario (e))."""
    window = Span.range(T0 + 60_000, T0 + 600_000, 10_000)
    want = [float(T0 + 60_000 + 10_000 * j) for j in range(55)]
    for max_samples, lazy in ((2_500_000, True), (0, False)):

        async def main(max_samples: int = max_samples, lazy: bool = lazy) -> None:
            store = MemoryStore(64 << 20)
            reader = reader_of(store, decoded_max_samples=max_samples)
            await store.put_many([item(key(0), payload(1.0))])
            slot = SimpleNamespace(keys=(key(0),), status="", piece=SimpleNamespace(span=window), result=None,
                                   answered_by=None)
            await reader.lookup([slot])  # type: ignore[list-item]
            r = slot.result
            assert slot.status == "hit" and isinstance(r, TimeCut) is lazy
            assert r.n_series == 4 and [float(t) for t in r.t_ms[:55]] == want and r.value[0] == 1.0

        asyncio.run(main())
