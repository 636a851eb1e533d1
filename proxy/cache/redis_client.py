"""Redis connections: the only module of promaccel that imports `redis`.

URLs: `redis://`, `rediss://`, `unix://` for one server; `redis+cluster://host:port` (or
`rediss+cluster://`, several seed nodes comma-separated) for Redis Cluster. A password kept
outside the URL (cache.redis_password_file, PROMACCEL_REDIS_PASSWORD) is passed as `password`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["connect", "raw_connection", "redact_url"]


def connect(url: str, connect_timeout_s: float, max_connections: int = 64,
            password: str | None = None) -> tuple[Any, bool]:
    """A redis.asyncio client for `url`, and whether it is a cluster client.

    One server: a *blocking* pool of `max_connections` (a caller waits for a free
    connection, within the store's own deadline). redis-py's default pool raises
    MaxConnectionsError as soon as 100 commands are in flight, which 50 dashboard users (300
    concurrent panel requests) hit at once: every such read was a cache error, three in a row
    opened the breaker, and the whole cache was bypassed. Cluster: `max_connections` per node
    (redis-py's cluster pool does not block; reads are coalesced, so few are in flight).

    `password`: AUTH with it (and the URL's user, if any) when the URL holds none; a password
    in the URL wins (redis-py lets the URL's options override keyword arguments)."""
    common: dict[str, Any] = {
        # Reads are bounded by the store's per-call deadlines instead (asyncio.timeout;
        # redis-py drops a connection whose read was cancelled): a socket timeout would
        # cut a large batch at the fixed connect timeout.
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout_s,
        "health_check_interval": 0,
        "decode_responses": False,
        "client_name": "promaccel",
    }
    if password:
        common["password"] = password
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("redis+cluster", "rediss+cluster"):
        userinfo, _, hosts = parts.netloc.rpartition("@")
        seeds = [h for h in hosts.split(",") if h]
        if not seeds:
            raise ValueError(f"cache.redis_url {redact_url(url)!r}: no cluster node given")
        first = urlunsplit((scheme.split("+")[0], f"{userinfo}@{seeds[0]}" if userinfo else seeds[0],
                            parts.path, parts.query, ""))
        others = []
        for seed in seeds[1:]:
            host, _, port = seed.rpartition(":")
            others.append(ClusterNode(host.strip("[]"), int(port)))
        # One retry without back-off lets a MOVED answer after resharding be followed; the
        # store's own deadline bounds the call either way.
        client = RedisCluster.from_url(first, startup_nodes=others or None, retry=Retry(NoBackoff(), 1),
                                       max_connections=max_connections, **common)
        return client, True
    if scheme in ("redis", "rediss", "unix"):
        # No client-side retries: a failed call is a miss, and the breaker handles outages.
        # timeout=None: waiting for a connection is bounded by the store's deadlines.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, retry=Retry(NoBackoff(), 0), **common
        )
        return aioredis.Redis.from_pool(pool), False
    raise ValueError(
        f"cache.redis_url {redact_url(url)!r}: expected redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
    )


async def raw_connection(client: Any) -> tuple[Any, Any, Any]:
    """A new connection to `client`'s server, set up as its pool sets up its own (TLS, unix
    socket, AUTH, SELECT, client name), for a reader of its own: (asyncio StreamReader,
    StreamWriter, an async callable that closes it). Used by cache/tracking.py, whose
    subscription redis-py's parsers do not hand back."""
    pool = client.connection_pool
    conn = pool.connection_class(**pool.connection_kwargs)
    await conn.connect()
    reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
    if reader is None or writer is None:  # another redis-py: no streams to read ourselves
        await conn.disconnect()
        raise RuntimeError("this redis-py's connection has no streams to read")
    return reader, writer, conn.disconnect


async def ping_report(client: Any, timeout_s: float) -> dict[str, Any]:
    """A PING within `timeout_s`: reachable and its round trip, or the error's type (never
    raised; for the operator page)."""
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await client.ping()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 -- reported, never raised
        return {"reachable": False, "ping_error": type(exc).__name__}
    return {"reachable": True, "ping_ms": round((time.perf_counter() - t0) * 1000, 1)}


def redact_url(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
