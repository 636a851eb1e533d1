"""Auth config and credential checks, in-process (proxy/config/auth.py, proxy/api/auth.py): digests at rest, plain-text
secrets from files and variables hashed at load, bearer and basic auth as Grafana sends them,
the refusals, and the cache scope a tenant makes (proxy/backends/tenancy.py). The served
behaviour, over real Prometheus backends, is tests/api/test_auth.py."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from proxy.api.auth import Authenticator, AuthFailure
from proxy.backends.tenancy import NO_TENANT, Tenancy
from proxy.config import Config, ConfigError, build_config, load_config
from proxy.config.auth import sha256_hex

TOKEN_A = "tok-a-0123456789abcdef"
TOKEN_B = "tok-b-0123456789abcdef"
PASSWORD = "grafana-pass-0123456789"
BACKENDS = [{"name": "amp-a", "url": "http://127.0.0.1:1"}, {"name": "local", "url": "http://127.0.0.1:2"}]


def _cfg(auth: dict[str, Any], **extra: Any) -> Config:
    return build_config({"backends": BACKENDS, "auth": auth, **extra})


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_off_by_default() -> None:
    cfg = build_config({"backends": BACKENDS})
    assert not cfg.auth.enabled and cfg.auth.tenants == []


def test_digest_is_sha256_of_the_utf8_secret() -> None:
    assert sha256_hex(TOKEN_A) == hashlib.sha256(TOKEN_A.encode()).hexdigest()
    assert len(sha256_hex("é" * 16)) == 64


def test_bearer_and_basic_map_to_their_tenant() -> None:
    cfg = _cfg({"tenants": [
        {"name": "team-a", "tokens_sha256": [sha256_hex(TOKEN_A)], "backends": ["amp-a"]},
        {"name": "team-b", "tokens_sha256": ["sha256:" + sha256_hex(TOKEN_B).upper()],
         "basic": [{"user": "grafana-b", "password_sha256": sha256_hex(PASSWORD)}]},
    ]})
    auth = Authenticator(cfg.auth)
    assert auth.tenant_of(f"Bearer {TOKEN_A}") == "team-a"
    assert auth.tenant_of(f"bearer   {TOKEN_B} ") == "team-b"
    assert auth.tenant_of(_basic("grafana-b", PASSWORD)) == "team-b"
    assert cfg.auth.tenants[1].backends is None  # all backends


@pytest.mark.parametrize("header, reason", [
    (None, "missing"),
    ("", "missing"),
    ("Bearer", "invalid"),
    ("Bearer wrong-token-0123456789", "invalid"),
    (f"Bearer {TOKEN_A}x", "invalid"),
    (f"Bearer {TOKEN_A} extra", "invalid"),
    ("Token " + TOKEN_A, "invalid"),
    (_basic("grafana-b", PASSWORD + "x"), "invalid"),
    (_basic("grafana-a", PASSWORD), "invalid"),  # right password, wrong user
    ("Basic not-base64!!", "invalid"),
    ("Basic " + base64.b64encode(b"no-colon").decode(), "invalid"),
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "invalid"),
])
def test_refusals_never_show_the_secret(header: str | None, reason: str) -> None:
    cfg = _cfg({"tenants": [
        {"name": "team-a", "tokens_sha256": [sha256_hex(TOKEN_A)]},
        {"name": "team-b", "basic": [{"user": "grafana-b", "password_sha256": sha256_hex(PASSWORD)}]},
    ]})
    with pytest.raises(AuthFailure) as err:
        Authenticator(cfg.auth).tenant_of(header)
    assert err.value.reason == reason
    for secret in (TOKEN_A, PASSWORD, "wrong-token", "not-base64"):
        assert secret not in err.value.message


def test_plain_secrets_from_file_and_env_are_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# team-b's tokens\n{TOKEN_B}\n\nsha256:{sha256_hex('another-token-0123456')}\n")
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    monkeypatch.setenv("PROMACCEL_AUTH_TEAM_A", f"{TOKEN_A}, second-token-0123456789")
    monkeypatch.setenv("PROMACCEL_AUTH_GRAFANA_A", PASSWORD + "-a")
    cfg = _cfg({"tenants": [
        {"name": "team-a", "tokens_env": "PROMACCEL_AUTH_TEAM_A",
         "basic": [{"user": "grafana-a", "password_env": "PROMACCEL_AUTH_GRAFANA_A"}]},
        {"name": "team-b", "tokens_file": str(tokens), "basic": [{"user": "grafana-b", "password_file": str(password)}]},
    ]})
    assert cfg.auth.tenants[1].token_digests() == [sha256_hex(TOKEN_B), sha256_hex("another-token-0123456")]
    auth = Authenticator(cfg.auth)
    assert auth.tenant_of(f"Bearer {TOKEN_A}") == "team-a"
    assert auth.tenant_of("Bearer second-token-0123456789") == "team-a"
    assert auth.tenant_of(_basic("grafana-a", PASSWORD + "-a")) == "team-a"
    assert auth.tenant_of(f"Bearer {TOKEN_B}") == "team-b"
    assert auth.tenant_of("Bearer another-token-0123456") == "team-b"
    assert auth.tenant_of(_basic("grafana-b", PASSWORD)) == "team-b"
    # The config and the authenticator keep digests only: no plain secret in their state.
    dumped = repr(cfg.model_dump()) + repr(vars(auth))
    for secret in (TOKEN_A, TOKEN_B, PASSWORD, "second-token"):
        assert secret not in dumped


def test_example_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """config/examples/tenants.yaml (README "Auth and tenants"), its plain secrets set."""
    monkeypatch.setenv("PROMACCEL_AUTH_SRE", "sre-token-0123456789abcdef")
    monkeypatch.setenv("PROMACCEL_AUTH_GRAFANA_B", "grafana-b-password-0123456789")
    cfg = load_config(str(Path(__file__).resolve().parent.parent / "config" / "examples" / "tenants.yaml"))
    assert [t.name for t in cfg.auth.tenants] == ["team-a", "team-b", "sre"]
    assert Authenticator(cfg.auth).tenant_of("Bearer sre-token-0123456789abcdef") == "sre"


@pytest.mark.parametrize("auth, fragment", [
    ({"tenants": [{"name": "a"}]}, "no credentials"),
    ({"tenants": [{"name": "a", "tokens_sha256": ["abc"]}]}, "SHA-256 hex digests"),
    ({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)], "backends": ["nope"]}]},
     "unknown backend(s) 'nope'"),
    ({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)], "backends": []}]}, "at least one backend"),
    ({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)]},
                  {"name": "a", "tokens_sha256": [sha256_hex(TOKEN_B)]}]}, "tenant names must be unique"),
    ({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)]},
                  {"name": "b", "tokens_sha256": [sha256_hex(TOKEN_A)]}]}, "one tenant only"),
    ({"tenants": [{"name": "a", "basic": [{"user": "u", "password_sha256": sha256_hex(PASSWORD)}]},
                  {"name": "b", "basic": [{"user": "u", "password_sha256": sha256_hex(TOKEN_A)}]}]}, "one tenant only"),
    ({"tenants": [{"name": "a", "basic": [{"user": "u"}]}]}, "exactly one of password_sha256"),
    ({"tenants": [{"name": "a", "basic": [{"user": "u:x", "password_sha256": sha256_hex(PASSWORD)}]}]}, "':'"),
    ({"tenants": [{"name": "a b", "tokens_sha256": [sha256_hex(TOKEN_A)]}]}, "tenant name"),
    ({"tenants": [{"name": "a", "tokens_env": "PROMACCEL_AUTH_UNSET_FOR_TEST"}]}, "is not set"),
    ({"tenants": [{"name": "a", "tokens_file": "/nonexistent/tokens"}]}, "cannot read tokens_file"),
    ({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)]}], "colour": 1}, "unknown key 'auth.colour'"),
])
def test_bad_auth_config_names_the_problem(auth: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(auth)
    assert fragment in str(err.value)


def test_short_plain_secrets_are_refused_without_showing_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMACCEL_AUTH_SHORT", "hunter2")
    with pytest.raises(ConfigError) as err:
        _cfg({"tenants": [{"name": "a", "tokens_env": "PROMACCEL_AUTH_SHORT"}]})
    assert "shorter than 16" in str(err.value) and "hunter2" not in str(err.value)
    (tmp_path / "pw").write_text("hunter2\n")
    with pytest.raises(ConfigError) as err:
        _cfg({"tenants": [{"name": "a", "basic": [{"user": "u", "password_file": str(tmp_path / "pw")}]}]})
    assert "shorter than 16" in str(err.value) and "hunter2" not in str(err.value)


def test_admin_token_must_not_be_a_tenant_token(monkeypatch: pytest.MonkeyPatch) -> None:
    tenants = {"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)]}]}
    with pytest.raises(ConfigError, match="admin_token is also a tenant's token"):
        _cfg(tenants, cache={"admin_token": TOKEN_A})
    monkeypatch.setenv("PROMACCEL_ADMIN_TOKEN", TOKEN_A)
    with pytest.raises(ConfigError, match="admin_token is also a tenant's token"):
        _cfg(tenants)
    monkeypatch.setenv("PROMACCEL_ADMIN_TOKEN", TOKEN_B)
    assert _cfg(tenants).auth.enabled


def test_forwarding_authorization_is_refused_with_auth() -> None:
    with pytest.raises(ConfigError, match="never forwarded"):
        _cfg({"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKEN_A)]}]},
             tenancy={"forward_headers": ["Authorization"]})


def test_tenant_is_part_of_the_cache_scope() -> None:
    t = Tenancy()
    assert t.of({}) is NO_TENANT
    a, b = t.of({}, "team-a"), t.of({}, "team-b")
    assert a.scope and b.scope and a.scope != b.scope
    assert a.headers == ()  # the tenant's name is never sent to a backend
    assert t.of({}, "team-a").scope == a.scope  # stable
    # With forwarded headers: the same org id under two tenants is two scopes, and a tenant
    # named like a header value cannot collide with that header.
    f = Tenancy(["X-Scope-OrgID"])
    h = {"x-scope-orgid": "org1"}
    assert len({f.of(h).scope, f.of(h, "team-a").scope, f.of(h, "team-b").scope, f.of({}, "org1").scope}) == 4
    assert f.of(h, "team-a").headers == (("x-scope-orgid", "org1"),)
