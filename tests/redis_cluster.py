"""redis-server processes for the cache tests: one server on a port of our choosing (so it
can be stopped and started again on the same port), and a local three-node Redis Cluster.

Each node runs on a free loopback port with its own directory and is always stopped by the
caller (`stop()`). A cluster node also listens on its cluster bus port, picked like any
other (`--cluster-port`, Redis 7), so both stay in this worker's port block.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port, stop


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: install Debian's redis-server (`make test` does)")
    return path


def free_cluster_ports(taken: Collection[int] = ()) -> tuple[int, int]:
    """A free port and a free cluster bus port for a Redis Cluster node, both from this xdist
    worker's port block (tests/servers.py)."""
    for _ in range(200):
        port, bus = free_port(), free_port()
        if len({port, bus}) == 2 and not {port, bus} & set(taken):
            return port, bus
    raise RuntimeError("no free port pair for a Redis Cluster node")


def redis_cli(port: int, *args: str, timeout: float = 10.0) -> str:
    out = subprocess.run(
        [_binary("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    return out.stdout + out.stderr


@dataclass
class RedisNode:
    port: int
    workdir: Path
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisNode:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "redis.log"
        self.proc = subprocess.Popen(
            [_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
             "--logfile", str(log), "--daemonize", "no", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} exited with {self.proc.returncode}:\n{tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


@dataclass
class LocalCluster:
    """Three masters, no replicas, every slot assigned."""

    nodes: list[RedisNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @classmethod
    def start(cls, workdir: Path, size: int = 3) -> LocalCluster:
        cluster = cls()
        taken: set[int] = set()
        try:
            for i in range(size):
                port, bus = free_cluster_ports(taken)
                taken |= {port, bus}
                node = RedisNode(
                    port, workdir / f"node-{i}",
                    ("--cluster-enabled", "yes", "--cluster-config-file", str(workdir / f"node-{i}" / "nodes.conf"),
                     "--cluster-node-timeout", "5000", "--cluster-port", str(bus)),
                )
                cluster.nodes.append(node)
                node.start()
            addrs = [f"127.0.0.1:{n.port}" for n in cluster.nodes]
            out = redis_cli(cluster.nodes[0].port, "--cluster", "create", *addrs,
                            "--cluster-replicas", "0", "--cluster-yes", timeout=60)
            if "[OK] All 16384 slots covered" not in out:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out}")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all("cluster_state:ok" in redis_cli(n.port, "cluster", "info") for n in cluster.nodes):
                    return cluster
                time.sleep(0.1)
            raise RuntimeError("cluster did not reach cluster_state:ok")
        except BaseException:
            cluster.stop()
            raise

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
