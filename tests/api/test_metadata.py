"""proxy/api/metadata.py: series, labels, label values and metadata over a hybrid fleet.

In process: which backends a call goes to (`metric_names`, `backends_for`) and how answers
merge (`merge_data`). Against a real Prometheus (the point is equivalence): promaccel over
two backends, both that Prometheus (one behind a fault-injecting proxy that holds only the
DCGM GPU metrics), answers /api/v1/series, labels, label values and metadata exactly as the
Prometheus does directly; a backend that holds nothing asked for is not asked; a backend that
fails is left out with the warning naming it; when every backend fails, or the request is bad,
the backend's error is the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from proxy.api.app import create_app
from proxy.api.metadata import backends_for, fan_out, merge_data, metric_names
from proxy.backends import BackendReply
from proxy.config import build_config
from proxy.errors import PromError
from shardplanner.holdings import BackendHolding
from tests import faulty

# --- metric_names -------------------------------------------------------------------------------


@pytest.mark.parametrize(("matches", "names"), [
    ([], None),  # no match[]: anything may be asked about
    (["up"], ["up"]),
    (['DCGM_FI_DEV_GPU_UTIL{Hostname="n1"}', "node_load1"], ["DCGM_FI_DEV_GPU_UTIL", "node_load1"]),
    (['{__name__=~"DCGM_.*"}'], [None]),  # no plain name: any metric
    (['{job="node"}'], [None]),
    (["rate(up[5m])"], [None]),  # not a selector: the backends give the error
    (["up{"], [None]),  # does not parse: the backends give the error
])
def test_metric_names_of_match_selectors(matches: list[str], names: list[str | None] | None) -> None:
    pairs = [("start", "1")] + [("match[]", m) for m in matches] + [("end", "2")]
    assert metric_names(pairs) == names


# --- backends_for -------------------------------------------------------------------------------

H = 3_600_000
LOCAL, AMP, OLD = (SimpleNamespace(name=n) for n in ("local", "amp", "old"))
HOLDINGS = [
    BackendHolding("local", ("*",), since_ms=100 * H),  # everything, recent
    BackendHolding("amp", ("DCGM_.*",)),  # the GPU metrics, all the time
    BackendHolding("old", ("*",), until_ms=50 * H),  # everything, before 50 h
]
FLEET: list[Any] = [LOCAL, AMP, OLD]


def _names(backends: list[Any]) -> list[str]:
    return [b.name for b in backends]


def test_backends_for_by_metric_and_window_in_configured_order() -> None:
    def asked(names: list[str | None] | None, start: int | None, end: int | None) -> list[str]:
        return _names(backends_for(FLEET, HOLDINGS, names, start, end))

    assert asked(None, None, None) == ["local", "amp", "old"]  # unbounded: everyone
    assert asked(["DCGM_FI_DEV_GPU_UTIL"], 120 * H, 121 * H) == ["local", "amp"]
    assert asked(["node_load1"], 120 * H, 121 * H) == ["local"]  # amp holds only DCGM
    assert asked(["node_load1"], 10 * H, 20 * H) == ["old"]
    assert asked(["DCGM_FI_DEV_GPU_UTIL"], 10 * H, 20 * H) == ["amp", "old"]
    assert asked([None], 10 * H, 20 * H) == ["amp", "old"]  # a selector without a name: any metric
    assert asked(["node_load1", "DCGM_FI_DEV_GPU_UTIL"], 120 * H, 121 * H) == ["local", "amp"]
    # Window edges are inclusive: a call ending exactly at `since` still meets it.
    assert asked(["node_load1"], 60 * H, 100 * H) == ["local"]
    assert asked(["node_load1"], 50 * H, 60 * H) == ["old"]
    assert asked(["node_load1"], 51 * H, 99 * H) == ["local"]  # nobody holds it: the first backend


# --- merge_data ---------------------------------------------------------------------------------


def test_series_union_without_duplicates_sorted_as_prometheus_sorts_label_sets() -> None:
    a = [{"__name__": "up", "job": "b"}, {"__name__": "up", "job": "a", "z": "1"}]
    b = [{"job": "a", "__name__": "up"}, {"__name__": "up", "job": "b"}, {"__name__": "up", "job": "a", "z": "0"}]
    merged = merge_data("series", [a, b, None], {})
    # labels.Compare: label by label in name order, a label set that is a prefix first.
    assert merged == [{"__name__": "up", "job": "a"}, {"__name__": "up", "job": "a", "z": "0"},
                      {"__name__": "up", "job": "a", "z": "1"}, {"__name__": "up", "job": "b"}]


def test_labels_and_values_are_a_sorted_union() -> None:
    assert merge_data("labels", [["job", "__name__"], ["instance", "job"], None], {}) == \
        ["__name__", "instance", "job"]
    assert merge_data("values", [["b", "a"], [], ["c", "a"]], {}) == ["a", "b", "c"]
    assert merge_data("values", [None, None], {}) == []


def test_metadata_union_keeps_first_seen_order_then_limits() -> None:
    g = {"type": "gauge", "help": "GPU utilisation", "unit": ""}
    c = {"type": "counter", "help": "bytes", "unit": ""}
    other = {"type": "gauge", "help": "GPU utilisation (AMP)", "unit": ""}
    a = {"DCGM_FI_DEV_GPU_UTIL": [g], "node_bytes_total": [c]}
    b = {"DCGM_FI_DEV_GPU_UTIL": [g, other], "up": [g]}
    merged = merge_data("metadata", [a, b], {})
    assert merged == {"DCGM_FI_DEV_GPU_UTIL": [g, other], "node_bytes_total": [c], "up": [g]}
    assert list(merged) == ["DCGM_FI_DEV_GPU_UTIL", "node_bytes_total", "up"]
    assert merge_data("metadata", [a, b], {"limit_per_metric": "1"})["DCGM_FI_DEV_GPU_UTIL"] == [g]
    assert list(merge_data("metadata", [a, b], {"limit": "2"})) == ["DCGM_FI_DEV_GPU_UTIL", "node_bytes_total"]
    assert merge_data("metadata", [a, b], {"limit": "0"}) == {}
    # Prometheus ignores a limit that is negative, empty or (here) not a number.
    for limit in ("-1", "", "lots"):
        assert len(merge_data("metadata", [a, b], {"limit": limit, "limit_per_metric": limit})) == 3


def test_an_unknown_kind_is_a_bug_not_an_empty_answer() -> None:
    with pytest.raises(ValueError):
        merge_data("exemplars", [[]], {})


# --- fan_out with a backend answering a 200 of the wrong shape ---------------------------------


def _stub(name: str, body: Any) -> Any:
    """A backend holding everything that answers every call with a 200 of `body` (JSON)."""
    async def request_sound(method: str, path: str, **kw: Any) -> BackendReply:
        raw = orjson.dumps(body)
        return BackendReply(200, raw, "application/json", parsed=body if isinstance(body, dict) else None)

    holding = BackendHolding(name, ("*",))
    return SimpleNamespace(name=name, cfg=SimpleNamespace(holdings=lambda now: [holding]),
                           request_sound=request_sound)


def _fan_out(backends: list[Any], kind: str, path: str) -> tuple[int, Any]:
    """promaccel's answer (status, JSON) to GET `path` of `kind` over `backends`."""
    async def run() -> tuple[int, Any]:
        try:
            out = await fan_out(backends, "GET", path, [], kind, None, None, None, 0, "series")
        except PromError as exc:
            return exc.status, orjson.loads(exc.body())
        return out.status_code, orjson.loads(bytes(out.body))
    return asyncio.run(run())


