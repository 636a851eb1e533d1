"""Backend credentials: basic auth from config, never in a cache key, value, banner, log line,
error or explain output; backend URLs with userinfo refused."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from proxy.config import BackendConfig, ConfigError, build_config, url_fingerprint
from tests.recording import recording_backend
from tests.servers import ROOT, Promaccel

USER = "promaccel"
PASSWORD = "s3cret-Pa55word-of-the-backend"
WRONG = "wrong-Pa55word-of-someone"


def _b64(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _forbidden(password: str = PASSWORD) -> tuple[str, ...]:
    return (password, _b64(USER, password))


# --- configuration -----------------------------------------------------------------------------


def test_basic_auth_parses_and_never_shows_the_password(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text(PASSWORD + "\n")
    for auth in ({"username": USER, "password": PASSWORD}, {"username": USER, "password_file": str(pw_file)}):
        cfg = build_config({"backends": [{"url": "http://127.0.0.1:9090", "basic_auth": auth}]})
        b = cfg.backends[0]
        assert b.basic_auth is not None and b.basic_auth.read_password() == PASSWORD
        for text in (repr(cfg), str(cfg), repr(b), cfg.model_dump_json(), str(cfg.model_dump())):
            assert PASSWORD not in text


@pytest.mark.parametrize("auth, message", [
    ({"username": USER}, "exactly one of password and password_file"),
    ({"username": USER, "password": "x", "password_file": "/x"}, "exactly one of password and password_file"),
    ({"username": USER, "password_file": "/nonexistent/pw"}, "cannot read password_file '/nonexistent/pw'"),
    ({"username": "a:b", "password": "x"}, "must not contain ':'"),
    ({"password": "x"}, "backends.0.basic_auth.username: Field required"),
])
def test_basic_auth_errors(auth: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"backends": [{"url": "http://127.0.0.1:9090", "basic_auth": auth}]})
    assert message in str(err.value)


def test_url_with_credentials_is_refused_without_echoing_them() -> None:
    for url in (f"http://{USER}:{PASSWORD}@127.0.0.1:9090", f"https://{PASSWORD}@mimir.example/prometheus"):
        with pytest.raises(ConfigError) as err:
            build_config({"backends": [{"url": url}]})
        assert "must not hold credentials" in str(err.value) and "basic_auth" in str(err.value)
        assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_config({"backends": [{"url": f"ftp://{USER}:{PASSWORD}@host"}]})
    assert PASSWORD not in str(err.value)


def test_command_line_url_with_credentials_exits_2_without_echoing_them() -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--backend",
                           f"http://{USER}:{PASSWORD}@127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2
    assert "must not hold credentials" in proc.stderr and PASSWORD not in proc.stderr + proc.stdout


def test_basic_auth_is_not_for_amp() -> None:
    with pytest.raises(ConfigError, match="basic_auth is not for kind amp"):
        build_config({"backends": [{"kind": "amp", "region": "us-east-1", "url": "https://x.example",
                                    "basic_auth": {"username": USER, "password": PASSWORD}}]})


def test_ident_is_name_and_url_hash() -> None:
    a = BackendConfig(url="http://10.0.0.1:9090")
    b = BackendConfig(url="http://10.0.0.2:9090")
    c = BackendConfig(url="http://10.0.0.1:9090", basic_auth={"username": "tenant-1", "password": PASSWORD})
    d = BackendConfig(url="http://10.0.0.1:9090", basic_auth={"username": "tenant-1", "password": WRONG})
    assert a.ident == "default#" + url_fingerprint("http://10.0.0.1:9090")
    assert len({a.ident, b.ident, c.ident}) == 3  # a changed URL or user changes every key
    assert c.ident == d.ident  # a rotated password does not
    for x in (a, c):
        assert "10.0.0.1" not in x.ident and PASSWORD not in x.ident and "tenant-1" not in x.ident


# --- end to end ----------------------------------------------------------------------------------


def _config(path: Path, url: str, password_file: Path, transport: str, redis_url: str | None) -> Path:
    data: dict[str, Any] = {"backends": [{"name": "guarded", "url": url, "transport": transport,
                                          "basic_auth": {"username": USER, "password_file": str(password_file)}}]}
    if redis_url:
        data["cache"] = {"redis_url": redis_url}
    path.write_text(orjson.dumps(data).decode())
    return path


def _all_redis_bytes(url: str) -> list[bytes]:
    r = redis.Redis.from_url(url)
    out: list[bytes] = []
    for key in r.scan_iter(count=1000):
        out.append(key)
        kind = r.type(key)
        out.append(r.get(key) if kind == b"string" else (r.dump(key) or b""))
    return out


@pytest.mark.prom
@pytest.mark.parametrize("transport, cache", [("aiohttp", "redis"), ("httpx", "memory")])
def test_password_reaches_the_backend_and_nothing_else(prom: Any, redis_server: Any, tmp_path: Path,
                                                       transport: str, cache: str) -> None:
    redis_url = redis_server.url.rsplit("/", 1)[0] + "/13" if cache == "redis" else None
    if redis_url:
        redis.Redis.from_url(redis_url).flushdb()
    pw_file = tmp_path / "password"
    pw_file.write_text(PASSWORD)
    with recording_backend(prom.url, (USER, PASSWORD)) as rec:
        path = _config(tmp_path / "c.yaml", rec.url, pw_file, transport, redis_url)
        proxy = Promaccel.start(None, ("--split-interval", "1h", "--shards", "2", "--log-level", "debug"),
                                tmp_path / "p", config=path)
        answers: list[str] = []
        try:
            form = {"query": "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.start_s + 600),
                    "end": str(prom.start_s + 3 * 3600), "step": "60"}
            first = httpx.post(proxy.url + "/api/v1/query_range", data=form, timeout=60)
            second = httpx.post(proxy.url + "/api/v1/query_range", data=form, timeout=60)
            assert first.status_code == second.status_code == 200
            assert first.json()["data"]["result"] and second.headers["X-Cache"] == "HIT"
            for p, f in (("/api/v1/query", {"query": "up", "time": str(prom.start_s + 3600)}),
                         ("/api/v1/series", {"match[]": "up"}), ("/api/v1/labels", {}),
                         ("/api/v1/explain", form), ("/api/v1/status/buildinfo", None)):
                r = httpx.post(proxy.url + p, data=f, timeout=60) if f is not None else httpx.get(proxy.url + p)
                assert r.status_code == 200, (p, r.text)
                answers.append(r.text)
            answers.append(httpx.get(proxy.url + "/metrics", timeout=10).text)
        finally:
            proxy.stop()
        seen = rec.snapshot()
    log = proxy.log.read_text(errors="replace")
    # Every call carried the credentials (the backend refuses the others).
    assert rec.rejected == 0 and len(seen) >= 6
    assert {s.path for s in seen} >= {"/api/v1/query_range", "/api/v1/query", "/api/v1/series", "/api/v1/labels"}
    # Banner: name and URL (which holds no credential), basic auth as a marker.
    assert f"guarded={rec.url} (basic auth)" in log
    for text in (log, *answers):
        for secret in _forbidden():
            assert secret not in text
    if redis_url:
        stored = _all_redis_bytes(redis_url)
        assert stored
        ident = BackendConfig(name="guarded", url=rec.url, basic_auth={"username": USER, "password": PASSWORD}).ident
        assert any(ident.encode() in v for v in stored)  # keys carry name#hash ...
        for blob in stored:
            for secret in (*_forbidden(), rec.url.split("//")[1]):  # ... never the URL or a secret
                assert secret.encode() not in blob


@pytest.mark.prom
def test_wrong_password_errors_name_no_password(prom: Any, tmp_path: Path) -> None:
    pw_file = tmp_path / "password"
    pw_file.write_text(WRONG)
    with recording_backend(prom.url, (USER, PASSWORD)) as rec:
        path = _config(tmp_path / "c.yaml", rec.url, pw_file, "aiohttp", None)
        proxy = Promaccel.start(None, ("--split-interval", "1h", "--log-level", "debug"), tmp_path / "p",
                                config=path)
        try:
            r = httpx.post(proxy.url + "/api/v1/query", data={"query": "up", "time": str(prom.start_s + 60)},
                           timeout=60)
        finally:
            proxy.stop()
    assert r.status_code == 401 and r.json()["errorType"] == "unauthorized"  # relayed as is
    assert rec.rejected >= 1
    log = proxy.log.read_text(errors="replace")
    for text in (r.text, log):
        for secret in (*_forbidden(WRONG), *_forbidden(PASSWORD)):
            assert secret not in text
