"""proxy/api/tenants.py: what a request sees. Auth off: one view, every backend. Auth on: a
request is its tenant's (a 401 with Prometheus's error JSON and the challenge when its
credentials are missing or wrong, counted by reason) and reaches only its tenant's backends,
the first of them for relays; a forwarded tenant header outside the tenant's values is a 403
naming the header and never the value; a tenant's queries are on the operator page as its own.

In process (the app over httpx's ASGI transport) in front of two recording fake backends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.config.auth import sha256_hex
from proxy.observe.activity import ACTIVITY
from proxy.observe.metrics import METRICS
from tests.api.in_process import serve
from tests.recording import Recorder, recording_backend

GPU_TOKEN = "gpu-team-token-0123456789"
NODES_TOKEN = "nodes-team-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789abc"
GPU = {"Authorization": f"Bearer {GPU_TOKEN}"}
NODES = {"Authorization": f"Bearer {NODES_TOKEN}"}
T = "1700000000"


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Recorder, Recorder]]:
    with recording_backend(None) as amp, recording_backend(None) as local:
        yield amp, local


def _config(fleet: tuple[Recorder, Recorder], auth: bool = True) -> dict[str, Any]:
    amp, local = fleet
    config: dict[str, Any] = {
        "backends": [{"name": "amp", "url": amp.url, "retries": 0}, {"name": "local", "url": local.url, "retries": 0}],
        "tenancy": {"forward_headers": ["X-Scope-OrgID"]},
        "cache": {"admin_token": ADMIN_TOKEN},
    }
    if auth:
        config["auth"] = {"tenants": [
            {"name": "gpu-team", "tokens_sha256": [sha256_hex(GPU_TOKEN)], "backends": ["amp"],
             "forward_headers": {"X-Scope-OrgID": ["gpu-a", "gpu-b"]}},
            {"name": "nodes-team", "tokens_sha256": [sha256_hex(NODES_TOKEN)], "backends": ["local", "amp"]},
        ]}
    return config


def _serve(config: dict[str, Any], body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    return serve(config, body)


def _calls(*, fleet: tuple[Recorder, Recorder], config: dict[str, Any], method: str, path: str,
           **kw: Any) -> tuple[httpx.Response, list[str], list[str]]:
    """One request; the paths each backend (amp, local) was asked for, shard discovery aside."""
    for rec in fleet:
        rec.clear()

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.request(method, path, **kw)

    r = _serve(config, body)
    return (r, *([s.path for s in rec.snapshot() if "/label/Hostname/" not in s.path and "/label/instance/" not in s.path]
                  for rec in fleet))  # type: ignore[return-value]


def _failures(reason: str) -> float:
    return METRICS.registry.get_sample_value("promaccel_auth_failures_total", {"reason": reason}) or 0.0


def test_auth_off_every_request_sees_every_backend(fleet: tuple[Recorder, Recorder]) -> None:
    r, amp, local = _calls(fleet=fleet, config=_config(fleet, auth=False), method="GET", path="/api/v1/status/flags")
    assert r.status_code == 200 and amp == ["/api/v1/status/flags"] and local == []  # the first backend relays
    # A hybrid fleet's metadata goes to both.
    r, amp, local = _calls(fleet=fleet, config=_config(fleet, auth=False), method="GET", path="/api/v1/labels")
    assert r.status_code == 200 and amp == local == ["/api/v1/labels"]


@pytest.mark.parametrize(("headers", "reason"), [
    ({}, "missing"),
    ({"Authorization": "Bearer not-a-token-of-anyone"}, "invalid"),
    ({"Authorization": "Bearer " + GPU_TOKEN[:-1]}, "invalid"),
])
def test_no_or_wrong_credentials_are_a_401_with_the_challenge(fleet: tuple[Recorder, Recorder],
                                                              headers: dict[str, str], reason: str) -> None:
    before = _failures(reason)
    for path in ("/api/v1/query", "/api/v1/labels", "/api/v1/status/buildinfo"):
        r, amp, local = _calls(fleet=fleet, config=_config(fleet), method="GET", path=path,
                               params={"query": "up", "time": T}, headers=headers)
        assert r.status_code == 401 and amp == local == []
        body = r.json()
        assert body["status"] == "error" and body["errorType"] == "unauthorized" and body["error"]
        assert 'Bearer realm="promaccel"' in r.headers["www-authenticate"]
    assert _failures(reason) == before + 3


def test_a_tenant_reaches_only_its_own_backends(fleet: tuple[Recorder, Recorder]) -> None:
    config = _config(fleet)
    # gpu-team holds amp only: its query, relays and metadata never reach local.
    for method, path, kw in (("GET", "/api/v1/query", {"params": {"query": "up", "time": T}}),
                             ("GET", "/api/v1/labels", {}),
                             ("GET", "/api/v1/status/config", {})):
        r, amp, local = _calls(fleet=fleet, config=config, method=method, path=path, headers=GPU, **kw)
        assert r.status_code == 200 and amp == [path] and local == [], (path, amp, local)
    # nodes-team names local before amp, but its backends keep the config's order: amp is its
    # primary (relays, buildinfo); both answer a hybrid metadata call.
    r, amp, local = _calls(fleet=fleet, config=config, method="GET", path="/api/v1/status/flags", headers=NODES)
    assert r.status_code == 200 and amp == ["/api/v1/status/flags"] and local == []
    r, amp, local = _calls(fleet=fleet, config=config, method="GET", path="/api/v1/labels", headers=NODES,
                           params={"match[]": "up"})
    assert r.status_code == 200 and local == amp == ["/api/v1/labels"]


def test_a_forwarded_header_outside_the_tenants_values_is_a_403(fleet: tuple[Recorder, Recorder]) -> None:
    config = _config(fleet)
    r, amp, local = _calls(fleet=fleet, config=config, method="GET", path="/api/v1/labels",
                           headers={**GPU, "X-Scope-OrgID": "nodes-secret-org"})
    assert r.status_code == 403 and amp == local == []
    body = r.json()
    assert body["errorType"] == "forbidden" and "X-Scope-OrgID".lower() in body["error"].lower()
    assert "gpu-team" in body["error"] and "nodes-secret-org" not in r.text
    # One of its own values passes and is what the backend sees; none sent: its first value.
    for sent, seen in (("gpu-b", "gpu-b"), (None, "gpu-a")):
        amp_rec = fleet[0]
        amp_rec.clear()
        headers = {**GPU, **({"X-Scope-OrgID": sent} if sent else {})}
        r, amp, _ = _calls(fleet=fleet, config=config, method="GET", path="/api/v1/labels", headers=headers)
        assert r.status_code == 200 and amp == ["/api/v1/labels"]
        (call,) = [s for s in amp_rec.snapshot() if s.path == "/api/v1/labels"]
        assert call.headers["x-scope-orgid"] == seen


def test_a_tenant_with_no_pinned_values_forwards_none(fleet: tuple[Recorder, Recorder]) -> None:
    r, _, _ = _calls(fleet=fleet, config=_config(fleet), method="GET", path="/api/v1/status/flags",
                     headers={**NODES, "X-Scope-OrgID": "gpu-a"})
    assert r.status_code == 403  # nodes-team has no X-Scope-OrgID values: any value is not its own
    fleet[1].clear()
    r, _, local = _calls(fleet=fleet, config=_config(fleet), method="GET", path="/api/v1/status/flags",
                         headers=NODES)
    assert r.status_code == 200
    assert all("x-scope-orgid" not in s.headers for s in fleet[1].snapshot())


def test_a_tenants_token_is_not_the_admins(fleet: tuple[Recorder, Recorder]) -> None:
    async def body(c: httpx.AsyncClient) -> list[int]:
        return [(await c.get("/api/v1/admin/cache/stats", headers=h)).status_code
                for h in (GPU, NODES, {"Authorization": f"Bearer {ADMIN_TOKEN}"})]

    assert _serve(_config(fleet), body) == [403, 403, 200]


def test_the_operator_page_shows_a_tenant_its_own_queries(fleet: tuple[Recorder, Recorder]) -> None:
    async def body(c: httpx.AsyncClient) -> dict[str, str]:
        ids = {}
        for who, headers in (("gpu-team", GPU), ("nodes-team", NODES), ("nobody", {})):
            r = await c.get("/api/v1/query", params={"query": f"count(up) # {who}", "time": T}, headers=headers)
            ids[who] = r.headers["x-promaccel-query-id"]
        return ids

    config = _config(fleet)
    # One backend each: a query of nodes-team over both would be evaluated across the two
    # stores, which needs real answers (the recording fakes answer an empty vector to all).
    config["auth"]["tenants"][1]["backends"] = ["local"]
    ids = _serve(config, body)
    recent = {r["query_id"]: r for r in ACTIVITY.snapshot()["recent"]}
    assert recent[ids["gpu-team"]]["tenant"] == "gpu-team" and recent[ids["nodes-team"]]["tenant"] == "nodes-team"
    assert "tenant" not in recent[ids["nobody"]]  # refused before it authenticated
    mine = {r["query_id"] for r in ACTIVITY.snapshot("gpu-team")["recent"]}
    assert ids["gpu-team"] in mine and ids["nodes-team"] not in mine and ids["nobody"] not in mine
