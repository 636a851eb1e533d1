"""Concurrent lookups of the same keys share one read (proxy/cache/shared_reads.py), over a
fake batched read that counts its calls and can be held, failed or cancelled. Through the
Redis store against a real server: tests/cache/test_cache_redis.py (one MGET per wave of 300
lookups, a cancelled lookup)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from proxy.cache import CacheKey, Payload
from proxy.cache.shared_reads import SharedReads
from shardplanner.plan import Span

BASE = CacheKey(query="up", span=Span.range(0, 3_600_000, 30_000), route=("prometheus",))


def key(i: int) -> CacheKey:
    return dataclasses.replace(BASE, query=f"up{i}")


class FakeRead:
    """A batched read: `b"<query>"` per key, except the keys in `missing`; waits for `gate`."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.fail = fail
        self.missing: set[str] = set()

    async def __call__(self, keys: list[CacheKey]) -> list[Payload | None]:
        self.batches.append([k.query for k in keys])
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("redis went away")
        return [None if k.query in self.missing else k.query.encode() for k in keys]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_lookups_of_keys_in_flight_join_the_read() -> None:
    async def main() -> None:
        read = FakeRead()
        reads = SharedReads(read)
        read.missing = {"up2"}
        first = asyncio.ensure_future(reads.get_many([key(0), key(1), key(2)]))
        await asyncio.sleep(0)
        # key 1 and 2 are in flight: only key 3 is read anew.
        second = asyncio.ensure_future(reads.get_many([key(1), key(2), key(3)]))
        await asyncio.sleep(0)
        read.gate.set()
        assert await first == [b"up0", b"up1", None]
        assert await second == [b"up1", None, b"up3"]
        assert read.batches == [["up0", "up1", "up2"], ["up3"]]
        # Done reads are not kept: the next lookup reads again.
        assert await reads.get_many([key(0)]) == [b"up0"]
        assert read.batches[-1] == ["up0"]
        assert await reads.get_many([]) == []

    run(main())


def test_a_cancelled_lookup_does_not_fail_the_lookups_that_joined_it() -> None:
    async def main() -> None:
        read = FakeRead()
        reads = SharedReads(read)
        first = asyncio.ensure_future(reads.get_many([key(0)]))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(reads.get_many([key(0)]))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        read.gate.set()
        assert await second == [b"up0"]
        with pytest.raises(asyncio.CancelledError):
            await first
        assert len(read.batches) == 1

    run(main())


def test_a_failed_or_cancelled_read_is_a_miss_for_every_waiter() -> None:
    async def main() -> None:
        read = FakeRead(fail=True)
        reads = SharedReads(read)
        read.gate.set()
        assert await reads.get_many([key(0), key(1)]) == [None, None]
        # Shutdown: the read in flight is cancelled, its waiters read misses.
        held = FakeRead()
        reads = SharedReads(held)
        waiter = asyncio.ensure_future(reads.get_many([key(0)]))
        await asyncio.sleep(0)
        reads.cancel()
        assert await waiter == [None]

    run(main())


def test_after_forget_lookups_read_afresh() -> None:
    """After an invalidation a lookup must not join a read that began before it."""

    async def main() -> None:
        read = FakeRead()
        reads = SharedReads(read)
        old = asyncio.ensure_future(reads.get_many([key(0)]))
        await asyncio.sleep(0)
        reads.forget()
        new = asyncio.ensure_future(reads.get_many([key(0)]))
        await asyncio.sleep(0)
        read.gate.set()
        assert await old == [b"up0"] and await new == [b"up0"]
        assert read.batches == [["up0"], ["up0"]]

    run(main())
