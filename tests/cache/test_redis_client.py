"""proxy/cache/redis_client.py: `connect` gives a client for each URL form (TCP, unix socket,
cluster), with a pool that makes callers wait for a connection instead of failing when all
are busy, raw bytes back, and AUTH with a password kept outside the URL (the URL's own wins);
URLs it cannot use are errors that never show a password (`redact_url`). Real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from proxy.cache.redis_client import connect, redact_url
from tests.redis_cluster import RedisNode
from tests.servers import free_port

pytestmark = [pytest.mark.redis]

USER, PASSWORD = "promaccel-user", "s3cr3t:p@ss/word"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisNode, Path]]:
    work = tmp_path_factory.mktemp("rc")
    sock = work / "r.sock"
    n = RedisNode(free_port(), work, ("--enable-debug-command", "local", "--unixsocket", str(sock),
                                      "--unixsocketperm", "700")).start()
    admin = redis.Redis(port=n.port)
    admin.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"])
    admin.close()
    try:
        yield n, sock
    finally:
        n.stop()


def quoted(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def use(url: str, fn: Any, **kw: Any) -> Any:
    """Run `fn(client)` on a client from connect(url, ...), closed afterwards."""

    async def main() -> Any:
        client, cluster = connect(url, 2.0, **kw)
        try:
            return cluster, await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_tcp_url_gives_a_plain_client_answering_bytes_under_promaccels_name(node: tuple[RedisNode, Path]) -> None:
    n, _ = node

    async def fn(c: aioredis.Redis) -> tuple[Any, Any]:
        await c.set("k", b"\x00\xffvalue")
        return await c.get("k"), await c.client_getname()

    cluster, (value, name) = use(f"redis://127.0.0.1:{n.port}/0", fn)
    assert cluster is False
    assert value == b"\x00\xffvalue"  # not decoded: payloads are binary
    assert name == "promaccel"  # visible in CLIENT LIST for the operator


def test_a_unix_socket_url_works(node: tuple[RedisNode, Path]) -> None:
    _, sock = node

    async def fn(c: aioredis.Redis) -> Any:
        return await c.ping()

    assert use(f"unix://{sock}", fn) == (False, True)


def test_callers_wait_for_a_free_connection_instead_of_failing(node: tuple[RedisNode, Path]) -> None:
    """Two connections, eight slow commands at once: all succeed, two at a time (redis-py's
    default pool would raise MaxConnectionsError for the third)."""
    n, _ = node

    async def fn(c: aioredis.Redis) -> tuple[list[Any], float]:
        t0 = time.monotonic()
        out = await asyncio.gather(*(c.execute_command("DEBUG", "SLEEP", "0.1") for _ in range(8)),
                                   return_exceptions=True)
        return out, time.monotonic() - t0

    _, (out, elapsed) = use(f"redis://127.0.0.1:{n.port}/0", fn, max_connections=2)
    assert all(not isinstance(x, Exception) for x in out), out
    assert elapsed >= 0.38  # 8 x 0.1 s over 2 connections: 4 rounds (the server runs one at a time anyway)


def test_a_password_kept_outside_the_url_is_used(node: tuple[RedisNode, Path]) -> None:
    n, _ = node

    async def whoami(c: aioredis.Redis) -> Any:
        return await c.acl_whoami()

    url = f"redis://{USER}@127.0.0.1:{n.port}/0"
    assert use(url, whoami, password=PASSWORD) == (False, USER)
    with pytest.raises(redis.exceptions.AuthenticationError):
        use(url, whoami, password="wrong")
    # A password in the URL (percent-encoded) wins over the one passed.
    in_url = f"redis://{USER}:{quoted(PASSWORD)}@127.0.0.1:{n.port}/0"
    assert use(in_url, whoami, password="wrong") == (False, USER)
    assert use(in_url, whoami) == (False, USER)


def test_a_cluster_url_gives_a_cluster_client() -> None:
    async def main() -> tuple[Any, bool]:
        # No connection is made before the first command.
        client, cluster = connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000,[::1]:7001", 0.5)
        await client.aclose()
        return client, cluster

    client, cluster = asyncio.run(main())
    assert cluster is True and isinstance(client, RedisCluster)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://user:topsecret@", "no cluster node given"),
        ("rediss+cluster://:topsecret@,,", "no cluster node given"),
        ("http://user:topsecret@127.0.0.1:6379", "expected redis://"),
        ("memcached://:topsecret@127.0.0.1:11211", "expected redis://"),
    ],
)
def test_an_unusable_url_is_an_error_that_does_not_show_the_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        connect(url, 0.5)
    assert "topsecret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
        ("rediss://user:pw@redis.internal:6380/2?ssl_cert_reqs=none", "rediss://***@redis.internal:6380/2?ssl_cert_reqs=none"),
        ("redis://user@127.0.0.1:6379", "redis://***@127.0.0.1:6379"),
        ("redis://us@er:p@ss@host:1/0", "redis://***@host:1/0"),  # an unencoded @ in the password
        ("redis+cluster://u:pw@a:1,b:2", "redis+cluster://***@a:1,b:2"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_redact_url_hides_the_user_and_password_and_keeps_where(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "pw" not in redact_url(url).split("@")[0]
