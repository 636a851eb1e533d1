"""proxy/cache/factory.py: `make_store` gives the store the configuration asks for, with
the payload bounds of `cache.max_piece_*`; `frame_secret` picks the frames' secret (configured,
else derived from the Redis credentials, else the built-in one) so that every replica sharing
a Redis computes the same key -- and only they: values made under another secret are misses
(real Redis)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from proxy.cache import CacheItem, CacheKey, MemoryStore, PieceMeta, RedisStore, make_store
from proxy.cache.bound import PayloadLimits
from proxy.cache.factory import frame_secret
from proxy.cache.frame import DEFAULT_SECRET, frame_key
from proxy.codec.arrow import to_ipc_bytes
from proxy.config import CacheConfig
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.redis_cluster import RedisNode

SECRET = "a-shared-secret-of-32-bytes-0000"
URL = "redis://127.0.0.1:6390/0"


@pytest.fixture(autouse=True)
def no_secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMACCEL_CACHE_SECRET", raising=False)
    monkeypatch.delenv("PROMACCEL_REDIS_PASSWORD", raising=False)


def made(cfg: CacheConfig) -> Any:
    """make_store(cfg), closed again (a Redis store opens nothing until used)."""
    store = make_store(cfg)
    asyncio.run(store.aclose())
    return store


def test_without_a_redis_url_the_store_is_in_process_with_the_configured_bounds() -> None:
    cfg = CacheConfig(max_bytes=12_345_678, max_piece_samples=1_000, max_piece_label_bytes=4_096)
    store = made(cfg)
    assert isinstance(store, MemoryStore)
    assert store.max_bytes == 12_345_678
    assert store.limits == PayloadLimits(1_000, 4_096)
    assert store.leases is None


def test_with_a_redis_url_the_store_is_redis_with_the_configured_bounds_and_key() -> None:
    cfg = CacheConfig(redis_url=URL, secret=SecretStr(SECRET), max_piece_samples=1_000, max_piece_label_bytes=4_096)
    store = made(cfg)
    assert isinstance(store, RedisStore)
    assert store.limits == PayloadLimits(1_000, 4_096)
    assert store.mac_key == frame_key(SECRET.encode())
    assert store.leases is not None  # shared by every process using the Redis


def test_a_configured_secret_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"from-a-mounted-secret-file-1234\n")
    monkeypatch.setenv("PROMACCEL_CACHE_SECRET", "from-the-environment-0123456789")
    with_password = "redis://user:pw@127.0.0.1:6390/0"
    assert frame_secret(CacheConfig(redis_url=with_password, secret_file=str(path))) == (
        b"from-a-mounted-secret-file-1234", "secret_file")
    assert frame_secret(CacheConfig(redis_url=with_password, secret=SecretStr(SECRET))) == (SECRET.encode(), "secret")
    assert frame_secret(CacheConfig(redis_url=with_password)) == (b"from-the-environment-0123456789", "env")


def test_without_one_the_key_derives_from_the_redis_credentials(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def secret(url: str | None, **kw: Any) -> tuple[bytes, str]:
        return frame_secret(CacheConfig(redis_url=url, **kw))

    a, source = secret("redis://promaccel:hunter2@10.0.0.1:6379/0")
    assert source == "redis_url"
    assert a not in (DEFAULT_SECRET, b"hunter2")  # not the password itself
    # Replicas with the same credentials agree, whatever the host they reach it by.
    assert secret("redis://promaccel:hunter2@redis.internal:6379/3")[0] == a
    # Another password or another user: another key.
    assert secret("redis://promaccel:hunter3@10.0.0.1:6379/0")[0] != a
    assert secret("redis://other:hunter2@10.0.0.1:6379/0")[0] != a
    assert secret("redis://:hunter2@10.0.0.1:6379/0")[0] != a
    # A password in the URL (percent-encoded) and the same one in a file or the environment
    # are the same credentials: the same key.
    in_url = secret("redis://:p%40ss%3Aw0rd@10.0.0.1:6379/0")
    path = tmp_path / "redis-password"
    path.write_text("p@ss:w0rd\n")
    assert secret("redis://10.0.0.1:6379/0", redis_password_file=str(path)) == in_url
    monkeypatch.setenv("PROMACCEL_REDIS_PASSWORD", "p@ss:w0rd")
    assert secret("redis://10.0.0.1:6379/0") == in_url
    assert in_url[1] == "redis_url"


def test_without_any_credentials_the_built_in_key_is_used() -> None:
    assert frame_secret(CacheConfig(redis_url="redis://10.0.0.1:6379/0")) == (DEFAULT_SECRET, "default")
    assert frame_secret(CacheConfig()) == (DEFAULT_SECRET, "default")


@pytest.mark.parametrize(
    ("kw", "env", "warning"),
    [
        (dict(redis_url="redis://:pw@127.0.0.1:6390/0"), None, "derived from the Redis password"),
        (dict(redis_url=URL), None, "built-in key"),
        (dict(redis_url=URL), "short-secret", "shorter than 16 bytes"),
        (dict(redis_url=URL, secret=SecretStr(SECRET)), None, None),
    ],
)
def test_a_weak_key_is_announced_at_start_up(kw: dict[str, Any], env: str | None, warning: str | None,
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    if env is not None:
        monkeypatch.setenv("PROMACCEL_CACHE_SECRET", env)
    with caplog.at_level(logging.WARNING, logger="promaccel.cache"):
        store = made(CacheConfig(**kw))
    messages = [r.getMessage() for r in caplog.records if r.name == "promaccel.cache"]
    if warning is None:
        assert messages == []
    else:
        assert any(warning in m for m in messages), messages
    # The password never reaches the log.
    assert not any(":pw@" in m for m in messages)
    assert store.mac_key == frame_key(frame_secret(CacheConfig(**kw))[0])


# --- the key at work, against a real Redis ---------------------------------------------------------

KEY = CacheKey(query="sum(up)", span=Span.range(0, 3_570_000, 30_000), route=("prometheus",))
PAYLOAD = to_ipc_bytes(QueryResult.from_series("matrix", [({"job": "node"}, [0, 30_000], [1.0, 2.0])]))


@pytest.fixture()
def url(server: RedisNode) -> Iterator[str]:
    client = redis.Redis(port=server.port)
    client.flushall()
    client.close()
    yield server.url


@pytest.mark.redis
def test_replicas_with_the_same_secret_share_values_and_others_cannot_read_them(url: str) -> None:
    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        writer = make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET)))
        replica = make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET)))
        stranger = make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET[::-1])))
        unkeyed = make_store(CacheConfig(redis_url=url))
        try:
            meta = PieceMeta(("up",), 0, 3_600_000, int(time.time() * 1000))
            await writer.put_many([CacheItem(KEY, PAYLOAD, 600_000, meta)])
            shared = await replica.get_many([KEY])
            refused = [await stranger.get_many([KEY]), await unkeyed.get_many([KEY])]
            after = await replica.get_many([KEY])  # the refused value was deleted as corrupt
            return shared, refused, after
        finally:
            for s in (writer, replica, stranger, unkeyed):
                await s.aclose()

    shared, refused, after = asyncio.run(main())
    assert [bytes(p) if p is not None else None for p in shared] == [PAYLOAD]
    assert refused == [[None], [None]]
    assert after == [None]


@pytest.mark.redis
def test_the_payload_bounds_apply_to_what_a_redis_store_reads(url: str) -> None:
    big = to_ipc_bytes(QueryResult.from_series("matrix", [({"i": str(i)}, [0], [1.0]) for i in range(50)]))
    key = dataclasses.replace(KEY, span=Span.instant(0))

    async def main() -> list[Any]:
        roomy = make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET)))
        strict = make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET), max_piece_samples=49))
        try:
            meta = PieceMeta(("up",), 0, 1, int(time.time() * 1000))
            await strict.put_many([CacheItem(key, big, 600_000, meta)])  # over its bound: not stored
            first = await roomy.get_many([key])
            await roomy.put_many([CacheItem(key, big, 600_000, meta)])
            return [first, await strict.get_many([key]), await roomy.get_many([key])]
        finally:
            await roomy.aclose()
            await strict.aclose()

    first, strict_read, roomy_read = asyncio.run(main())
    assert first == [None]
    assert strict_read == [None]  # 50 samples over its 49
    assert roomy_read == [None]  # the strict reader deleted it as out of bounds
