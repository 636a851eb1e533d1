"""The `promaccel` command line run as a user runs it, a real process (issue 30 item 3):
`--version`; `serve` on a port another process listens on fails at once, naming --port, without
announcing that it serves; `serve` stopped by SIGTERM with a query in flight lets it finish and
logs what its shutdown drained."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import proxy
from tests.servers import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
SLOW_S = 2.0  # the fake backend's answer to a query takes this long


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy.cli", *args]


def test_version_prints_the_installed_version() -> None:
    proc = subprocess.run(_cli("--version"), capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"promaccel {proxy.__version__}"


def test_serve_on_a_busy_port_fails_fast_naming_the_port_flag() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        t0 = time.monotonic()
        proc = subprocess.run(_cli("serve", "--backend", "http://127.0.0.1:9", "--port", str(port)),
                              capture_output=True, text=True, timeout=30, cwd=str(ROOT))
        took = time.monotonic() - t0
    finally:
        holder.close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert took < 10, f"took {took:.1f}s"
    assert "--port" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert "in use" in proc.stderr
    assert "serving" not in out and "Grafana" not in out


class _SlowBackend(BaseHTTPRequestHandler):
    """A Prometheus that answers every query with an empty vector after SLOW_S seconds."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/api/v1/query"):
            time.sleep(SLOW_S)
            data: object = {"resultType": "vector", "result": []}
        else:
            data = []
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_backend() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _SlowBackend)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_sigterm_lets_the_query_in_flight_finish_and_logs_the_drain(slow_backend: str, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "promaccel.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_cli("serve", "--backend", slow_backend, "--port", str(port)),
                                stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/healthy", proc, timeout=240, log=log)
        assert f"promaccel serving on {url}" in log.read_text()
        answer: dict[str, object] = {}

        def ask() -> None:
            with urllib.request.urlopen(url + "/api/v1/query?query=up&time=1700000000", timeout=30) as r:
                answer.update(status=r.status, body=json.loads(r.read()))

        client = threading.Thread(target=ask)
        client.start()
        time.sleep(SLOW_S / 2)  # the query is at the backend
        proc.send_signal(signal.SIGTERM)
        client.join(timeout=30)
        # uvicorn re-raises the signal once it has shut down cleanly: the exit is SIGTERM's.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = log.read_text()
    # The query in flight was answered, not cut off, and the shutdown says so.
    assert answer.get("status") == 200, text
    assert "promaccel stopping" in text and "1 requests in flight" in text, text
    stopped = [line for line in text.splitlines() if "promaccel stopped" in line]
    assert len(stopped) == 1, text
    assert "1 requests in flight finished, 0 cancelled" in stopped[0]
    assert "background cache writes flushed" in stopped[0] and "fetch leases released" in stopped[0]


@pytest.mark.parametrize("overlay", ["hybrid-amp", "amp-elasticache"])
def test_serve_refuses_the_deploy_overlays_placeholders(overlay: str, tmp_path: Path) -> None:
    """An AMP overlay deployed as is (its all-zero workspace, AWS's documentation account in
    the IRSA role) exits 2 naming what to set, instead of running without its AMP data."""
    # The overlay's config as its pod reads it, the mounted Secrets' files made here.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    text = (ROOT / "deploy" / "overlays" / overlay / "promaccel.yaml").read_text()
    for name in set(re.findall(r"/etc/promaccel-secrets/([\w.-]+)", text)):
        (secrets / name).write_text("a-test-secret-of-32-characters!!")
    text = text.replace("/etc/promaccel-secrets/", f"{secrets}/")
    assert "ws-00000000-0000-0000-0000-000000000000" in text
    config = tmp_path / "overlay.yaml"
    config.write_text(text)
    proc = subprocess.run(_cli("serve", "--config", str(config), "--port", str(free_port())),
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "placeholder workspace" in proc.stderr and "serving" not in proc.stdout + proc.stderr
    # The workspace set, the role still the placeholder: refused too.
    real = tmp_path / "promaccel.yaml"
    real.write_text(text.replace("ws-00000000-0000-0000-0000-000000000000", "ws-0123abcd-4567-89ef-0123-456789abcdef"))
    env = {"AWS_ROLE_ARN": "arn:aws:iam::111122223333:role/promaccel-amp-query", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(_cli("serve", "--config", str(real), "--port", str(free_port())),
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT), env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "AWS_ROLE_ARN" in proc.stderr and "eks.amazonaws.com/role-arn" in proc.stderr
