"""Fixtures of the Redis store tests (tests/cache/test_cache_redis.py,
test_redis_invalidation.py, test_redis_store.py, ...): one real redis-server per test module,
and a client to it, flushed and with reset command stats, per test; a 3-node Redis Cluster
per module that asks for one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.redis_cluster import LocalCluster, RedisNode
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.start(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield c
    finally:
        c.stop()
