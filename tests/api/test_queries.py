"""proxy/api/queries.py through its HTTP behaviour: /api/v1/query, /api/v1/query_range and
/api/v1/explain.

Parameters are read as Prometheus reads them (a POST body's values before the URL's; `time`
defaults to now) and what reaches the backend is what the client asked; a bad parameter gets
Prometheus 2.42's own error, byte for byte (compared with the real server); a `timeout` of
zero is the backend's verdict on the request as it came; `limits.max_query_range` refuses a
longer range with a 422 before any backend call; answers carry the plan's headers; explain
shows the plan (time pieces tiling the step grid of [start, end]) without asking a backend;
a query is on the operator page with its text and kind while it runs and after.

In process (the app over httpx's ASGI transport) in front of a recording fake backend; the
error texts against the real Prometheus."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.observe.activity import ACTIVITY
from tests.api.in_process import serve
from tests.recording import EMPTY_VECTOR, Recorder, recording_backend

T = 1_700_000_000


@pytest.fixture
def backend() -> Iterator[Recorder]:
    """One per test: a call a test's app left in flight when it closed may still land later."""
    with recording_backend(None) as rec:
        yield rec


def _serve(config: dict[str, Any], body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    return serve(config, body)


def _config(url: str, **extra: Any) -> dict[str, Any]:
    return {"backends": [{"name": "local", "url": url, "retries": 0}], **extra}


def _ask(backend: Recorder, method: str, path: str, config: dict[str, Any] | None = None,
         **kw: Any) -> tuple[httpx.Response, list[Any]]:
    """One request; the backend's query calls it caused (shard label discovery aside)."""
    backend.clear()

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.request(method, path, **kw)

    r = _serve(config or _config(backend.url), body)
    return r, [s for s in backend.snapshot() if s.path in ("/api/v1/query", "/api/v1/query_range")]


# --- parameters -----------------------------------------------------------------------------------


def test_an_instant_query_reaches_the_backend_as_asked(backend: Recorder) -> None:
    r, calls = _ask(backend, "GET", "/api/v1/query", params={"query": "count(up)", "time": str(T)})
    assert r.status_code == 200 and r.content == EMPTY_VECTOR
    (call,) = calls
    assert call.path == "/api/v1/query" and dict(call.form) == {"query": "count(up)", "time": str(T)}


def test_a_post_bodys_values_come_before_the_urls(backend: Recorder) -> None:
    r, calls = _ask(backend, "POST", f"/api/v1/query?query=from_url&time={T - 60}",
                    data={"query": "from_body", "time": str(T)})
    assert r.status_code == 200
    (call,) = calls
    # Forwarded with both, the body's first: what Prometheus's r.FormValue reads is the body's.
    first: dict[str, str] = {}
    for k, v in call.form:
        first.setdefault(k, v)
    assert first == {"query": "from_body", "time": str(T)}


def test_time_defaults_to_now(backend: Recorder) -> None:
    r, calls = _ask(backend, "GET", "/api/v1/query", params={"query": "count(up)"})
    assert r.status_code == 200
    (call,) = calls
    assert call.form == [("query", "count(up)")]  # as asked: the backend's "now" is the time
    # ... and promaccel's plan is for the time the request came.
    before = time.time()
    r, _ = _ask(backend, "GET", "/api/v1/explain", params={"query": "count(up)"})
    after = time.time()
    assert before * 1000 - 1000 <= r.json()["data"]["time_ms"] <= after * 1000 + 1000


@pytest.mark.prom
def test_a_range_query_asks_pieces_on_the_grid_it_was_given(prom: Any) -> None:
    """Split by hour in front of the real Prometheus (recorded on the way): every piece asked
    is on the client's grid, together they cover it, and the answer is Prometheus's."""
    start, end, step = prom.end_s - 7200 - 30, prom.end_s - 30, 60
    form = {"query": "sum(DCGM_FI_DEV_GPU_UTIL)", "start": str(start), "end": str(end), "step": str(step)}
    direct = httpx.post(prom.url + "/api/v1/query_range", data=form, timeout=60)
    with recording_backend(prom.url) as rec:
        r, calls = _ask(rec, "POST", "/api/v1/query_range",
                        config=_config(rec.url, planner={"split_interval": "1h"}), data=form)
    assert r.status_code == 200 and r.json() == direct.json()
    asked = [dict(c.form) for c in calls]
    assert len(asked) > 1 and all(float(a["step"]) == step for a in asked)
    covered = {t for a in asked for t in range(int(float(a["start"])), int(float(a["end"])) + 1, step)}
    assert {start + step * k for k in range((end - start) // step + 1)} <= covered
    assert all((t - start) % step == 0 for t in covered)


def test_answers_carry_the_plans_headers(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/api/v1/query", params={"query": "max(up)", "time": str(T)}) for _ in range(2)]

    backend.clear()
    cold, warm = _serve(_config(backend.url), body)
    assert cold.headers["x-cache"] == "MISS" and warm.headers["x-cache"] == "HIT"
    assert cold.headers["x-promaccel-pieces"] == warm.headers["x-promaccel-pieces"] == "1"
    assert cold.headers["x-promaccel-backend-calls"] == "1" and warm.headers["x-promaccel-backend-calls"] == "0"
    assert cold.headers["x-promaccel-query-id"] != warm.headers["x-promaccel-query-id"]
    assert len([s for s in backend.snapshot() if s.path == "/api/v1/query"]) == 1


# --- limits and timeouts --------------------------------------------------------------------------


def test_a_range_over_max_query_range_is_a_422_without_a_backend_call(backend: Recorder) -> None:
    config = _config(backend.url, limits={"max_query_range": "2h"})
    base = {"query": "sum(up)", "end": str(T + 7200), "step": "60"}
    over, calls = _ask(backend, "GET", "/api/v1/query_range", config=config, params={**base, "start": str(T - 1)})
    assert over.status_code == 422 and calls == []
    body = over.json()
    assert body["errorType"] == "execution" and "limits.max_query_range" in body["error"]
    # Durations as Prometheus writes them (model.Duration): 2h1s, not Go's 2h0m1s.
    assert "of 2h1s exceeds the limit of 2h " in body["error"]
    at, calls = _ask(backend, "GET", "/api/v1/query_range", config=config, params={**base, "start": str(T)})
    assert at.status_code != 422 and calls  # exactly the limit is allowed


def test_a_zero_timeout_is_the_backends_verdict_on_the_request_as_it_came(backend: Recorder) -> None:
    for path, params in (("/api/v1/query", {"query": "up", "time": str(T), "timeout": "0s"}),
                         ("/api/v1/query_range", {"query": "up", "start": str(T), "end": str(T + 60), "step": "15",
                                                  "timeout": "0.0001"})):  # under 1 ms
        r, calls = _ask(backend, "GET", path, params=params)
        assert r.status_code == 200 and r.content == EMPTY_VECTOR  # the fake's verdict, relayed
        (call,) = calls
        assert call.method == "POST" and call.path == path and call.form == list(params.items())


# --- Prometheus's own errors ----------------------------------------------------------------------

BAD = [
    ("/api/v1/query", {}),
    ("/api/v1/query", {"query": ""}),
    ("/api/v1/query", {"query": "up", "time": "yesterday"}),
    ("/api/v1/query", {"query": "up", "timeout": "soon"}),
    ("/api/v1/query", {"query": "up", "timeout": "-1s"}),
    ("/api/v1/query", {"query": "sum(up"}),
    ("/api/v1/query", {"query": "up[5m] + 1"}),
    ("/api/v1/query_range", {"query": "up", "end": "100", "step": "15"}),
    ("/api/v1/query_range", {"query": "up", "start": "100", "step": "15"}),
    ("/api/v1/query_range", {"query": "up", "start": "100", "end": "200"}),
    ("/api/v1/query_range", {"query": "up", "start": "200", "end": "100", "step": "15"}),
    ("/api/v1/query_range", {"query": "up", "start": "100", "end": "200", "step": "0"}),
    ("/api/v1/query_range", {"query": "up", "start": "100", "end": "200", "step": "-15"}),
    ("/api/v1/query_range", {"query": "up", "start": "100", "end": "200", "step": "fast"}),
    ("/api/v1/query_range", {"query": "up", "start": "0", "end": "1000000", "step": "1"}),  # > 11,000 points
    ("/api/v1/query_range", {"query": "up", "start": "NaN", "end": "200", "step": "15"}),
    ("/api/v1/query_range", {"query": "sum(rate(x[5m]) by (a)", "start": "100", "end": "200", "step": "15"}),
]


@pytest.mark.prom
@pytest.mark.parametrize(("path", "params"), BAD)
def test_bad_parameters_get_prometheus_own_error(prom: Any, path: str, params: dict[str, str]) -> None:
    theirs = httpx.get(prom.url + path, params=params, timeout=30)

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get(path, params=params), await c.post(path, data=params)]

    assert 400 <= theirs.status_code < 500
    for ours in _serve(_config(prom.url), body):
        assert ours.status_code == theirs.status_code and ours.json() == theirs.json(), (ours.text, theirs.text)


@pytest.mark.prom
def test_a_zero_timeout_against_prometheus(prom: Any) -> None:
    """Prometheus runs such a query on a deadline already past (503), and a query that does
    not parse still gets its 400: promaccel gives the same answers."""
    cases = [{"query": "sum(DCGM_FI_DEV_GPU_UTIL)", "time": str(prom.end_s), "timeout": "0s"},
             {"query": "sum(DCGM_FI_DEV_GPU_UTIL", "time": str(prom.end_s), "timeout": "0s"}]

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/api/v1/query", params=p) for p in cases]

    ours = _serve(_config(prom.url), body)
    theirs = [httpx.get(prom.url + "/api/v1/query", params=p, timeout=30) for p in cases]
    assert [r.status_code for r in theirs] == [503, 400]
    for o, t in zip(ours, theirs):
        assert o.status_code == t.status_code and o.json()["errorType"] == t.json()["errorType"]


# --- explain --------------------------------------------------------------------------------------


def test_explain_a_range_query_tiles_the_step_grid_without_a_backend_call(backend: Recorder) -> None:
    start, end, step = T, T + 10_000, 60  # 10,000 s is not a multiple of 60: the grid ends before `end`
    r, calls = _ask(backend, "GET", "/api/v1/explain",
                    config=_config(backend.url, planner={"split_interval": "1h"}),
                    params={"query": "sum(up)", "start": str(start), "end": str(end), "step": str(step)})
    assert r.status_code == 200 and calls == []
    plan = r.json()["data"]
    assert plan["type"] == "range" and plan["query"] == "sum(up)" and plan["time_split"] is True
    pieces = plan["time_pieces"]
    last = start + (end - start) // step * step
    assert pieces[0][0] == start * 1000 and pieces[-1][1] == last * 1000
    for (_, hi), (lo, _) in zip(pieces, pieces[1:]):
        assert lo == hi + step * 1000  # adjacent on the grid: no point lost, none twice
    assert all((lo - start * 1000) % (step * 1000) == 0 for lo, _ in pieces)
    assert plan["piece_count"] == len(plan["pieces"]) >= len(pieces) > 1


def test_explain_without_start_or_step_is_an_instant_query(backend: Recorder) -> None:
    r, calls = _ask(backend, "POST", "/api/v1/explain", data={"query": "sum(up)", "time": str(T)})
    assert r.status_code == 200 and calls == []
    plan = r.json()["data"]
    assert plan["type"] == "instant" and plan["time_ms"] == T * 1000 and plan["step_ms"] is None


@pytest.mark.parametrize("params", [
    {"query": "sum(up)", "start": str(T)},  # a range without end and step
    {"query": "sum(up)", "step": "15", "start": str(T), "end": str(T - 60)},
    {"query": "sum(up)", "time": "later"},
    {},
])
def test_explain_with_bad_parameters_is_a_400(backend: Recorder, params: dict[str, str]) -> None:
    r, calls = _ask(backend, "GET", "/api/v1/explain", params=params)
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data" and calls == []


# --- the operator page ----------------------------------------------------------------------------


def test_a_query_is_on_the_operator_page_with_its_text_and_kind(backend: Recorder) -> None:
    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/api/v1/query", params={"query": "max(up) # instant", "time": str(T)}),
                await c.post("/api/v1/query_range", data={"query": "max(up) # range", "start": str(T),
                                                          "end": str(T + 60), "step": "60"}),
                await c.get("/api/v1/query", params={"query": "max(up", "time": str(T)})]

    answers = _serve(_config(backend.url), body)
    recent = {r["query_id"]: r for r in ACTIVITY.snapshot()["recent"]}
    instant, ranged, bad = (recent[a.headers["x-promaccel-query-id"]] for a in answers)
    assert instant["query"] == "max(up) # instant" and instant["range"] is False
    assert ranged["query"] == "max(up) # range" and ranged["range"] is True
    assert bad["query"] == "max(up" and bad["status"] == answers[2].status_code
