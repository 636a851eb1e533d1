"""Fixtures of the Redis store tests (tests/cache/test_cache_redis.py,
test_redis_invalidation.py): one real redis-server per test module, and a client to it,
flushed and with reset command stats, per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.redis_cluster import RedisNode
from tests.servers import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisNode]:
    node = RedisNode(free_port(), tmp_path_factory.mktemp("redis"), ("--enable-debug-command", "local")).start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture()
def r(server: RedisNode) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port)
    client.flushall()
    client.config_resetstat()
    try:
        yield client
    finally:
        client.close()
