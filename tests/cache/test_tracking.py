"""proxy/cache/tracking.py: the RESP reader and the trust rules in process; against a real
redis-server, that a store with tracking answers `unchanged` without a round trip once Redis
has said nothing about the keys, and asks again as soon as a key is written, deleted or
flushed, the generation moves, or the subscription is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from proxy.cache import RedisStore
from proxy.cache.redis_invalidation import GENERATION_KEY, INVALIDATED_AT_KEY
from proxy.cache.tracking import MAX_BULK, RespError, TagWatch, read_reply
from tests.cache.redis_helpers import item, key, run
from tests.redis_cluster import RedisNode


def _parse(data: bytes) -> Any:
    async def go() -> Any:
        r = asyncio.StreamReader()
        r.feed_data(data)
        r.feed_eof()
        return await read_reply(r)
    return run(go())


def test_read_reply_reads_resp2_and_refuses_what_is_out_of_bounds() -> None:
    assert _parse(b"+OK\r\n") == b"OK"
    assert _parse(b":42\r\n") == 42
    assert _parse(b"$3\r\nabc\r\n") == b"abc" and _parse(b"$-1\r\n") is None and _parse(b"*-1\r\n") is None
    msg = b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*2\r\n$3\r\nk:a\r\n$3\r\nk:b\r\n"
    assert _parse(msg) == [b"message", b"__redis__:invalidate", [b"k:a", b"k:b"]]
    assert _parse(b">2\r\n$1\r\na\r\n_\r\n") == [b"a", None]  # a RESP3 push, read alike
    with pytest.raises(RespError, match="ERR nope"):
        _parse(b"-ERR nope\r\n")
    with pytest.raises(RespError):
        _parse(b"$%d\r\n" % (MAX_BULK + 1))
    with pytest.raises(RespError):
        _parse(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")  # nested too deep
    with pytest.raises(RespError):
        _parse(b"?what\r\n")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _watch(clock: Callable[[], float] = time.monotonic) -> tuple[TagWatch, list[int]]:
    resets: list[int] = []

    async def never() -> Any:
        raise AssertionError("not connected in these tests")

    w = TagWatch(never, max_age_s=30, clock=clock, reset=lambda: resets.append(1))
    w.listening = True
    return w, resets


def test_trust_needs_a_quiet_probe_and_goes_with_a_message_naming_the_key() -> None:
    w, _ = _watch()
    e = w.epoch()
    w.trust(e, [(b"k:a", b"A"), (b"k:b", b"B")])
    assert w.trusted(b"k:a", b"A") and w.trusted(b"k:b", b"B")
    assert not w.trusted(b"k:a", b"other tag") and not w.trusted(b"k:a", b"A")  # a mismatch drops it
    w.invalidated([b"k:b"])
    assert not w.trusted(b"k:b", b"B")
    # A message between a probe's send and its reply: nothing it read is trusted.
    e = w.epoch()
    w.invalidated([b"k:unrelated"])
    w.trust(e, [(b"k:c", b"C")])
    assert not w.trusted(b"k:c", b"C")
    # Not subscribed: no epoch, no trust.
    w.listening = False
    assert w.epoch() is None
    w.trust(None, [(b"k:d", b"D")])
    w.listening = True
    assert not w.trusted(b"k:d", b"D")


@pytest.mark.parametrize("message", [None, [GENERATION_KEY.encode()], [INVALIDATED_AT_KEY.encode()], [7]])
def test_a_flush_a_new_generation_or_a_marker_takes_all_trust(message: Any) -> None:
    w, resets = _watch()
    w.trust(w.epoch(), [(b"k:a", b"A"), (b"k:b", b"B")])
    w.invalidated(message)
    assert not w.trusted(b"k:a", b"A") and not w.trusted(b"k:b", b"B")
    assert resets  # the store reads its generation again


def test_trust_lasts_at_most_max_age() -> None:
    clock = Clock()
    w, _ = _watch(clock)
    w.trust(w.epoch(), [(b"k:a", b"A")])
    clock.t += 29
    assert w.trusted(b"k:a", b"A")
    clock.t += 2
    assert not w.trusted(b"k:a", b"A")


# --- against a real redis-server ----------------------------------------------------------


def _getranges(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))


async def _until(pred: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


@pytest.mark.redis
def test_a_store_with_tracking_trusts_unchanged_tags_until_redis_says_otherwise(
        server: RedisNode, r: redis.Redis) -> None:
    k1, k2 = key(1), key(2)

    async def main() -> None:
        store = RedisStore(server.url, tracking=True, generation_refresh_ms=60_000)
        try:
            await store.put_many([item(k1, b"payload-1"), item(k2, b"payload-2")])
            tags = [t.tag for t in await store.get_tagged([k1, k2], [None, None])]
            assert all(tags)
            assert await store.unchanged([k1, k2], tags)  # starts the watch; asked
            watch = store._watch
            assert watch is not None
            await _until(lambda: watch.listening)

            async def asks() -> int:
                before = _getranges(r)
                assert await store.unchanged([k1, k2], tags)
                return _getranges(r) - before

            # (The put's own confirmation read may have made them trusted already: start over.)
            watch.forget_all()
            assert await asks() > 0  # asked once more: now trusted ...
            assert await asks() == 0  # ... answered with no round trip
            # Another client writes k2 again: Redis says so, and the answer is asked (a miss).
            gen = await store.generation()
            r.set(k2.redis_key(gen), b"written by someone else")
            await _until(lambda: not watch.trusted(k2.redis_key(gen).encode(), tags[1]))
            assert not await store.unchanged([k1, k2], tags)
            # Put back, trusted again; then a flush takes every key's trust.
            await store.put_many([item(k2, b"payload-2")])
            tags = [t.tag for t in await store.get_tagged([k1, k2], [None, None])]
            assert await store.unchanged([k1, k2], tags)
            assert await asks() == 0
            r.flushall()
            await _until(lambda: not watch.trusted(k1.redis_key(gen).encode(), tags[0]))
            assert not await store.unchanged([k1, k2], tags)
            # The subscription lost: nothing trusted until it is back, then trusted again.
            await store.put_many([item(k1, b"payload-1"), item(k2, b"payload-2")])
            tags = [t.tag for t in await store.get_tagged([k1, k2], [None, None])]
            assert await store.unchanged([k1, k2], tags) and await asks() == 0
            r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await _until(lambda: not watch.listening)
            assert await asks() > 0
            await _until(lambda: watch.listening, timeout=10)
            assert await asks() > 0 and await asks() == 0
            # Another process moves to a new generation: all trust goes, the generation is read
            # again at once (not after generation_refresh), and the old entries are not it.
            r.incr(GENERATION_KEY)
            await _until(lambda: not watch.trusted(k1.redis_key(gen).encode(), tags[0]))
            assert not await store.unchanged([k1, k2], tags)
        finally:
            await store.aclose()

    run(main())


@pytest.mark.redis
def test_without_tracking_every_check_asks(server: RedisNode, r: redis.Redis) -> None:
    k1 = key(1)

    async def main() -> None:
        store = RedisStore(server.url, tracking=False)
        try:
            stored = await store.put_many([item(k1, b"payload-1")])
            tags = [t.tag for t in await store.get_tagged([k1], [None])]
            # put_many says what it stored with the tags a read finds (the reader keeps the
            # cells it stored as those frames: pipeline/cache_read.py `_stored`).
            assert stored == {k1.digest: tags[0]}
            for _ in range(3):
                before = _getranges(r)
                assert await store.unchanged([k1], tags)  # type: ignore[arg-type]
                assert _getranges(r) - before == 1
        finally:
            await store.aclose()

    run(main())


def _reads(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "mget", "getrange"))


@pytest.mark.redis
def test_a_lookup_trusts_kept_cells_and_absent_keys_until_redis_says_otherwise(
        server: RedisNode, r: redis.Redis) -> None:
    """A lookup (get_tagged) answers a kept cell's known tag and a key found absent without a
    round trip while tracking trusts them; a write by another client is read at once after
    Redis's message, as is an absence once the key is there."""
    k1, k2 = key(11), key(12)

    async def main() -> None:
        store = RedisStore(server.url, tracking=True, generation_refresh_ms=60_000)
        try:
            await store.put_many([item(k1, b"payload-1")])
            tag = (await store.get_tagged([k1], [None]))[0].tag  # starts the watch
            watch = store._watch
            assert watch is not None and tag
            await _until(lambda: watch.listening)

            async def lookup() -> tuple[list[Any], int]:
                before = _reads(r)
                got = await store.get_tagged([k1, k2], [tag, None])
                return got, _reads(r) - before

            got, n = await lookup()  # asked: k1 unchanged, k2 absent -- both trusted now
            assert got[0].same and got[0].tag == tag and got[1].payload is None and not got[1].same and n > 0
            got, n = await lookup()
            assert got[0].same and got[1].payload is None and n == 0
            # Another client writes k2: Redis says so, and the lookup reads it.
            gen = await store.generation()
            other = RedisStore(server.url, tracking=False, generation_refresh_ms=60_000)
            try:
                await other.put_many([item(k2, b"payload-2")])
            finally:
                await other.aclose()
            await _until(lambda: not watch.trusted(k2.redis_key(gen).encode(), b""))
            got, n = await lookup()
            assert got[0].same and got[1].payload is not None and bytes(got[1].payload) == b"payload-2" and n > 0
            # ... and trusts what it read: k2's frame, with no round trip next time.
            tag2 = got[1].tag
            got = await store.get_tagged([k1, k2], [tag, tag2])
            assert all(t.same for t in got)
            before = _reads(r)
            assert all(t.same for t in await store.get_tagged([k1, k2], [tag, tag2])) and _reads(r) == before
            # k1 unlinked by someone else: a miss after the message, not the kept cell.
            r.delete(k1.redis_key(gen))
            await _until(lambda: not watch.trusted(k1.redis_key(gen).encode(), tag))
            got, _ = await lookup()
            assert got[0].payload is None and not got[0].same
        finally:
            await store.aclose()

    run(main())


