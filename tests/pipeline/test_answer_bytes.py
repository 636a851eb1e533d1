"""The process-wide budget of answer bytes being materialised (limits.max_inflight_answer_bytes)
and the send timeout for clients that do not read (listen.send_timeout).

In-process: the budget's order, a query larger than the budget running alone, the bounded
wait, corrections to the real size (the answer-size estimate itself:
tests/shardplanner/test_answer_size.py). Real parts: a
promaccel over a real Prometheus (behind tests/faulty.py's stalling front to make queries
overlap): a query waits for room and then answers as Prometheus does, a wait past
queue_timeout gets 429 with Retry-After, a query larger than the whole budget still answers,
and a client that never reads its answer is cut off and gives its share back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.compare import diff_answers
from proxy.errors import PromError
from proxy.pipeline.answer_bytes import AnswerBytes
from proxy.pipeline.context import Budget, RequestContext
from tests import faulty, rawhttp
from tests.servers import Promaccel

# --- the budget, in process ------------------------------------------------------------------


def test_budget_waits_in_order_and_a_query_larger_than_the_budget_runs_alone() -> None:
    async def scenario() -> list[str]:
        budget = AnswerBytes(limit=100, timeout_s=5)
        events: list[str] = []
        a = await budget.reserve(60, 5)

        async def wait(name: str, size: int) -> None:
            held = await budget.reserve(size, 5)
            events.append(f"in {name} (used {budget.used})")
            await asyncio.sleep(0.01)
            held.release()

        big = asyncio.create_task(wait("big", 500))  # larger than the budget: waits for an empty budget
        await asyncio.sleep(0.01)
        small = asyncio.create_task(wait("small", 10))  # would fit, but the big one is first in line
        await asyncio.sleep(0.01)
        assert events == [] and budget.used == 60
        a.release()
        a.release()  # idempotent
        await asyncio.gather(big, small)
        assert budget.used == 0 and budget.running == 0
        return events

    assert asyncio.run(scenario()) == ["in big (used 500)", "in small (used 10)"]


def test_budget_wait_is_bounded_and_a_correction_lets_waiters_in() -> None:
    async def scenario() -> None:
        budget = AnswerBytes(limit=100, timeout_s=0.2)
        held = await budget.reserve(90, 5)
        t0 = time.monotonic()
        with pytest.raises(PromError) as refused:
            await budget.reserve(50, 5)  # queue_timeout 0.2 s
        assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
        assert "limits.max_inflight_answer_bytes" in refused.value.message
        assert 0.15 < time.monotonic() - t0 < 2
        with pytest.raises(PromError):
            await budget.reserve(50, 0.05)  # the query's own deadline, shorter
        assert not budget._waiting and budget.used == 90
        waiter = asyncio.create_task(budget.reserve(50, 5))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        held.resize(20)  # the real answer is smaller than estimated: room for the waiter
        second = await asyncio.wait_for(waiter, 1)
        assert budget.used == 70
        held.release()
        second.release()
        assert budget.used == 0
        cancelled = AnswerBytes(limit=10, timeout_s=5)
        first = await cancelled.reserve(10, 5)
        gone = asyncio.create_task(cancelled.reserve(10, 5))
        await asyncio.sleep(0.01)
        gone.cancel()  # the client went away while waiting
        await asyncio.gather(gone, return_exceptions=True)
        first.release()
        assert cancelled.used == 0 and cancelled.running == 0 and not cancelled._waiting

    asyncio.run(scenario())


def test_a_reservation_is_held_until_the_puts_of_its_pieces_land() -> None:
    """The pieces a query fetched stay in memory (the landing zone) until their puts land:
    its bytes are given back then, not when the answer is sent."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        budget = AnswerBytes(limit=100, timeout_s=5)
        held = await budget.reserve(80, 5)
        ctx = RequestContext(held=held)  # what Reserve hands down the rest of the pipeline
        first, second = loop.create_future(), loop.create_future()
        assert ctx.held is not None
        ctx.held.hold(first)
        ctx.held.hold(second)
        held.release()  # the answer was sent; two puts are pending
        waiter = asyncio.create_task(budget.reserve(50, 5))
        await asyncio.sleep(0.01)
        assert budget.used == 80 and not waiter.done()
        first.set_result(None)
        await asyncio.sleep(0.01)
        assert budget.used == 80 and not waiter.done()  # the second put is still in flight
        second.set_exception(RuntimeError("put failed"))  # a failed put lets go too
        second.exception()
        taken = await asyncio.wait_for(waiter, 1)
        assert budget.used == 50
        taken.release()
        done = loop.create_future()
        done.set_result(None)
        late = await budget.reserve(10, 5)
        late.hold(done)  # a put already landed holds nothing
        late.release()
        assert budget.used == 0 and budget.running == 0

    asyncio.run(scenario())


