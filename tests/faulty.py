"""The fault-injecting backend of the tests (loadtests/faults.py, on a port from this test
worker's block): a small HTTP/1.1 server on 127.0.0.1 in front of a real Prometheus, which
answers some requests with a fault instead of Prometheus's answer.

`faulty.set(fault, first=n)`: each distinct request gets the fault on its first n tries, then
the real answer; `first=None`: every time. `set_random(rate, faults, seed)`: each request
gets one of `faults` with probability `rate`. `faulty.calls` counts requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loadtests.faults import FAULTS, FaultyBackend
from tests.servers import free_port


def start(upstream: str, stall_s: float = 3.0) -> FaultyBackend:
    return FaultyBackend(upstream, free_port(), stall_s).start()


__all__ = ["FAULTS", "FaultyBackend", "start"]


@pytest.fixture(scope="module")
def backend(prom: Any) -> Iterator[FaultyBackend]:
    """A fault-injecting backend in front of the session's Prometheus, per test module
    (tests/conftest.py makes it a fixture everywhere)."""
    b = start(prom.url)
    try:
        yield b
    finally:
        b.stop()
