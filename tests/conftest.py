"""Session fixtures: a real Prometheus over generated GPU fleet data, real Redis, and
promaccel servers over real HTTP, each on a free loopback port, always stopped at the end."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loadtests.gen import CI_SPEC, FleetSpec
from tests.servers import ROOT, Promaccel, ProxyPool, RedisServer
# Hybrid fleets (backends holding slices of the CI fleet): see tests/hybrid.py.
from tests.hybrid import amp_down, hybrid, hybrid_slices, hybrid_throttled  # noqa: E402,F401

DATA_ROOT = Path(os.environ.get("PROMACCEL_TEST_DATA", ROOT / ".cache" / "testdata"))


@dataclass
class PromServer:
    url: str
    spec: FleetSpec
    data_dir: Path

    @property
    def start_s(self) -> int:
        return self.spec.start

    @property
    def end_s(self) -> int:
        return self.spec.end


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    from loadtests.load import build_tsdb, start_prometheus, stop_prometheus

    built = DATA_ROOT / "ci"
    build_tsdb(CI_SPEC, str(built))
    # Each session serves its own copy (3 MB): Prometheus locks its data directory, and two
    # test sessions on one machine must not share one.
    work = tmp_path_factory.mktemp("prometheus")
    data_dir = work / "data"
    shutil.copytree(built, data_dir, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head", "queries.active"))
    log = work / "prometheus.log"
    proc = start_prometheus(str(data_dir), log_path=str(log))
    try:
        yield PromServer(proc.url, CI_SPEC, data_dir)  # type: ignore[attr-defined]
    finally:
        stop_prometheus(proc)


def _docker_answers() -> bool:
    import shutil
    import subprocess

    if os.environ.get("PROMACCEL_TEST_DOCKER", "auto") == "0" or shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's redis-server on a free loopback port; a testcontainers Redis instead only
    when a Docker engine answers (never the case on the development machines)."""
    if _docker_answers():
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.redis import RedisContainer  # type: ignore[no-redef]

        with RedisContainer("redis:7") as container:
            host, port = container.get_container_host_ip(), int(container.get_exposed_port(6379))
            yield SimpleNamespace(url=f"redis://{host}:{port}/0", port=port, stop=lambda: None)
        return
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def proxies(prom: PromServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyPool]:
    pool = ProxyPool(prom.url, tmp_path_factory.mktemp("promaccel"))
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="session")
def passthrough(proxies: ProxyPool) -> Promaccel:
    """promaccel with no acceleration: every query forwarded whole."""
    return proxies.get("--split-interval", "none", "--shards", "1")


@pytest.fixture(scope="session")
def planned(proxies: ProxyPool) -> Promaccel:
    """promaccel splitting by hour and sharding by node in 8."""
    return proxies.get("--split-interval", "1h", "--shards", "8")
