"""Tags that Redis says are unchanged, trusted without asking again until Redis says otherwise.

A warm answer kept whole (pipeline/answer_memo.py) is right while each cell it was made of is
still the same frame in Redis; asking costs a round trip (~0.2-0.35 ms of a ~0.6 ms tiny
panel). Redis's server-assisted client-side caching, broadcasting mode
(https://redis.io/docs/latest/develop/reference/client-side-caching/), tells a subscribed
connection the name of every key under a prefix that is written, deleted, expired or evicted,
and a flush. So one connection of this process:

    CLIENT ID                      -> its own id
    CLIENT TRACKING ON REDIRECT <id> BCAST PREFIX promaccel:
    SUBSCRIBE __redis__:invalidate -> messages: the keys changed (a null: a flush)

and a storage key whose frame a probe found to be tag T is trusted to still be T until a
message names it. Trust is given up, for every key, on a flush, on a message for the
generation or invalidation-marker key (and the generation is then read again before the next
read), when the connection is lost (until it is back and subscribed), and after MAX_AGE_S in
any case (a message lost in a way nobody noticed, a key
expired lazily). A probe establishes trust only if no message at all arrived between its
send and its reply (`epoch`): an invalidation racing the read could otherwise be applied
before the old value is trusted. A key a probe found absent is trusted absent the same way
(`ABSENT`): a lookup's exact-window pieces and wider cells that nobody stored are then not
asked for on every request; being wrong about an absence (a message still on its way)
costs a fetch, never a wrong answer, and the fetch's lease reads the key once more
(pipeline/leases.py). Messages only take trust away, so a hostile or confused
Redis can only make promaccel ask more (it could replay old genuine frames anyway).

The wire is read by a small RESP2 reader of our own (`read_reply`): redis-py's parsers treat
the subscription's frames as pushes and never hand them back. The connection itself (TLS,
unix sockets, AUTH, SELECT) is made by redis-py (redis_client.raw_connection). Not for Redis
Cluster (tracking is per node).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from ..observe.metrics import METRICS
from .redis_invalidation import GENERATION_KEY, INVALIDATED_AT_KEY
from .store import Tagged

__all__ = ["ABSENT", "CHANNEL", "MAX_AGE_S", "RespError", "TagWatch", "read_reply"]

log = logging.getLogger("promaccel.cache")

CHANNEL = b"__redis__:invalidate"
# Keys whose change takes all trust away: a new generation, an invalidation's marker.
_WHOLESALE = frozenset({GENERATION_KEY.encode(), INVALIDATED_AT_KEY.encode()})
PREFIX = "promaccel:"
# What this process wrote is read once more this long after (`confirm_soon`), when Redis's
# message about its own write has come, so that the read can establish trust.
CONFIRM_AFTER_S = 0.01
# The tag trusted for a key that a probe found absent (no frame has an empty tag).
ABSENT = b""
# Trust lasts at most this long without a new probe.
MAX_AGE_S = 30.0
# At most this many keys trusted (least recently trusted dropped first: a dict keeps order).
MAX_KEYS = 200_000
# Bounds on what the connection may send (a hostile Redis must not make us allocate much).
MAX_BULK = 1 << 20
MAX_ITEMS = 1 << 17
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0)

# A connection: its streams, and how to close it.
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter, Callable[[], Awaitable[None]]]


class RespError(Exception):
    """A RESP error reply, or bytes that are not RESP2 within the bounds."""


async def read_reply(r: asyncio.StreamReader, depth: int = 0) -> object:
    """One RESP2 (or RESP3 push) reply: bytes, int, None (a null), or a list of them."""
    line = await r.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return bytes(rest)
    if kind == b"-":
        raise RespError(rest.decode("utf-8", "replace")[:200])
    if kind == b":":
        return int(rest)
    if kind == b"_":
        return None
    if kind not in (b"$", b"*", b">") or not rest.lstrip(b"-").isdigit():
        raise RespError(f"not RESP2: {line[:20]!r}")
    n = int(rest)
    if kind == b"$":
        if n < 0:
            return None
        if n > MAX_BULK:
            raise RespError(f"a bulk string of {n} bytes")
        return (await r.readexactly(n + 2))[:-2]
    if n < 0:  # a null array
        return None
    if n > MAX_ITEMS or depth > 3:
        raise RespError(f"an array of {n} items at depth {depth}")
    return [await read_reply(r, depth + 1) for _ in range(n)]


def _command(*args: str | bytes | int) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"".join([b"*%d\r\n" % len(parts), *(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)])


class TagWatch:
    """The trusted tags of storage keys, kept true by one subscribed connection (`run`).

    `epoch()` before a probe and `trust(epoch, pairs)` after it; `trusted(skey, tag)` for a
    check without I/O. `connect` opens the connection (redis_client.raw_connection)."""

    def __init__(self, connect: Callable[[], Awaitable[Streams]], prefix: str = PREFIX,
                 max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic,
                 reset: Callable[[], None] = lambda: None) -> None:
        self._connect = connect
        self._reset = reset  # called when all trust goes (the store re-reads its generation)
        self.prefix = prefix
        self.max_age_s = max_age_s
        self._clock = clock
        self._trusted: dict[bytes, tuple[bytes, float]] = {}
        self.listening = False
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    # --- what the store asks --------------------------------------------------------------

    def epoch(self) -> int | None:
        """The message count now, or None when nothing can be trusted (not subscribed)."""
        return self._seq if self.listening else None

    def trust(self, epoch: int | None, pairs: list[tuple[bytes, bytes]]) -> None:
        """Trust each (storage key, tag) a probe sent at `epoch` found, if no message came
        since (and the connection stayed up)."""
        if epoch is None or not self.listening or self._seq != epoch:
            return
        until = self._clock() + self.max_age_s
        for skey, tag in pairs:
            self._trusted.pop(skey, None)
            self._trusted[skey] = (tag, until)
        while len(self._trusted) > MAX_KEYS:
            del self._trusted[next(iter(self._trusted))]

    def trusted(self, skey: bytes, tag: bytes) -> bool:
        held = self._trusted.get(skey)
        if held is None or not self.listening:
            return False
        if held[0] != tag or held[1] < self._clock():
            del self._trusted[skey]
            return False
        return True

    def answers(self, skeys: Sequence[bytes], known: Sequence[bytes | None],
                miss: Tagged) -> tuple[list[Tagged], list[int]]:
        """A lookup's keys (storage keys, the tags the reader holds) as trust answers them
        without a read: a known tag still that frame, a key trusted absent `miss`; and the
        indexes of the keys left to read (`cache_tag_checks_total` counts the known tags)."""
        out = [miss if t is None else Tagged(None, t) for t in known]
        ask = [i for i, (sk, t) in enumerate(zip(skeys, known)) if not self.trusted(sk, ABSENT if t is None else t)]
        asked = sum(1 for i in ask if known[i] is not None)
        trusted = sum(1 for t in known if t is not None) - asked
        if trusted:
            METRICS.cache_tag_checks.labels("trusted").inc(trusted)
        if asked:
            METRICS.cache_tag_checks.labels("asked").inc(asked)
        return out, ask

    def learn(self, epoch: int | None, skeys: Sequence[str], read: Sequence[Tagged], miss: Tagged) -> None:
        """What one read sent at `epoch` found -- a frame's tag, or an absence (a result that
        is `miss` itself: not a failed read's) -- trusted if no message came since."""
        if epoch is None:  # not subscribed when the read was sent: nothing to trust
            return
        self.trust(epoch, [(sk.encode(), ABSENT if t.tag is None else t.tag)
                           for sk, t in zip(skeys, read) if t.tag is not None or t is miss])

    async def confirm_soon(self, read: Callable[[], Awaitable[object]]) -> None:
        """`read()` the frames this process just wrote, CONFIRM_AFTER_S later: trust cannot
        come from the write itself (Redis's message about it arrives after the reply, and a
        message taken for another writer's would be wrong to ignore), but a read sent once
        that message is in establishes it, so the answer asked again right after a miss is
        recalled without a read of its own."""
        await asyncio.sleep(CONFIRM_AFTER_S)
        if self.listening:
            await read()

    def forget_all(self) -> None:
        self._trusted.clear()
        self._seq += 1
        self._reset()

    # --- the connection -------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="promaccel-redis-tracking")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 -- shutting down
                pass
        self._lost()

    def _lost(self) -> None:
        self.listening = False
        self.forget_all()

    def invalidated(self, keys: object) -> None:
        """One message's payload: the keys changed, or None (a flush: everything)."""
        self._seq += 1
        if not isinstance(keys, list):
            self.forget_all()
            return
        for k in keys:
            if not isinstance(k, bytes) or k in _WHOLESALE:
                self.forget_all()
                return
            self._trusted.pop(k, None)

    async def run(self) -> None:
        """Subscribe, apply messages; on any failure give up all trust and subscribe again
        (backing off). Runs until cancelled."""
        failures = 0
        while True:
            close: Callable[[], Awaitable[None]] | None = None
            try:
                reader, writer, close = await self._connect()
                writer.write(_command("CLIENT", "ID"))
                await writer.drain()
                own = await read_reply(reader)
                if not isinstance(own, int):
                    raise RespError(f"CLIENT ID answered {own!r}")
                writer.write(_command("CLIENT", "TRACKING", "ON", "REDIRECT", own, "BCAST", "PREFIX", self.prefix))
                writer.write(_command("SUBSCRIBE", CHANNEL))
                await writer.drain()
                if await read_reply(reader) != b"OK":
                    raise RespError("CLIENT TRACKING refused")
                first = await read_reply(reader)
                if not (isinstance(first, list) and first[:2] == [b"subscribe", CHANNEL]):
                    raise RespError(f"SUBSCRIBE answered {first!r}")
                self.forget_all()
                self.listening = True
                failures = 0
                log.info("redis tracking: subscribed (trusting unchanged tags between invalidations)")
                while True:
                    msg = await read_reply(reader)
                    if isinstance(msg, list) and len(msg) == 3 and msg[0] == b"message" and msg[1] == CHANNEL:
                        self.invalidated(msg[2])
                    else:  # anything else on this connection: unexpected, so trust nothing
                        self.forget_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure: trust nothing, try again
                was = self.listening
                self._lost()
                if was or failures == 0:
                    log.warning("redis tracking: %s: %s (cached cells and answers kept whole are checked "
                                "with Redis each time until it is back)", type(exc).__name__, str(exc)[:200])
                failures += 1
            finally:
                self._lost()
                if close is not None:
                    try:
                        await close()
                    except Exception:  # noqa: BLE001 -- a broken connection closes as it can
                        pass
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
