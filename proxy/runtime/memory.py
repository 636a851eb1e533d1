"""Process memory: how freed buffers go back to the system.

glibc serves an allocation of 128 KiB or more with its own mmap, returned to the system when
freed -- but each such free *raises* that threshold (up to 32 MiB), after which buffers of a
few megabytes come from the heap and arenas and stay resident after they are freed. An
answer of a few million samples is made of such buffers (numpy arrays, Arrow payloads,
JSON chunks), so after one heavy query promaccel's RSS stayed ~100 MiB above what it held.
So `tune_malloc` pins the threshold at 128 KiB (`mallopt(M_MMAP_THRESHOLD)`, which turns the
raising off), and has Arrow allocate from the same malloc instead of its bundled mimalloc
(which kept 25-60 MiB of a burst's freed payloads). Together: 20 heavy 24 h queries at once
peaked ~110 MiB lower, and a warm 24 h dashboard refresh took as long (docs/BENCHMARKS.md).

It also caps glibc's arenas at ARENA_MAX (`mallopt(M_ARENA_MAX)`). glibc gives each thread
that allocates while another holds an arena's lock an arena of its own, up to 8 per core,
and memory freed into an arena stays there for its thread: the worker threads that decode,
cut, encode and gzip (asyncio's executor, the gzip halves) each kept their share of a burst.
20 heavy 24 h queries at once (scenario (e), a development script, 4 runs each, alternating):
peak 101.9-111.6 MiB over idle with glibc's default, 91.9-100.1 with 2 arenas, as fast.
Most allocations happen under the GIL anyway, so the threads rarely wait on each other.

- `PROMACCEL_MMAP_THRESHOLD=<bytes>` sets another threshold; 0 leaves glibc's dynamic one.
- `PROMACCEL_MALLOC_ARENAS=<n>` another arena cap; 0 leaves glibc's (8 per core), as does
  glibc's own MALLOC_ARENA_MAX when set.
- `ARROW_DEFAULT_MEMORY_POOL` (Arrow's own setting: mimalloc, jemalloc, system), when set, is
  left to Arrow.
- Nothing happens to malloc where there is no glibc (musl, macOS) or when glibc's own
  MALLOC_MMAP_THRESHOLD_ is set.

`give_back_soon` (called when a large answer's reservation is let go,
`pipeline/answer_bytes.py`, and when a large call's answer has been cut into packed cells,
`pipeline/fetch.py`) also returns what the heap holds freed: `malloc_trim(0)` releases whole
free pages in the middle of the heap, and Arrow's pool its cached blocks (when it is not
malloc). Off the event loop, at most once every GIVE_BACK_EVERY_S.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger("promaccel")

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 << 10  # 0: glibc's dynamic threshold (see above)
ARENA_MAX = 2  # 0: glibc's own cap (see above)

_done = False


def _libc() -> Any:
    """The C library's functions, from the symbols already loaded in this process (no
    `ctypes.util.find_library`: it runs `ldconfig -p` in a subprocess, and a fork of a process
    of a few hundred MiB from the give-back thread, in the middle of a burst, showed as a
    +250 MiB spike in a sampler summing the process tree, 1 run in ~10: issue 15)."""
    return ctypes.CDLL(None)


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold, cap its arenas, and choose Arrow's pool (once per
    process); True if the threshold was set."""
    global _done
    if _done:
        return False
    _done = True
    from .. import ARROW_POOL_CHOSEN

    if not ARROW_POOL_CHOSEN:  # pyarrow may have been imported first (an embedding program)
        from ..codec.arrow import use_system_pool

        use_system_pool()
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    arenas = _setting("PROMACCEL_MALLOC_ARENAS", ARENA_MAX, "a number of arenas")
    if arenas > 0 and "MALLOC_ARENA_MAX" not in os.environ and not mallopt(M_ARENA_MAX, arenas):
        log.debug("mallopt(M_ARENA_MAX) refused")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    threshold = _setting("PROMACCEL_MMAP_THRESHOLD", MMAP_THRESHOLD, "a number of bytes")
    if threshold <= 0:
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return ok


def _setting(name: str, default: int, what: str) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        log.warning("%s is not %s: ignored", name, what)
        return default


# Memory given back after a large answer or a large call (`give_back_soon`): at most once per
# this many seconds. A trim takes a few milliseconds; 1 s let a burst of heavy queries pile
# up freed pages between trims (20 heavy 24 h queries at once: median peak +107 -> +96 MiB
# over idle with 0.25 s and a trim after each packed call, 10 runs each; issue 15).
GIVE_BACK_EVERY_S = 0.25
_last_give_back = 0.0
_trim: Any = None


def give_back() -> None:
    """Return freed memory to the system: glibc's free heap pages (`malloc_trim`) and Arrow's
    pool's cached blocks. A few milliseconds; run off the event loop."""
    global _trim
    if _trim is None:
        try:
            _trim = _libc().malloc_trim
            _trim.argtypes = [ctypes.c_size_t]
            _trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)
    try:
        from ..codec.arrow import release_unused

        release_unused()
    except Exception:  # noqa: BLE001 -- best effort
        pass


def give_back_soon() -> None:
    """`give_back` in a worker thread, at most once per GIVE_BACK_EVERY_S: one asked for
    sooner runs when that second is over (once, however many were asked for), so the last
    large answer of a burst gives its memory back too (20 heavy queries at once kept ~35 MiB
    more, one run in two, when it came within the second of the one before: issue 15)."""
    global _last_give_back, _trailing
    now = time.monotonic()
    wait = _last_give_back + GIVE_BACK_EVERY_S - now
    if wait > 0:
        if _trailing is None:
            _trailing = threading.Timer(wait, _give_back_late)
            _trailing.daemon = True
            _trailing.start()
        return
    _last_give_back = now
    threading.Thread(target=give_back, name="promaccel-give-back", daemon=True).start()


_trailing: Any = None


def _give_back_late() -> None:
    global _last_give_back, _trailing
    _trailing = None
    _last_give_back = time.monotonic()
    give_back()
