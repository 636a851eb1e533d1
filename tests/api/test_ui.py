"""The operator page's data: the recorder (proxy/observe/activity.py) in process with a fake clock, and
/ui + /ui/data.json in process over a real Prometheus (and a real Redis): a query just run is
listed with its plan, pieces, cache hits and backend calls; nothing secret is ever shown.
The page in a real browser: test_ui_browser.py."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.api.access_log import error_text
from proxy.config import build_config
from proxy.observe.activity import ACTIVITY, MAX_TEXT, MINUTES, Activity
from tests.api.in_process import serve
from tests.servers import free_port

H = 3600


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _activity(recent: int = 3) -> tuple[Activity, Clock]:
    clock = Clock()
    return Activity(recent=recent, clock=clock, perf=clock), clock


# --- the recorder ---------------------------------------------------------------------------


def test_in_flight_then_recent_newest_first_and_bounded() -> None:
    act, clock = _activity(recent=3)
    recs = [act.begin(f"id{i}", "POST", "/api/v1/query_range") for i in range(5)]
    recs[0].note(query="up")
    snap = act.snapshot()
    assert [r["query_id"] for r in snap["in_flight"]] == [f"id{i}" for i in range(5)] and snap["running"] == 5
    assert snap["in_flight"][0]["query"] == "up" and "duration_ms" not in snap["in_flight"][0]
    clock.t += 2
    assert act.snapshot()["in_flight"][0]["running_ms"] == 2000.0
    for i, r in enumerate(recs):
        act.finish(r, 200, 0.25, {"pieces": i, "cache": "MISS"})
    snap = act.snapshot()
    assert snap["in_flight"] == [] and snap["running"] == 0
    assert [r["query_id"] for r in snap["recent"]] == ["id4", "id3", "id2"]  # the last 3, newest first
    assert snap["recent"][0]["pieces"] == 4 and snap["recent"][0]["duration_ms"] == 250.0


def test_in_flight_list_is_bounded_but_all_are_counted() -> None:
    clock = Clock()
    act = Activity(recent=10, max_in_flight=2, clock=clock, perf=clock)
    recs = [act.begin(f"id{i}", "GET", "/api/v1/query") for i in range(5)]
    snap = act.snapshot()
    assert snap["running"] == 5 and [r["query_id"] for r in snap["in_flight"]] == ["id0", "id1"]
    for r in recs:
        act.finish(r, 200, 0.1, {})
    snap = act.snapshot()
    assert snap["running"] == 0 and snap["in_flight"] == [] and len(snap["recent"]) == 5


def test_only_listed_fields_are_kept_and_texts_are_cut() -> None:
    act, _ = _activity()
    rec = act.begin("q", "GET", "/api/v1/query")
    rec.note(query="x" * (MAX_TEXT + 500))
    act.finish(rec, 400, 0.001, {"authorization": "Bearer hunter2", "x_scope_orgid": "tenant-a", "query": "short",
                                 "panel_id": "7"}, error="bad_data: " + "e" * 2000)
    shown = act.snapshot()["recent"][0]
    assert "authorization" not in shown and "x_scope_orgid" not in shown
    assert "hunter2" not in orjson.dumps(shown).decode()
    assert shown["panel_id"] == "7"
    # The text noted when the query was read stands (the access log's copy is cut at 1000).
    assert shown["query"].startswith("x" * MAX_TEXT) and shown["query"].endswith("(500 more characters)")
    assert len(shown["error"]) < 600 and shown["error"].startswith("bad_data: eee")


def test_minutes_cover_the_last_hour_and_forget_older_ones() -> None:
    act, clock = _activity()
    clock.t = 60 * 30_000_000  # a minute boundary
    act.pieces_looked_up(3, 1)
    act.backend_call("local", "/api/v1/query_range", 0.2, 200)
    act.backend_call("local", "/api/v1/query_range", 0.4, 503)
    act.backend_call("local", "ready", 9.0, None, "ConnectError")  # health, not query traffic
    clock.t += 61
    act.pieces_looked_up(0, 2)
    minutes = act.snapshot()["minutes"]
    assert len(minutes) == MINUTES and minutes[-1]["t"] == 60 * 30_000_001
    first, second = minutes[-2], minutes[-1]
    assert first["hit_ratio"] == 0.75 and first["backend_calls"] == 2 and first["backend_errors"] == 1
    assert first["backend_avg_ms"] == pytest.approx(300.0) and first["backend_max_ms"] == 400.0
    assert second["hit_ratio"] == 0.0 and second["backend_calls"] == 0 and second["backend_avg_ms"] is None
    seen = act.snapshot()["backends"]["local"]
    # A failed readiness probe counts as an error, but the last call is the last query call.
    assert seen["calls"] == 2 and seen["errors"] == 2 and seen["last_error"] == "ready: ConnectError"
    assert seen["last_status"] == 503 and seen["last_ms"] == 400.0
    # An hour later the old minutes are out of the window, and a minute slot reused is reset.
    clock.t += MINUTES * 60
    act.pieces_looked_up(1, 0)
    minutes = act.snapshot()["minutes"]
    assert sum(m["piece_hits"] + m["piece_misses"] for m in minutes) == 1
    assert sum(m["backend_calls"] for m in minutes) == 0


def test_calls_and_lookups_are_charged_to_the_running_query() -> None:
    act, _ = _activity()
    rec = act.begin("q1", "POST", "/api/v1/query_range")

    async def run() -> None:
        async def piece(seconds: float) -> None:  # the query's calls name its record
            act.backend_call("local", "/api/v1/query_range", seconds, 200, record=rec)
        await asyncio.gather(piece(0.1), piece(0.3))
        act.pieces_looked_up(2, 2, rec)
        act.backend_call("local", "/api/v1/query_range", 5.0, 200)  # another query's call

    asyncio.run(run())
    act.finish(rec, 200, 0.5, {})
    shown = act.snapshot()["recent"][0]
    assert shown["backend_ms"] == pytest.approx(400.0) and shown["backend_max_ms"] == pytest.approx(300.0)
    assert (shown["piece_hits"], shown["piece_misses"]) == (2, 2)


def test_error_text() -> None:
    assert error_text(b'{"status":"error","errorType":"bad_data","error":"parse error"}', False) == \
        "bad_data: parse error"
    assert error_text(b"<html>502 Bad Gateway</html>", False) == "<html>502 Bad Gateway</html>"
    assert error_text(b"\x1f\x8b...", True) == "(compressed error body)"
    # A relayed AWS error echoing what was signed is redacted as a log line would be.
    shown = error_text(b'{"status":"error","errorType":"unavailable","error":"canonical request: '
                       b'x-amz-security-token:FwoGZXIvYXdzEXAMPLE Signature=0123456789abcdef0123456789"}', False)
    assert "FwoGZXIvYXdzEXAMPLE" not in shown and "0123456789abcdef0123456789" not in shown
    assert shown.startswith("unavailable: canonical request: x-amz-security-token:")


# --- /ui and /ui/data.json in process -------------------------------------------------------

SECRETS = ("s3cr3t-backend-pw", "adm1n-t0ken-xyz", "redis-pw-777", "client-bearer-555", "tenant-orgid-999")


def _serve(config: dict[str, Any], body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    return serve(config, body, base_url="http://promaccel")


def _hour(data: dict[str, Any]) -> dict[str, int]:
    return {k: sum(m[k] for m in data["minutes"]) for k in ("piece_hits", "piece_misses", "backend_calls")}


def _backend(prom: Any, **kw: Any) -> dict[str, Any]:
    return {"name": "local", "url": prom.url, **kw}


@pytest.mark.prom
def test_data_lists_a_query_just_run_with_its_plan_and_health(prom: Any) -> None:
    start, end = prom.end_s - 4 * H, prom.end_s
    query = 'sum by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!="<script>alert(1)</script>"})'
    config = {"backends": [_backend(prom)], "planner": {"split_interval": "1h"}}

    async def body(c: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, int], httpx.Response,
                                                  httpx.Response]:
        before = _hour(ACTIVITY.snapshot())
        form = {"query": query, "start": str(start), "end": str(end), "step": "60"}
        answers = [await c.post("/api/v1/query_range", data=form) for _ in range(2)]
        answers.append(await c.get("/api/v1/query", params={"query": "sum(rate(nope[5m]"}))
        return answers, before, await c.get("/ui/data.json"), await c.get("/ui")

    answers, before, data_r, page = _serve(config, body)
    assert [a.status_code for a in answers] == [200, 200, 400]
    assert data_r.status_code == 200 and data_r.headers["cache-control"] == "no-store"
    data = data_r.json()["data"]
    by_id = {r["query_id"]: r for r in data["recent"]}
    cold, warm = (by_id[a.headers["x-promaccel-query-id"]] for a in answers[:2])
    assert cold["query"] == warm["query"] == query and cold["range"] is True
    # Four hourly pieces (five with the edge), fetched in one or more calls the first time,
    # all cached the second time.
    assert cold["pieces"] == int(answers[0].headers["x-promaccel-pieces"]) >= 4
    assert cold["time_split"] is True and cold["cache"] == "MISS"
    assert cold["backend_calls"] == int(answers[0].headers["x-promaccel-backend-calls"]) >= 1
    assert cold["backend_ms"] > 0 and cold["piece_misses"] == cold["pieces"] and cold["piece_hits"] == 0
    assert warm["cache"] == "HIT" and warm["backend_calls"] == 0 and warm["piece_hits"] == warm["pieces"]
    assert cold["status"] == 200 and cold["duration_ms"] > 0 and cold["bytes"] == answers[0].num_bytes_downloaded > 0
    bad = by_id[answers[2].headers["x-promaccel-query-id"]]
    assert bad["status"] == 400 and bad["query"] == "sum(rate(nope[5m]" and bad["error"].startswith("bad_data: ")
    # The hour's minutes got the lookups (half of them hits) and the backend calls: the two
    # range queries', the relayed bad one's (Prometheus's 400), and the planner's discovery of
    # the shard labels' values (answer-size estimates; one call per label, not charged to a query).
    hour = _hour(data)
    assert hour["piece_hits"] - before["piece_hits"] == warm["pieces"]
    assert hour["piece_misses"] - before["piece_misses"] == cold["pieces"]
    discovery = len(build_config({}).planner.shard_labels)
    assert 0 <= hour["backend_calls"] - before["backend_calls"] - (cold["backend_calls"] + 1) <= discovery
    assert any(m["backend_avg_ms"] for m in data["minutes"][-2:])
    assert data["cache"] == {"kind": "memory", "reachable": True, "errors": 0}
    (backend,) = data["backends"]
    assert backend["name"] == "local" and backend["ready"] is True and backend["calls"] >= 1
    assert backend["last_status"] == 400  # the bad query, relayed (readiness probes are not calls)
    # The page is static: no data in it, an inline script allowed by hash only.
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "DCGM" not in page.text and "alert(1)" not in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp and re.search(r"script-src 'sha256-[^']+'", csp)
    assert "innerHTML" not in page.text and "insertAdjacentHTML" not in page.text


@pytest.mark.prom
@pytest.mark.redis
def test_no_secret_is_ever_shown(prom: Any, redis_server: Any, tmp_path: Path) -> None:
    """Backend basic auth, the admin token, Redis's password, a client's Authorization and
    tenant headers: none appears in /ui or /ui/data.json."""
    pw_file = tmp_path / "pw"
    pw_file.write_text(SECRETS[0])
    redis_url = re.sub(r"^redis://", f"redis://:{SECRETS[2]}@", redis_server.url)
    config = {"backends": [_backend(prom, basic_auth={"username": "promaccel", "password_file": str(pw_file)})],
              "cache": {"admin_token": SECRETS[1], "redis_url": redis_url},
              "tenancy": {"forward_headers": ["X-Scope-OrgID"]}}

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, str]:
        r = await c.get("/api/v1/query", params={"query": "count(up)", "time": str(prom.end_s)},
                        headers={"Authorization": f"Bearer {SECRETS[3]}", "X-Scope-OrgID": SECRETS[4],
                                 "X-Dashboard-Uid": "gpu-fleet", "X-Panel-Id": "12"})
        return r, (await c.get("/ui/data.json")).text + (await c.get("/ui")).text

    r, shown = _serve(config, body)
    assert r.status_code == 200
    data = orjson.loads(shown[:shown.index("<!DOCTYPE")])["data"]
    row = next(q for q in data["recent"] if q["query_id"] == r.headers["x-promaccel-query-id"])
    assert row["query"] == "count(up)" and row["dashboard_uid"] == "gpu-fleet" and row["panel_id"] == "12"
    for secret in SECRETS:
        assert secret not in shown
    assert prom.url.split("//")[1] not in shown  # backends by name, not by address
    # Named by host, port and database only (this Redis needs no password: it answers anyway).
    cache = data["cache"]
    assert cache["kind"] == "redis" and cache["address"] == "redis://" + redis_url.rsplit("@", 1)[1]
    assert cache["reachable"] is True


@pytest.mark.prom
@pytest.mark.redis
def test_redis_health(prom: Any, redis_server: Any) -> None:
    async def body(c: httpx.AsyncClient) -> dict[str, Any]:
        return (await c.get("/ui/data.json")).json()["data"]["cache"]

    up = _serve({"backends": [_backend(prom)], "cache": {"redis_url": redis_server.url}}, body)
    assert up["reachable"] is True and up["breaker_open"] is False and up["ping_ms"] >= 0
    down = _serve({"backends": [_backend(prom)], "cache": {"redis_url": f"redis://127.0.0.1:{free_port()}/0"}}, body)
    assert down["reachable"] is False and down["ping_error"] == "ConnectionError"


@pytest.mark.prom
def test_a_running_query_is_listed_in_flight_then_recent(prom: Any) -> None:
    """A backend that stalls 3 s (tests/faulty.py): while the query waits, data.json lists it in
    flight with its text and running time; then among the recent, with its backend time."""
    from tests import faulty

    backend = faulty.start(prom.url)
    query = "max(DCGM_FI_DEV_GPU_TEMP)"

    async def body(c: httpx.AsyncClient) -> tuple[list[dict[str, Any]], httpx.Response, dict[str, Any]]:
        await c.get("/ui/data.json")  # the backend's readiness, probed (and kept 2 s) without a stall
        backend.set("stall", first=None)
        running = asyncio.create_task(c.get("/api/v1/query", params={"query": query, "time": str(prom.end_s)}))
        seen: list[dict[str, Any]] = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            seen = [q for q in (await c.get("/ui/data.json")).json()["data"]["in_flight"] if q.get("query") == query]
            if seen and seen[0]["running_ms"] > 500:
                break
        answer = await running
        backend.set(None)
        return seen, answer, (await c.get("/ui/data.json")).json()["data"]

    try:
        seen, answer, data = _serve({"backends": [{"name": "slow", "url": backend.url}]}, body)
    finally:
        backend.stop()
    assert answer.status_code == 200
    assert len(seen) == 1, "the query was never listed in flight"
    (q,) = seen
    assert q["query_id"] == answer.headers["x-promaccel-query-id"] and q["range"] is False
    assert q["running_ms"] > 500 and "duration_ms" not in q and q["status"] is None
    assert all(r["query_id"] != q["query_id"] for r in data["in_flight"])
    done = next(r for r in data["recent"] if r["query_id"] == q["query_id"])
    assert done["status"] == 200 and done["duration_ms"] >= 3000 and done["backend_max_ms"] >= 3000
    assert (done["piece_hits"], done["piece_misses"]) == (0, 1) and done["cache"] == "MISS"


@pytest.mark.prom
def test_backend_down_shows_not_ready_with_its_error(prom: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    async def body(c: httpx.AsyncClient) -> dict[str, Any]:
        await c.get("/api/v1/query", params={"query": "up", "time": "1"})
        return (await c.get("/ui/data.json")).json()["data"]

    data = _serve({"backends": [{"name": "gone", "url": dead, "retries": 0}]}, body)
    (b,) = data["backends"]
    assert b["ready"] is False and b["errors"] >= 1 and "Error" in b["last_error"]
    assert data["recent"][0]["status"] == 503 and "unreachable" in data["recent"][0]["error"]


def test_ui_can_be_turned_off() -> None:
    async def body(c: httpx.AsyncClient) -> list[int]:
        return [(await c.get(p)).status_code for p in ("/ui", "/ui/data.json")]

    assert _serve({"backends": [{"url": "http://127.0.0.1:1"}], "ui": {"enabled": False}}, body) == [404, 404]


def test_recent_queries_setting_bounds_the_list() -> None:
    async def body(c: httpx.AsyncClient) -> int:
        return ACTIVITY.recent.maxlen or 0

    assert _serve({"backends": [{"url": "http://127.0.0.1:1"}], "ui": {"recent_queries": 7}}, body) == 7
    ACTIVITY.resize(100)


# --- auth on: /ui and its data need credentials; a tenant sees its own records only (issue 26) ---

UI_TOKENS = {"team-a": "ui-team-a-token-5e4d3c2b1a09", "team-b": "ui-team-b-token-9a8b7c6d5e4f"}
UI_BASIC = ("grafana-c", "ui-team-c-password-0123456789")
UI_ADMIN = "ui-admin-token-0a1b2c3d4e5f6a7b"
B_SECRET = "team-b-secret-label-4711"  # a label value only team-b's queries and errors carry


@pytest.fixture(scope="module")
def ui_auth(prom: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real promaccel with Redis, auth on, three tenants (two bearer, one basic) and the
    admin token; team-a sees only the backend "gpu", team-b and team-c both."""
    from proxy.config.auth import sha256_hex
    from tests.servers import Promaccel

    work = tmp_path_factory.mktemp("ui-auth")
    cfg = {"backends": [{"name": "gpu", "url": prom.url}, {"name": "nodes", "url": prom.url}],
           "cache": {"redis_url": redis_server.url},
           "auth": {"tenants": [
               {"name": "team-a", "tokens_sha256": [sha256_hex(UI_TOKENS["team-a"])], "backends": ["gpu"]},
               {"name": "team-b", "tokens_sha256": [sha256_hex(UI_TOKENS["team-b"])]},
               {"name": "team-c", "basic": [{"user": UI_BASIC[0], "password_sha256": sha256_hex(UI_BASIC[1])}]}]}}
    path = work / "c.yaml"
    path.write_text(orjson.dumps(cfg).decode())
    proxy = Promaccel.start(None, ("--split-interval", "1h"), work, config=path, env={"PROMACCEL_ADMIN_TOKEN": UI_ADMIN})
    try:
        yield proxy
    finally:
        proxy.stop()


