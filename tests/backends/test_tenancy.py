"""Tenancy: `tenancy.forward_headers` reach the backend and key the cache and coalescing;
with nothing configured client headers neither reach the backend nor change a key."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY
from proxy.backends import Backend, tenancy
from proxy.config import BackendConfig, ConfigError, build_config
from proxy.pipeline.revalidate import Revalidator
from tests.recording import Recorder, recording_backend
from tests.servers import Promaccel

ORG = "x-scope-orgid"


# --- units ---------------------------------------------------------------------------------------


def test_scope_depends_on_forwarded_headers_only() -> None:
    none = tenancy.Tenancy(())
    assert none.of({"authorization": "Bearer a", ORG: "team-a"}) == tenancy.NO_TENANT
    t = tenancy.Tenancy(["X-Scope-OrgID"])
    assert t.of({"authorization": "Bearer a"}) == tenancy.NO_TENANT
    a, b = t.of({ORG: "team-a", "authorization": "x"}), t.of({ORG: "team-b"})
    assert a.headers == ((ORG, "team-a"),) and a.scope.startswith("t2:") and a.scope != b.scope
    assert a == t.of({ORG: "team-a", "authorization": "other"})  # unforwarded headers: no effect
    assert "team-a" not in a.scope and "team-a" not in repr(a)
    assert tenancy.Tenancy(["X-Scope-OrgID"], b"another-key-of-16-bytes").of({ORG: "team-a"}).scope != a.scope


def test_scope_is_fast() -> None:
    """A keyed hash, not password hashing: 2,000 distinct tenants in well under the 7 s that
    PBKDF2 at 20,000 rounds took (3.7 ms each); the bound leaves room for a loaded machine."""
    t = tenancy.Tenancy(["authorization", "x-scope-orgid"])
    t0 = time.perf_counter()
    scopes = {t.of({"authorization": f"Bearer token-{i}", ORG: "org"}).scope for i in range(2000)}
    assert len(scopes) == 2000 and time.perf_counter() - t0 < 2.0


def test_tenancy_config(tmp_path: Path) -> None:
    cfg = build_config({"tenancy": {"forward_headers": ["X-Scope-OrgID", "x-scope-orgid", "Authorization"]}})
    assert cfg.tenancy.forward_headers == ["x-scope-orgid", "authorization"]
    assert build_config({}).tenancy.forward_headers == []
    for bad, msg in ((["Host"], "cannot be forwarded"), (["Content-Type"], "cannot be forwarded"),
                     (["bad header"], "not an HTTP header name")):
        with pytest.raises(ConfigError, match=msg):
            build_config({"tenancy": {"forward_headers": bad}})
    with pytest.raises(ConfigError, match="one Authorization header per request"):
        build_config({"tenancy": {"forward_headers": ["authorization"]},
                      "backends": [{"url": "http://127.0.0.1:1", "basic_auth": {"username": "u", "password": "p"}}]})
    short = tmp_path / "short"
    short.write_text("tiny")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        build_config({"tenancy": {"hash_key_file": str(short)}})
    good = tmp_path / "key"
    good.write_text("0123456789abcdef0123456789abcdef\n")
    assert build_config({"tenancy": {"hash_key_file": str(good)}}).tenancy.hash_key() == b"0123456789abcdef" * 2


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_forwarded_to_prometheus_backends_never_to_amp(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent/c",
                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/s"}.items():
        monkeypatch.setenv(k, v)
    for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    who = tenancy.Tenancy([ORG, "x-tenant-extra"]).of({ORG: "team-a", "x-tenant-extra": "e"})
    with recording_backend(None) as rec:
        async def go() -> None:
            prom = Backend(BackendConfig(name="prom", url=rec.url, transport=transport))
            amp = Backend(BackendConfig(name="amp", kind="amp", url=rec.url, region="us-east-1", transport=transport))
            try:
                caller = tenancy.Caller(who)
                for b in (prom, amp):
                    await b.request("GET", "/api/v1/query", params=[("query", b.name)], timeout_s=10, caller=caller)
                    await b.request("POST", "/api/v1/query", form=[("query", b.name)], timeout_s=10, caller=caller)
                await prom.request("GET", "/api/v1/query", params=[("query", "outside")], timeout_s=10)
            finally:
                await prom.aclose()
                await amp.aclose()

        asyncio.run(asyncio.wait_for(go(), 60))
        seen = rec.snapshot()
    by_query = {}
    for s in seen:
        by_query.setdefault(s.query, []).append(s.headers)
    assert len(by_query["prom"]) == len(by_query["amp"]) == 2
    for h in by_query["prom"]:
        assert h.get(ORG) == "team-a" and h.get("x-tenant-extra") == "e"
    for h in by_query["amp"]:
        assert ORG not in h and "x-tenant-extra" not in h and h["authorization"].startswith("AWS4-HMAC-SHA256")
    assert ORG not in by_query["outside"][0]  # made for nobody: nothing


def test_revalidation_digests_as_the_tenant_that_stored() -> None:
    a = tenancy.Tenancy([ORG]).of({ORG: "team-a"})
    b = tenancy.Tenancy([ORG]).of({ORG: "team-b"})
    with recording_backend(None) as rec:
        async def go() -> int:
            backend = Backend(BackendConfig(url=rec.url))

            async def invalidate(*_: Any) -> int:
                return 0
            rv = Revalidator(backend, invalidate, interval_ms=3_600_000, max_age_ms=3_600_000, max_entries=10)
            try:
                for who in (a, b):
                    rv.record("count_over_time(up[1h])", 1000, b"[]", ("up",), 0, 1000, tenant=who)
                await rv.run_pass()  # made for no request: each record brings its own tenant
                return len(rv)
            finally:
                await backend.aclose()

        records = asyncio.run(asyncio.wait_for(go(), 60))
        seen = rec.snapshot()
    assert records == 2  # kept apart per tenant
    assert sorted(s.headers.get(ORG, "") for s in seen) == ["team-a", "team-b"]


# --- end to end ----------------------------------------------------------------------------------


def _start(rec: Recorder, work: Path, *, forward: list[str], cache: bool = True,
           args: tuple[str, ...] = ()) -> Promaccel:
    work.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {"backends": [{"name": "mimir", "url": rec.url}],
                           "tenancy": {"forward_headers": forward}, "cache": {"enabled": cache}}
    path = work / "c.yaml"
    path.write_text(orjson.dumps(cfg).decode())
    return Promaccel.start(None, ("--split-interval", "1h", "--shards", "2", *args), work, config=path)


def _range_form(prom: Any, query: str, hours: int = 3) -> dict[str, str]:
    return {"query": query, "start": str(prom.start_s + 600), "end": str(prom.start_s + hours * 3600), "step": "60"}


@pytest.mark.prom
def test_tenants_reach_the_backend_and_never_share(prom: Any, tmp_path: Path) -> None:
    with recording_backend(prom.url) as rec:
        proxy = _start(rec, tmp_path / "p", forward=["X-Scope-OrgID"])
        try:
            form = _range_form(prom, "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)")

            def ask(org: str, path: str = "/api/v1/query_range", data: dict[str, str] | None = None) -> httpx.Response:
                headers = {"X-Scope-OrgID": org, "Authorization": f"Bearer not-forwarded-{org}"}
                r = httpx.post(proxy.url + path, data=data if data is not None else form, headers=headers, timeout=60)
                assert r.status_code == 200, r.text
                return r

            a1 = ask("team-a")
            seen_a = rec.snapshot()
            rec.clear()
            b1 = ask("team-b")
            seen_b = rec.snapshot()
            rec.clear()
            a2 = ask("team-a")
            after = rec.snapshot()
            rec.clear()
            # Planned (time-split and sharded) pieces and shard-value discovery, per tenant.
            assert int(a1.headers["X-Promaccel-Pieces"]) >= 4
            for seen, org in ((seen_a, "team-a"), (seen_b, "team-b")):
                paths = [s.path for s in seen]
                assert paths.count("/api/v1/query_range") >= 2 and "/api/v1/label/Hostname/values" in paths
                assert {s.headers.get(ORG) for s in seen} == {org}
                assert all("authorization" not in s.headers for s in seen)
            # team-b did not get team-a's cache entries; team-a's second ask did.
            assert a1.headers["X-Cache"] == "MISS" and b1.headers["X-Cache"] == "MISS"
            assert a2.headers["X-Cache"] == "HIT" and after == []
            assert a1.json() == b1.json() == a2.json()  # same data behind both tenants here
            # Instant queries and the relayed endpoints carry the header too.
            ask("team-c", "/api/v1/query", {"query": "sum(up)", "time": str(prom.start_s + 3600)})
            ask("team-c", "/api/v1/series", {"match[]": "up"})
            ask("team-c", "/api/v1/labels", {})
            r = httpx.get(proxy.url + "/api/v1/label/job/values", headers={"X-Scope-OrgID": "team-c"}, timeout=60)
            assert r.status_code == 200
            seen_c = rec.snapshot()
            assert {s.path for s in seen_c} >= {"/api/v1/query", "/api/v1/series", "/api/v1/labels",
                                                "/api/v1/label/job/values"}
            assert {s.headers.get(ORG) for s in seen_c} == {"team-c"}
        finally:
            proxy.stop()


@pytest.mark.prom
def test_two_tenants_never_share_a_coalesced_call(prom: Any, tmp_path: Path) -> None:
    """Cache off (so only single-flight could merge them): identical queries from two tenants
    at the same moment are two backend calls, each with its own header."""
    with recording_backend(prom.url, delay_s=0.5) as rec:
        proxy = _start(rec, tmp_path / "p", forward=["X-Scope-OrgID"], cache=False,
                       args=("--split-interval", "none", "--shards", "1"))
        try:
            form = {"query": "count(up)", "time": str(prom.start_s + 7200)}
            same = [("team-a", "1"), ("team-a", "2"), ("team-b", "3"), ("team-b", "4")]
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda o: httpx.post(
                    proxy.url + "/api/v1/query", data=form, headers={"X-Scope-OrgID": o[0]}, timeout=60), same))
            assert all(r.status_code == 200 for r in answers)
            orgs = sorted(s.headers.get(ORG, "") for s in rec.snapshot() if s.query == "count(up)")
            # Both tenants reached the backend; a tenant's identical concurrent calls may share.
            assert "team-a" in orgs and "team-b" in orgs and len(orgs) <= 4
        finally:
            proxy.stop()


@pytest.mark.prom
def test_nothing_configured_client_headers_go_nowhere(prom: Any, tmp_path: Path) -> None:
    with recording_backend(prom.url) as rec:
        proxy = _start(rec, tmp_path / "p", forward=[])
        try:
            form = _range_form(prom, "avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP)")
            answers = [httpx.post(proxy.url + "/api/v1/query_range", data=form, timeout=60,
                                  headers={"X-Scope-OrgID": org, "Authorization": f"Bearer {org}-token"})
                       for org in ("team-a", "team-b")]
            httpx.post(proxy.url + "/api/v1/series", data={"match[]": "up"}, timeout=60,
                       headers={"X-Scope-OrgID": "team-a", "Authorization": "Bearer x"})
            seen = rec.snapshot()
        finally:
            proxy.stop()
    assert [r.status_code for r in answers] == [200, 200]
    # Keys do not depend on client headers: the second "tenant" is served from the cache.
    assert answers[0].headers["X-Cache"] == "MISS" and answers[1].headers["X-Cache"] == "HIT"
    assert seen and all(ORG not in s.headers and "authorization" not in s.headers for s in seen)


# --- auth on: each tenant's forwarded values are pinned (issue 26) -------------------------------

TOKENS = {"team-a": "team-a-token-0f1e2d3c4b5a6978", "team-b": "team-b-token-8a7b6c5d4e3f2a1b",
          "team-c": "team-c-token-13579bdf02468ace"}


def _bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


def test_pin_unit() -> None:
    names = (ORG, "x-extra")
    allowed = {ORG: ("org-a", "org-shared")}
    assert tenancy.pin(names, {}, allowed) == ((ORG, "org-a"),)  # the default; x-extra: none for it
    assert tenancy.pin(names, {ORG: "org-shared"}, allowed) == ((ORG, "org-shared"),)
    for bad in ({ORG: "org-b"}, {ORG: "org-a|org-b"}, {"x-extra": "e"}):
        with pytest.raises(tenancy.HeaderNotAllowed) as err:
            tenancy.pin(names, bad, allowed)
        assert err.value.name in names and "org-b" not in str(err.value)
    t = tenancy.Tenancy([ORG], pins={"team-a": {ORG: ("org-a",)}, "team-b": {ORG: ("org-b",)}})
    a = t.of({}, "team-a")
    assert a.headers == ((ORG, "org-a"),)
    # A value the tenant may not use never gets through (the route wrapper refused it already).
    assert t.of({ORG: "org-b"}, "team-a") == a
    assert t.of({ORG: "org-b"}, "team-b").headers == ((ORG, "org-b"),) and t.of({}, "team-b").scope != a.scope
    assert t.of({ORG: "org-a"}, "team-nobody").headers == ()  # a tenant without pins forwards nothing
    # Auth off (no pins): the client's values, as before.
    assert tenancy.Tenancy([ORG]).of({ORG: "org-b"}).headers == ((ORG, "org-b"),)


def test_pinned_forward_headers_config() -> None:
    from proxy.config.auth import sha256_hex

    def cfg(pins: Any, forward: list[str] | None = None) -> Any:
        return build_config({"backends": [{"name": "mimir", "url": "http://127.0.0.1:1"}],
                             "tenancy": {"forward_headers": [ORG] if forward is None else forward},
                             "auth": {"tenants": [{"name": "a", "tokens_sha256": [sha256_hex(TOKENS["team-a"])],
                                                   "forward_headers": pins}]}})

    assert cfg({"X-Scope-OrgID": "org-a"}).auth.pins() == {"a": {ORG: ("org-a",)}}
    assert cfg({"X-Scope-OrgID": ["org-a", "org-s", "org-a"]}).auth.pins() == {"a": {ORG: ("org-a", "org-s")}}
    for pins, forward, msg in (({"X-Other": "v"}, None, "that tenancy.forward_headers does not list"),
                               ({ORG: "v"}, [], "that tenancy.forward_headers does not list"),
                               ({ORG: []}, None, "non-empty list"), ({ORG: ""}, None, "not a header value"),
                               ({ORG: "a\r\nX-Evil: 1"}, None, "not a header value"),
                               ({"bad name": "v"}, None, "not an HTTP header name")):
        with pytest.raises(ConfigError, match=msg):
            cfg(pins, forward)


@pytest.fixture(scope="module")
def pinned(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real promaccel with auth on and three tenants over one recording backend in front of
    the real Prometheus: team-a pinned to org-a, team-b to org-b, team-c to [org-c, org-shared]."""
    from proxy.config.auth import sha256_hex

    work = tmp_path_factory.mktemp("pinned")
    with recording_backend(prom.url) as rec:
        pins = {"team-a": "org-a", "team-b": "org-b", "team-c": ["org-c", "org-shared"]}
        cfg = {"backends": [{"name": "mimir", "url": rec.url}], "tenancy": {"forward_headers": ["X-Scope-OrgID"]},
               "auth": {"tenants": [{"name": n, "tokens_sha256": [sha256_hex(TOKENS[n])],
                                     "forward_headers": {"X-Scope-OrgID": pins[n]}} for n in TOKENS]}}
        path = work / "c.yaml"
        path.write_text(orjson.dumps(cfg).decode())
        proxy = Promaccel.start(None, ("--split-interval", "1h", "--shards", "2"), work, config=path)
        try:
            yield proxy, rec
        finally:
            proxy.stop()


