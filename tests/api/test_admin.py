"""proxy/api/admin.py: cache administration behind a bearer token.

Off without a token (403 saying how to turn it on); with one, a request without
`Authorization: Bearer` gets 401 and a wrong token 403. Invalidation takes Prometheus series
selectors (`match[]`) and an optional [start, end], refuses what is not a selector or not a
time with Prometheus-style 400s, and drops exactly what it names: a cached instant query
is served from the cache until its metric (or everything, or a time range holding it) is
invalidated or the generation is bumped, and is fetched again afterwards.

In process (the app over httpx's ASGI transport) in front of a recording fake backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.api.in_process import serve
from tests.recording import Recorder, recording_backend

TOKEN = "adm1n-t0ken-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T = 1_700_000_000  # the instant the cached query asks about (old enough to be cached)
ENDPOINTS = [("POST", "/api/v1/admin/cache/invalidate"), ("POST", "/api/v1/admin/cache/generation"),
             ("GET", "/api/v1/admin/cache/stats")]


@pytest.fixture(scope="module")
def backend() -> Iterator[Recorder]:
    with recording_backend(None) as rec:
        yield rec


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMACCEL_ADMIN_TOKEN", raising=False)


def _serve(backend: Recorder, body: Callable[[httpx.AsyncClient], Awaitable[Any]], token: str | None = TOKEN) -> Any:
    config: dict[str, Any] = {"backends": [{"name": "local", "url": backend.url, "retries": 0}]}
    if token is not None:
        config["cache"] = {"admin_token": token}

    return serve(config, body)


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == kind
    message: str = body["error"]
    return message


# --- who may call ---------------------------------------------------------------------------------


def test_without_a_token_every_admin_endpoint_is_off(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.request(m, p, headers=AUTH, data={"match[]": "up"} if m == "POST" else None)
                for m, p in ENDPOINTS]

    for r in _serve(backend, body, token=None):
        assert "PROMACCEL_ADMIN_TOKEN" in _error(r, 403, "forbidden")


def test_the_token_may_come_from_the_environment(backend: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMACCEL_ADMIN_TOKEN", TOKEN)

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.get("/api/v1/admin/cache/stats", headers=AUTH)

    assert _serve(backend, body, token=None).status_code == 200


@pytest.mark.parametrize(("authorization", "status"), [
    (None, 401),
    ("Basic " + TOKEN, 401),  # not a bearer token
    ("Bearer", 401),
    ("Bearer ", 401),
    ("Bearer " + TOKEN[:-1], 403),
    ("Bearer " + TOKEN + "x", 403),
    ("Bearer " + TOKEN.upper(), 403),
    ("bearer " + TOKEN, 200),  # the scheme is case-insensitive (RFC 7235)
    ("Bearer " + TOKEN, 200),
])
def test_bearer_token_checks(backend: Recorder, authorization: str | None, status: int) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.request(m, p, headers=headers, data={"match[]": "nothing_cached"} if m == "POST" else None)
                for m, p in ENDPOINTS]

    for r in _serve(backend, body):
        assert r.status_code == status, (authorization, r.text)
        if status != 200:
            _error(r, status, "unauthorized" if status == 401 else "forbidden")
            assert TOKEN not in r.text


def test_methods_other_than_their_own_are_not_admin_calls(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/api/v1/admin/cache/invalidate", headers=AUTH),
                await c.get("/api/v1/admin/cache/generation", headers=AUTH),
                await c.post("/api/v1/admin/cache/stats", headers=AUTH)]

    for r in _serve(backend, body):
        assert r.status_code in (404, 405) and r.json()["status"] == "error"


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("form", "says"), [
    ({}, "no match[] parameter provided"),
    ({"start": "1"}, "no match[] parameter provided"),
    ({"match[]": "up{"}, 'invalid parameter "match[]"'),
    ({"match[]": "rate(up[5m])"}, "is not a series selector"),
    ({"match[]": "sum(up)"}, "is not a series selector"),
    ({"match[]": ["up", "1 + 1"]}, "is not a series selector"),
    ({"match[]": "up", "start": "yesterday"}, 'invalid parameter "start"'),
    ({"match[]": "up", "end": "NaNx"}, 'invalid parameter "end"'),
    ({"match[]": "up", "start": "200", "end": "100"}, "end timestamp must not be before start time"),
])
def test_bad_invalidations_are_400s_and_drop_nothing(backend: Recorder, form: dict[str, Any], says: str) -> None:
    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        await c.get("/api/v1/query", params={"query": "up", "time": str(T)})
        bad = await c.post("/api/v1/admin/cache/invalidate", headers=AUTH, data=form)
        return bad, await c.get("/api/v1/query", params={"query": "up", "time": str(T)}), \
            await c.get("/api/v1/admin/cache/stats", headers=AUTH)

    bad, again, stats = _serve(backend, body)
    assert says in _error(bad, 400, "bad_data")
    assert again.headers["x-cache"] == "HIT" and stats.json()["data"]["invalidated"] == 0


# --- what is dropped ------------------------------------------------------------------------------


def _queries_after(backend: Recorder, form: dict[str, Any] | None, bump: bool = False
                   ) -> tuple[list[str], dict[str, Any] | None, int]:
    """X-Cache of `up` and `node_load1` at T cached, then again after invalidating `form` (and/or
    bumping the generation); the invalidation's data; how often the backend was asked for `up`."""
    queries = [{"query": "up", "time": str(T)}, {"query": "node_load1", "time": str(T)}]

    async def body(c: httpx.AsyncClient) -> tuple[list[str], dict[str, Any] | None]:
        for q in queries:
            await c.get("/api/v1/query", params=q)
        cached = [(await c.get("/api/v1/query", params=q)).headers["x-cache"] for q in queries]
        assert cached == ["HIT", "HIT"]
        data = None
        if form is not None:
            r = await c.post("/api/v1/admin/cache/invalidate", headers=AUTH, data=form)
            assert r.status_code == 200, r.text
            data = r.json()["data"]
        if bump:
            assert (await c.post("/api/v1/admin/cache/generation", headers=AUTH)).status_code == 200
        return [(await c.get("/api/v1/query", params=q)).headers["x-cache"] for q in queries], data

    backend.clear()
    after, data = _serve(backend, body)
    return after, data, sum(1 for s in backend.snapshot() if s.path == "/api/v1/query" and s.query == "up")


