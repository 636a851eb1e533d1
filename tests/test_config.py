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