ENDPOINTS = ["/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels",
             "/api/v1/label/job/values", "/api/v1/metadata", "/api/v1/explain"]
GET_ONLY = ("/api/v1/label/job/values", "/api/v1/metadata")


def _ask(proxy: Promaccel, method: str, path: str, form: dict[str, str], headers: dict[str, str]) -> httpx.Response:
    if method == "GET" or path in GET_ONLY:
        return httpx.get(proxy.url + path, params=form, headers=headers, timeout=60)
    return httpx.post(proxy.url + path, data=form, headers=headers, timeout=60)


def _form(prom: Any, path: str, query: str) -> dict[str, str]:
    if path == "/api/v1/query":
        return {"query": query, "time": str(prom.start_s + 3 * 3600)}
    if path in ("/api/v1/query_range", "/api/v1/explain"):
        return _range_form(prom, query)
    if path == "/api/v1/series":
        return {"match[]": "up"}
    return {}


@pytest.mark.prom
def test_a_tenant_never_reaches_the_backend_with_another_tenants_org(pinned: Any, prom: Any) -> None:
    """The finding: team-a sending team-b's X-Scope-OrgID reached the backend with it. Now a
    403 before anything runs, on every endpoint; nothing reaches the backend for it."""
    proxy, rec = pinned
    rec.clear()
    query = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    for path in ENDPOINTS:
        for method in ("GET", "POST"):
            r = _ask(proxy, method, path, _form(prom, path, query), {**_bearer("team-a"), ORG: "org-b"})
            assert r.status_code == 403, (path, method, r.status_code, r.text)
            body = r.json()
            assert body["status"] == "error" and body["errorType"] == "forbidden", body
            assert "x-scope-orgid" in body["error"] and "org-b" not in body["error"]
            assert r.headers["content-type"] == "application/json"
    assert rec.snapshot() == []  # not one call: no query, piece, relay or shard discovery