def _as(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {UI_ADMIN if tenant == 'admin' else UI_TOKENS[tenant]}"}


@pytest.mark.prom
@pytest.mark.redis
def test_ui_needs_credentials_with_auth_on(ui_auth: Any) -> None:
    """The finding: GET /ui/data.json without credentials gave every tenant's queries, errors
    and Redis's address. Now 401 (Prometheus-style JSON) like every API route, and a Basic
    challenge of its own so that a browser prompts."""
    wrong = [{}, {"Authorization": "Bearer not-a-token-0123456789"}, {"Authorization": "Basic !!!"},
             {"Authorization": "Basic " + base64.b64encode(b"anyone:wrong-password-0123456").decode()}]
    for path in ("/ui", "/ui/data.json"):
        for headers in wrong:
            r = httpx.get(ui_auth.url + path, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers, r.text)
            body = r.json()
            assert body["status"] == "error" and body["errorType"] == "unauthorized" and "team-" not in r.text
            assert r.headers.get_list("www-authenticate")[0].startswith('Basic realm="promaccel"')
            assert r.headers["cache-control"] == "no-store"


@pytest.mark.prom
@pytest.mark.redis
def test_a_tenant_sees_only_its_own_queries_and_no_internals(ui_auth: Any, prom: Any, redis_server: Any) -> None:
    t = str(prom.end_s)
    url = ui_auth.url
    a_ids = [httpx.get(url + "/api/v1/query", params={"query": 'count(up{job="team-a-own-query"})', "time": t},
                       headers={**_as("team-a"), "X-Dashboard-Uid": "dash-a"}, timeout=60)]
    b_ids = [httpx.get(url + "/api/v1/query", params={"query": f'count(up{{job="{B_SECRET}"}})', "time": t},
                       headers={**_as("team-b"), "X-Dashboard-Uid": "dash-b-private"}, timeout=60),
             # a failing one: its error text is team-b's too
             httpx.get(url + "/api/v1/query", params={"query": f'sum(rate(up{{job="{B_SECRET}"}}[5m]', "time": t},
                       headers=_as("team-b"), timeout=60)]
    c_ids = [httpx.get(url + "/api/v1/query", params={"query": "count(up)", "time": t}, auth=UI_BASIC, timeout=60)]
    anon = httpx.get(url + "/api/v1/query", params={"query": f'up{{job="{B_SECRET}-anon"}}'}, timeout=60)
    assert [r.status_code for r in a_ids + b_ids + c_ids + [anon]] == [200, 200, 400, 200, 401]

    def data(**kw: Any) -> dict[str, Any]:
        r = httpx.get(url + "/ui/data.json", timeout=30, **kw)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()["data"]
        return out

    def ids(d: dict[str, Any]) -> set[str]:
        return {q["query_id"] for q in d["recent"] + d["in_flight"]}

    a = data(headers=_as("team-a"))
    shown = orjson.dumps(a).decode()
    assert ids(a) == {r.headers["x-promaccel-query-id"] for r in a_ids}
    assert a["viewer"] == {"tenant": "team-a"} and a["recent"][0]["dashboard_uid"] == "dash-a"
    for other in (B_SECRET, "dash-b-private", "count(up)", redis_server.url.split("//")[1], prom.url.split("//")[1]):
        assert other not in shown, other
    assert a["cache"] == {"kind": "redis", "reachable": True, "breaker_open": False}  # no address, no errors
    assert [b["name"] for b in a["backends"]] == ["gpu"] and set(a["backends"][0]) <= {
        "name", "kind", "ready", "primary", "breaker"}
    assert "pid" not in a and a["running"] == 0
    assert sum(m["queries"] for m in a["minutes"]) == len(a_ids)  # its own tallies only

    b = data(headers=_as("team-b"))
    assert ids(b) == {r.headers["x-promaccel-query-id"] for r in b_ids}
    assert any(q["error"] and q["status"] == 400 for q in b["recent"])  # its own error texts
    assert [x["name"] for x in b["backends"]] == ["gpu", "nodes"] and sum(m["queries"] for m in b["minutes"]) == 2
    # team-c by basic auth; a tenant's token as the password of basic auth (a browser's prompt)
    c = data(auth=UI_BASIC)
    assert ids(c) == {r.headers["x-promaccel-query-id"] for r in c_ids}
    assert ids(data(auth=("anything", UI_TOKENS["team-a"]))) == ids(a)

    # The admin token sees everything, each query with its tenant; the refused one without.
    for kw in ({"headers": _as("admin")}, {"auth": ("admin", UI_ADMIN)}):
        full = data(**kw)
        by_id = {q["query_id"]: q for q in full["recent"]}
        for tenant, answers in (("team-a", a_ids), ("team-b", b_ids), ("team-c", c_ids)):
            for r in answers:
                assert by_id[r.headers["x-promaccel-query-id"]]["tenant"] == tenant
        assert "tenant" not in by_id[anon.headers["x-promaccel-query-id"]]
        assert full["viewer"] == {"admin": True} and full["cache"]["address"] and "pid" in full
        assert B_SECRET in orjson.dumps(full).decode()
    # The page itself: the same credentials.
    assert httpx.get(url + "/ui", headers=_as("team-a"), timeout=30).status_code == 200
    assert httpx.get(url + "/ui", auth=UI_BASIC, timeout=30).status_code == 200


def test_viewer_of_unit() -> None:
    from proxy.api.auth import ADMIN, Authenticator, AuthFailure
    from proxy.config.auth import sha256_hex

    cfg = build_config({"backends": [{"url": "http://127.0.0.1:1"}], "auth": {"tenants": [
        {"name": "team-a", "tokens_sha256": [sha256_hex(UI_TOKENS["team-a"])]},
        {"name": "team-c", "basic": [{"user": UI_BASIC[0], "password_sha256": sha256_hex(UI_BASIC[1])}]}]}})

    def basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    auth = Authenticator(cfg.auth, UI_ADMIN)
    assert auth.viewer_of(f"Bearer {UI_ADMIN}") == ADMIN and auth.viewer_of(basic("x", UI_ADMIN)) == ADMIN
    assert auth.viewer_of(f"Bearer {UI_TOKENS['team-a']}") == "team-a"
    assert auth.viewer_of(basic("", UI_TOKENS["team-a"])) == "team-a"
    assert auth.viewer_of(basic(*UI_BASIC)) == "team-c"
    for bad in (None, "", f"Bearer {UI_ADMIN}x", basic(UI_BASIC[0], UI_ADMIN + "x"), "Token x", "Basic !!"):
        with pytest.raises(AuthFailure) as err:
            auth.viewer_of(bad)
        assert UI_ADMIN not in err.value.message
    # The admin token is the operator page's only: the API's tenant_of refuses it.
    with pytest.raises(AuthFailure):
        auth.tenant_of(f"Bearer {UI_ADMIN}")
    with pytest.raises(AuthFailure):
        Authenticator(cfg.auth).viewer_of(f"Bearer {UI_ADMIN}")  # no admin token configured


def test_tenant_snapshot_unit() -> None:
    act, _ = _activity(recent=10)
    recs = []
    for i, tenant in enumerate(("a", "b", None, "a")):
        rec = act.begin(f"id{i}", "GET", "/api/v1/query")
        rec.tenant = tenant
        recs.append(rec)
    act.backend_call("local", "/api/v1/query", 0.1, 200, record=recs[1])
    act.pieces_looked_up(1, 2, recs[1])
    act.finish(recs[0], 200, 0.1, {"query": "a-query"})
    act.finish(recs[1], 400, 0.1, {"query": "b-query"}, error="bad_data: b-secret")
    act.finish(recs[2], 401, 0.1, {})
    a = act.snapshot("a")
    assert [q["query_id"] for q in a["recent"]] == ["id0"] and [q["query_id"] for q in a["in_flight"]] == ["id3"]
    assert a["running"] == 1 and "backends" not in a and "pid" not in a
    assert "b-secret" not in orjson.dumps(a).decode()
    assert sum(m["queries"] for m in a["minutes"]) == 1 and sum(m["backend_calls"] for m in a["minutes"]) == 0
    b = act.snapshot("b")
    assert sum(m["backend_calls"] for m in b["minutes"]) == 1 and sum(m["piece_misses"] for m in b["minutes"]) == 2
    assert b["recent"][0]["error"] == "bad_data: b-secret" and b["recent"][0]["tenant"] == "b"
    assert act.snapshot("nobody")["recent"] == [] and len(act.snapshot("nobody")["minutes"]) == MINUTES
    full = act.snapshot()
    assert {q["query_id"] for q in full["recent"]} == {"id0", "id1", "id2"} and full["running"] == 1
    assert sum(m["queries"] for m in full["minutes"]) == 3
