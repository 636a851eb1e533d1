"""The one error type (proxy/errors.py): a kind is Prometheus's `errorType`, with the HTTP status
Prometheus 2.42 gives it, and the body is Prometheus's error JSON."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import PromError, bad_data, invalid_param


@pytest.mark.parametrize(("kind", "status"), [
    # Prometheus 2.42 web/api/v1/api.go, respondError: errorBadData -> 400, errorExec -> 422,
    # errorCanceled and errorTimeout -> 503, errorInternal -> 500, errorNotFound -> 404.
    ("bad_data", 400), ("execution", 422), ("canceled", 503), ("timeout", 503), ("internal", 500),
    ("not_found", 404),
    # Prometheus's default (500) would say "promaccel is broken"; a backend that did not
    # answer is a 503, as a gateway says it, and clients retry it.
    ("unavailable", 503),
    ("something_new", 500),  # an unknown kind: respondError's default
])
def test_status_of_each_kind(kind: str, status: int) -> None:
    assert PromError(kind, "x").status == status


def test_the_body_is_prometheus_error_json_in_its_field_order() -> None:
    # 2.42's response struct: status, (data omitted), errorType, error.
    body = PromError("execution", 'query processing would load too many samples "x"').body()
    assert body == b'{"status":"error","errorType":"execution","error":"query processing would load too many samples \\"x\\""}'
    assert list(orjson.loads(body)) == ["status", "errorType", "error"]


def test_too_large_is_a_413_of_bad_data() -> None:
    # Prometheus has no errorType for a body too large: the type a client knows is bad_data.
    err = PromError("too_large", "request body over 1 MiB")
    assert err.status == 413 and orjson.loads(err.body())["errorType"] == "bad_data"


def test_explicit_status_and_headers() -> None:
    err = PromError("unavailable", "busy", status=429, headers={"Retry-After": "2"})
    assert (err.status, err.headers, err.kind, err.message, str(err)) == (429, {"Retry-After": "2"}, "unavailable",
                                                                            "busy", "busy")
    assert repr(err) == "PromError('unavailable', 'busy', status=429)"


def test_parameter_errors_read_as_prometheus_writes_them() -> None:
    # 2.42 api.go: errors.Wrapf(err, "invalid parameter %q", name) -> `invalid parameter "start": ...`.
    err = invalid_param("start", 'cannot parse "x" to a valid timestamp')
    assert err.status == 400 and err.message == 'invalid parameter "start": cannot parse "x" to a valid timestamp'
    assert bad_data("no query").kind == "bad_data"