@pytest.mark.prom
def test_each_tenant_reaches_the_backend_with_its_own_org_only(pinned: Any, prom: Any) -> None:
    """Without the header, and with its own value: every backend call made for team-a --
    planned pieces, shard-value discovery, relays, metadata -- carries org-a; team-b's org-b."""
    proxy, rec = pinned
    for tenant, org in (("team-a", "org-a"), ("team-b", "org-b")):
        for i, extra in enumerate(({}, {ORG: org})):
            query = f'sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{Hostname!="{tenant}-{i}"}})'  # never cached yet
            rec.clear()
            for path in ENDPOINTS:
                r = _ask(proxy, "POST", path, _form(prom, path, query), {**_bearer(tenant), **extra})
                assert r.status_code == 200, (tenant, path, r.text)
            seen = rec.snapshot()
            paths = {s.path for s in seen}
            assert {"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels",
                    "/api/v1/label/job/values"} <= paths, paths
            if not extra:  # the first query of each tenant discovers its shard values
                assert "/api/v1/label/Hostname/values" in paths, paths
            assert {s.headers.get(ORG) for s in seen} == {org}, (tenant, extra)
            assert all("authorization" not in s.headers for s in seen)


@pytest.mark.prom
def test_a_tenant_chooses_among_its_own_values_and_they_key_the_cache(pinned: Any, prom: Any) -> None:
    proxy, rec = pinned
    form = _range_form(prom, "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)")

    def ask(extra: dict[str, str]) -> tuple[httpx.Response, set[str | None]]:
        rec.clear()
        r = httpx.post(proxy.url + "/api/v1/query_range", data=form, headers={**_bearer("team-c"), **extra}, timeout=60)
        return r, {s.headers.get(ORG) for s in rec.snapshot()}

    first, orgs = ask({})
    assert first.status_code == 200 and first.headers["X-Cache"] == "MISS" and orgs == {"org-c"}  # the default
    again, orgs = ask({ORG: "org-c"})
    assert again.headers["X-Cache"] == "HIT" and orgs == set()
    shared, orgs = ask({ORG: "org-shared"})  # another value: its own cache entries and discovery
    assert shared.status_code == 200 and shared.headers["X-Cache"] == "MISS" and orgs == {"org-shared"}
    refused, orgs = ask({ORG: "org-a"})
    assert refused.status_code == 403 and orgs == set()