GOOD = {"series": [{"__name__": "up", "job": "a"}], "labels": ["job"], "values": ["a"],
        "metadata": {"up": [{"type": "gauge", "help": "", "unit": ""}]}}
PATHS = {"series": "/api/v1/series", "labels": "/api/v1/labels", "values": "/api/v1/label/job/values",
         "metadata": "/api/v1/metadata"}
# Each kind's data in shapes merge_data cannot take (each was a 500 before), and whole bodies
# whose warnings are not strings.
WRONG = {
    "series": [{"up": 1}, "up", [["up"]], [{"job": 1}], [{"job": None}]],
    "labels": [{"job": "a"}, "job", [1], [["job"]], [{"a": "b"}]],
    "values": [{"a": 1}, 7, [None], [1.5]],
    "metadata": [[{"type": "gauge"}], "up", {"up": {"type": "gauge"}}, {"up": ["gauge"]}, {"up": 1}],
}
CASES = [(kind, data) for kind, shapes in WRONG.items() for data in shapes]


@pytest.mark.parametrize(("kind", "data"), CASES)
def test_a_wrong_shaped_answer_beside_a_sound_one_is_left_out_with_the_warning(kind: str, data: Any) -> None:
    good = _stub("good", {"status": "success", "data": GOOD[kind]})
    bad = _stub("bad", {"status": "success", "data": data})
    for order in ([good, bad], [bad, good]):
        status, body = _fan_out(order, kind, PATHS[kind])
        assert status == 200, body
        assert body["data"] == GOOD[kind]
        (warning,) = body["warnings"]
        assert "'bad'" in warning and "did not answer" in warning