def test_invalidating_a_metric_drops_it_and_only_it(backend: Recorder) -> None:
    after, data, asked = _queries_after(backend, {"match[]": 'up{job="x"}'})
    assert after == ["MISS", "HIT"] and asked == 2  # fetched once, and again after the invalidation
    assert data is not None and data["metrics"] == ["up"] and data["dropped"] >= 1
    assert data["start_ms"] is None and data["end_ms"] is None


def test_invalidating_several_metrics_names_them_once_sorted(backend: Recorder) -> None:
    after, data, _ = _queries_after(backend, {"match[]": ["up", "node_load1", "up"]})
    assert after == ["MISS", "MISS"] and data is not None and data["metrics"] == ["node_load1", "up"]


@pytest.mark.parametrize("match", ['{__name__=~".+"}', '{job="node"}', "{__name__=~\"up|node_load1\"}"])
def test_a_selector_without_a_plain_name_drops_every_metric(backend: Recorder, match: str) -> None:
    after, data, _ = _queries_after(backend, {"match[]": match})
    assert after == ["MISS", "MISS"] and data is not None and data["metrics"] is None


def test_a_time_range_drops_what_it_meets(backend: Recorder) -> None:
    after, data, _ = _queries_after(backend, {"match[]": "up", "start": str(T - 3600), "end": str(T + 60)})
    assert after == ["MISS", "HIT"]
    assert data is not None and (data["start_ms"], data["end_ms"]) == ((T - 3600) * 1000, (T + 60) * 1000)
    # RFC 3339 times, as Prometheus takes them.
    after, data, _ = _queries_after(backend, {"match[]": "up", "start": "2023-11-14T21:00:00Z"})
    assert after == ["MISS", "HIT"] and data is not None and data["start_ms"] == 1_699_995_600_000


def test_a_time_range_elsewhere_drops_nothing(backend: Recorder) -> None:
    after, data, asked = _queries_after(backend, {"match[]": "up", "start": str(T - 86_400 * 30),
                                                  "end": str(T - 86_400 * 29)})
    assert after == ["HIT", "HIT"] and asked == 1 and data is not None and data["dropped"] == 0


def test_bumping_the_generation_drops_everything_and_counts_up(backend: Recorder) -> None:
    after, _, asked = _queries_after(backend, None, bump=True)
    assert after == ["MISS", "MISS"] and asked == 2

    async def body(c: httpx.AsyncClient) -> list[int]:
        return [(await c.post("/api/v1/admin/cache/generation", headers=AUTH)).json()["data"]["generation"]
                for _ in range(3)]

    first, second, third = _serve(backend, body)
    assert second == first + 1 and third == second + 1


def test_stats_count_what_happened(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> tuple[dict[str, Any], dict[str, Any]]:
        before = (await c.get("/api/v1/admin/cache/stats", headers=AUTH)).json()["data"]
        for _ in range(3):
            await c.get("/api/v1/query", params={"query": "up", "time": str(T)})
        await c.post("/api/v1/admin/cache/invalidate", headers=AUTH, data={"match[]": "up"})
        return before, (await c.get("/api/v1/admin/cache/stats", headers=AUTH)).json()["data"]

    before, after = _serve(backend, body)
    assert after["enabled"] is True and after["kind"] == "memory"
    assert after["stored"] - before["stored"] == 1  # fetched once, then served twice from the cache
    assert after["invalidated"] - before["invalidated"] >= 1 and after["entries"] == 0