def test_no_limit_never_waits() -> None:
    async def scenario() -> int:
        budget = AnswerBytes(limit=0, timeout_s=0.01)
        held = [await budget.reserve(1 << 40, 1) for _ in range(5)]
        for h in held:
            h.release()
        return budget.used

    assert asyncio.run(scenario()) == 0


# --- real promaccel over a real Prometheus ---------------------------------------------------

def _server(backend_url: str, tmp_path: Path, limits: str, listen: str = "") -> Promaccel:
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("cache:\n  enabled: false\nlimits:\n" + limits + (f"listen:\n{listen}" if listen else ""))
    return Promaccel.start(backend_url, ("--config", str(cfg), "--split-interval", "none"), tmp_path)


def _forms(prom: Any, n: int) -> list[dict[str, str]]:
    # Raw DCGM series over 2 h at 15 s: estimated 16 nodes x 8 x 481 points ~ 1 MiB each.
    return [{"query": f"DCGM_FI_DEV_GPU_UTIL + {i}", "start": str(prom.end_s - 7200 - 60 * i),
             "end": str(prom.end_s - 60 * i), "step": "15"} for i in range(n)]


def _metric(server: Promaccel, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def _at_once(url: str, forms: list[dict[str, str]]) -> list[tuple[httpx.Response, float]]:
    def one(form: dict[str, str]) -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        r = httpx.post(url + "/api/v1/query_range", data=form, timeout=60)
        return r, time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(len(forms)) as pool:
        return list(pool.map(one, forms))


@pytest.mark.prom
def test_a_query_waits_for_room_then_answers_as_prometheus(prom: Any, backend: faulty.FaultyBackend,
                                                           tmp_path: Path) -> None:
    """Budget 1.5 MiB, two ~1 MiB answers at once, every backend call stalled 3 s: one runs,
    the other waits for it (one wait counted, it takes one stall longer) and then runs; both
    answers equal Prometheus's and the budget is empty afterwards."""
    server = _server(backend.url, tmp_path, "  max_inflight_answer_bytes: 1572864\n  queue_timeout: 30s\n")
    forms = _forms(prom, 2)
    try:
        backend.set("stall", first=None)
        got = _at_once(server.url, forms)
        backend.set(None)
        assert [r.status_code for r, _ in got] == [200, 200], [r.text[:300] for r, _ in got]
        assert _metric(server, "promaccel_answer_bytes_waits_total") == 1
        # One ran after the other (both first waited for the shard-label discovery, stalled too).
        assert max(t for _, t in got) - min(t for _, t in got) > 2.5
        assert _metric(server, "promaccel_answer_bytes_reserved") == 0
        for form, (r, _) in zip(forms, got):
            direct = httpx.post(prom.url + "/api/v1/query_range", data=form, timeout=30)
            assert diff_answers(direct.json(), r.json()) == []
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_a_wait_past_queue_timeout_gets_429(prom: Any, backend: faulty.FaultyBackend, tmp_path: Path) -> None:
    server = _server(backend.url, tmp_path, "  max_inflight_answer_bytes: 1572864\n  queue_timeout: 1s\n")
    try:
        backend.set("stall", first=None)
        got = _at_once(server.url, _forms(prom, 2))
        backend.set(None)
        statuses = sorted(r.status_code for r, _ in got)
        assert statuses == [200, 429], [r.text[:300] for r, _ in got]
        refused = next(r for r, _ in got if r.status_code == 429)
        body = refused.json()
        assert refused.headers["retry-after"] == "1" and body["status"] == "error"
        assert body["errorType"] == "unavailable" and "limits.max_inflight_answer_bytes" in body["error"]
        assert _metric(server, "promaccel_answer_bytes_reserved") == 0
    finally:
        backend.set(None)
        server.stop()


@pytest.mark.prom
def test_queries_larger_than_the_budget_still_answer(prom: Any, tmp_path: Path) -> None:
    """Budget 4 KiB, far below any of these answers: each runs alone, none is refused or stuck."""
    server = _server(prom.url, tmp_path, "  max_inflight_answer_bytes: 4096\n  queue_timeout: 60s\n")
    forms = _forms(prom, 3)
    try:
        got = _at_once(server.url, forms)
        for form, (r, _) in zip(forms, got):
            assert r.status_code == 200, r.text[:300]
            direct = httpx.post(prom.url + "/api/v1/query_range", data=form, timeout=30)
            assert diff_answers(direct.json(), r.json()) == []
        assert _metric(server, "promaccel_answer_bytes_reserved") == 0
    finally:
        server.stop()


@pytest.mark.prom
@pytest.mark.parametrize("split", ["none", "1h"])
def test_a_client_that_never_reads_is_cut_off_and_gives_its_share_back(prom: Any, tmp_path: Path, split: str) -> None:
    """A 12 MB answer (relayed as the backend's bytes with split none; merged from pieces and
    streamed with 1h) to a client whose socket never reads: with listen.send_timeout 1s the
    connection is aborted (the client gets a few MB of it, what the kernel's buffers held),
    the budget is empty again and the next query runs without waiting."""
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("cache:\n  enabled: false\nlimits:\n  max_inflight_answer_bytes: 1048576\n"
                   "listen:\n  send_timeout: 1s\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg), "--split-interval", split), tmp_path)
    body = (f"query=DCGM_FI_DEV_GPU_UTIL&start={prom.start_s}&end={prom.start_s + 6 * 3600 - 60}"
            "&step=2").encode()
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        parts = urllib.parse.urlsplit(server.url)
        sock.connect((parts.hostname, parts.port))
        sock.sendall(b"POST /api/v1/query_range HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 60
        while "listen.send_timeout" not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)  # the answer is made, sent until the buffers are full, then cut off
        assert "listen.send_timeout" in server.log.read_text()
        while _metric(server, "promaccel_answer_bytes_reserved") != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(server, "promaccel_answer_bytes_reserved") == 0
        got, _ = rawhttp.read_until_closed(sock, 10)
        sock.close()
        assert got.startswith(b"HTTP/1.1 200")
        whole = httpx.post(server.url + "/api/v1/query_range", content=body, timeout=60, headers={
            "Accept-Encoding": "identity", "Content-Type": "application/x-www-form-urlencoded"})
        assert whole.status_code == 200 and len(whole.content) > 10_000_000
        assert len(got) < len(whole.content) - 1_000_000, (len(got), len(whole.content))
        assert _metric(server, "promaccel_answer_bytes_waits_total") == 0  # the budget was free again
    finally:
        server.stop()


@pytest.mark.parametrize("reserved, at_once", [(None, 6), (1 << 20, 6), (64 << 20, 2)])
def test_a_large_answer_makes_its_backend_calls_two_at_a_time(reserved: int | None, at_once: int) -> None:
    """Each call of a large answer holds its body and decoded arrays until it is cut and
    packed: a query reserved at LARGE_ANSWER_BYTES or more runs LARGE_CALLS_AT_ONCE of them at
    a time (issue 15); other queries all at once. Every call is made either way."""
    from types import SimpleNamespace

    from proxy.pipeline import lookup

    assert lookup.LARGE_CALLS_AT_ONCE == 2 and lookup.LARGE_ANSWER_BYTES <= 64 << 20
    running, peak, done = [0], [0], []

    class Fetcher:
        async def parts(self, f: Any, *args: Any) -> Any:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.02)
            running[0] -= 1
            done.append(f)
            return f

    async def scenario() -> None:
        held = await AnswerBytes(0, 1.0).reserve(reserved, 1.0) if reserved is not None else None
        q = SimpleNamespace(timeout_s=5.0, extra=(), cache=None, router=None, ctx=RequestContext(held=held))
        got, _ = await lookup.FanOut(Fetcher())(lookup.Calls(q, list(range(6)), []))  # type: ignore[arg-type]
        assert got == list(range(6)) and sorted(done) == list(range(6))

    asyncio.run(scenario())
    assert peak[0] == at_once


@pytest.mark.parametrize("reserved, max_calls, made, want", [
    (None, 0, 0, 4), (1 << 20, 0, 0, 4), (46 << 20, 0, 0, 6), (200 << 20, 0, 0, 16),
    (46 << 20, 5, 0, 5), (46 << 20, 8, 6, 4), (46 << 20, 3, 0, 4)])
def test_a_large_answer_is_fetched_in_smaller_calls(reserved: int | None, max_calls: int, made: int, want: int) -> None:
    """A query reserved at LARGE_ANSWER_BYTES or more aims for a call per LARGE_CALL_BYTES of
    its reservation (a 24 h raw panel of 2,048 GPUs: 6 calls of 4 h, not 4 of 6 h), so that the
    two calls in flight hold less (issue 15); never more than limits.max_backend_calls leaves
    (which still refuses a plan over it, as before)."""
    from proxy.pipeline import lookup

    async def scenario() -> int:
        held = await AnswerBytes(0, 1.0).reserve(reserved, 1.0) if reserved is not None else None
        budget = Budget(max_calls, 0)
        budget.calls = made
        return lookup.calls_for(4, RequestContext(budget=budget, held=held))

    assert asyncio.run(scenario()) == want
