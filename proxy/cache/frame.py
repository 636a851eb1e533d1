"""Stored value format: a frame around a piece's payload (Arrow IPC bytes).

    magic b"PAXC" | frame version u8 | len(canonical) u32 | crc32(canonical + payload) u32
    | canonical | payload

`decode_value` checks magic, version, length, checksum and that the stored canonical key
equals the requested one. Any failure is a miss and the value is deleted -- a canonical
mismatch under the same sha256 too: a true collision is astronomically unlikely, so a
mismatch means a bug or a foreign writer, and dropping it costs one miss (if it ever were a
real collision, the two pieces would evict each other rather than answer for each other).
"""

from __future__ import annotations

import struct
import zlib
from typing import Literal

from .keys import CacheKey, Payload

__all__ = ["FRAME_VERSION", "MAGIC", "CorruptValue", "decode_value", "encode_value"]

MAGIC = b"PAXC"
FRAME_VERSION = 1
_HEADER = struct.Struct(">4sBII")  # magic, frame version, len(canonical), crc32


class CorruptValue(Exception):
    """A stored value that is not a valid frame for the requested key."""

    def __init__(self, reason: Literal["truncated", "magic", "version", "checksum", "collision"]) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_value(key: CacheKey, payload: Payload) -> bytes:
    canonical = key.canonical_bytes
    crc = zlib.crc32(payload, zlib.crc32(canonical))
    return b"".join((_HEADER.pack(MAGIC, FRAME_VERSION, len(canonical), crc), canonical, payload))


def decode_value(key: CacheKey, value: bytes, *, verify_checksum: bool = True) -> memoryview:
    """The payload of `value` if it is a sound frame for `key`, else CorruptValue.

    The checksum costs about 1 ms per MB; the in-process store skips it (its values never
    leave process memory) but still checks the frame and the key."""
    if len(value) < _HEADER.size:
        raise CorruptValue("truncated")
    magic, version, clen, crc = _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise CorruptValue("magic")
    if version != FRAME_VERSION:
        raise CorruptValue("version")
    body = _HEADER.size + clen
    if len(value) < body:
        raise CorruptValue("truncated")
    view = memoryview(value)
    if verify_checksum and zlib.crc32(view[body:], zlib.crc32(view[_HEADER.size : body])) != crc:
        raise CorruptValue("checksum")
    if view[_HEADER.size : body] != key.canonical_bytes:
        raise CorruptValue("collision")
    # A view, not a copy: a heavy panel's cached cells are tens of megabytes (issue 15).
    return view[body:]