@pytest.mark.parametrize(("kind", "data"), CASES)
def test_wrong_shaped_answers_from_every_backend_are_a_502_naming_the_first(kind: str, data: Any) -> None:
    status, body = _fan_out([_stub("one", {"status": "success", "data": data}),
                             _stub("two", {"status": "success", "data": data})], kind, PATHS[kind])
    assert status == 502 and body["status"] == "error" and body["errorType"] == "unavailable"
    assert "backend 'one'" in body["error"] and "data that is not" in body["error"]


@pytest.mark.parametrize("body", [
    {"status": "success", "data": ["a"], "warnings": "w"},
    {"status": "success", "data": ["a"], "warnings": [1]},
    ["a"],  # not an object at all
])
def test_a_body_that_is_not_an_answer_is_a_502_naming_the_backend(body: Any) -> None:
    status, out = _fan_out([_stub("one", body), _stub("two", body)], "labels", PATHS["labels"])
    assert status == 502 and "backend 'one'" in out["error"]


def test_null_data_is_nothing_and_sound_answers_merge() -> None:
    status, body = _fan_out([_stub("one", {"status": "success", "data": None}),
                             _stub("two", {"status": "success", "data": ["b", "a"], "warnings": ["w"]})],
                            "values", PATHS["values"])
    assert (status, body) == (200, {"status": "success", "data": ["a", "b"], "warnings": ["w"]})


# --- over HTTP, against a real Prometheus ---------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_only(prom_scraped: Any) -> Iterator[faulty.FaultyBackend]:
    """The second backend: the same Prometheus behind a fault-injecting proxy."""
    b = faulty.start(prom_scraped.url)
    try:
        yield b
    finally:
        b.stop()


def _api_calls(b: faulty.FaultyBackend) -> list[bytes]:
    """The API requests `b` saw since its last `set` (method, target and body; no probes)."""
    return [k for k in b.seen if k.split(b" ", 1)[1].startswith(b"/api/v1/")]


def _config(prom: Any, gpu_only: faulty.FaultyBackend, **local: Any) -> dict[str, Any]:
    return {"backends": [{"name": "local", "url": prom.url, "retries": 0, **local},
                         {"name": "gpu", "url": gpu_only.url, "retries": 0,
                          "holds": {"metrics": ["DCGM_.*"]}}]}


def _both(config: dict[str, Any], direct_url: str, calls: list[tuple[str, str, dict[str, Any]]]
          ) -> list[tuple[httpx.Response, httpx.Response]]:
    """Each call through an in-process promaccel and straight to Prometheus."""
    async def run() -> list[tuple[httpx.Response, httpx.Response]]:
        app = create_app(build_config(config))
        out = []
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p",
                                         timeout=60) as ours, httpx.AsyncClient(base_url=direct_url, timeout=60) as theirs:
                for method, path, kw in calls:
                    out.append((await ours.request(method, path, **kw), await theirs.request(method, path, **kw)))
        return out
    return asyncio.run(run())


