"""Redis with a password (and TLS) as deploy/ runs it, against a real redis-server: the Redis
container's own rendered command (`sh -c` with the password on redis-server's stdin) started
with the Secret's value, and promaccel's store built from the overlay's rendered promaccel.yaml
(cache.redis_password_file resolved through the pod's Secret volume). promaccel reads and
writes with the password, fails without it; the probe's command answers only with it. Plus
cache.redis_password_file / PROMACCEL_REDIS_PASSWORD in the config loader."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.cache import CacheItem, CacheKey, PieceMeta, make_store
from proxy.codec import arrow
from proxy.config import CacheConfig, ConfigError, build_config
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.deploy.test_deploy import container, promaccel_config, promaccel_deployment, render, secret_source
from tests.servers import free_port, stop

pytestmark = [pytest.mark.redis]

PASSWORD = "0f3c9a7e5d1b2c4a6e8f0a1b3c5d7e9f"  # what `openssl rand -hex 16` prints; a test value
KEY = CacheKey(query="sum(up)", span=Span.range(1_700_000_000_000, 1_700_003_570_000, 30_000), route=("prometheus",))


def _cell() -> bytes:
    return arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"job": "a"}, [1_700_000_000_000], [1.0])]))


def _redis_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "promaccel-redis"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


def _shims(tmp: Path, port: int, extra: list[str]) -> Path:
    """redis-server and redis-cli on PATH that add this test's loopback port (and data dir)."""
    shims = tmp / "bin"
    shims.mkdir()
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.fail("redis-server/redis-cli not found: `make setup` installs Debian's redis-server", pytrace=False)
    (shims / "redis-server").write_text(
        f'#!/bin/sh\nexec {server} "$@" --bind 127.0.0.1 --dir {tmp} --logfile {tmp}/redis.log {" ".join(extra)}\n')
    (shims / "redis-cli").write_text(f'#!/bin/sh\nexec {cli} -p {port} "$@"\n')
    for f in shims.iterdir():
        f.chmod(0o755)
    return shims


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"redis exited: {log.read_text() if log.exists() else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail("redis did not listen")


