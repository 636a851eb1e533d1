"""The Redis store's batched writes: each item as a frame (MAC'd under its storage key) SET
with its TTL, queued on one pipeline after the invalidation indexes' updates. Used by
`redis_store.RedisStore`, which owns the guarding (deadline, breaker), the marker reads around
the write and the unlinking of what raced an invalidation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .frame import encode_value, frame_mac
from .keys import CacheItem

__all__ = ["Queued", "queue_frames"]


class Queued(NamedTuple):
    """What `queue_frames` queued: the storage keys (in the items' order), each frame's tag
    (its MAC) by storage key, and the bytes of all frames."""

    skeys: list[str]
    tags: dict[str, bytes]
    nbytes: int


def queue_frames(pipe: Any, gen: int, items: Sequence[CacheItem], mac_key: bytes | None) -> Queued:
    """Queue a SET of each item's frame (generation `gen`'s storage key, the item's TTL)."""
    skeys: list[str] = []
    tags: dict[str, bytes] = {}
    nbytes = 0
    for it in items:
        skey = it.key.redis_key(gen)
        value = encode_value(it.key, it.payload, mac_key=mac_key, skey=skey)
        pipe.set(skey, value, px=it.ttl_ms)
        skeys.append(skey)
        tags[skey] = frame_mac(value)
        nbytes += len(value)
    return Queued(skeys, tags, nbytes)