@pytest.mark.prom
def test_fanned_out_answers_equal_prometheus(prom_scraped: Any, gpu_only: faulty.FaultyBackend) -> None:
    prom = prom_scraped
    window = {"start": str(prom.start_s), "end": str(prom.end_s)}
    gpu = {"match[]": 'DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-node-000[0-3]"}', **window}
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/api/v1/series", {"params": gpu}),
        ("POST", "/api/v1/series", {"data": gpu}),
        ("GET", "/api/v1/labels", {"params": window}),
        ("GET", "/api/v1/labels", {"params": {"match[]": "DCGM_FI_DEV_FB_USED", **window}}),
        ("GET", "/api/v1/label/Hostname/values", {"params": window}),
        ("GET", "/api/v1/label/gpu/values", {"params": {"match[]": "DCGM_FI_DEV_GPU_TEMP"}}),
        ("GET", "/api/v1/metadata", {}),
        ("GET", "/api/v1/metadata", {"params": {"metric": "prometheus_http_requests_total"}}),
    ]
    gpu_only.set(None)  # healthy; forgets the requests it saw
    for ours, theirs in _both(_config(prom, gpu_only), prom.url, calls):
        assert theirs.status_code == 200 and ours.status_code == 200, ours.text
        mine, want = ours.json(), theirs.json()
        assert mine["data"] == want["data"] and "warnings" not in mine, ours.request.url
        assert len(mine["data"]) > 0
    # The GPU backend was asked for the DCGM series/labels/values and the calls naming no metric,
    # not for the metadata of a metric it does not hold.
    asked = _api_calls(gpu_only)
    assert len(asked) == 7 and not any(b"prometheus_http_requests_total" in k for k in asked)


@pytest.mark.prom
def test_a_backend_holding_nothing_asked_for_is_not_asked(prom_scraped: Any, gpu_only: faulty.FaultyBackend) -> None:
    gpu_only.set(None)
    ((ours, theirs),) = _both(_config(prom_scraped, gpu_only), prom_scraped.url,
                              [("GET", "/api/v1/series", {"params": {"match[]": "node_load1"}})])
    assert ours.json() == theirs.json() and _api_calls(gpu_only) == []


@pytest.mark.prom
def test_a_failing_backend_is_left_out_with_a_warning_naming_it(prom_scraped: Any,
                                                               gpu_only: faulty.FaultyBackend) -> None:
    gpu_only.set("json503", first=None)
    try:
        ((ours, theirs),) = _both(_config(prom_scraped, gpu_only), prom_scraped.url,
                                  [("GET", "/api/v1/label/Hostname/values", {})])
    finally:
        gpu_only.set(None)
    assert ours.status_code == 200
    body = ours.json()
    assert body["data"] == theirs.json()["data"]  # the local backend holds it all too
    (warning,) = body["warnings"]
    assert "'gpu'" in warning and "HTTP 503" in warning and "missing" in warning


@pytest.mark.prom
def test_every_backend_failing_relays_the_first_failure(prom_scraped: Any, gpu_only: faulty.FaultyBackend) -> None:
    from tests.servers import free_port

    cfg = _config(prom_scraped, gpu_only)
    cfg["backends"][0]["url"] = f"http://127.0.0.1:{free_port()}"  # nobody listens
    gpu_only.set("json503", first=None)
    try:
        ((ours, _),) = _both(cfg, prom_scraped.url, [("GET", "/api/v1/labels", {})])
    finally:
        gpu_only.set(None)
    assert ours.status_code == 503 and ours.json()["status"] == "error"


@pytest.mark.prom
def test_a_bad_match_gets_prometheus_own_error(prom_scraped: Any, gpu_only: faulty.FaultyBackend) -> None:
    gpu_only.set(None)
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/api/v1/series", {"params": {"match[]": "DCGM_FI_DEV_GPU_UTIL{"}}),
        ("GET", "/api/v1/series", {}),  # no match[] at all
        ("GET", "/api/v1/labels", {"params": {"start": "yesterday"}}),
    ]
    for ours, theirs in _both(_config(prom_scraped, gpu_only), prom_scraped.url, calls):
        assert theirs.status_code == 400
        assert ours.status_code == 400 and ours.json() == theirs.json()