@pytest.mark.redis
def test_what_the_store_wrote_is_trusted_soon_after_without_a_lookup_reading_it(
        server: RedisNode, r: redis.Redis) -> None:
    """put_many reads its frames once more CONFIRM_AFTER_S later (its own write's message in
    by then): the first lookup of those tags reads nothing from Redis; a frame another client
    wrote meanwhile is not trusted."""
    k1, k2 = key(21), key(22)

    async def main() -> None:
        store = RedisStore(server.url, tracking=True, generation_refresh_ms=60_000)
        try:
            await store.get_tagged([k1], [None])  # starts the watch
            watch = store._watch
            assert watch is not None
            await _until(lambda: watch.listening)
            tags = await store.put_many([item(k1, b"payload-1"), item(k2, b"payload-2")])
            known = [tags[k1.digest], tags[k2.digest]]
            gen = await store.generation()
            await _until(lambda: watch.trusted(k1.redis_key(gen).encode(), known[0])
                         and watch.trusted(k2.redis_key(gen).encode(), known[1]))
            before = _reads(r)
            got = await store.get_tagged([k1, k2], known)
            assert all(t.same for t in got) and _reads(r) == before
            # Written again by another client: Redis's message takes the trust away.
            r.set(k2.redis_key(gen), b"someone else's")
            await _until(lambda: not watch.trusted(k2.redis_key(gen).encode(), known[1]))
            got = await store.get_tagged([k1, k2], known)
            assert got[0].same and not got[1].same and _reads(r) > before
        finally:
            await store.aclose()

    run(main())
