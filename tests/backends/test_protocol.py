"""What a backend call sends and gets back (proxy/backends/protocol.py): Retry-After, the path
guard, and error answers made readable as Prometheus's error JSON naming the backend."""

from __future__ import annotations

import email.utils
import time

import orjson
import pytest

from proxy.backends.protocol import (
    BackendReply,
    broken_answer,
    check_path,
    complete_json,
    is_prom_error,
    parsed_json,
    retry_after_s,
    sane_error,
)
from proxy.errors import PromError

JSON = "application/json"


@pytest.mark.parametrize(("value", "want"), [
    (None, None), ("", None), ("5", 5.0), (" 2.5 ", 2.5), ("-3", 0.0), ("soon", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # an HTTP-date in the past: now
])
def test_retry_after_seconds(value: str | None, want: float | None) -> None:
    # RFC 9110 section 10.2.3: delay-seconds or an HTTP-date.
    assert retry_after_s(value) == want


def test_retry_after_an_http_date_in_the_future() -> None:
    when = email.utils.formatdate(time.time() + 60, usegmt=True)
    got = retry_after_s(when)
    assert got is not None and 55 <= got <= 61


@pytest.mark.parametrize("path", [
    "/api/v1/query_range", "/api/v1/label/__name__/values", "/api/v1/label/a%20b/values",
    "/workspaces/ws-1/api/v1/query",
])
def test_paths_that_stay_on_their_endpoint(path: str) -> None:
    check_path(path)


@pytest.mark.parametrize("path", [
    "api/v1/query",  # relative
    "/api/v1/../../debug/pprof", "/api/v1/%2e%2e/x", "/api/v1/label/a%2Fb/values", "/a/./b",
    "/api/v1//query", "/api/v1/query?x=1", "/api/v1/query#f", "/api\\v1", "/api/v1/%5c", "/api/%252e%252e",
])
def test_paths_that_could_leave_it_are_refused(path: str) -> None:
    with pytest.raises(PromError) as err:
        check_path(path)
    assert err.value.kind == "internal" and err.value.status == 500


def test_a_prometheus_error_is_relayed_as_it_is() -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 4"}'
    reply = BackendReply(400, body, JSON)
    assert is_prom_error(reply) and sane_error(reply, "amp", "/api/v1/query") is reply
    ok = BackendReply(200, b"<html>", "text/html")
    assert sane_error(ok, "amp", "/api/v1/query") is ok
    assert not is_prom_error(BackendReply(400, b'{"status":"error","errorType":"bad_data"}', JSON))  # no message
    assert not is_prom_error(BackendReply(400, b'{"status":"error","errorType":"bad_data","error":"x"', JSON))


def _error(reply: BackendReply) -> tuple[int, dict[str, str]]:
    out = sane_error(reply, "amp", "/api/v1/query_range")
    assert out.content_type == JSON
    return out.status, orjson.loads(out.body)


@pytest.mark.parametrize(("status", "want_status", "want_type"), [
    (502, 502, "unavailable"), (503, 503, "unavailable"), (504, 504, "timeout"),
    (500, 502, "unavailable"),  # any other 5xx: the backend failed, as a gateway says it
    (404, 404, "not_found"), (400, 400, "bad_data"), (422, 422, "execution"), (418, 418, "bad_data"),
])
def test_other_error_bodies_become_prometheus_errors(status: int, want_status: int, want_type: str) -> None:
    got_status, doc = _error(BackendReply(status, b"<html><body>nginx</body></html>", "text/html"))
    assert got_status == want_status and doc["status"] == "error" and doc["errorType"] == want_type
    # The backend is named; the HTML page is not echoed.
    assert doc["error"] == f"backend 'amp' answered /api/v1/query_range with HTTP {status}"


def test_an_aws_message_is_kept_short() -> None:
    body = orjson.dumps({"message": "User is not authorized " + "x" * 1000})
    status, doc = _error(BackendReply(403, body, "application/x-amz-json-1.1", {"retry-after": "1"}))
    assert status == 403 and doc["errorType"] == "unavailable"
    assert doc["error"].startswith("backend 'amp' answered /api/v1/query_range with HTTP 403: User is not authorized")
    assert len(doc["error"]) < 400
    out = sane_error(BackendReply(403, body, JSON, {"retry-after": "1"}), "amp", "/x")
    assert out.headers == {"retry-after": "1"}


def test_json_helpers_and_the_broken_answer_error() -> None:
    assert parsed_json(b'{"status":"success"}') == {"status": "success"}
    assert parsed_json(b"[1]") is None and parsed_json(b'{"a":') is None
    assert complete_json(bytearray(b"{}")) and not complete_json(b"")
    assert BackendReply(204, b"", JSON).ok and not BackendReply(302, b"", JSON).ok
    err = broken_answer("local", "/api/v1/query", "cut short")
    assert err.status == 502 and err.kind == "unavailable" and "'local'" in err.message and "cut short" in err.message
