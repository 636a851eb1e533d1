"""Real services for tests: Prometheus over generated GPU data, redis-server, promaccel.

Each runs on a free loopback port with its own data directory and is always stopped at the
end of the session. Binaries come from Debian's `prometheus` and `redis-server` packages
(`make test` installs them when missing).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.ports import PORTS_FROM, free_port, kernel_free_port, port_bindable, port_block, use_port_blocks
from loadtests.services import Promaccel, RedisServer, stop, wait_http

# Re-exported for the suite: one implementation of the ports and the servers for the harness and
# the tests (loadtests/ports.py, loadtests/services.py).
__all__ = ["PORTS_FROM", "Promaccel", "ProxyPool", "RedisServer", "free_port", "port_bindable", "port_block",
           "stop", "wait_http", "require", "built_tsdb", "serving_copy", "metric_sum"]

ROOT = Path(__file__).resolve().parent.parent

# Ports: the suite picks below the kernel's ephemeral range, each xdist worker from its own
# block (loadtests/ports.py says why); so do the servers loadtests starts for the suite in this
# process (start_prometheus without a port, RedisServer.start).
use_port_blocks()
_kernel_free_port = kernel_free_port  # the harness's own pick (tests/test_ports.py)


def require(binary: str) -> str:
    """The path of a binary the suite needs; a missing one fails the test (never a skip):
    `make test` installs Debian's prometheus (prometheus, promtool) and redis-server."""
    path = shutil.which(binary)
    if path is None:
        import pytest

        pytest.fail(f"{binary} is missing: run `make test`, which installs Debian's "
                    f"{'redis-server' if binary.startswith('redis') else 'prometheus'} package")
    return path


def metric_sum(url: str, sample: str, **labels: str) -> float:
    """The sum of a server's /metrics samples named `sample` (a counter's with `_total`)
    whose labels include `labels`."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def built_tsdb(spec: Any, data_dir: Path, **kw: Any) -> dict[str, Any]:
    """`loadtests.load.build_tsdb` under an exclusive file lock beside `data_dir`: test
    sessions and xdist workers on one machine share the cached builds under .cache/testdata,
    and two of them finding one missing at once must not build it both (one builds, the
    others wait and find it built)."""
    import fcntl

    from loadtests.load import build_tsdb

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(data_dir.with_name(data_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_tsdb(spec, str(data_dir), **kw)


def serving_copy(built: Path, dest: Path) -> Path:
    """A copy of a built TSDB for one Prometheus to serve: Prometheus locks (and compacts) its
    data directory, so each session and each xdist worker serves its own copy (a few MB)."""
    shutil.copytree(built, dest, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head", "queries.active"))
    return dest


@dataclass
class ProxyPool:
    """promaccel instances by their flags, started on first use, stopped at session end."""

    backend_url: str
    workdir: Path
    running: dict[tuple[str, ...], Promaccel] = field(default_factory=dict)

    def get(self, *args: str) -> Promaccel:
        if args not in self.running:
            self.running[args] = Promaccel.start(self.backend_url, args, self.workdir)
        return self.running[args]

    def stop_all(self) -> None:
        for p in self.running.values():
            p.stop()
        self.running.clear()
