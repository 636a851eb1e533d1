"""loadtests/client.py: the request budget, the loopback-only client, answer comparison and the tally."""

from __future__ import annotations

import json

import pytest

from loadtests import client
from loadtests.timeline import PHASE_S, instant_request

NOW = 1793491200 - PHASE_S


def test_budget_caps_requests() -> None:
    b = client.Budget(3)
    b.take()
    b.take(2)
    with pytest.raises(client.BudgetExhausted):
        b.take()


def test_deadline() -> None:
    assert client.Deadline(0).expired()
    assert not client.Deadline(3600).expired()


def test_client_refuses_non_loopback() -> None:
    with pytest.raises(ValueError, match="127.0.0.1"):
        client.Client("http://10.1.2.3:9090", client.Budget(1), 1)
    with pytest.raises(ValueError):
        client.Client("http://localhost.example.com:9090", client.Budget(1), 1)
    client.Client("http://127.0.0.1:9090", client.Budget(1), 1)



# --- answer comparison -----------------------------------------------------------------------


def _matrix(values: list[list[object]], status: str = "success") -> bytes:
    return json.dumps({"status": status, "data": {"resultType": "matrix", "result": [
        {"metric": {"Hostname": "gpu-node-0000"}, "values": values}]}}).encode()


def test_compare_answers() -> None:
    base = client.Answer(200, _matrix([[1, "0.1"], [2, "NaN"]]), 0.1)
    assert client.compare_answers(base, client.Answer(200, base.body, 0.1)) == []
    close = client.Answer(200, _matrix([[1, "0.10000000000000001"], [2, "NaN"]]), 0.1)
    assert client.compare_answers(base, close) == []
    off = client.Answer(200, _matrix([[1, "0.1001"], [2, "NaN"]]), 0.1)
    assert client.compare_answers(base, off)
    extra_point = client.Answer(200, _matrix([[0, "0"], [1, "0.1"], [2, "NaN"]]), 0.1)
    assert "timestamps differ" in client.compare_answers(base, extra_point)[0]
    status = client.Answer(503, base.body, 0.1)
    assert client.compare_answers(base, status)[0].startswith("HTTP status")
    assert client.compare_answers(base, client.Answer(200, b"<html>", 0.1))


def test_tally_counts_failures_apart_from_mismatches() -> None:
    t = client.Tally()
    ok = client.Answer(200, _matrix([[1, "1"]]), 0.1)
    assert t.check("same", ok, client.Answer(200, ok.body, 0.1))
    assert not t.check("wrong", ok, client.Answer(200, _matrix([[1, "2"]]), 0.1))
    assert not t.check("down", ok, client.Answer(0, b"", 0.1, error="ClientConnectorError"))
    assert (t.compared, t.mismatches, t.failures) == (2, 1, 1)
    assert t.mismatch_examples[0].startswith("wrong:")


def test_tally_counts_direct_failures_and_retries_apart() -> None:
    t = client.Tally()
    ok = client.Answer(200, _matrix([[1, "1"]]), 0.1)
    timeout = client.Answer(503, b'{"status":"error","errorType":"timeout"}', 120.0)
    assert not t.check("overloaded", timeout, ok)
    assert t.check("resent", ok, client.Answer(200, ok.body, 0.1, retries=1))
    assert (t.compared, t.mismatches, t.failures, t.direct_failures) == (1, 0, 0, 1)
    assert t.retries == {"direct": 0, "promaccel": 1}
    # a reference noted once, compared with many users' answers
    assert t.check("user 2", ok, client.Answer(200, ok.body, 0.1), direct_noted=True)
    assert t.compared == 2


def test_client_resends_once_on_a_stale_keep_alive_connection() -> None:
    """The server drops a kept-alive connection when the next request arrives on it (as an
    idle-timeout race looks from the client); the client resends on a new connection, as Go's
    http.Transport does for Grafana, and counts it."""
    import asyncio

    answer = _matrix([[1, "1"]])
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first_connection = connections == 1
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            if first_connection and served == 1:
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()
            served += 1

    async def run() -> list[client.Answer]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        req = instant_request("t", "vector(1)", NOW)
        async with server, client.Client(f"http://127.0.0.1:{port}", client.Budget(10), 10) as c:
            return [await c.send(req), await c.send(req), await c.send(req)]

    answers = asyncio.run(run())
    assert [(x.status, x.retries, x.error) for x in answers] == [(200, 0, None), (200, 1, None), (200, 0, None)]
    assert connections == 2
