"""Freshness policy: how long a piece may be cached, from the end of the data it reads.

The pipeline passes the end of the piece's footprint (`shardplanner/footprint.py`: the newest
sample any selector of the piece reads, offsets and `@` included), so a piece far in the
past that reads recent data through `offset -1h` is still treated as recent.
"""

from __future__ import annotations

from ..config import CacheConfig

__all__ = ["ttl_for"]


def ttl_for(piece_end_ms: int, now_ms: int, cfg: CacheConfig) -> int | None:
    """TTL for a piece whose data ends at `piece_end_ms` (instant piece: its time), or None.

    Recent pieces still change (late scrapes, out-of-order samples), so they get the short
    `recent_ttl` (0: not cached) -- enough for a storm of identical refreshes to cost one
    backend call. With `out_of_order_window`/`out_of_order_ttl` configured, pieces inside
    the backend's out-of-order window get that shorter TTL instead of the long one.
    """
    if piece_end_ms > now_ms - cfg.max_freshness:
        return cfg.recent_ttl or None
    # Optional keys (not every CacheConfig has them): 0 means "no out-of-order window".
    ooo_window = int(getattr(cfg, "out_of_order_window", 0) or 0)
    ooo_ttl = int(getattr(cfg, "out_of_order_ttl", 0) or 0)
    if ooo_window and piece_end_ms > now_ms - ooo_window:
        return ooo_ttl or None
    return cfg.ttl or None