def _run_container(c: dict[str, Any], tmp: Path, port: int, extra: list[str],
                   replace: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """The container's command and args, as the kubelet runs them, with the Secret's value in
    the env the manifest names (the env of secretKeyRef promaccel-redis/password)."""
    argv = list(c["command"]) + list(c["args"])
    for old, new in (replace or {}).items():
        argv = [a.replace(old, new) for a in argv]
    env = dict(os.environ, PATH=f"{_shims(tmp, port, extra)}:{os.environ['PATH']}")
    for e in c["env"]:
        ref = e["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("promaccel-redis", "password")
        env[e["name"]] = PASSWORD
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp)
    _wait_port(port, proc, tmp / "redis.log")
    return proc, env["PATH"]


def _probe(c: dict[str, Any], path: str, auth: bool, replace: dict[str, str] | None = None) -> bool:
    argv = list(c["readinessProbe"]["exec"]["command"])
    for old, new in (replace or {}).items():
        argv = [a.replace(old, new) for a in argv]
    env = {"PATH": str(path)}
    if auth:
        env["REDISCLI_AUTH"] = PASSWORD
    return subprocess.run(argv, env=env, capture_output=True, timeout=20).returncode == 0


def _round_trip(cfg: CacheConfig) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        store: Any = make_store(cfg)
        try:
            health = await store.health()
            if health.get("reachable"):
                await store.put_many([CacheItem(KEY, _cell(), 600_000,
                                                PieceMeta(("up",), 0, 3_600_000, int(time.time() * 1000)))])
                health["read_back"] = await store.get_many([KEY]) == [_cell()]
            return health
        finally:
            await store.aclose()

    return asyncio.run(main())


@pytest.fixture()
def in_cluster(tmp_path: Path) -> Iterator[tuple[list[dict[str, Any]], Any]]:
    docs = render("single-prometheus")
    port = free_port()
    proc, path = _run_container(_redis_container(docs), tmp_path, port, [f"--port {port}"])
    try:
        yield docs, (port, path)
    finally:
        stop(proc)


def test_in_cluster_redis_requires_the_secret_and_promaccel_reads_it(
        in_cluster: tuple[list[dict[str, Any]], Any], tmp_path: Path) -> None:
    docs, (port, path) = in_cluster
    c = _redis_container(docs)
    assert _probe(c, path, auth=True) and not _probe(c, path, auth=False), "the probe must need the password"

    cfg = promaccel_config(docs, tmp_path, files={"/etc/promaccel-secrets/redis-password": PASSWORD})
    assert cfg.cache.redis_url == "redis://promaccel-redis:6379/0"
    local = cfg.cache.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
    health = _round_trip(local)
    assert health["reachable"] and health["read_back"], health
    # Without the Secret's file: refused (the old deploy/: no password at all).
    refused = _round_trip(local.model_copy(update={"redis_password_file": None}))
    assert refused["reachable"] is False and refused["ping_error"] == "AuthenticationError", refused
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    refused = _round_trip(local.model_copy(update={"redis_password_file": str(wrong)}))
    assert refused["reachable"] is False, refused


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        pytest.fail("openssl not found: the TLS test makes its certificates with it "
                    "(`apt-get install openssl`)", pytrace=False)
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> None:
    """A CA and a server certificate for promaccel-redis (and 127.0.0.1, where the test reaches
    it), the way README's commands make them."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=promaccel-redis-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=promaccel-redis",
             "-keyout", "tls.key", "-out", "tls.csr", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:promaccel-redis,DNS:promaccel-redis.promaccel.svc,"
                               "DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "san.ext", "-out", "tls.crt", cwd=d)


def test_tls_variant_speaks_rediss_with_the_password(tmp_path: Path) -> None:
    docs = render("single-prometheus-tls")
    certs = tmp_path / "tls"
    certs.mkdir()
    make_certs(certs)
    c = _redis_container(docs)
    port = free_port()
    # Later options win: the test's loopback TLS port instead of 6379.
    proc, path = _run_container(c, tmp_path, port, [f"--tls-port {port}"], replace={"/tls/": f"{certs}/"})
    try:
        assert _probe(c, path, auth=True, replace={"/tls/": f"{certs}/"})
        dep = promaccel_deployment(docs)
        ca_path = "/etc/promaccel-redis-tls/ca.crt"
        assert secret_source(dep, container(dep), ca_path) == ("promaccel-redis-tls", "ca.crt")
        cfg = promaccel_config(docs, tmp_path, files={"/etc/promaccel-secrets/redis-password": PASSWORD})
        assert cfg.cache.redis_url == f"rediss://promaccel-redis:6379/0?ssl_ca_certs={ca_path}"
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certs / 'ca.crt'}"
        health = _round_trip(cfg.cache.model_copy(update={"redis_url": url}))
        assert health["reachable"] and health["read_back"], health
        # Plain redis:// to the TLS port fails; so does TLS with another CA.
        assert not _round_trip(cfg.cache.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"}))["reachable"]
        other = tmp_path / "other"
        other.mkdir()
        make_certs(other)
        bad = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other / 'ca.crt'}"
        assert not _round_trip(cfg.cache.model_copy(update={"redis_url": bad}))["reachable"]
    finally:
        stop(proc)


# --------------------------------------------------------------------------- the config keys

def _cache(tmp_path: Path, **cache: Any) -> CacheConfig:
    return build_config({"backends": [{"name": "p", "url": "http://127.0.0.1:9090"}], "cache": cache}).cache


def test_redis_password_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "pw"
    f.write_text("hunter2-hunter2\n")
    monkeypatch.delenv("PROMACCEL_REDIS_PASSWORD", raising=False)
    assert _cache(tmp_path, redis_url="redis://r:6379/0", redis_password_file=str(f)).redis_password() == "hunter2-hunter2"
    assert _cache(tmp_path, redis_url="redis://r:6379/0").redis_password() is None
    monkeypatch.setenv("PROMACCEL_REDIS_PASSWORD", "from-the-env")
    assert _cache(tmp_path, redis_url="redis://r:6379/0").redis_password() == "from-the-env"
    # The file wins over the env; a password in the URL is redis-py's to read.
    assert _cache(tmp_path, redis_url="redis://r:6379/0", redis_password_file=str(f)).redis_password() == "hunter2-hunter2"
    assert _cache(tmp_path, redis_url="redis://:inurl@r:6379/0").redis_password() is None


@pytest.mark.parametrize("case", ["both", "missing", "empty"])
def test_redis_password_file_errors_name_the_key_not_the_secret(tmp_path: Path, case: str) -> None:
    f = tmp_path / "pw"
    f.write_text("" if case == "empty" else "s3cret-value-123\n")
    url = "redis://:s3cret-value-123@r:6379/0" if case == "both" else "redis://r:6379/0"
    path = str(tmp_path / "nope") if case == "missing" else str(f)
    with pytest.raises((ConfigError, ValueError)) as exc:
        _cache(tmp_path, redis_url=url, redis_password_file=path)
    assert "redis_password_file" in str(exc.value) and "s3cret-value-123" not in str(exc.value)
