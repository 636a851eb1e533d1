"""proxy/cache/redis_reads.py against a real redis-server: a probe with the tag the reader keeps
is answered by the 32 MAC bytes alone when the entry is unchanged, and read whole when it is
not; missing entries and keys of another type read as misses. (The store around it, frames and
all: tests/cache/test_redis_store.py.)"""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aredis

from proxy.cache.frame import MAC_OFFSET, MAC_SIZE
from proxy.cache.redis_reads import Probe, fetch_probes, flight_of, mget
from tests.cache.redis_helpers import key, mget_calls, run
from tests.redis_cluster import RedisNode

pytestmark = pytest.mark.redis


def framed(mac: bytes, body: bytes = b"payload") -> bytes:
    """A value whose bytes at the frame's MAC offset are `mac` (what GETRANGE reads)."""
    assert len(mac) == MAC_SIZE
    return b"h" * MAC_OFFSET + mac + body


def test_flight_of_keeps_reads_with_other_tags_apart() -> None:
    k = key(1)
    assert flight_of(Probe(k)) == k.digest
    a, b = flight_of(Probe(k, b"a" * 32)), flight_of(Probe(k, b"b" * 32))
    assert a != b and k.digest in a and a != flight_of(Probe(k))


def test_unchanged_entries_are_told_by_their_mac_changed_and_untagged_ones_read_whole(
        server: RedisNode, r: redis.Redis) -> None:
    mac_a, mac_b, mac_c = b"A" * 32, b"B" * 32, b"C" * 32
    r.set("k:a", framed(mac_a))
    r.set("k:b", framed(mac_b, b"written-again"))
    r.set("k:c", framed(mac_c))
    probes = [Probe(key(1), mac_a),  # kept, unchanged
              Probe(key(2), b"X" * 32),  # kept, but another process wrote it again
              Probe(key(3)),  # not kept: read whole
              Probe(key(4), mac_a)]  # kept, but gone (invalidated, expired)
    skeys = ["k:a", "k:b", "k:c", "k:gone"]

    async def main() -> tuple[list[bytes | None], list[bool], tuple[int, int], tuple[int, int]]:
        client = aredis.Redis.from_url(server.url)
        try:
            before = mget_calls(r)
            _, values, same = await fetch_probes(client, False, skeys, probes)
            return values, same, before, mget_calls(r)
        finally:
            await client.aclose()

    values, same, before, after = run(main())
    assert same == [True, False, False, False]
    # Unchanged: nothing read (the reader serves what it keeps); changed: read whole; gone: None.
    assert values == [None, framed(mac_b, b"written-again"), framed(mac_c), None]
    # One MGET beside the GETRANGEs for the untagged one, one more for the entry whose MAC changed.
    assert after[0] - before[0] == 2


def test_no_tag_is_one_plain_mget_and_another_type_is_a_miss(server: RedisNode, r: redis.Redis) -> None:
    r.set("p:1", b"one")
    r.rpush("p:list", b"not a string")  # GETRANGE/GET on a list: WRONGTYPE

    async def main() -> tuple[list[bytes | None], list[bytes | None], list[bool]]:
        client = aredis.Redis.from_url(server.url)
        try:
            plain = await mget(client, False, ["p:1", "p:none"])
            _, values, same = await fetch_probes(client, False, ["p:list", "p:1"],
                                                 [Probe(key(1), b"A" * 32), Probe(key(2))])
            return plain, values, same
        finally:
            await client.aclose()

    plain, values, same = run(main())
    assert plain == [b"one", None]
    assert same == [False, False] and values == [None, b"one"]
