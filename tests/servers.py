"""Real services for tests: Prometheus over generated GPU data, redis-server, promaccel.

Each runs on a free loopback port with its own data directory and is always stopped at the
end of the session. Binaries come from Debian's `prometheus` and `redis-server` packages
(`make test` installs them when missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import loadtests.load
import loadtests.services
from loadtests.services import RedisServer, stop, wait_http  # noqa: F401 (re-exported for tests)

ROOT = Path(__file__).resolve().parent.parent


# --- ports --------------------------------------------------------------------------------------
#
# A server is started on a port picked a moment (for promaccel, seconds) before it binds it.
# With bind(0) the kernel may hand that same port to anyone meanwhile: another xdist worker
# picking a port for its own server (which then answers the first one's health check: a
# promaccel test talking to the other worker's Prometheus), or a client's outgoing connection.
# So the suite picks its ports below the kernel's ephemeral range (never used for bind(0) or
# outgoing connections), each xdist worker from its own block.

#
# PROMACCEL_TEST_PORTS=LOW-HIGH (e.g. 20000-29999, both included) confines every port the suite
# binds to that range instead (shared among the xdist workers the same way): the servers it
# starts, the Redis Cluster buses, and the ports the harness picks in subprocesses
# (loadtests.load.free_port reads the same variable).

PORTS_FROM = 10000
_recent: list[int] = []


def port_block() -> tuple[int, int]:
    """[low, high) of the ports this process hands out: its xdist worker's share of
    $PROMACCEL_TEST_PORTS, or of [PORTS_FROM, start of the ephemeral range)."""
    confined = loadtests.load.port_range()
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


port_bindable = loadtests.load.port_bindable


def free_port(low: int | None = None, high: int | None = None) -> int:
    """A loopback port nothing listens on, from this worker's block (or [low, high)), not one
    handed out lately by this process; bind(0) only when the block is too small."""
    import random

    block_low, block_high = port_block()
    low, high = low or block_low, high or block_high
    confined = loadtests.load.port_range() is not None
    if high - low >= 200 or confined:
        for _ in range(500):
            port = random.randrange(low, high)
            if port not in _recent and port_bindable(port):
                _recent.append(port)
                del _recent[:-max(1, min(256, (high - low) // 2))]
                return port
        if confined:
            raise RuntimeError(f"no free port in {low}..{high - 1} ({loadtests.load.PORTS_ENV})")
    return _kernel_free_port()


_kernel_free_port = loadtests.load.free_port
# Servers that loadtests starts for the suite in this process (start_prometheus without a
# port, RedisServer.start) take their ports from here too.
loadtests.load.free_port = free_port  # type: ignore[assignment]
loadtests.services.free_port = free_port  # type: ignore[attr-defined]


def require(binary: str) -> str:
    """The path of a binary the suite needs; a missing one fails the test (never a skip):
    `make test` installs Debian's prometheus (prometheus, promtool) and redis-server."""
    path = shutil.which(binary)
    if path is None:
        import pytest

        pytest.fail(f"{binary} is missing: run `make test`, which installs Debian's "
                    f"{'redis-server' if binary.startswith('redis') else 'prometheus'} package")
    return path


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
class Promaccel:
    url: str
    proc: subprocess.Popen[bytes]
    args: tuple[str, ...]
    log: Path

    @classmethod
    def start(cls, backend_url: str | None, args: tuple[str, ...], workdir: Path, *,
              config: Path | None = None, env: dict[str, str] | None = None) -> "Promaccel":
        """`backend_url` None: the backends come from `config` (a YAML file, e.g. with an AMP
        backend); `env` is added to the environment (e.g. AWS credentials)."""
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = workdir / f"promaccel-{port}.log"
        proc_env = dict(os.environ)
        proc_env.pop("PROMACCEL_CONFIG", None)
        proc_env.update(env or {})
        where = ["--backend", backend_url] if backend_url is not None else []
        if config is not None:
            where += ["--config", str(config)]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", *where,
                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT), env=proc_env,
            )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/-/healthy", proc, timeout=240, log=log)
        return cls(url, proc, args, log)

    def stop(self) -> None:
        stop(self.proc)


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
