"""The wall clock, in integer milliseconds since the epoch (the one clock of the product).

Cache entries' fetch times and expiries, the invalidation marker shared through Redis, day
cells, freshness windows and the holdings of a hybrid fleet all compare times with each other
and with other processes' times, so they read one clock. Components that take a clock take a
`WallClock` (tests pass a fake one); durations measured inside one process use
`time.monotonic` instead, which never jumps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["WallClock", "wall_ms"]

WallClock = Callable[[], int]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
