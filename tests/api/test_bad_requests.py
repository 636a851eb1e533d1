"""Bad requests: sent to promaccel and to a real Prometheus. Same status class, a
Prometheus-style error body from promaccel, never a 5xx; and promaccel never rejects what
Prometheus accepts."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

pytestmark = pytest.mark.prom

R = "/api/v1/query_range"
Q = "/api/v1/query"

# (name, method, path, params or form, extra headers)
CASES: list[tuple[str, str, str, dict[str, Any], dict[str, str]]] = [
    ("range_missing_query", "GET", R, {"start": "0", "end": "60", "step": "15"}, {}),
    ("range_empty_query", "GET", R, {"query": "", "start": "0", "end": "60", "step": "15"}, {}),
    ("range_blank_query", "GET", R, {"query": "   ", "start": "0", "end": "60", "step": "15"}, {}),
    ("range_missing_start", "GET", R, {"query": "up", "end": "60", "step": "15"}, {}),
    ("range_missing_end", "GET", R, {"query": "up", "start": "0", "step": "15"}, {}),
    ("range_missing_step", "GET", R, {"query": "up", "start": "0", "end": "60"}, {}),
    ("range_bad_start", "GET", R, {"query": "up", "start": "yesterday", "end": "60", "step": "15"}, {}),
    ("range_bad_end_rfc3339", "GET", R, {"query": "up", "start": "0", "end": "2023-02-30T00:00:00Z", "step": "15"}, {}),
    ("range_end_before_start", "GET", R, {"query": "up", "start": "100", "end": "50", "step": "15"}, {}),
    ("range_zero_step", "GET", R, {"query": "up", "start": "0", "end": "60", "step": "0"}, {}),
    ("range_negative_step", "GET", R, {"query": "up", "start": "0", "end": "60", "step": "-15"}, {}),
    ("range_bad_step", "GET", R, {"query": "up", "start": "0", "end": "60", "step": "fast"}, {}),
    ("range_bad_step_unit", "GET", R, {"query": "up", "start": "0", "end": "60", "step": "15x"}, {}),
    ("range_too_many_points", "GET", R, {"query": "up", "start": "0", "end": "86400", "step": "1"}, {}),
    ("range_bad_timeout", "GET", R, {"query": "up", "start": "0", "end": "60", "step": "15", "timeout": "never"}, {}),
    ("range_nan_start", "GET", R, {"query": "up", "start": "NaN", "end": "60", "step": "15"}, {}),
    ("range_malformed_promql", "GET", R, {"query": "sum(up", "start": "0", "end": "60", "step": "15"}, {}),
    ("range_unknown_function", "GET", R, {"query": "nosuchfn(up)", "start": "0", "end": "60", "step": "15"}, {}),
    ("range_string_result", "GET", R, {"query": '"text"', "start": "0", "end": "60", "step": "15"}, {}),
    ("range_post_malformed", "POST", R, {"query": "rate(up[5m]", "start": "0", "end": "60", "step": "15"}, {}),
    ("instant_missing_query", "GET", Q, {"time": "0"}, {}),
    ("instant_bad_time", "GET", Q, {"query": "up", "time": "tomorrow"}, {}),
    ("instant_malformed_promql", "GET", Q, {"query": "up{", "time": "0"}, {}),
    ("instant_bad_label_matcher", "GET", Q, {"query": 'up{instance=~"("}', "time": "0"}, {}),
    ("instant_range_vector_result", "GET", Q, {"query": "up[5m", "time": "0"}, {}),
    ("instant_type_error", "GET", Q, {"query": "rate(up)", "time": "0"}, {}),
    ("instant_post_bad_timeout", "POST", Q, {"query": "up", "time": "0", "timeout": "-"}, {}),
    ("instant_unknown_escape", "GET", Q, {"query": 'up{a="\\q"}', "time": "0"}, {}),
    ("unknown_path", "GET", "/api/v1/nonsense", {}, {}),
    ("unknown_path_root", "GET", "/not/an/api", {}, {}),
    ("series_without_match", "GET", "/api/v1/series", {}, {}),
    ("series_bad_match", "GET", "/api/v1/series", {"match[]": "up{"}, {}),
    ("label_values_bad_start", "GET", "/api/v1/label/job/values", {"start": "x"}, {}),
]

# Valid input that promql-parser cannot parse: Prometheus accepts, so must promaccel.
ACCEPTED: list[tuple[str, dict[str, str]]] = [
    ("raw_string_backslash", {"query": "vector(1) * on() group_left count(up{a=`raw\\d`})", "time": "0"}),
    ("escaped_regex", {"query": 'up{instance=~"10\\\\.42\\\\..+"}', "time": "0"}),
    ("escaped_quote", {"query": 'up{a="x\\"y"}', "time": "0"}),
    ("trailing_backslash", {"query": 'up{a="\\\\"}', "time": "0"}),
    ("subquery_without_step", {"query": "max_over_time(rate(up[1m])[5m:])", "time": "0"}),
    ("label_replace_class", {"query": 'label_replace(vector(1), "n", "$1", "x", "(\\\\d+)")', "time": "0"}),
    ("name_matcher_only", {"query": '{__name__="up"}', "time": "0"}),
    ("step_float_seconds", {"query": "vector(1)", "start": "0", "end": "60", "step": "15.5"}),
    ("rfc3339_times", {"query": "vector(1)", "start": "2023-01-01T00:00:00Z", "end": "2023-01-01T00:10:00.5Z", "step": "1m"}),
]


def _send(base: str, method: str, path: str, params: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    if method == "POST":
        return httpx.post(base + path, data=params, headers=headers, timeout=30)
    return httpx.get(base + path, params=params, headers=headers, timeout=30)


@pytest.mark.parametrize("name, method, path, params, headers", CASES, ids=[c[0] for c in CASES])
def test_bad_request(prom: Any, passthrough: Any, name: str, method: str, path: str,
                     params: dict[str, Any], headers: dict[str, str]) -> None:
    direct = _send(prom.url, method, path, params, headers)
    proxied = _send(passthrough.url, method, path, params, headers)
    assert proxied.status_code < 500, (name, proxied.status_code, proxied.text)
    assert direct.status_code // 100 == proxied.status_code // 100, (name, direct.text, proxied.text)
    if proxied.status_code >= 400:
        body = orjson.loads(proxied.content)
        assert body["status"] == "error" and body["errorType"] and body["error"], body
        if direct.headers.get("content-type", "").startswith("application/json"):
            assert orjson.loads(direct.content)["errorType"] == body["errorType"]


# Parameter errors: status and body byte for byte as Prometheus 2.42 writes them, GET and POST
# (query and query_range are validated by promaccel itself; errors the backend decides,
# malformed PromQL, are relayed as they are).
PARAM_ERRORS: list[tuple[str, str, dict[str, str]]] = [
    ("range_missing_query", R, {"start": "0", "end": "60", "step": "15"}),
    ("range_empty_query", R, {"query": "", "start": "0", "end": "60", "step": "15"}),
    ("range_missing_start", R, {"query": "up", "end": "60", "step": "15"}),
    ("range_missing_end", R, {"query": "up", "start": "0", "step": "15"}),
    ("range_missing_step", R, {"query": "up", "start": "0", "end": "60"}),
    ("range_bad_start", R, {"query": "up", "start": "yesterday", "end": "60", "step": "15"}),
    ("range_bad_end_rfc3339", R, {"query": "up", "start": "0", "end": "2023-02-30T00:00:00Z", "step": "15"}),
    ("range_nan_start", R, {"query": "up", "start": "NaN", "end": "60", "step": "15"}),
    ("range_inf_end", R, {"query": "up", "start": "0", "end": "+Inf", "step": "15"}),
    ("range_end_before_start", R, {"query": "up", "start": "100", "end": "50", "step": "15"}),
    ("range_zero_step", R, {"query": "up", "start": "0", "end": "60", "step": "0"}),
    ("range_zero_duration_step", R, {"query": "up", "start": "0", "end": "60", "step": "0s"}),
    ("range_negative_step", R, {"query": "up", "start": "0", "end": "60", "step": "-15"}),
    ("range_bad_step", R, {"query": "up", "start": "0", "end": "60", "step": "fast"}),
    ("range_bad_step_unit", R, {"query": "up", "start": "0", "end": "60", "step": "15x"}),
    ("range_nan_step", R, {"query": "up", "start": "0", "end": "60", "step": "NaN"}),
    ("range_too_many_points", R, {"query": "up", "start": "0", "end": "86400", "step": "1"}),
    ("range_bad_timeout", R, {"query": "up", "start": "0", "end": "60", "step": "15", "timeout": "never"}),
    ("range_nan_end", R, {"query": "up", "start": "0", "end": "NaN", "step": "15"}),
    ("range_end_before_start_and_zero_step", R, {"query": "up", "start": "100", "end": "50", "step": "0"}),
    ("instant_missing_query", Q, {"time": "0"}),
    ("instant_empty_query", Q, {"query": "", "time": "0"}),
    ("instant_bad_time", Q, {"query": "up", "time": "tomorrow"}),
    ("instant_bad_timeout", Q, {"query": "up", "time": "0", "timeout": "-"}),
    ("series_without_match", "/api/v1/series", {}),
    ("series_bad_start", "/api/v1/series", {"match[]": "up", "start": "x"}),
    ("series_bad_end", "/api/v1/series", {"match[]": "up", "end": "x"}),
    ("labels_bad_start", "/api/v1/labels", {"start": "x"}),
    ("label_values_bad_start", "/api/v1/label/job/values", {"start": "x"}),
]


# label values: GET only, in Prometheus as in promaccel
PARAM_CASES = [(m, *c) for c in PARAM_ERRORS for m in ("GET", "POST") if m == "GET" or "/label/" not in c[1]]


@pytest.mark.parametrize("method, name, path, params", PARAM_CASES, ids=[f"{c[1]}-{c[0]}" for c in PARAM_CASES])
def test_parameter_error_is_prometheus_byte_for_byte(prom: Any, passthrough: Any, method: str, name: str,
                                                      path: str, params: dict[str, str]) -> None:
    direct = _send(prom.url, method, path, params, {})
    proxied = _send(passthrough.url, method, path, params, {})
    assert direct.status_code == 400, (name, direct.text)  # a parameter error, as the table says
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content), name
    assert proxied.headers["content-type"] == direct.headers["content-type"], name


def test_oversized_body(passthrough: Any) -> None:
    big = {"query": "up", "time": "0", "pad": "x" * (2 * 1024 * 1024)}
    r = httpx.post(passthrough.url + Q, data=big, timeout=30)
    assert r.status_code == 413
    body = r.json()
    assert body["status"] == "error" and "too large" in body["error"]


@pytest.mark.parametrize("name, params", ACCEPTED, ids=[a[0] for a in ACCEPTED])
@pytest.mark.parametrize("mode", ["passthrough", "planned"])
def test_valid_input_is_accepted(prom: Any, passthrough: Any, planned: Any, mode: str, name: str,
                                 params: dict[str, str]) -> None:
    server = passthrough if mode == "passthrough" else planned
    path = R if "step" in params else Q
    direct = httpx.post(prom.url + path, data=params, timeout=30)
    proxied = httpx.post(server.url + path, data=params, timeout=30)
    assert direct.status_code == 200, direct.text
    assert proxied.status_code == 200, proxied.text
    assert orjson.loads(proxied.content)["data"] == orjson.loads(direct.content)["data"]
