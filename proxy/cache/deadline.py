"""Deadlines that count the event loop's idle time, not its lag (`idle_timeout`).

Under load the event loop runs other requests' work between a Redis reply's arrival and its
reading, and on a busy machine it also waits for a CPU; a wall-clock deadline would count
that lag against Redis. Used for every cache read and background write.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["idle_timeout"]

_T = TypeVar("_T")

_SCHEDSTAT = threading.local()


def _busy_s() -> float:
    """Seconds this thread has been running or runnable: its CPU time plus its time waiting
    for a CPU (Linux /proc/thread-self/schedstat), or its CPU time where that is missing."""
    fd = getattr(_SCHEDSTAT, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _SCHEDSTAT.fd = fd
    if fd >= 0:
        try:
            run_ns, wait_ns, _ = os.pread(fd, 128, 0).split()
            return (int(run_ns) + int(wait_ns)) / 1e9
        except (OSError, ValueError):
            pass
    return time.thread_time()


async def idle_timeout(aw: Awaitable[_T], idle_s: float, max_wall_s: float) -> _T:
    """Await `aw` until this thread has been *idle* (blocked waiting for I/O: wall time minus
    its CPU time and its time waiting for a CPU) for `idle_s`, or `max_wall_s` of wall time
    passed; then cancel it, TimeoutError.

    Under load the event loop runs other requests' work (encoding answers, merging) between
    a Redis reply's arrival and its reading, and on a busy machine it also waits for a CPU;
    a plain wall-clock deadline counts that lag against Redis and turns healthy reads into
    misses. A stalled Redis leaves the loop idle, so this still times out after `idle_s`.

    Like asyncio.timeout, `aw` runs in the calling task (no task of its own per call: this
    wraps every cache read and write); a timer re-checks the idle time when it fires and
    cancels the task only once the deadline has really passed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    wall0, busy0 = time.monotonic(), _busy_s()
    expired = False
    handle: asyncio.TimerHandle

    def check() -> None:
        nonlocal handle, expired
        wall = time.monotonic() - wall0
        idle = wall - (_busy_s() - busy0)
        wait_s = min(idle_s - idle, max_wall_s - wall)
        if wait_s <= 0:
            expired = True
            task.cancel()
        else:
            handle = loop.call_later(wait_s, check)

    handle = loop.call_later(max(0.0, min(idle_s, max_wall_s)), check)
    try:
        return await aw
    except asyncio.CancelledError:
        if expired and task.uncancel() <= cancelling:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()
        if asyncio.iscoroutine(aw):
            aw.close()  # never started (cancelled at once): no "never awaited" warning
