"""Fetch leases in Redis: of all the promaccel processes sharing a Redis, one fetches a piece
that is missing from the cache and the others wait for it to land.

`promaccel:v1:lease:<key digest>` holds its owner's token, set with NX and a short PX, renewed
while the owner fetches and stores the piece, and deleted by the owner (only while the token
is still its own) once the piece is stored or will not be. Every call is guarded like the
store's others (deadline in loop idle time, circuit breaker, `promaccel_cache_errors_total
{op="lease"}`): a failure answers None, and the caller fetches by itself.

A lease key without a TTL, or with one longer than the lease time asked for
(`cache.fetch_lease`), is not a lease promaccel made (someone with write access to Redis, or
a replica configured otherwise): it is ignored -- `acquire` deletes it and takes the lease,
`poll` reads it as absent -- so it can neither stall queries nor stay forever (issue 26).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from .keys import KEY_PREFIX, CacheKey, Payload

__all__ = ["LEASE_PREFIX", "LeaseHost", "RedisLeases", "lease_key"]

_T = TypeVar("_T")

LEASE_PREFIX = f"{KEY_PREFIX}:lease:"

# Delete / extend a lease only while it still holds the caller's token: a lease that expired
# and was taken by another process is theirs.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
# Take a lease: one without a TTL or with a longer one than asked for is deleted first.
# 1: taken, 2: taken after deleting such a lease, 0: held by another.
_ACQUIRE = ("local t = redis.call('pttl', KEYS[1]) local gone = 0 "
            "if t == -1 or t > tonumber(ARGV[2]) then redis.call('del', KEYS[1]) gone = 1 end "
            "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 + gone end "
            "return 0")
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
          "return 0")


def lease_key(digest: str) -> str:
    return LEASE_PREFIX + digest


class LeaseHost(Protocol):
    """What the lease commands need of a Redis store (`RedisStore` provides it): its pipelines,
    its generation (leases read the pieces they guard under the current one), its check of
    stored frames, and its guard (deadline, breaker, error counting)."""

    def pipeline(self, atomic: bool = False) -> Any:
        """A command pipeline; `atomic`: one transaction where the server allows it."""

    async def generation(self) -> int: ...

    def verify(self, keys: Sequence[CacheKey], skeys: Sequence[str],
               values: Sequence[bytes | None]) -> tuple[list[Payload | None], list[str]]: ...

    async def guarded(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T | None:
        """fn() under the store's guard; None when it failed, timed out or was skipped."""


class RedisLeases:
    """The lease commands over one Redis store (`LeaseHost`): the `LeaseTable` a store
    shared by several processes offers (`store.PieceStore.leases`)."""

    def __init__(self, host: LeaseHost) -> None:
        self.host = host
        self.ignored = 0  # leases without a TTL or with too long a one, deleted by acquire

    def _pipe(self, atomic: bool = False) -> Any:
        # One server: a transaction, so that two processes asking for the same pieces at
        # once get all of them each way, never half; a cluster spreads the keys over nodes.
        return self.host.pipeline(atomic)

    async def acquire(self, keys: Sequence[CacheKey], tokens: Sequence[str],
                      ttl_ms: int) -> tuple[list[bool], list[Payload | None]] | None:
        """SET NX PX each piece's lease (deleting a lease without a TTL or with a longer one
        first), then read the pieces, in one round trip: True where the caller now holds the
        lease, and the pieces already stored (payloads of sound frames; one that landed since
        the caller's lookup needs no fetch); None if Redis failed. `self.ignored` counts the
        leases deleted so."""

        async def go() -> tuple[list[bool], list[Payload | None]]:
            gen = await self.host.generation()
            skeys = [k.redis_key(gen) for k in keys]
            pipe = self._pipe(atomic=True)
            for k, t in zip(keys, tokens):
                pipe.eval(_ACQUIRE, 1, lease_key(k.digest), t, ttl_ms)
            for skey in skeys:
                pipe.get(skey)
            replies = await pipe.execute()
            payloads, _ = self.host.verify(keys, skeys, replies[len(keys):])
            taken = [int(r or 0) for r in replies[:len(keys)]]
            self.ignored += sum(1 for r in taken if r == 2)
            return [r > 0 for r in taken], payloads

        return await self.host.guarded("lease", go)

    async def renew(self, digests: Sequence[str], tokens: Sequence[str], ttl_ms: int) -> list[bool] | None:
        """Extend the leases still held with these tokens: False where one is no longer ours."""

        async def go() -> list[bool]:
            pipe = self._pipe()
            for d, t in zip(digests, tokens):
                pipe.eval(_RENEW, 1, lease_key(d), t, ttl_ms)
            return [bool(r) for r in await pipe.execute()]

        return await self.host.guarded("lease", go)

    async def release(self, digests: Sequence[str], tokens: Sequence[str]) -> bool:
        async def go() -> bool:
            pipe = self._pipe()
            for d, t in zip(digests, tokens):
                pipe.eval(_RELEASE, 1, lease_key(d), t)
            await pipe.execute()
            return True

        return await self.host.guarded("lease", go) is not None

    async def poll(self, keys: Sequence[CacheKey],
                   max_ttl_ms: int | None = None) -> tuple[list[bool], list[Payload | None]] | None:
        """Which leases are still held, then the pieces (payloads of sound frames), in one
        round trip: a lease found gone before a piece found missing means its owner stored
        nothing (it deletes the lease only after the write landed). A lease without a TTL,
        or with one over `max_ttl_ms`, is not held."""

        async def go() -> tuple[list[bool], list[Payload | None]]:
            gen = await self.host.generation()
            skeys = [k.redis_key(gen) for k in keys]
            pipe = self._pipe()
            for k in keys:
                pipe.pttl(lease_key(k.digest))
            for skey in skeys:
                pipe.get(skey)
            replies = await pipe.execute()
            held = [0 <= int(r) and (max_ttl_ms is None or int(r) <= max_ttl_ms) for r in replies[:len(keys)]]
            payloads, _ = self.host.verify(keys, skeys, replies[len(keys):])
            return held, payloads

        return await self.host.guarded("lease", go)
