"""The piece cache: finished pieces (Arrow IPC bytes) kept in process or in Redis.

    keys.py          CacheKey (what changes a piece's answer), PieceMeta, CacheItem
    ttl.py           freshness policy: ttl_for
    frame.py         stored value format: header, MAC (shared secret), key check
    bound.py         what a stored payload may decode to, checked before decoding
    store.py         PieceStore, the interface every store implements
    memory.py        the in-process LRU store
    redis_store.py   the Redis / Redis Cluster store
    redis_invalidation.py  its generation, per-metric invalidation indexes and marker
    redis_reads.py   its batched reads: whole entries, or only the MACs of kept ones
    redis_writes.py  its batched writes: frames queued with their TTLs and tags
    shared_reads.py  concurrent lookups of the same keys share one read
    redis_client.py  Redis connections (the only importer of `redis`)
    leases.py        fetch leases in Redis (one process of all sharing it fetches a piece)
    breaker.py       the Redis store's circuit breaker (the product's one, primitives/breaker.py)
    deadline.py      deadlines in event-loop idle time
    factory.py       make_store: the store a configuration asks for
    revalidate.py    background re-digests that drop pieces whose data changed

This module re-exports the API the executor and the admin routes use.
"""

from __future__ import annotations

from .breaker import CircuitBreaker
from .factory import make_store
from .frame import CorruptValue, decode_value, encode_value
from .keys import FORMAT_VERSION, CacheItem, CacheKey, Payload, PieceMeta
from .memory import MemoryStore
from .redis_store import RedisStore
from .store import LeaseTable, PieceStore
from .ttl import ttl_for

__all__ = [
    "FORMAT_VERSION",
    "CacheItem",
    "CacheKey",
    "CircuitBreaker",
    "CorruptValue",
    "LeaseTable",
    "MemoryStore",
    "Payload",
    "PieceMeta",
    "PieceStore",
    "RedisStore",
    "decode_value",
    "encode_value",
    "make_store",
    "ttl_for",
]
