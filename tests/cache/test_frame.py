"""Stored value frames (proxy/cache/frame.py): what `decode_value` accepts and refuses, and
`frame_mac`, the tag by which a reader that keeps a frame's payload decoded learns, from 32
bytes, that an entry still is that frame (issue 28). Frames in the stores, against a real
Redis: tests/cache/test_cache_integrity.py, tests/cache/test_redis_store.py."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from proxy.cache import CacheKey, CorruptValue, decode_value, encode_value
from proxy.cache.frame import DEFAULT_KEY, FRAME_VERSION, MAC_OFFSET, MAC_SIZE, MAGIC, frame_key, frame_mac
from shardplanner.plan import Span

KEY = CacheKey(query="up", span=Span.range(0, 3_600_000, 30_000), route=("prometheus",))
OTHER = dataclasses.replace(KEY, query="up2")
SECRET = frame_key(b"shared secret")
SKEY = "promaccel:v1:g3:" + KEY.digest


def test_round_trip_returns_a_view_of_the_payload() -> None:
    value = encode_value(KEY, b"payload bytes", mac_key=SECRET, skey=SKEY)
    got = decode_value(KEY, value, mac_key=SECRET, skey=SKEY)
    assert isinstance(got, memoryview) and bytes(got) == b"payload bytes"
    assert value[:4] == MAGIC and value[4] == FRAME_VERSION


@pytest.mark.parametrize(("change", "reason"), [
    (lambda v: v[:20], "truncated"),
    (lambda v: b"XXXX" + v[4:], "magic"),
    (lambda v: v[:4] + bytes([1]) + v[5:], "version"),
    (lambda v: v[:-1] + bytes([v[-1] ^ 1]), "mac"),  # one payload bit
    (lambda v: v[:MAC_OFFSET] + bytes(MAC_SIZE) + v[MAC_OFFSET + MAC_SIZE:], "mac"),
    (lambda v: v[:5] + struct.pack(">I", 10**6) + v[9:], "truncated"),
])
def test_damaged_frames_are_refused(change: object, reason: str) -> None:
    value = encode_value(KEY, b"payload bytes", mac_key=SECRET, skey=SKEY)
    with pytest.raises(CorruptValue) as err:
        decode_value(KEY, change(value), mac_key=SECRET, skey=SKEY)  # type: ignore[operator]
    assert err.value.reason == reason


def test_the_mac_binds_the_secret_the_storage_key_and_the_canonical_key() -> None:
    value = encode_value(KEY, b"p", mac_key=SECRET, skey=SKEY)
    for kw in ({"mac_key": frame_key(b"a guess")}, {"mac_key": DEFAULT_KEY},
               {"skey": SKEY.replace(":g3:", ":g4:")}):  # another generation
        with pytest.raises(CorruptValue, match="mac"):
            decode_value(KEY, value, **{"mac_key": SECRET, "skey": SKEY, **kw})  # type: ignore[arg-type]
    with pytest.raises(CorruptValue, match="collision"):
        decode_value(OTHER, value, mac_key=SECRET, skey=SKEY)
    # The in-process store neither writes nor checks a MAC, but still checks the key.
    bare = encode_value(KEY, b"p", mac_key=None)
    assert bytes(decode_value(KEY, bare, verify_mac=False)) == b"p"
    with pytest.raises(CorruptValue, match="collision"):
        decode_value(OTHER, bare, verify_mac=False)


def test_frame_mac_tells_frames_apart_by_everything_the_mac_covers() -> None:
    value = encode_value(KEY, b"payload", mac_key=SECRET, skey=SKEY)
    tag = frame_mac(value)
    assert len(tag) == MAC_SIZE == 32 and tag == value[MAC_OFFSET:MAC_OFFSET + MAC_SIZE]
    assert frame_mac(memoryview(value)) == tag  # from a view too (a bytes copy)
    assert frame_mac(encode_value(KEY, b"payload", mac_key=SECRET, skey=SKEY)) == tag  # deterministic
    others = {
        frame_mac(encode_value(KEY, b"payloaX", mac_key=SECRET, skey=SKEY)),
        frame_mac(encode_value(KEY, b"payload", mac_key=SECRET, skey=SKEY.replace(":g3:", ":g4:"))),
        frame_mac(encode_value(OTHER, b"payload", mac_key=SECRET, skey=SKEY)),
        frame_mac(encode_value(KEY, b"payload", mac_key=frame_key(b"other secret"), skey=SKEY)),
    }
    assert tag not in others and len(others) == 4
