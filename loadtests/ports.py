"""Loopback ports for every server the harness and the test suite start: one implementation.

Two policies, one function (`free_port`):
- the harness (bench, soak, demo) takes the kernel's pick (bind(0)), or a port from
  $PROMACCEL_TEST_PORTS when it is set;
- the test suite (tests/servers.py calls `use_port_blocks()` once) picks below the kernel's
  ephemeral range, each xdist worker from its own block. A server is started on a port picked a
  moment (for promaccel, seconds) before it binds it; with bind(0) the kernel may hand that same
  port to anyone meanwhile: another xdist worker picking a port for its own server (which then
  answers the first one's health check), or a client's outgoing connection. Ports below the
  ephemeral range are never used for bind(0) or outgoing connections.

PROMACCEL_TEST_PORTS=LOW-HIGH (e.g. 20000-29999, both included) confines every port to that
range instead, shared among the xdist workers the same way.
"""

from __future__ import annotations

import os
import random
import re
import socket
from pathlib import Path

PORTS_ENV = "PROMACCEL_TEST_PORTS"
PORTS_FROM = 10000  # the suite's blocks start here and end where the ephemeral range starts


def port_range() -> tuple[int, int] | None:
    """[low, high) from $PROMACCEL_TEST_PORTS ("LOW-HIGH", both included), or None."""
    text = os.environ.get(PORTS_ENV, "").strip()
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if m is None or not 1024 <= int(m.group(1)) <= int(m.group(2)) <= 65535:
        raise ValueError(f"{PORTS_ENV}={text!r}: expected LOW-HIGH, e.g. 20000-29999 (1024 <= LOW <= HIGH <= 65535)")
    return int(m.group(1)), int(m.group(2)) + 1


def port_bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kernel_free_port() -> int:
    """A free loopback port: from $PROMACCEL_TEST_PORTS when set, else the kernel's pick."""
    confined = port_range()
    if confined is not None:
        low, high = confined
        for _ in range(min(4 * (high - low), 2000)):
            port = random.randrange(low, high)
            if port_bindable(port):
                return port
        raise RuntimeError(f"no free port in {PORTS_ENV}={os.environ[PORTS_ENV]}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_block() -> tuple[int, int]:
    """[low, high) of the ports this process hands out in block mode: its xdist worker's share
    of $PROMACCEL_TEST_PORTS, or of [PORTS_FROM, start of the ephemeral range)."""
    confined = port_range()
    if confined is not None:
        low, high = confined
    else:
        try:
            ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            ephemeral = 32768
        low, high = PORTS_FROM, ephemeral
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    span = (high - low) // count
    return low + index * span, low + (index + 1) * span


class _Policy:
    """This process's policy: the kernel's pick (the harness) or worker blocks (the suite),
    and the ports handed out lately in block mode (not handed out again too soon)."""

    blocks = False
    recent: list[int] = []


def use_port_blocks() -> None:
    """From now on this process picks from its worker's block (the test suite), including the
    ports that loadtests' own servers pick (start_prometheus without a port, RedisServer)."""
    _Policy.blocks = True


def free_port(low: int | None = None, high: int | None = None) -> int:
    """A loopback port nothing listens on. Harness mode: `kernel_free_port()`. Block mode (or
    with `low`/`high`): from this worker's block (or [low, high)), not one handed out lately by
    this process; bind(0) only when the block is too small."""
    if not _Policy.blocks and low is None and high is None:
        return kernel_free_port()
    block_low, block_high = port_block()
    low, high = low or block_low, high or block_high
    confined = port_range() is not None
    if high - low >= 200 or confined:
        recent = _Policy.recent
        for _ in range(500):
            port = random.randrange(low, high)
            if port not in recent and port_bindable(port):
                recent.append(port)
                del recent[:-max(1, min(256, (high - low) // 2))]
                return port
        if confined:
            raise RuntimeError(f"no free port in {low}..{high - 1} ({PORTS_ENV})")
    return kernel_free_port()
