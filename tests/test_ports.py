"""PROMACCEL_TEST_PORTS confines the ports the suite and the harness bind (tests/servers.py,
loadtests/load.py): every port handed out, in this process and in the harness's own picks
(subprocesses such as the demo), lies in the range, split between the xdist workers."""

from __future__ import annotations

import pytest

import loadtests.load
import tests.redis_cluster
import tests.servers


def test_ports_stay_in_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMACCEL_TEST_PORTS", "20000-20999")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert tests.servers.port_block() == (20500, 21000)
    picked = {tests.servers.free_port() for _ in range(100)}
    picked |= {p for _ in range(20) for p in tests.redis_cluster.free_cluster_ports()}
    assert min(picked) >= 20500 and max(picked) <= 20999, sorted(picked)
    harness = {tests.servers._kernel_free_port() for _ in range(50)}  # loadtests.load's own pick
    assert min(harness) >= 20000 and max(harness) <= 20999, sorted(harness)


def test_unset_means_the_default_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMACCEL_TEST_PORTS", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    low, high = tests.servers.port_block()
    assert low == tests.servers.PORTS_FROM and high > low
    assert loadtests.load.port_range() is None


@pytest.mark.parametrize("text", ["20000", "30000-20000", "80-90", "a-b", "20000-70000"])
def test_a_bad_range_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("PROMACCEL_TEST_PORTS", text)
    with pytest.raises(ValueError, match="PROMACCEL_TEST_PORTS"):
        loadtests.load.port_range()
