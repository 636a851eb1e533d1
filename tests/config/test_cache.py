"""The `cache:` section's own checks (proxy/config/cache.py): which Redis URLs are accepted,
errors that never show a password, and where the frames' shared secret comes from. What the
store makes of them: tests/cache/test_cache.py, test_cache_integrity.py; the Redis password
through a pod's Secret: tests/deploy/test_redis_auth.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from proxy.config import CacheConfig, ConfigError, build_config


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "REDIS://h:1", "rediss://user:pw@h:6380", "unix:///run/redis.sock",
    "redis+cluster://a:1,b:2", "rediss+cluster://h:1",
])
def test_redis_urls_accepted(url: str) -> None:
    assert CacheConfig(redis_url=url).redis_url == url


def test_no_url_is_the_in_process_cache() -> None:
    assert CacheConfig(redis_url="").redis_url is None and CacheConfig().redis_url is None


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:6379", "expected a redis://"),
    ("127.0.0.1:6379", "expected a redis://"),
    ("redis://", "names no host"),
    ("redis://:pw@/0", "names no host"),
])
def test_redis_urls_refused(url: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        CacheConfig(redis_url=url)


def test_a_refused_url_never_shows_its_password() -> None:
    # As the loader reports it (pydantic's own text would repeat the input value).
    with pytest.raises(ConfigError) as err:
        build_config({"backends": [{"url": "http://127.0.0.1:1"}],
                      "cache": {"redis_url": "https://admin:very-secret-pw@redis.example:6379"}})
    assert "very-secret-pw" not in str(err.value)
    assert "cache.redis_url" in str(err.value) and "'redis.example:6379'" in str(err.value)


def test_the_frames_secret_from_a_file_the_config_or_the_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMACCEL_CACHE_SECRET", "  from-the-environment-0001 \n")
    f = tmp_path / "secret"
    f.write_bytes(b"from-a-mounted-file-0001\n")  # a Kubernetes Secret's trailing newline is not part of it
    assert CacheConfig(secret_file=str(f)).frame_secret() == (b"from-a-mounted-file-0001", "secret_file")
    assert CacheConfig(secret=SecretStr("from-the-config-0001")).frame_secret() == (b"from-the-config-0001", "secret")
    assert CacheConfig().frame_secret() == (b"from-the-environment-0001", "env")
    monkeypatch.setenv("PROMACCEL_CACHE_SECRET", "   ")
    assert CacheConfig().frame_secret() == (None, "none")
    f.write_bytes(b"too-short\n")
    with pytest.raises(ValidationError, match="at least 16 bytes"):
        CacheConfig(secret_file=str(f))
