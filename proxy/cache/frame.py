"""Stored value format: an authenticated frame around a piece's payload (Arrow IPC bytes).

    magic b"PAXC" | frame version u8 (2) | len(canonical) u32 | mac (32 bytes)
    | canonical | payload

    mac = HMAC-SHA256(frame key, magic | version | len(canonical)
                                 | len(storage key) u16 | storage key | canonical | payload)

The frame key is derived from the cache secret shared by every promaccel using the store
(`frame_key`, `cache.secret_file` / `cache.secret` / `PROMACCEL_CACHE_SECRET`; factory.py
says what is used without one). Someone who can write to Redis but lacks the secret cannot
make a value promaccel serves (issue 26: a CRC only caught accidents, and a forged piece was
a HIT). The storage key (`promaccel:v1:g<generation>:<digest>`) is part of the MAC, so a
genuine value copied under another key or into another generation is refused too.

`decode_value` checks magic, version, length, the MAC (compared in constant time) and that
the stored canonical key equals the requested one. Any failure is a miss and the value is
deleted -- a canonical mismatch under the same sha256 too: a true collision is
astronomically unlikely, so a mismatch means a bug or a foreign writer, and dropping it costs
one miss (if it ever were a real collision, the two pieces would evict each other rather
than answer for each other). Version 1 frames (CRC only) are misses.

The in-process store neither computes nor checks the MAC (`mac_key` None: its values never
leave process memory); it still checks the frame and the key.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Literal

from .keys import CacheKey, Payload

__all__ = ["DEFAULT_SECRET", "FRAME_VERSION", "MAC_OFFSET", "MAC_SIZE", "MAGIC", "CorruptValue", "decode_value",
           "encode_value", "frame_key", "frame_mac"]

MAGIC = b"PAXC"
FRAME_VERSION = 2
MAC_SIZE = 32
_HEADER = struct.Struct(">4sBI32s")  # magic, frame version, len(canonical), mac
_PREFIX = 9  # magic, version, len(canonical): what the MAC covers of the header
# Where a frame's MAC lies: a reader that keeps a frame's decoded payload reads only these 32
# bytes (Redis GETRANGE) to learn whether the entry is still that frame (`frame_mac`).
MAC_OFFSET = _PREFIX
_NO_MAC = bytes(MAC_SIZE)
# The secret used when none is configured and none can be derived (factory.py): public,
# so frames keyed by it are checked for integrity only, not authenticity.
DEFAULT_SECRET = b"promaccel-cache-frame-default-secret"

Reason = Literal["truncated", "magic", "version", "mac", "collision", "too_large", "payload"]


class CorruptValue(Exception):
    """A stored value that is not a valid frame for the requested key (or whose payload
    is out of bounds, bound.py)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason)
        self.reason = reason


def frame_key(secret: bytes) -> bytes:
    """The MAC key of frames from the shared cache secret (a key of its own: the secret
    itself is never used directly)."""
    return hmac.digest(secret, b"promaccel cache frame mac v2", "sha256")


DEFAULT_KEY = frame_key(DEFAULT_SECRET)


def _mac(mac_key: bytes, prefix: Payload, skey: str, *body: Payload) -> bytes:
    """body: canonical and payload (one buffer or two)."""
    sk = skey.encode()
    h = hmac.new(mac_key, prefix, hashlib.sha256)
    h.update(struct.pack(">H", len(sk)))
    h.update(sk)
    for part in body:
        h.update(part)
    return h.digest()


def encode_value(key: CacheKey, payload: Payload, *, mac_key: bytes | None = DEFAULT_KEY, skey: str = "") -> bytes:
    """The frame of `payload` for `key`, stored under `skey`. `mac_key` None: no MAC (the
    in-process store)."""
    canonical = key.canonical_bytes
    prefix = struct.pack(">4sBI", MAGIC, FRAME_VERSION, len(canonical))
    mac = _NO_MAC if mac_key is None else _mac(mac_key, prefix, skey, canonical, payload)
    return b"".join((prefix, mac, canonical, payload))


def frame_mac(value: Payload) -> bytes:
    """The MAC of a frame that `decode_value` accepted (with `verify_mac`): the tag of that
    exact frame. The MAC covers the storage key, the canonical key and the payload, so an
    entry whose MAC bytes still equal this tag holds that frame's payload -- or is a copy of
    the MAC bytes beside other content, which only someone with Redis access could write,
    and whose reader then serves what it authenticated before (the tag's payload), never
    the forged content (pipeline/cache_read.py)."""
    return bytes(value[MAC_OFFSET:MAC_OFFSET + MAC_SIZE])


def decode_value(key: CacheKey, value: bytes, *, verify_mac: bool = True, mac_key: bytes = DEFAULT_KEY,
                 skey: str = "") -> memoryview:
    """The payload of `value` if it is a sound frame for `key` under `skey`, else
    CorruptValue. The MAC costs about 1 ms per MB; the in-process store skips it
    (`verify_mac` False) but still checks the frame and the key."""
    if len(value) < _HEADER.size:
        raise CorruptValue("truncated")
    magic, version, clen, mac = _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise CorruptValue("magic")
    if version != FRAME_VERSION:
        raise CorruptValue("version")
    body = _HEADER.size + clen
    if len(value) < body:
        raise CorruptValue("truncated")
    view = memoryview(value)
    if verify_mac and not hmac.compare_digest(_mac(mac_key, view[:_PREFIX], skey, view[_HEADER.size:]), mac):
        raise CorruptValue("mac")
    if view[_HEADER.size : body] != key.canonical_bytes:
        raise CorruptValue("collision")
    # A view, not a copy: a heavy panel's cached cells are tens of megabytes (issue 15).
    return view[body:]
