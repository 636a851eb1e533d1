"""proxy/runtime/memory.py, observed in glibc itself: after `tune_malloc` an allocation of
1 MiB is its own mmap (returned to the system when freed) even after glibc's dynamic
threshold would have been raised past it, PROMACCEL_MMAP_THRESHOLD moves the threshold, 0
and glibc's own MALLOC_MMAP_THRESHOLD_ leave glibc alone, threads get at most ARENA_MAX arenas
(PROMACCEL_MALLOC_ARENAS, MALLOC_ARENA_MAX), Arrow allocates with malloc unless
ARROW_DEFAULT_MEMORY_POOL says otherwise; `give_back` returns freed heap pages (RSS falls);
`give_back_soon` runs at once, then at most once per GIVE_BACK_EVERY_S, the last one late.

Each configuration runs in a fresh process: the tuning is once per process, and a process's
malloc state is what is measured (`mallinfo2`: bytes in mmapped blocks; /proc/self/statm)."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from proxy.runtime import memory

ROOT = Path(__file__).resolve().parent.parent.parent
GLIBC = hasattr(ctypes.CDLL(None), "mallinfo2") and hasattr(ctypes.CDLL(None), "mallopt")

PROBE = r"""
import ctypes, json, os, sys

libc = ctypes.CDLL(None)


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

from proxy.runtime import memory

tuned = memory.tune_malloc() if sys.argv[1] == "tune" else None
# Freeing an mmapped 8 MiB block is what raises glibc's dynamic threshold to 8 MiB (a heavy
# answer's buffers do this in the server).
p = libc.malloc(8 << 20)
libc.free(p)


def mapped(size):
    # glibc maps a block of its own only when the heap cannot serve it; 1 and 4 MiB are more
    # than the heap of this small process has free.
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(size)
    grew = libc.mallinfo2().hblkhd - before
    libc.free(p)
    return grew >= size


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


import pyarrow as pa

out = {"tuned": tuned, "pool": pa.default_memory_pool().backend_name,
       "1MiB": mapped(1 << 20), "4MiB": mapped(4 << 20)}
if "rss" in sys.argv:
    blocks = [libc.malloc(60 << 10) for _ in range(400)]  # 24 MB of heap blocks, under any threshold
    for b in blocks:
        ctypes.memset(b, 1, 60 << 10)
    top = libc.malloc(60 << 10)  # holds the heap's top: free() alone cannot shrink the heap
    ctypes.memset(top, 1, 60 << 10)
    for b in blocks:
        libc.free(b)
    held = rss()
    memory.give_back()
    out["freed_rss"] = held - rss()
if "arenas" in sys.argv:
    # Eight threads allocate at once (each holds its block until all have one): glibc gives
    # each an arena of its own up to its cap; malloc_stats prints one "Arena n:" per arena.
    import threading
    barrier = threading.Barrier(8)

    def grab():
        p = libc.malloc(4096)
        barrier.wait()
        libc.free(p)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stderr.flush()
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    libc.malloc_stats()
    os.dup2(saved, 2)
    os.close(w)
    text = os.read(r, 1 << 20).decode()
    out["arenas"] = sum(1 for line in text.splitlines() if line.startswith("Arena "))
print(json.dumps(out))
"""



def test_the_suite_runs_over_glibc() -> None:
    """The suite runs on Debian (make test), whose glibc malloc is what memory.py tunes: these
    tests measure it, and are not to be skipped on a machine without it (musl/macOS)."""
    assert GLIBC


@functools.cache
def _run(args: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MALLOC_MMAP_THRESHOLD_", "PROMACCEL_MMAP_THRESHOLD", "ARROW_DEFAULT_MEMORY_POOL",
                            "MALLOC_ARENA_MAX", "PROMACCEL_MALLOC_ARENAS")}
    environ.update(dict(env), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                         env=environ, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _probe(*args: str, **env: str) -> dict[str, object]:
    """The probe's findings in a fresh process (each configuration run once per session)."""
    return _run(args, tuple(sorted(env.items())))


