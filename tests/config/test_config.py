"""Configuration: YAML + flags, strict validation with messages that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "promaccel.yaml"
    p.write_text(text)
    return str(p)


def test_backend_flag_alone_serves() -> None:
    cfg = load_config(None, backends=["http://127.0.0.1:9090"])
    assert cfg.backends[0].url == "http://127.0.0.1:9090"
    assert cfg.cache.redis_url is None
    assert cfg.listen.host == "127.0.0.1"


def test_flags_override_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "backends: [{url: 'http://127.0.0.1:1'}]\nlisten: {port: 1234}\n"
                  "planner: {split_interval: 2h}\n")
    cfg = load_config(path, backends=["http://127.0.0.1:9090"], port=5555)
    assert cfg.backends[0].url == "http://127.0.0.1:9090"
    assert cfg.listen.port == 5555
    assert cfg.planner.split_interval == 7_200_000


def test_env_var_names_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "backends: [{url: 'http://127.0.0.1:9'}]\ncache: {max_freshness: 5m}\n")
    monkeypatch.setenv("PROMACCEL_CONFIG", path)
    cfg = load_config(None)
    assert cfg.cache.max_freshness == 300_000


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("backends: [{url: 'http://x'}]\nbogus: 1\n", "unknown key 'bogus'"),
        ("backends: [{url: 'http://x', colour: red}]\n", "unknown key 'backends.0.colour'"),
        ("backends: [{url: 'http://x'}]\nlisten: {port: eighty}\n", "listen.port"),
        ("backends: [{url: 'http://x'}]\ncache: {max_freshness: soon}\n", "cache.max_freshness"),
        ("backends: [{url: 'ftp://x'}]\n", "backends.0.url"),
        ("backends: [{url: 'http://x', kind: mimir}]\n", "backends.0.kind"),
        ("backends: [{url: 'http://x'}]\nplanner: {shards: 0}\n", "planner.shards"),
        ("- just\n- a list\n", "mapping at the top level"),
        ("backends: [\n", "not valid YAML"),
        ("listen: {port: 1}\n", "no backend configured"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert fragment in str(err.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config("/nonexistent/promaccel.yaml")


def test_cli_reports_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "backends: [{url: 'http://127.0.0.1:9'}]\nplanner: {splitinterval: 1h}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--config", path],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown key 'planner.splitinterval'" in proc.stderr


# --- hybrid holdings (issue 6) -----------------------------------------------------------

NOW_MS = 1_793_491_200_000


def _cfg(tmp_path: Path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(str(path))


def test_holds_resolve_to_holdings(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, """
backends:
  - name: local
    url: http://127.0.0.1:9090
    holds: {metrics: ["*"], last: 15d}
    primary: true
  - name: amp
    kind: amp
    url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1
    holds:
      - {metrics: ["DCGM_.*"], since: "2026-10-01T00:00:00Z"}
      - {metrics: ["kube_.*"], since: 2026-10-15, until: now-1h}
""")
    local, amp = cfg.backends
    (h,) = local.holdings(NOW_MS)
    assert (h.name, h.metrics, h.since_ms, h.until_ms, h.primary) == (
        "local", ("*",), NOW_MS - 15 * 86_400_000, None, True)
    a, b = amp.holdings(NOW_MS)
    assert a.metrics == ("DCGM_.*",) and a.since_ms == 1_790_812_800_000 and a.until_ms is None
    assert b.metrics == ("kube_.*",) and b.until_ms == NOW_MS - 3_600_000 and not b.primary


def test_no_holds_means_everything_always(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "backends: [{url: 'http://127.0.0.1:9090'}]\n")
    (h,) = cfg.backends[0].holdings(NOW_MS)
    assert (h.metrics, h.since_ms, h.until_ms) == (("*",), None, None)


@pytest.mark.parametrize(
    ("holds", "fragment"),
    [
        ("{last: 15d, since: 2026-01-01}", "either last or since"),
        ("{since: 'yesterday'}", "RFC 3339"),
        ("{metrics: ['DCGM_(']}", "not a valid regex"),
        ("{metrics: []}", "metrics"),
        ("{since: 2026-11-02, until: 2026-11-01}", "is after until"),
        ("{metric: ['x']}", "unknown key"),
    ],
)
def test_bad_holds_named(tmp_path: Path, holds: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, f"backends: [{{url: 'http://127.0.0.1:9090', holds: {holds}}}]\n")
    assert fragment in str(err.value) and "holds" in str(err.value)


def test_backend_names_unique_and_one_primary(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'a' repeats"):
        _cfg(tmp_path, "backends: [{name: a, url: 'http://127.0.0.1:1'}, {name: a, url: 'http://127.0.0.1:2'}]\n")
    with pytest.raises(ConfigError, match="at most one backend may be primary"):
        _cfg(tmp_path, "backends: [{name: a, url: 'http://127.0.0.1:1', primary: true},"
                       " {name: b, url: 'http://127.0.0.1:2', primary: true}]\n")


def test_server_limits(tmp_path: Path) -> None:
    """listen: server limits (proxy/api/server_limits.py): defaults, durations, the example file's values,
    and bad values named."""
    from proxy.api.server_limits import LimitedHttpToolsProtocol, configure

    listen = load_config(None, backends=["http://127.0.0.1:9090"]).listen
    assert (listen.max_header_bytes, listen.header_timeout, listen.body_timeout, listen.keep_alive_timeout,
            listen.max_concurrency) == (65536, 30_000, 60_000, 120_000, 1024)
    example = load_config(str(Path(__file__).resolve().parents[2] / "config" / "promaccel.example.yaml")).listen
    assert example.model_dump(exclude={"host", "port"}) == listen.model_dump(exclude={"host", "port"})
    path = _write(tmp_path, "backends: [{url: 'http://x'}]\nlisten: {header_timeout: 1.5, body_timeout: 2m, "
                  "keep_alive_timeout: 5s, max_header_bytes: 8192, max_concurrency: 10}\n")
    args = configure(load_config(path).listen)
    assert args == {"http": LimitedHttpToolsProtocol, "timeout_keep_alive": 5.0, "limit_concurrency": 10,
                    "timeout_graceful_shutdown": 25.0}
    assert (LimitedHttpToolsProtocol.header_timeout_s, LimitedHttpToolsProtocol.body_timeout_s,
            LimitedHttpToolsProtocol.max_header_bytes) == (1.5, 120.0, 8192)
    configure(listen)  # back to the defaults for this process
    for bad, key in [("max_header_bytes: 100", "listen.max_header_bytes"), ("header_timeout: 0", "listen.header_timeout"),
                     ("body_timeout: soon", "listen.body_timeout"), ("max_concurrency: 0", "listen.max_concurrency"),
                     ("keep_alive_timeout: -1", "listen.keep_alive_timeout")]:
        with pytest.raises(ConfigError, match=key):
            load_config(_write(tmp_path, f"backends: [{{url: 'http://x'}}]\nlisten: {{{bad}}}\n"))
