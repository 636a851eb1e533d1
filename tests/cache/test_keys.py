"""proxy/cache/keys.py: a cache key carries everything that changes a piece's answer, no two
different answers share a key (not even through a forged delimiter), and what reaches Redis is
bounded whatever the query's size. PieceMeta.overlaps: closed ranges, None unbounded."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import pytest

from proxy.cache.keys import FORMAT_VERSION, KEY_PREFIX, CacheKey, PieceMeta
from shardplanner.plan import Piece, ShardSpec, Span

SHARD = ShardSpec("Hostname", 1, 4, "=~", "node-1|node-5")
BASE = CacheKey(
    query="sum by (Hostname) (rate(DCGM_FI_DEV_GPU_UTIL[5m]))",
    span=Span.range(1_700_000_000_000, 1_700_003_600_000, 30_000),
    step_offset_ms=0,
    shard=SHARD,
    lookback_ms=300_000,
    route=("prometheus",),
    tenant="team-a",
)

# One variant per field that changes the answer; each must give a key of its own.
VARIANTS: dict[str, CacheKey] = {
    "query": dataclasses.replace(BASE, query=BASE.query + " "),
    "start": dataclasses.replace(BASE, span=Span.range(1_700_000_030_000, 1_700_003_600_000, 30_000)),
    "end": dataclasses.replace(BASE, span=Span.range(1_700_000_000_000, 1_700_003_630_000, 30_000)),
    "step": dataclasses.replace(BASE, span=Span.range(1_700_000_000_000, 1_700_003_600_000, 60_000)),
    "instant": dataclasses.replace(BASE, span=Span.instant(1_700_000_000_000)),
    "step_offset": dataclasses.replace(BASE, step_offset_ms=15_000),
    "unsharded": dataclasses.replace(BASE, shard=None),
    "shard_label": dataclasses.replace(BASE, shard=dataclasses.replace(SHARD, label="instance")),
    "shard_index": dataclasses.replace(BASE, shard=dataclasses.replace(SHARD, index=2)),
    "shard_count": dataclasses.replace(BASE, shard=dataclasses.replace(SHARD, count=8)),
    "shard_op": dataclasses.replace(BASE, shard=dataclasses.replace(SHARD, matcher_op="!~")),
    "shard_value": dataclasses.replace(BASE, shard=dataclasses.replace(SHARD, matcher_value="node-1")),
    "lookback": dataclasses.replace(BASE, lookback_ms=600_000),
    "route": dataclasses.replace(BASE, route=("amp",)),
    "route_order": dataclasses.replace(BASE, route=("prometheus", "amp")),
    "route_order_2": dataclasses.replace(BASE, route=("amp", "prometheus")),
    "no_route": dataclasses.replace(BASE, route=()),
    "tenant": dataclasses.replace(BASE, tenant="team-b"),
    "no_tenant": dataclasses.replace(BASE, tenant=""),
    "format": dataclasses.replace(BASE, format_version=FORMAT_VERSION + 1),
}


def test_every_field_that_changes_the_answer_changes_the_key() -> None:
    keys = {"base": BASE, **VARIANTS}
    digests = {name: k.digest for name, k in keys.items()}
    assert len(set(digests.values())) == len(keys), digests
    storage = {k.redis_key(0) for k in keys.values()}
    assert len(storage) == len(keys)


def test_equal_keys_give_equal_text_whatever_the_instance() -> None:
    # Two processes building the same key must find each other's entries.
    again = CacheKey(query=str(BASE.query), span=Span.range(1_700_000_000_000, 1_700_003_600_000, 30_000),
                     shard=ShardSpec("Hostname", 1, 4, "=~", "node-1|node-5"), route=tuple(["prometheus"]),
                     tenant="team-a")
    assert again == BASE
    assert again.canonical() == BASE.canonical()
    assert again.digest == BASE.digest
    assert again.redis_key(7) == BASE.redis_key(7)


def test_the_storage_key_is_prefix_generation_and_the_sha256_of_the_canonical_text() -> None:
    digest = hashlib.sha256(BASE.canonical().encode("ascii")).hexdigest()
    assert BASE.digest == digest
    assert BASE.redis_key(3) == f"{KEY_PREFIX}:g3:{digest}"
    # A new generation makes every old entry unreachable: its storage key differs.
    assert BASE.redis_key(3) != BASE.redis_key(4)
    assert BASE.redis_key(1) != BASE.redis_key(11)  # no prefix confusion between generations


def test_the_canonical_text_holds_each_field_so_a_digest_match_can_be_confirmed() -> None:
    # frame.py compares the stored canonical text with the requested one: it must name every
    # field, readable back exactly (not a lossy summary).
    fields = json.loads(BASE.canonical())
    assert BASE.query in fields
    assert ["prometheus"] in fields
    assert "team-a" in fields
    assert [SHARD.label, SHARD.index, SHARD.count, SHARD.matcher_op, SHARD.matcher_value] in fields
    assert BASE.span.start_ms in fields and BASE.span.end_ms in fields and BASE.span.step_ms in fields


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # A naive "a|b" or "a,b" join would make these collide.
        (dict(route=("a,b",)), dict(route=("a", "b"))),
        (dict(route=("a", "b")), dict(route=("a\",\"b",))),
        (dict(tenant='x","y'), dict(tenant="x", route=("y",))),
        (dict(query='up","x'), dict(query="up", tenant="x")),
        (dict(query="up\\"), dict(query="up\\\\")),
        (dict(tenant=""), dict(tenant="\x00")),
        (dict(query="up", tenant="ab"), dict(query="upa", tenant="b")),
    ],
)
def test_no_delimiter_inside_a_field_can_forge_another_key(a: dict[str, object], b: dict[str, object]) -> None:
    ka = dataclasses.replace(BASE, **a)  # type: ignore[arg-type]
    kb = dataclasses.replace(BASE, **b)  # type: ignore[arg-type]
    assert ka.canonical() != kb.canonical()
    assert ka.digest != kb.digest


def test_an_instant_and_a_one_point_range_at_the_same_time_are_different_pieces() -> None:
    # An instant query's answer is a vector, a range query's a matrix.
    t = 1_700_000_000_000
    instant = dataclasses.replace(BASE, span=Span.instant(t))
    one_point = dataclasses.replace(BASE, span=Span.range(t, t, 30_000))
    assert instant.digest != one_point.digest


def test_instants_differ_by_their_time() -> None:
    a = dataclasses.replace(BASE, span=Span.instant(1_000))
    b = dataclasses.replace(BASE, span=Span.instant(2_000))
    assert a.digest != b.digest


def test_the_storage_key_is_bounded_and_ascii_whatever_the_query() -> None:
    huge = dataclasses.replace(BASE, query="up{a=\"" + "x" * 200_000 + "\"}")
    unicode = dataclasses.replace(BASE, query='up{a="\u00e9\u4e2d\U0001f600"}', tenant="\u00fc")
    lone_surrogate = dataclasses.replace(BASE, query='up{a="\ud800"}')
    lengths = set()
    for k in (BASE, huge, unicode, lone_surrogate):
        skey = k.redis_key(123_456)
        assert re.fullmatch(rf"{re.escape(KEY_PREFIX)}:g123456:[0-9a-f]{{64}}", skey), skey
        lengths.add(len(skey))
        # The canonical text is ASCII (JSON escapes): encodable, and decodes back to the query.
        assert k.canonical_bytes.decode("ascii") == k.canonical()
        assert k.query in json.loads(k.canonical())
    assert len(lengths) == 1
    # Different non-ASCII spellings stay different.
    other = dataclasses.replace(BASE, query='up{a="\u00e9\u4e2d\U0001f601"}', tenant="\u00fc")
    assert other.digest != unicode.digest


def test_for_piece_takes_the_pieces_fields_and_the_grid_offset_of_its_start() -> None:
    piece = Piece("sum(up)", Span.range(1_000_015_000, 1_000_315_000, 60_000), shard=SHARD)
    k = CacheKey.for_piece(piece, lookback_ms=120_000, route=["amp", "prometheus"], tenant="t")
    assert k.query == "sum(up)" and k.span == piece.span and k.shard == SHARD
    assert k.lookback_ms == 120_000 and k.route == ("amp", "prometheus") and k.tenant == "t"
    # start mod step: 1_000_015_000 = 16_666 * 60_000 + 55_000
    assert k.step_offset_ms == 1_000_015_000 - (1_000_015_000 // 60_000) * 60_000 == 55_000
    # Pieces of the same query on grids shifted against each other never share a key.
    shifted = Piece("sum(up)", Span.range(1_000_020_000, 1_000_320_000, 60_000), shard=SHARD)
    assert CacheKey.for_piece(shifted, lookback_ms=120_000, route=["amp", "prometheus"], tenant="t").digest != k.digest
    # An explicit offset (the whole query's) wins; an instant has none.
    assert CacheKey.for_piece(piece, lookback_ms=1, route=(), step_offset_ms=7).step_offset_ms == 7
    instant = CacheKey.for_piece(Piece("up", Span.instant(1_234_567)), lookback_ms=1, route=())
    assert instant.step_offset_ms == 0
    assert instant.format_version == FORMAT_VERSION


def test_keys_are_hashable_values() -> None:
    # Used as dict keys by the readers and writers: equal keys are one entry.
    again = dataclasses.replace(BASE)
    assert {BASE: 1, again: 2} == {BASE: 2}
    assert len({BASE, *VARIANTS.values()}) == len(VARIANTS) + 1


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (None, None, True),
        (100, 200, True),  # same range
        (200, 300, True),  # touches the end: closed
        (0, 100, True),  # touches the start: closed
        (201, 300, False),
        (0, 99, False),
        (150, 160, True),  # inside
        (0, 1_000, True),  # around
        (None, 99, False),
        (None, 100, True),
        (201, None, False),
        (200, None, True),
    ],
)
def test_piece_meta_overlaps_closed_ranges(start: int | None, end: int | None, expected: bool) -> None:
    meta = PieceMeta(("up",), 100, 200, fetched_at_ms=0)
    assert meta.overlaps(start, end) is expected
