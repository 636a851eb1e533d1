"""The Redis store's batched reads: whole entries (MGET), or, for entries the reader keeps
decoded, only their frames' MACs (GETRANGE of 32 bytes) to learn that they did not change.

A warm dashboard refresh reads the same cells again and again; their decoded columns are kept
by the reader (pipeline/cache_read.py). Reading every cell's payload from Redis and checking
its MAC again cost ~5 of 13 ms of a warm 2 MB panel (issue 28): the MAC bytes tell the same
thing for 32 bytes a cell. Used by `redis_store.RedisStore`, which owns the guarding
(deadline, breaker) and the frame checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .frame import MAC_OFFSET, MAC_SIZE
from .keys import CacheKey

__all__ = ["Probe", "fetch_probes", "flight_of", "mget"]


class Probe(NamedTuple):
    """A key to read, and the tag (frame MAC) of the frame the reader keeps for it (None:
    none)."""

    key: CacheKey
    known: bytes | None = None


def flight_of(probe: Probe) -> str:
    """Reads in flight are shared per key and known tag: a reader that keeps another frame
    (or none) needs another answer."""
    return probe.key.digest if probe.known is None else f"{probe.key.digest}:{probe.known.hex()}"


async def mget(client: Any, cluster: bool, skeys: list[str]) -> list[bytes | None]:
    """Whole values of `skeys` (None: missing), one MGET (one per node for a cluster)."""
    if cluster:
        return list(await client.mget_nonatomic(skeys))
    return list(await client.mget(skeys))


async def fetch_probes(client: Any, cluster: bool, skeys: list[str],
                       probes: Sequence[Probe]) -> tuple[list[str], list[bytes | None], list[bool]]:
    """Storage keys, values (None: missing, or unchanged) and which entries are unchanged:
    their MAC bytes equal the probe's known tag. One round trip (GETRANGEs and an MGET in
    one pipeline), and a second for entries whose MAC changed, read whole."""
    same = [False] * len(probes)
    checks = [i for i, p in enumerate(probes) if p.known is not None]
    if not checks:
        return skeys, await mget(client, cluster, skeys), same
    values: list[bytes | None] = [None] * len(probes)
    rest = [i for i, p in enumerate(probes) if p.known is None]
    pipe = client.pipeline(transaction=False)
    for i in checks:
        pipe.execute_command("GETRANGE", skeys[i], MAC_OFFSET, MAC_OFFSET + MAC_SIZE - 1)
    if rest and not cluster:
        pipe.execute_command("MGET", *(skeys[i] for i in rest))
    else:  # a cluster pipeline sends each GET to the node of its key
        for i in rest:
            pipe.execute_command("GET", skeys[i])
    # A key holding another type answers WRONGTYPE to GETRANGE: it is read whole below,
    # where MGET says nil, as a plain read does.
    replies = await pipe.execute(raise_on_error=False)
    for i, tag in zip(checks, replies):
        same[i] = isinstance(tag, bytes) and tag == probes[i].known
    got = replies[len(checks):]
    if rest and not cluster:
        if isinstance(got[0], Exception):
            raise got[0]
        got = got[0]
    for i, value in zip(rest, got):
        if isinstance(value, Exception) and not _wrong_type(value):
            raise value
        values[i] = value if isinstance(value, bytes) else None
    changed = [i for i in checks if not same[i]]
    if changed:
        for i, value in zip(changed, await mget(client, cluster, [skeys[i] for i in changed])):
            values[i] = value
    return skeys, values, same


def _wrong_type(exc: Exception) -> bool:
    return str(exc).startswith("WRONGTYPE")
