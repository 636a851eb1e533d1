"""End to end: a backend answering garbage to a 200 makes promaccel answer a 502 naming that
backend (errorType "unavailable", as `Asker.sound` and `sane_error` do for a garbled body),
never a 500; beside a sound backend holding the same data, the garbled one is left out with
the one missing-backend warning.

The backends are fake (aiohttp on 127.0.0.1 in the test's own event loop), each answering
every query_range with one fixed body; promaccel runs in process (ASGI). The garbage:
- answers the decoder refuses (proxy/codec/json_decode.py): a timestamp beyond int64
  milliseconds, a scalar result that is not JSON;
- a sound JSON answer of the wrong type: a vector or a scalar for a query_range
  (proxy/pipeline/hybrid/fetch.py `RouteAnswer`, once cut by fetch.py, once merged across
  backends holding the same times and cropped by result/pieces.py `slice_time`);
- series, labels, label values or metadata whose `data` has another shape
  (proxy/api/metadata.py, merged over the backends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from proxy.api.app import create_app
from proxy.config import build_config

T = 1_700_000_000  # seconds
STEP = 60
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def _matrix(*ts: int | str) -> bytes:
    values = ",".join(f'[{t},"1"]' for t in ts)
    return (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"job":"a"},"values":[' +
            values.encode() + b"]}]}}")


SOUND = _matrix(*range(T - 3600, T + 7200, STEP))
GARBLED = {
    "timestamp_1e300": _matrix(T, "1e300"),
    "timestamp_int64_max_seconds": _matrix(T, "9223372036854775807"),
    "scalar_not_json": b'{"status":"success","data":{"resultType":"scalar","result":[17000 00000,"0.5"]}}',
    "string_not_json": b'{"status":"success","data":{"resultType":"string","result":[1700000000"hi"]}}',
    "vector": b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"a"},"value":[' +
              str(T).encode() + b',"1"]}]}}',
    "scalar": b'{"status":"success","data":{"resultType":"scalar","result":[' + str(T).encode() + b',"1"]}}',
}
# Planned queries (cut in time, sharded or evaluated by promaccel), each over an hour.
QUERIES = ["sum(rate(up[5m]))", "up", "max by (job) (up) / on (job) count by (job) (up)"]


class FakeBackend:
    """A Prometheus that answers every query_range with `body`, anything else empty."""

    def __init__(self, body: bytes, meta: bytes | dict[str, bytes] = b'{"status":"success","data":[]}') -> None:
        self.body = body
        self.meta = meta  # the answer to anything else but /api/v1/query (by path, or to all)
        self.ranges = 0
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        if request.path == "/api/v1/query_range":
            self.ranges += 1
            return web.Response(body=self.body, content_type="application/json")
        if request.path in ("/api/v1/query",):
            return web.Response(body=EMPTY_VECTOR, content_type="application/json")
        meta = self.meta.get(request.path, b"{}") if isinstance(self.meta, dict) else self.meta
        return web.Response(body=meta, content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _serve(bodies: dict[str, bytes], ask: Callable[[httpx.AsyncClient], Awaitable[Any]],
           metas: dict[str, bytes | dict[str, bytes]] | None = None) -> tuple[Any, list[int]]:
    """`ask` against an in-process promaccel over one fake backend per (name, body) (its
    metadata answer from `metas`); also how many query_range calls each backend saw."""
    async def run() -> tuple[Any, list[int]]:
        fakes = [FakeBackend(b, *(metas[n],) if metas else ()) for n, b in bodies.items()]
        for f in fakes:
            await f.start()
        try:
            config = {"backends": [{"name": n, "url": f.url, "retries": 0} for n, f in zip(bodies, fakes)]}
            app = create_app(build_config(config))
            async with app.router.lifespan_context(app):
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p",
                                             timeout=60) as c:
                    return await ask(c), [f.ranges for f in fakes]
        finally:
            for f in fakes:
                await f.stop()
    return asyncio.run(run())


def _query_range(bodies: dict[str, bytes], query: str) -> tuple[httpx.Response, list[int]]:
    async def ask(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/api/v1/query_range", data={"query": query, "start": str(T), "end": str(T + 3600),
                                                          "step": str(STEP)})
    r, ranges = _serve(bodies, ask)
    assert isinstance(r, httpx.Response)
    return r, ranges


def _is_502_naming(r: httpx.Response, backend: str) -> None:
    assert r.status_code == 502, (r.status_code, r.text)
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "unavailable"
    assert f"backend {backend!r}" in body["error"], body["error"]


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("garbage", list(GARBLED))
def test_one_backend_answering_garbage_is_a_502_naming_it(garbage: str, query: str) -> None:
    r, (ranges,) = _query_range({"local": GARBLED[garbage]}, query)
    _is_502_naming(r, "local")
    assert ranges >= 1  # the backend was asked: the 502 is its answer's, not a refusal


@pytest.mark.parametrize("garbage", list(GARBLED))
def test_every_backend_of_the_same_times_answering_garbage_is_a_502_naming_one(garbage: str) -> None:
    r, ranges = _query_range({"one": GARBLED[garbage], "two": GARBLED[garbage]}, "sum(rate(up[5m]))")
    assert r.status_code == 502, r.text
    assert "backend 'one'" in r.json()["error"] or "backend 'two'" in r.json()["error"]
    assert all(n >= 1 for n in ranges)


@pytest.mark.parametrize("garbage", list(GARBLED))
def test_a_garbled_backend_beside_a_sound_one_is_left_out_with_a_warning(garbage: str) -> None:
    sound, _ = _query_range({"only": SOUND}, "up")
    assert sound.status_code == 200, sound.text
    r, _ = _query_range({"good": SOUND, "bad": GARBLED[garbage]}, "up")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["data"] == sound.json()["data"]
    (warning,) = body["warnings"]
    assert "'bad'" in warning and "did not answer" in warning


def test_a_sound_answer_is_not_refused() -> None:
    r, _ = _query_range({"local": SOUND}, "up")
    assert r.status_code == 200 and orjson.loads(r.content)["data"]["resultType"] == "matrix"


SOUND_META = {
    "/api/v1/series": b'{"status":"success","data":[{"__name__":"up","job":"a"}]}',
    "/api/v1/labels": b'{"status":"success","data":["__name__","job"]}',
    "/api/v1/label/job/values": b'{"status":"success","data":["a"]}',
    "/api/v1/metadata": b'{"status":"success","data":{"up":[{"type":"gauge","help":"","unit":""}]}}',
}
META_CALLS = [("/api/v1/series", {"match[]": "up"}), ("/api/v1/labels", {}), ("/api/v1/label/job/values", {}),
              ("/api/v1/metadata", {})]
WRONG_DATA = [b'{"status":"success","data":{"up":1}}', b'{"status":"success","data":"up"}',
              b'{"status":"success","data":[1,[2]]}', b'{"status":"success","data":[],"warnings":7}']


def _metadata_call(metas: dict[str, bytes | dict[str, bytes]], path: str, params: dict[str, str]) -> httpx.Response:
    async def ask(c: httpx.AsyncClient) -> httpx.Response:
        return await c.get(path, params=params)
    r, _ = _serve({n: SOUND for n in metas}, ask, metas)
    assert isinstance(r, httpx.Response)
    return r


@pytest.mark.parametrize("wrong", WRONG_DATA)
@pytest.mark.parametrize(("path", "params"), META_CALLS)
def test_metadata_of_the_wrong_shape_is_a_502_naming_the_backend(path: str, params: dict[str, str],
                                                                  wrong: bytes) -> None:
    _is_502_naming(_metadata_call({"one": wrong, "two": wrong}, path, params), "one")
    beside = _metadata_call({"bad": wrong, "good": SOUND_META}, path, params)
    assert beside.status_code == 200, beside.text
    assert beside.json()["data"] == orjson.loads(SOUND_META[path])["data"]
    (warning,) = beside.json()["warnings"]
    assert "'bad'" in warning and "did not answer" in warning
