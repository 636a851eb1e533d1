"""Process management for the harness and the test suite: redis-server and promaccel on free
loopback ports, their RSS and CPU, plain loopback HTTP.

One implementation for both: the bench, soak and demo start their servers here, and so does
the suite (tests/servers.py re-exports `Promaccel`, `RedisServer` and the ports of
loadtests/ports.py). Prometheus comes from `loadtests.load` (it owns the dataset and its TSDB).
Every process is started by us, is stopped by its own handle (never by name), and logs into
its run's directory so a failed run can be read afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from loadtests.load import die_with_parent
from loadtests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"




def assert_loopback(url: str) -> None:
    """The bench only ever talks to processes it started on this machine."""
    host = urlsplit(url).hostname
    if host != LOOPBACK:
        raise ValueError(f"benchmark targets must be on {LOOPBACK}, got {url!r}")


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    assert_loopback(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def http_post_form(url: str, body: str, timeout: float = 60.0) -> tuple[int, bytes]:
    assert_loopback(url)
    req = urllib.request.Request(url, data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback only
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process for {url} exited with {proc.returncode}:\n{tail}")
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in {timeout}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class RedisServer:
    url: str
    port: int
    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, workdir: Path, *, tied: bool = False) -> "RedisServer":
        """`tied`: it also stops when this process dies (loadtests.load.die_with_parent)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: `make setup` installs Debian's redis-server")
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--logfile", str(workdir / "redis.log"), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=die_with_parent if tied else None,
        )
        server = cls(f"redis://{LOOPBACK}:{port}/0", port, proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if server.command(b"PING").startswith(b"+PONG"):
                    return server
            except OSError:
                time.sleep(0.05)
        stop(proc)
        raise RuntimeError("redis-server did not start")

    def command(self, *words: bytes) -> bytes:
        """One RESP command, one short reply (enough for PING, FLUSHALL, DBSIZE)."""
        payload = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
        with socket.create_connection((LOOPBACK, self.port), timeout=5) as s:
            s.sendall(payload)
            return s.recv(256)

    def flush(self) -> None:
        reply = self.command(b"FLUSHALL")
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"redis FLUSHALL failed: {reply!r}")

    def stop(self) -> None:
        stop(self.proc)


class RssSampler:
    """Samples the resident set size of a process and its children in a thread.

    uvicorn with several workers forks children, so the tree is summed; a short-lived peak
    between two samples can be missed, hence the short interval.
    """

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def rss(self) -> int:
        import psutil

        total = 0
        try:
            procs = [self._proc, *self._proc.children(recursive=True)]
        except psutil.Error:
            return 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def reset_peak(self) -> None:
        self.peak = self.rss()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            value = self.rss()
            self.peak = max(self.peak, value)
            if len(self.samples) < 200_000:
                self.samples.append((time.monotonic() - t0, value))
            self._stop.wait(self.interval_s)

    def start(self) -> "RssSampler":
        self.reset_peak()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live children."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for q in procs:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


@dataclass
class Promaccel:
    url: str
    proc: subprocess.Popen[bytes]
    args: tuple[str, ...]
    log: Path
    started: list[float] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @classmethod
    def start(cls, backend_url: str | None, args: Sequence[str], workdir: Path, redis_url: str | None = None,
              code_dir: Path | None = None, *, config: Path | None = None,
              env: dict[str, str] | None = None) -> "Promaccel":
        """`promaccel serve` on a free loopback port, logging into `workdir`; returns once
        /-/healthy answers. `backend_url` None: the backends come from `config` (a YAML file,
        e.g. with an AMP backend) or a `--config` in `args`. `env` is added to the environment
        (e.g. AWS credentials). `code_dir`: serve another checkout's promaccel (run from its
        directory), to measure two versions side by side."""
        if backend_url is not None:
            assert_loopback(backend_url)
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = workdir / f"promaccel-{port}.log"
        proc_env = dict(os.environ)
        proc_env.pop("PROMACCEL_CONFIG", None)  # the caller's own setting must not leak into a test
        proc_env.update(env or {})
        where = ["--backend", backend_url] if backend_url is not None else []
        if config is not None:
            where += ["--config", str(config)]
        extra = ["--redis", redis_url] if redis_url else []
        t0 = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", *where,
                 "--host", LOOPBACK, "--port", str(port), "--log-level", "warning", *extra, *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(code_dir or ROOT), env=proc_env,
            )
        url = f"http://{LOOPBACK}:{port}"
        try:
            wait_http(url + "/-/healthy", proc, timeout=300, log=log)
        except BaseException:
            stop(proc)
            raise
        return cls(url, proc, tuple(args), log, [time.monotonic() - t0])

    def metrics_text(self) -> str:
        status, body = http_get(self.url + "/metrics")
        if status != 200:
            raise RuntimeError(f"promaccel /metrics answered {status}")
        return body.decode()

    def stop(self) -> None:
        stop(self.proc)
