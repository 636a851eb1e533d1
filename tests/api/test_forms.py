"""proxy/api/forms.py: request parameters read as Prometheus reads them (Go's `r.ParseForm`):
the POST form body's values before the URL query's, repeated keys all kept, blank values
kept; a body over limits.max_body_bytes refused with a 413 before it is all read, a bad
Content-Length or a body that is not UTF-8 with a 400, a client gone mid-body with a 499.

Driven in process through a tiny app that answers the pairs it read (or the PromError)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from proxy.api.forms import FORM_TYPE, client_gone, first_values, read_pairs, without
from proxy.errors import PromError

LIMIT = 2048


async def _echo(request: Request) -> Response:
    try:
        pairs = await read_pairs(request, LIMIT)
    except PromError as exc:
        return Response(exc.body(), status_code=exc.status, media_type="application/json")
    return Response(orjson.dumps(pairs), media_type="application/json")


APP = Starlette(routes=[Route("/p", _echo, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])])


def _call(method: str, url: str, **kw: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=APP), base_url="http://t") as c:
            return await c.request(method, url, **kw)
    return asyncio.run(run())


def _pairs(r: httpx.Response) -> list[tuple[str, str]]:
    assert r.status_code == 200, r.text
    return [tuple(p) for p in r.json()]  # type: ignore[misc]


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "bad_data", body
    message: str = body["error"]
    return message


def test_body_values_come_before_the_query_and_repeats_are_kept() -> None:
    r = _call("POST", "/p?query=from_url&match[]=a", data={"query": "from_body", "match[]": ["b", "c"]})
    pairs = _pairs(r)
    assert pairs == [("query", "from_body"), ("match[]", "b"), ("match[]", "c"), ("query", "from_url"),
                     ("match[]", "a")]
    # What a handler reads as "the" value: the body's (Go's r.FormValue).
    assert first_values(pairs)["query"] == "from_body"
    assert [v for k, v in pairs if k == "match[]"] == ["b", "c", "a"]


def test_get_reads_the_url_only_and_keeps_blank_values() -> None:
    r = _call("GET", "/p?query=up&time=&step", content=b"query=ignored")
    assert _pairs(r) == [("query", "up"), ("time", ""), ("step", "")]
    assert _pairs(_call("GET", "/p")) == []


def test_percent_and_plus_decoding_as_a_form_is_decoded() -> None:
    r = _call("POST", "/p", content=b"query=sum+by+(a)+(rate(x%5B5m%5D))&x=%E2%9C%93",
              headers={"content-type": FORM_TYPE + "; charset=UTF-8"})
    assert _pairs(r) == [("query", "sum by (a) (rate(x[5m]))"), ("x", "\u2713")]


@pytest.mark.parametrize("ctype", ["application/json", "text/plain", ""])
def test_a_body_that_is_not_a_form_is_not_read_as_parameters(ctype: str) -> None:
    r = _call("POST", "/p?query=up", content=b"query=other", headers={"content-type": ctype})
    assert _pairs(r) == [("query", "up")]


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_put_and_patch_bodies_are_read_like_post(method: str) -> None:
    assert _pairs(_call(method, "/p", data={"a": "1"})) == [("a", "1")]


def test_declared_length_over_the_limit_is_a_413_before_reading() -> None:
    r = _call("POST", "/p", content=b"a=1", headers={"content-type": FORM_TYPE, "content-length": str(LIMIT + 1)})
    assert r.status_code == 413
    body = r.json()
    # Prometheus has no errorType for it: bad_data, with the limit named.
    assert body["errorType"] == "bad_data" and f"at most {LIMIT} bytes" in body["error"]
    assert "limits.max_body_bytes" in body["error"]


def test_a_body_exactly_at_the_limit_is_read() -> None:
    body = b"q=" + b"x" * (LIMIT - 2)
    assert _pairs(_call("POST", "/p", content=body, headers={"content-type": FORM_TYPE})) == [("q", "x" * (LIMIT - 2))]


def test_a_streamed_body_over_the_limit_is_a_413_without_a_length() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"q=" + b"x" * 500

    r = _call("POST", "/p", content=chunks(), headers={"content-type": FORM_TYPE})
    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert r.status_code == 413 and r.json()["errorType"] == "bad_data"


@pytest.mark.parametrize("length", ["abc", "1e3", ""])
def test_a_bad_content_length_is_a_400(length: str) -> None:
    r = _call("POST", "/p", content=b"a=1", headers={"content-type": FORM_TYPE, "content-length": length})
    assert "Content-Length" in _error(r, 400)


def test_a_body_that_is_not_utf8_is_a_400() -> None:
    r = _call("POST", "/p", content=b"query=\xff\xfe", headers={"content-type": FORM_TYPE})
    assert "not valid UTF-8" in _error(r, 400)


def test_a_client_gone_mid_body_is_a_499_not_an_error_of_ours() -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": b"query=su", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/p", "raw_path": b"/p", "query_string": b"",
             "headers": [(b"content-type", FORM_TYPE.encode())], "http_version": "1.1", "scheme": "http",
             "server": ("t", 80), "client": ("127.0.0.1", 1), "root_path": ""}
    asyncio.run(APP(scope, receive, send))
    assert sent[0]["status"] == 499
    assert orjson.loads(sent[1]["body"])["errorType"] == "canceled"
    assert client_gone().status == 499 and client_gone().kind == "canceled"


def test_first_values_and_without() -> None:
    pairs = [("a", "1"), ("b", "2"), ("a", "3"), ("match[]", "x"), ("match[]", "y")]
    assert first_values(pairs) == {"a": "1", "b": "2", "match[]": "x"}
    assert without(pairs, frozenset({"a"})) == [("b", "2"), ("match[]", "x"), ("match[]", "y")]
    assert without(pairs, frozenset()) == pairs and without(pairs, frozenset()) is not pairs
    assert first_values([]) == {}
