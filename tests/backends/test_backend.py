"""Backend calls over real loopback HTTP, on both transports: what reaches the backend
(path prefix, query string, form body), and how failures are reported."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import pytest
from aiohttp import web

from proxy.backends import Backend
from proxy.config import BackendConfig
from proxy.errors import PromError

TRANSPORTS = ["aiohttp", "httpx"]
AWKWARD = 'sum by (Hostname) (rate(DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-node-0+1|x y",job!="a+b&c=d"}[5m])) # é'


def _free_port() -> int:
    from tests.servers import free_port  # this xdist worker's own ports

    return free_port()


async def _echo_server(seen: list[dict[str, Any]], delay_s: float = 0.0) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path, "query": list(request.query.items()),
                     "body": await request.read(), "headers": dict(request.headers)})
        if delay_s:
            await asyncio.sleep(delay_s)
        status = 503 if request.path.endswith("/flaky") else 200
        return web.Response(body=b'{"status":"success","data":[]}', status=status, content_type="application/json",
                            headers={"Retry-After": "1"} if status == 503 else None)

    return await _serve(handler)


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    """`handler` for every path, on a loopback port of this worker's."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_form_body_query_string_and_path_prefix_arrive_intact(transport: str) -> None:
    async def run() -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        runner, url = await _echo_server(seen)
        b = Backend(BackendConfig(name="p", url=url + "/prefix/", transport=transport))
        try:
            reply = await b.request("POST", "/api/v1/query", form=[("query", AWKWARD), ("time", "1793480000.5")])
            assert reply.status == 200 and reply.body == b'{"status":"success","data":[]}'
            assert reply.content_type.startswith("application/json")
            reply = await b.request("GET", "/api/v1/series", params=[("match[]", AWKWARD), ("match[]", "up")])
            assert reply.status == 200
        finally:
            await b.aclose()
            await runner.cleanup()
        return seen

    post, get = asyncio.run(run())
    assert post["method"] == "POST" and post["path"] == "/prefix/api/v1/query"
    assert post["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert urllib.parse.parse_qsl(post["body"].decode()) == [("query", AWKWARD), ("time", "1793480000.5")]
    assert post["headers"].get("Accept-Encoding") == "identity"
    assert get["path"] == "/prefix/api/v1/series"
    assert get["query"] == [("match[]", AWKWARD), ("match[]", "up")]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refused_connection_is_unavailable(transport: str) -> None:
    async def run() -> None:
        b = Backend(BackendConfig(name="gone", url=f"http://127.0.0.1:{_free_port()}", transport=transport, retries=1))
        try:
            await b.request("POST", "/api/v1/query", form=[("query", "up")], timeout_s=5)
        finally:
            await b.aclose()

    with pytest.raises(PromError) as err:
        asyncio.run(run())
    assert err.value.kind == "unavailable"
    assert "backend 'gone' is unreachable" in str(err.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_slow_backend_is_a_timeout(transport: str) -> None:
    async def run() -> None:
        seen: list[dict[str, Any]] = []
        runner, url = await _echo_server(seen, delay_s=2.0)
        b = Backend(BackendConfig(name="slow", url=url, transport=transport, retries=0))
        try:
            await b.request("POST", "/api/v1/query", form=[("query", "up")], timeout_s=0.3, endpoint="query")
        finally:
            await b.aclose()
            await runner.cleanup()

    with pytest.raises(PromError) as err:
        asyncio.run(run())
    assert err.value.kind == "timeout"
    assert "did not answer in time (query)" in str(err.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_503_is_retried_then_returned_with_retry_after(transport: str) -> None:
    async def run() -> tuple[int, dict[str, str], int]:
        seen: list[dict[str, Any]] = []
        runner, url = await _echo_server(seen)
        b = Backend(BackendConfig(name="flaky", url=url, transport=transport, retries=2))
        try:
            reply = await b.request("GET", "/flaky")
        finally:
            await b.aclose()
            await runner.cleanup()
        return reply.status, reply.headers, len(seen)

    status, headers, calls = asyncio.run(run())
    assert status == 503 and headers == {"retry-after": "1"} and calls == 3


@pytest.mark.parametrize("transport", TRANSPORTS + ["httpx-aiohttp"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_refused_not_followed(transport: str, status: int) -> None:
    """A backend's redirect is an error naming the backend (never its URL), and its target is
    never asked: a 301 for a path with `..` once led a relay to /debug/pprof/cmdline."""
    async def run() -> tuple[list[str], PromError | None]:
        seen: list[str] = []

        async def handler(request: web.Request) -> web.Response:
            seen.append(request.path)
            if request.path == "/secret":
                return web.Response(body=b"SECRET")
            return web.Response(status=status, headers={"Location": "/secret"})

        runner, url = await _serve(handler)
        b = Backend(BackendConfig(name="moved", url=url,
                                  transport="aiohttp" if transport == "httpx-aiohttp" else transport))
        if transport == "httpx-aiohttp":
            b._direct = None  # httpx over httpx-aiohttp's transport, as AMP backends are called
        failure = None
        try:
            await b.request("GET", "/api/v1/labels", endpoint="/api/v1/labels")
        except PromError as exc:
            failure = exc
        finally:
            await b.aclose()
            await runner.cleanup()
        return seen, failure

    seen, failure = asyncio.run(run())
    assert seen == ["/api/v1/labels"]  # asked once: no retry, no redirect followed
    assert failure is not None and failure.status == 502 and failure.kind == "unavailable"
    assert failure.message == (f"backend 'moved' answered /api/v1/labels with a redirect (HTTP {status}); "
                               "promaccel does not follow backend redirects")


@pytest.mark.parametrize("path", [
    "/api/v1/status/../../debug/pprof/cmdline", "/api/v1/status/..%2F..%2Fdebug", "/api/v1/label/a%2fb/values",
    "/api/v1/label/%2e%2e/values", "/api/v1/label/a%252Fb/values", "/api/v1//labels", "/api/v1/labels/",
    "/api/v1/query?x=1", "api/v1/query", "/api/v1/status/.", "/api/v1/label/a%5Cb/values", "/api/v1/a\\b",
])
def test_paths_that_could_leave_their_endpoint_are_refused(path: str) -> None:
    async def run() -> None:
        b = Backend(BackendConfig(name="p", url=f"http://127.0.0.1:{_free_port()}"))
        try:
            await b.request("GET", path)
        finally:
            await b.aclose()

    with pytest.raises(PromError) as err:
        asyncio.run(run())
    assert err.value.kind == "internal" and "refused to send the backend path" in err.value.message


def test_a_large_body_is_read_into_one_buffer_and_decodes_as_bytes() -> None:
    """A body of KEEP_BYTEARRAY_BYTES or more is handed on as the bytearray it was read into
    (aiohttp's `read` held every chunk and their join: twice the body, issue 15); the decoder
    and the checks take it as they take bytes, and a relay sends bytes."""
    import asyncio as aio

    import orjson
    from aiohttp import web

    from proxy.api.responses import relay
    from proxy.backends.transports import KEEP_BYTEARRAY_BYTES, DirectAiohttp
    from proxy.codec.json_decode import decode_prometheus_json
    from proxy.config import BackendConfig

    def answer(q: str) -> bytes:
        result = [{"metric": {"__name__": "m", "i": f"{i:03d}", "q": q},
                   "values": [[1_700_000_000 + 15 * k, str(k * 0.25 + i)] for k in range(400)]} for i in range(300)]
        return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})

    # The compiled scanner's answer, and one with escapes (its exact slow path).
    bodies = {"/plain": answer("x"), "/escaped": answer('a"b\\c')}
    big = bodies["/escaped"]
    small = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    assert len(big) >= KEEP_BYTEARRAY_BYTES > len(small)

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        body = bodies.get(request.path, small)
        for i in range(0, len(body), 65_536):  # chunked, as Prometheus sends large answers
            await resp.write(body[i:i + 65_536])
        await resp.write_eof()
        return resp

    async def run() -> None:
        app = web.Application()
        for path in (*bodies, "/small"):
            app.router.add_get(path, stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = DirectAiohttp(BackendConfig(url=f"http://127.0.0.1:{port}"))
        try:
            for path, body in bodies.items():
                got = await transport.request("GET", path, None, None, None, 10)
                assert type(got.body) is bytearray and got.body == body
                decoded = decode_prometheus_json(got.body)
                assert decoded.to_pylist() == decode_prometheus_json(body).to_pylist()
                assert all(type(k) is bytes for k in decoded.canonical_keys())
                relayed = relay(got)
                assert type(relayed.body) is bytes and relayed.body == body
            tiny = await transport.request("GET", "/small", None, None, None, 10)
            assert type(tiny.body) is bytes and tiny.body == small
        finally:
            await transport.aclose()
            await runner.cleanup()

    aio.run(run())
