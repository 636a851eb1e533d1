"""proxy/api/relays.py: endpoints relayed to the backend. Each relayed route reaches exactly
its own backend path with the client's parameters (GET as query, POST as form) and answers the
backend's body as application/json with nosniff; /api/v1/label/<name>/values takes only names
Prometheus accepts (its 400 otherwise, before any backend call); /api/v1/status/<what> relays
only Prometheus's own pages; buildinfo is the backend's when it has one, promaccel's own
(Prometheus 2.42 compatible) otherwise; relays wait for or are refused by the queries'
admission like a query.

In process (the app over httpx's ASGI transport) in front of a recording fake backend
(tests/recording.py), and for buildinfo in front of the real Prometheus."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.api.relays import PROMETHEUS_COMPAT_VERSION, RELAYED, STATUS_PAGES
from tests.api.in_process import serve
from tests.recording import Recorder, empty_answer, recording_backend
from tests.servers import free_port


@pytest.fixture(scope="module")
def backend() -> Iterator[Recorder]:
    with recording_backend(None) as rec:
        yield rec


def _serve(config: dict[str, Any], body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    return serve(config, body)


def _one(rec: Recorder, method: str, path: str, **kw: Any) -> httpx.Response:
    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.request(method, path, **kw)
    rec.clear()
    response: httpx.Response = _serve({"backends": [{"name": "local", "url": rec.url, "retries": 0}]}, body)
    return response


def _label_calls(rec: Recorder) -> list[str]:
    """The label names the backend was asked values of, but the planner's own discovery of
    its shard labels' values (Hostname, instance) at a query's planning."""
    return [s.path.split("/")[4] for s in rec.snapshot() if s.path.startswith("/api/v1/label/")
            and s.path.split("/")[4] not in ("Hostname", "instance")]


@pytest.mark.parametrize(("path", "methods"), [(p, m) for p, m, _ in RELAYED])
def test_each_relay_reaches_its_own_path_with_the_clients_parameters(backend: Recorder, path: str,
                                                                     methods: tuple[str, ...]) -> None:
    params = [("match[]", 'up{job="a"}'), ("match[]", "node_load1"), ("limit", "5")]
    for method in methods:
        kw: dict[str, Any] = {"params": params} if method == "GET" else {"data": {"match[]": [v for _, v in params[:2]],
                                                                                   "limit": "5"}}
        r = _one(backend, method, path, **kw)
        assert r.status_code == 200 and r.content == empty_answer(path)  # relayed as the backend sent it
        assert r.headers["content-type"] == "application/json" and r.headers["x-content-type-options"] == "nosniff"
        seen = [s for s in backend.snapshot() if s.path == path]
        assert len(seen) == 1 and seen[0].method == method
        assert seen[0].form == params


def test_a_get_only_relay_refuses_post_without_calling_the_backend(backend: Recorder) -> None:
    r = _one(backend, "POST", "/api/v1/rules", data={"type": "alert"})
    assert r.status_code in (404, 405) and r.json()["status"] == "error"
    assert "/api/v1/rules" not in [s.path for s in backend.snapshot()]


@pytest.mark.parametrize("name", ["job", "__name__", "Hostname", "_x9"])
def test_label_values_of_a_valid_name(backend: Recorder, name: str) -> None:
    r = _one(backend, "GET", f"/api/v1/label/{name}/values", params={"match[]": "up"})
    assert r.status_code == 200
    seen = [s for s in backend.snapshot() if s.path == f"/api/v1/label/{name}/values" and s.form == [("match[]", "up")]]
    assert len(seen) == 1


@pytest.mark.parametrize(("raw", "quoted"), [
    ("1abc", '"1abc"'),
    ("a-b", '"a-b"'),
    ("%C3%A9t%C3%A9", '"\u00e9t\u00e9"'),  # Go's %q keeps printable Unicode
    ("a%0Ab", '"a\\nb"'),
])
def test_label_values_of_an_invalid_name_is_prometheus_400(backend: Recorder, raw: str, quoted: str) -> None:
    r = _one(backend, "GET", f"/api/v1/label/{raw}/values")
    assert r.status_code == 400
    # web/api/v1/api.go labelValues: errors.Errorf("invalid label name: %q", name)
    assert r.json() == {"status": "error", "errorType": "bad_data", "error": f"invalid label name: {quoted}"}
    assert _label_calls(backend) == []


def test_an_encoded_slash_in_a_label_name_is_never_a_path(backend: Recorder) -> None:
    """Percent-decoded once, as Go's router does: `a/../b` is no route (tests/api/test_relay_paths.py
    tries every encoding against the real Prometheus)."""
    r = _one(backend, "GET", "/api/v1/label/a%2F..%2Fb/values")
    assert r.status_code in (400, 404) and r.json()["status"] == "error"
    assert _label_calls(backend) == []


@pytest.mark.parametrize("what", sorted(STATUS_PAGES))
def test_status_pages_of_prometheus_are_relayed(backend: Recorder, what: str) -> None:
    r = _one(backend, "GET", f"/api/v1/status/{what}")
    assert r.status_code == 200 and f"/api/v1/status/{what}" in [s.path for s in backend.snapshot()]


@pytest.mark.parametrize("what", ["pprof", "..", "config%2F..%2F..%2Fdebug", "CONFIG"])
def test_other_status_pages_are_404_and_never_reach_the_backend(backend: Recorder, what: str) -> None:
    r = _one(backend, "GET", f"/api/v1/status/{what}")
    assert r.status_code == 404 and r.json()["errorType"] == "not_found"
    assert not [s for s in backend.snapshot() if s.path.startswith("/api/v1/status/") and
                s.path.removeprefix("/api/v1/status/") not in ("buildinfo", "config")]


def test_buildinfo_is_promaccels_own_when_the_backend_has_none(backend: Recorder) -> None:
    r = _one(backend, "GET", "/api/v1/status/buildinfo")  # the fake answers without a version
    data = r.json()["data"]
    assert r.status_code == 200 and data["version"] == PROMETHEUS_COMPAT_VERSION == "2.42.0"
    assert data["promaccel"] and data["revision"] == f"promaccel-{data['promaccel']}"


def test_buildinfo_with_no_backend_at_all_is_still_an_answer() -> None:
    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.get("/api/v1/status/buildinfo")

    dead = {"backends": [{"name": "gone", "url": f"http://127.0.0.1:{free_port()}", "retries": 0}]}
    r = _serve(dead, body)
    assert r.status_code == 200 and r.json()["data"]["version"] == PROMETHEUS_COMPAT_VERSION


@pytest.mark.prom
def test_buildinfo_is_the_backends_own_plus_promaccels_version(prom: Any) -> None:
    direct = httpx.get(prom.url + "/api/v1/status/buildinfo", timeout=10).json()["data"]

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.get("/api/v1/status/buildinfo")

    r = _serve({"backends": [{"name": "local", "url": prom.url}]}, body)
    data = r.json()["data"]
    assert {k: v for k, v in data.items() if k != "promaccel"} == direct
    assert data["promaccel"]


def test_relays_are_under_the_queries_admission() -> None:
    """One query or relay at a time and no queue: a second relay while one runs gets the same
    429 (with Retry-After) a query gets; once the first is done, the next one passes."""
    with recording_backend(None, delay_s=0.5) as slow:
        config = {"backends": [{"name": "local", "url": slow.url, "retries": 0}],
                  "limits": {"max_queries_in_flight": 1, "max_queued": 0}}

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            first = asyncio.create_task(c.get("/api/v1/labels"))
            await asyncio.sleep(0.2)
            second = await c.get("/api/v1/series", params={"match[]": "up"})
            after = await c.get("/api/v1/labels") if (await first).status_code == 200 else None
            return [await first, second, after] if after is not None else [await first, second]

        answers = _serve(config, body)
    assert [a.status_code for a in answers] == [200, 429, 200]
    refused = answers[1]
    assert refused.json()["status"] == "error" and "retry-after" in refused.headers