def test_untuned_glibc_keeps_a_megabyte_in_the_heap_after_a_large_free() -> None:
    """The problem tune_malloc solves, shown: glibc's dynamic threshold."""
    got = _probe("none")
    assert got["1MiB"] is False and got["4MiB"] is False


def test_tuned_a_megabyte_is_its_own_mapping_and_arrow_uses_malloc() -> None:
    got = _probe("tune", "rss")
    assert got["tuned"] is True
    assert got["1MiB"] is True and got["4MiB"] is True  # the threshold stayed at 128 KiB
    assert got["pool"] == "system"


def test_promaccel_mmap_threshold_moves_the_threshold() -> None:
    got = _probe("tune", PROMACCEL_MMAP_THRESHOLD=str(2 << 20))
    assert got["tuned"] is True and got["1MiB"] is False and got["4MiB"] is True


@pytest.mark.parametrize("env", [{"PROMACCEL_MMAP_THRESHOLD": "0"}, {"MALLOC_MMAP_THRESHOLD_": str(2 << 20)}])
def test_zero_or_glibcs_own_setting_leave_glibc_alone(env: dict[str, str]) -> None:
    got = _probe("tune", **env)
    assert got["tuned"] is False
    if "MALLOC_MMAP_THRESHOLD_" in env:  # glibc's fixed 2 MiB threshold, as the user set it
        assert got["1MiB"] is False and got["4MiB"] is True
    else:  # the dynamic threshold, raised by the 8 MiB free
        assert got["1MiB"] is False and got["4MiB"] is False


def test_tuned_glibc_gives_threads_at_most_arena_max_arenas() -> None:
    untuned, tuned = _probe("none", "arenas"), _probe("tune", "arenas")
    assert isinstance(untuned["arenas"], int) and untuned["arenas"] > memory.ARENA_MAX  # one per thread
    assert tuned["arenas"] == memory.ARENA_MAX
    assert _probe("tune", "arenas", PROMACCEL_MALLOC_ARENAS="4")["arenas"] == 4
    # 0, or glibc's own MALLOC_ARENA_MAX, leave glibc's cap (8 per core) as it is.
    assert _probe("tune", "arenas", PROMACCEL_MALLOC_ARENAS="0")["arenas"] == untuned["arenas"]
    assert _probe("tune", "arenas", MALLOC_ARENA_MAX="3")["arenas"] == 3


def test_a_bad_threshold_is_ignored_with_the_default_taking_its_place() -> None:
    got = _probe("tune", PROMACCEL_MMAP_THRESHOLD="lots")
    assert got["tuned"] is True and got["1MiB"] is True


def test_arrows_own_pool_setting_is_left_to_arrow() -> None:
    got = _probe("tune", ARROW_DEFAULT_MEMORY_POOL="jemalloc")
    assert got["pool"] == "jemalloc" and got["tuned"] is True


def test_give_back_returns_freed_heap_pages() -> None:
    got = _probe("tune", "rss")
    # 24 MB freed in the middle of the heap (its top still in use): give_back returns most of it.
    assert isinstance(got["freed_rss"], int) and got["freed_rss"] > 16 << 20


def test_give_back_soon_runs_at_once_then_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    time.sleep(memory.GIVE_BACK_EVERY_S + 0.05)  # any earlier give-back's interval is over
    runs: list[float] = []
    done = threading.Event()

    def recorded() -> None:
        runs.append(time.monotonic())
        if len(runs) == 2:
            done.set()

    monkeypatch.setattr(memory, "give_back", recorded)
    t0 = time.monotonic()
    memory.give_back_soon()
    for _ in range(5):  # a burst: one more give-back, once the interval is over
        memory.give_back_soon()
    assert done.wait(5), runs
    time.sleep(memory.GIVE_BACK_EVERY_S + 0.1)
    assert len(runs) == 2, "a burst gives back twice: at once, and once late"
    assert runs[0] - t0 < memory.GIVE_BACK_EVERY_S
    assert runs[1] - t0 >= memory.GIVE_BACK_EVERY_S - 0.01
    # After the interval, at once again.
    memory.give_back_soon()
    deadline = time.monotonic() + 5
    while len(runs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(runs) == 3 and runs[2] - runs[1] >= memory.GIVE_BACK_EVERY_S - 0.01
