"""A call that expects a small answer names its own body limit (`Backend.request(...,
max_body_bytes=)`): a hostile backend's huge answer is cut there as it streams in, never read
whole -- series counts (4 KB), a backend's buildinfo (4 KB) and config (1 MiB). Real HTTP to the
hostile backend of test_hostile_backend.py, both transports, with `backends[].max_body_bytes`
at its 256 MiB default: without the per-call limit each of these answers (64 MiB, a valid
JSON answer) would be read to its end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Literal, TypeVar

import pytest

from proxy.backends import Backend
from proxy.config import BackendConfig, BreakerConfig
from proxy.errors import PromError
from proxy.pipeline.backend_facts import DEFAULT_EVALUATION_INTERVAL_MS, FACT_BODY_MAX, BackendFacts
from proxy.pipeline.series_counts import COUNT_BODY_MAX, SeriesCounts
from shardplanner.promql import GO_1_19
from tests.backends.test_hostile_backend import EMPTY_VECTOR, HUGE, Hostile

Transport = Literal["aiohttp", "httpx"]
R = TypeVar("R")
# What the server may have written before promaccel dropped the connection: the sockets'
# buffers, far below the 64 MiB it tries to send.
SENT_AT_MOST = HUGE // 4


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[Hostile]:
    h = Hostile.start()
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture
def hostile(hostile_server: Hostile) -> Hostile:
    hostile_server.reset()
    return hostile_server


def _with_backend(hostile: Hostile, transport: Transport, use: Callable[[Backend], Awaitable[R]]) -> R:
    async def go() -> R:
        b = Backend(BackendConfig(name="hostile", url=hostile.url, transport=transport, retries=3, retry_ratio=100,
                                  breaker=BreakerConfig(failures=0)))
        assert b.cfg.max_body_bytes == 256 * 1024 * 1024  # the default: far over these answers
        try:
            return await use(b)
        finally:
            await b.aclose()

    return asyncio.run(go())


def _sent(hostile: Hostile, path: str) -> int:
    time.sleep(0.2)  # the server notices the dropped connection
    with hostile.lock:
        return hostile.sent.get(path, 0)


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("mode", ["huge", "huge_length"])
def test_a_body_over_the_calls_limit_stops_the_read(hostile: Hostile, transport: Transport, mode: str) -> None:
    hostile.modes["/api/v1/query"] = mode

    async def call(b: Backend) -> PromError | bytes:
        try:
            reply = await b.request("GET", "/api/v1/query", params=[("query", "up")], endpoint="query",
                                    timeout_s=20, max_body_bytes=4096)
            return bytes(reply.body)
        except PromError as exc:
            return exc

    out = _with_backend(hostile, transport, call)
    assert isinstance(out, PromError), len(out) if isinstance(out, bytes) else out
    assert out.status == 502 and "'hostile'" in out.message and "4096 bytes" in out.message, out.message
    assert hostile.calls["/api/v1/query"] == 1  # the same body would come again: not retried
    assert _sent(hostile, "/api/v1/query") < SENT_AT_MOST


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_an_answer_under_the_calls_limit_passes(hostile: Hostile, transport: Transport) -> None:
    async def call(b: Backend) -> bytes:
        reply = await b.request("GET", "/api/v1/query", params=[("query", "up")], endpoint="query",
                                timeout_s=20, max_body_bytes=len(EMPTY_VECTOR))
        return bytes(reply.body)

    assert _with_backend(hostile, transport, call) == EMPTY_VECTOR


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_huge_series_count_is_a_failed_count_read_no_further(hostile: Hostile, transport: Transport) -> None:
    hostile.modes["/api/v1/query"] = "huge"

    async def counts(b: Backend) -> dict[str, int]:
        return await SeriesCounts(b, 60_000).get(["DCGM_FI_DEV_GPU_UTIL"], 1_700_000_000_000)

    assert _with_backend(hostile, transport, counts) == {}  # the planner's guess, then
    assert hostile.calls["/api/v1/query"] == 1
    assert COUNT_BODY_MAX == 4096 and _sent(hostile, "/api/v1/query") < SENT_AT_MOST


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("mode", ["huge", "huge_length"])
def test_huge_backend_facts_are_the_defaults_read_no_further(hostile: Hostile, transport: Transport,
                                                             mode: str) -> None:
    buildinfo, config = "/api/v1/status/buildinfo", "/api/v1/status/config"
    hostile.modes[buildinfo] = hostile.modes[config] = mode

    async def facts(b: Backend) -> tuple[object, int]:
        f = BackendFacts()
        return await f.dialect(b), await f.evaluation_interval_ms(b)

    assert _with_backend(hostile, transport, facts) == (GO_1_19, DEFAULT_EVALUATION_INTERVAL_MS)
    assert hostile.calls[buildinfo] == hostile.calls[config] == 1
    assert FACT_BODY_MAX == 4096 and _sent(hostile, buildinfo) < SENT_AT_MOST and _sent(hostile, config) < SENT_AT_MOST
