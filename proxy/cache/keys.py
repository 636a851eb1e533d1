"""Cache keys: everything that changes a piece's answer, and what invalidation knows of it.

`CacheKey.canonical()` is the key's deterministic text (ASCII JSON of a fixed field list);
`redis_key(gen)` is `promaccel:v1:g<gen>:<sha256 of canonical>`. No Redis Cluster hash tag:
keys spread over all slots and a batched read is split per node. `PieceMeta` is what
invalidation needs (the metrics a piece reads and the time range of its samples), and
`CacheItem` is one piece to store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from shardplanner.plan import Piece, ShardSpec, Span

__all__ = ["FORMAT_VERSION", "KEY_PREFIX", "CacheItem", "CacheKey", "PieceMeta"]

# Version of the payload layout (proxy/codec/arrow.py's Arrow IPC table); part of every key, so a new
# layout never reads an old one. 2: the label list is compressed (`promaccel.labels_zstd`).
FORMAT_VERSION = 2
KEY_PREFIX = "promaccel:v1"


@dataclass(frozen=True)
class CacheKey:
    """Everything that changes a piece's answer.

    query           the piece's PromQL exactly as sent to the backend (after normalisation)
    span            when it is evaluated (a range grid, or one instant)
    step_offset_ms  offset of the query's step grid (start mod step of the whole query)
    shard           the injected shard matcher, None when not sharded
    lookback_ms     the query's lookback delta
    route           backend name(s) the piece is answered from, in merge order
    tenant          tenant / auth scope: one caller's data never answers another
    format_version  payload layout version
    """

    query: str
    span: Span
    step_offset_ms: int = 0
    shard: ShardSpec | None = None
    lookback_ms: int = 300_000
    route: tuple[str, ...] = ()
    tenant: str = ""
    format_version: int = FORMAT_VERSION

    @classmethod
    def for_piece(
        cls,
        piece: Piece,
        *,
        lookback_ms: int,
        route: Sequence[str],
        tenant: str = "",
        step_offset_ms: int | None = None,
        format_version: int = FORMAT_VERSION,
    ) -> CacheKey:
        if step_offset_ms is None:
            span = piece.span
            step_offset_ms = span.start_ms % span.step_ms if span.step_ms else 0
        return cls(
            query=piece.query,
            span=piece.span,
            step_offset_ms=step_offset_ms,
            shard=piece.shard,
            lookback_ms=lookback_ms,
            route=tuple(route),
            tenant=tenant,
            format_version=format_version,
        )

    def canonical(self) -> str:
        return self._canonical

    @cached_property
    def _canonical(self) -> str:
        s = self.shard
        shard = None if s is None else [s.label, s.index, s.count, s.matcher_op, s.matcher_value]
        span = self.span
        ranged = span.step_ms is not None
        fields = [
            "piece",
            self.format_version,
            self.query,
            span.start_ms if ranged else None,
            span.end_ms if ranged else None,
            span.step_ms,
            None if ranged else span.time_ms,
            self.step_offset_ms,
            shard,
            self.lookback_ms,
            list(self.route),
            self.tenant,
        ]
        # ASCII JSON: unambiguous (no delimiter can be forged inside a string) and stable.
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":"))

    @cached_property
    def canonical_bytes(self) -> bytes:
        return self._canonical.encode("ascii")

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_bytes).hexdigest()

    def redis_key(self, generation: int) -> str:
        return f"{KEY_PREFIX}:g{generation}:{self.digest}"


@dataclass(frozen=True)
class PieceMeta:
    """What invalidation needs to know about a stored piece.

    metrics        metric names the piece reads; empty when unknown (e.g. a regex on
                   __name__): such a piece matches every invalidation
    start_ms/end_ms  time range of the samples the piece reads, i.e. its first evaluation
                   time minus the longest range/lookback/offset, to its last evaluation time
    fetched_at_ms  wall-clock time the backend call for the piece was sent; a piece fetched
                   before an invalidation is not stored
    """

    metrics: tuple[str, ...]
    start_ms: int
    end_ms: int
    fetched_at_ms: int

    def overlaps(self, start_ms: int | None, end_ms: int | None) -> bool:
        return (end_ms is None or self.start_ms <= end_ms) and (start_ms is None or self.end_ms >= start_ms)


# A stored piece's Arrow IPC bytes: a view of the stored value (no copy) when read back.
Payload = bytes | memoryview


class CacheItem(NamedTuple):
    """One piece to store. `ttl_ms` None or <= 0: not stored (pass `ttl_for`'s answer)."""

    key: CacheKey
    payload: Payload  # Arrow IPC (a view of Arrow's buffer when just encoded)
    ttl_ms: int | None
    meta: PieceMeta
