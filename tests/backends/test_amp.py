"""AMP backends over real sockets.

1. `Backend` (kind amp) against the AMP-compatible endpoint served by uvicorn in a thread,
   upstream faked: signing through both transports (aiohttp re-quotes URLs through yarl),
   throttling retried within budget and deadline, Retry-After honoured.
2. End to end (`prom`): the endpoint as a subprocess in front of the real Prometheus,
   promaccel configured with an AMP backend in front of that. Answers equal Prometheus's
   directly, also at 30% throttling; buildinfo answered although AMP 404s it; the AMP
   threshold parameters reach the backend; no secret in promaccel's log or /metrics.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import orjson
import pytest
from botocore.credentials import Credentials
from prometheus_client.parser import text_string_to_metric_families

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY, AmpEndpoint, AmpSettings, serve_in_thread
from proxy.backends import Backend
from proxy.backends.sigv4 import CredentialSource, SigV4Signer
from proxy.config import BackendConfig
from proxy.observe.metrics import METRICS
from tests.equivalence import metadata_problems, response_problems
from tests.servers import ROOT, Promaccel, free_port, stop, wait_http

SESSION_KEY = "ASIAEXAMPLESESSION01"
SESSION_SECRET = "sessionSecretEXAMPLE/K7MDENG+bPxRfiCYtest"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLEsessionTOKEN/with+plus=="
THRESHOLDS = {"max_samples_processed_warning_threshold": "1000000",
              "max_samples_processed_error_threshold": "500000000"}


def _aws_env(key: str, secret: str, token: str | None = None) -> dict[str, str]:
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
           # Never reach for instance metadata (off the loopback) or a developer's files.
           "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds"}
    if token:
        env["AWS_SESSION_TOKEN"] = token
    return env


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    for k, v in _aws_env(TEST_ACCESS_KEY, TEST_SECRET_KEY).items():
        monkeypatch.setenv(k, v)


# --- 1. Backend against the endpoint, upstream faked ------------------------------------------


class Upstream:
    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    def params(self, i: int = -1) -> list[tuple[str, str]]:
        r = self.seen[i]
        pairs = parse_qsl(r.url.query.decode(), keep_blank_values=True)
        return (parse_qsl(r.content.decode(), keep_blank_values=True) if r.method == "POST" else []) + pairs


@dataclass
class Served:
    amp: AmpEndpoint
    upstream: Upstream
    url: str


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    upstream = Upstream()
    settings: dict[str, Any] = getattr(request, "param", {})
    amp = AmpEndpoint(AmpSettings(upstream="http://prom.test", **settings), transport=upstream.transport)
    with serve_in_thread(amp.app) as url:
        yield Served(amp, upstream, url + "/workspaces/ws-test")


def _backend(url: str, name: str, **cfg: Any) -> Backend:
    return Backend(BackendConfig(name=name, kind="amp", url=url, region="us-east-1", **cfg))


def _metric(name: str, **labels: str) -> float:
    return METRICS.registry.get_sample_value(name, labels) or 0.0


AWKWARD = [
    ("query", 'sum by (Hostname) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1e+3'),
    ("query2", 'up{instance=~"10\\\\.42\\\\..+", team="温度 ü", x="a&b=c;%2B#?/~"}'),
    ("empty", ""),
]


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_backend_signs_get_and_post(served: Served, aws_env: None, transport: str) -> None:
    async def go() -> list[int]:
        backend = _backend(served.url, f"amp-sign-{transport}", transport=transport)
        try:
            out = [(await backend.request("GET", "/api/v1/query", params=AWKWARD)).status]
            assert served.upstream.params() == AWKWARD
            out.append((await backend.request("POST", "/api/v1/query", form=AWKWARD)).status)
            assert served.upstream.params() == AWKWARD
            out.append((await backend.request("GET", "/api/v1/label/Hostname/values")).status)
            out.append((await backend.request("POST", "/api/v1/series", form=[("match[]", "a"), ("match[]", "b+c")])).status)
            assert served.upstream.params() == [("match[]", "a"), ("match[]", "b+c")]
            return out
        finally:
            await backend.aclose()

    assert asyncio.run(go()) == [200, 200, 200, 200]
    assert served.amp.stats.rejected == {}


@pytest.mark.parametrize("served", [{"throttle_ratio": 1.0, "retry_after_s": 0}], indirect=True)
def test_throttling_retries_are_bounded(served: Served, aws_env: None) -> None:
    async def go() -> int:
        backend = _backend(served.url, "amp-bounded", throttle_retries=3)
        try:
            return (await backend.request("POST", "/api/v1/query", form=[("query", "up")])).status
        finally:
            await backend.aclose()

    assert asyncio.run(go()) == 429  # AMP's answer, relayed once the budget is spent
    stats = served.amp.stats.as_json()
    assert stats["requests"] == 4 and stats["max_attempts"] == 4 and stats["throttled"] == 4
    assert _metric("promaccel_backend_throttled_total", backend="amp-bounded", code="429", outcome="retried") == 3
    assert _metric("promaccel_backend_throttled_total", backend="amp-bounded", code="429", outcome="gave_up") == 1
    assert served.upstream.seen == []


@pytest.mark.parametrize("served", [{"throttle_ratio": 1.0, "retry_after_s": 1}], indirect=True)
def test_retry_after_is_honoured(served: Served, aws_env: None) -> None:
    async def go() -> tuple[int, float]:
        backend = _backend(served.url, "amp-retry-after", throttle_retries=1)
        try:
            t0 = time.monotonic()
            reply = await backend.request("GET", "/api/v1/query", params=[("query", "up")])
            return reply.status, time.monotonic() - t0
        finally:
            await backend.aclose()

    status, elapsed = asyncio.run(go())
    assert status == 429 and served.amp.stats.as_json()["requests"] == 2
    assert elapsed >= 1.0
    assert _metric("promaccel_backend_throttle_wait_seconds_total", backend="amp-retry-after") >= 1.0


@pytest.mark.parametrize("served", [{"throttle_ratio": 1.0, "retry_after_s": 30}], indirect=True)
def test_throttle_waits_never_pass_the_deadline(served: Served, aws_env: None) -> None:
    async def go() -> tuple[int, float]:
        backend = _backend(served.url, "amp-deadline")
        try:
            t0 = time.monotonic()
            reply = await backend.request("GET", "/api/v1/query", params=[("query", "up")], timeout_s=2)
            return reply.status, time.monotonic() - t0
        finally:
            await backend.aclose()

    status, elapsed = asyncio.run(go())
    assert status == 429 and elapsed < 1.5
    assert served.amp.stats.as_json()["requests"] == 1


@pytest.mark.parametrize("served", [{"throttle_ratio": 0.4, "retry_after_s": 0, "seed": 3}], indirect=True)
def test_throttled_calls_succeed_on_retry(served: Served, aws_env: None) -> None:
    async def go() -> list[int]:
        backend = _backend(served.url, "amp-recover", throttle_retries=10, max_parallel=8)
        try:
            replies = await asyncio.gather(*(
                backend.request("POST", "/api/v1/query", form=[("query", f"up{i}")], limited=True)
                for i in range(20)))
            return [r.status for r in replies]
        finally:
            await backend.aclose()

    assert asyncio.run(go()) == [200] * 20
    stats = served.amp.stats.as_json()
    assert stats["throttled"] >= 4 and stats["forwarded"] == 20
    assert stats["requests"] == 20 + stats["throttled"] and stats["max_attempts"] <= 11


@pytest.mark.parametrize("served", [{"error_ratio": 1.0, "error_status": 503}], indirect=True)
def test_503_is_retried_like_throttling(served: Served, aws_env: None) -> None:
    async def go() -> int:
        backend = _backend(served.url, "amp-503", throttle_retries=2)
        try:
            return (await backend.request("GET", "/api/v1/query", params=[("query", "up")])).status
        finally:
            await backend.aclose()

    assert asyncio.run(go()) == 503
    assert served.amp.stats.as_json()["requests"] == 3
    assert _metric("promaccel_backend_throttled_total", backend="amp-503", code="503", outcome="gave_up") == 1


def test_amp_region_comes_from_the_workspace_url() -> None:
    from proxy.config import ConfigError, build_config

    cfg = build_config({"backends": [{"name": "amp", "kind": "amp",
                                      "url": "https://aps-workspaces.ap-southeast-2.amazonaws.com/workspaces/ws-1"}]})
    assert cfg.backends[0].region == "ap-southeast-2"
    assert cfg.backends[0].service == "aps" and cfg.backends[0].throttle_retries == 5
    with pytest.raises(ConfigError, match="region is required for kind amp"):
        build_config({"backends": [{"name": "amp", "kind": "amp", "url": "http://127.0.0.1:1/workspaces/ws"}]})


# --- 2. End to end over the real Prometheus -------------------------------------------------


@dataclass
class AmpProcess:
    url: str
    proc: subprocess.Popen[bytes]

    @property
    def workspace(self) -> str:
        return self.url + "/workspaces/ws-test"

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/__stats", timeout=10).json())

    def reset(self) -> None:
        httpx.post(self.url + "/__reset", timeout=10)

    @classmethod
    def start(cls, upstream: str, workdir: Path, *args: str, env: dict[str, str] | None = None) -> AmpProcess:
        import os

        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = workdir / f"amp-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "loadtests.amp_endpoint", "--upstream", upstream, "--port", str(port), *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT), env={**os.environ, **(env or {})},
            )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/__stats", proc, timeout=30, log=log)
        return cls(url, proc)


def _config(path: Path, workspace_url: str, region: str = "us-east-1", **extra: Any) -> Path:
    backend = {"name": "amp", "kind": "amp", "url": workspace_url, "region": region, **extra}
    path.write_text(orjson.dumps({"backends": [backend]}).decode())  # JSON is YAML
    return path


@dataclass
class Stack:
    amp: AmpProcess
    proxy: Promaccel


@pytest.fixture(scope="module")
def stacks(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    """"clean": AMP endpoint with no faults; "throttled": 30% 429s and temporary (session)
    credentials, promaccel logging at info; "wrong_region": promaccel signing for the wrong
    region."""
    work = tmp_path_factory.mktemp("amp")
    running: list[Any] = []
    try:
        # AMP refuses instant queries reading >= 32 d; scaled down to the 6 h test fleet.
        clean = AmpProcess.start(prom.url, work, "--seed", "1", "--instant-range-limit", "2h")
        running.append(clean)
        throttled = AmpProcess.start(
            prom.url, work, "--throttle-ratio", "0.3", "--retry-after", "0", "--seed", "7",
            env={"AMP_ENDPOINT_ACCESS_KEY_ID": SESSION_KEY, "AMP_ENDPOINT_SECRET_ACCESS_KEY": SESSION_SECRET,
                 "AMP_ENDPOINT_SESSION_TOKEN": SESSION_TOKEN})
        running.append(throttled)
        planned = ("--split-interval", "1h", "--shards", "4")
        out: dict[str, Stack] = {}
        for name, amp, cfg, env, extra in (
            ("clean", clean, {}, _aws_env(TEST_ACCESS_KEY, TEST_SECRET_KEY), ()),
            ("throttled", throttled, {"throttle_retries": 8},
             _aws_env(SESSION_KEY, SESSION_SECRET, SESSION_TOKEN), ("--log-level", "info")),
            ("wrong_region", clean, {"region": "eu-west-1"}, _aws_env(TEST_ACCESS_KEY, TEST_SECRET_KEY),
             ("--log-level", "info")),
        ):
            path = _config(work / f"{name}.yaml", amp.workspace, **cfg)
            proxy = Promaccel.start(None, planned + extra, work, config=path, env=env)
            running.append(proxy)
            out[name] = Stack(amp, proxy)
        yield out
    finally:
        for r in reversed(running):
            if isinstance(r, AmpProcess):
                stop(r.proc)
            else:
                r.stop()


DASHBOARD = {
    "util_by_node": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "fb_used_by_namespace": "sum by (namespace) (DCGM_FI_DEV_FB_USED)",
    "fb_total_plus": "sum by (Hostname) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
    "temp_top10": "topk(10, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    "power_total": "sum(DCGM_FI_DEV_POWER_USAGE)",
    "xid_count": "count(DCGM_FI_DEV_XID_ERRORS > 0)",
    "nvlink_by_node": "sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]))",
    "net_rx_by_instance": "sum by (instance) (rate(node_network_receive_bytes_total[5m]))",
    "pod_phases": "sum by (phase) (kube_pod_status_phase)",
    "energy_increase": "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h]))",
    "regex_escaped": 'avg(node_network_receive_bytes_total{instance=~"gpu-node-000\\\\d.*:9100"})',
    "unicode_matcher": 'count by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!="ünïcode ✓ + x"})',
    "tensor_by_ns": "avg by (namespace) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) * 100",
}


def _requests(prom: Any) -> list[tuple[str, str, dict[str, str]]]:
    out = []
    for name, q in sorted(DASHBOARD.items()):
        out.append((name, "/api/v1/query_range",
                    {"query": q, "start": str(prom.end_s - 4 * 3600), "end": str(prom.end_s - 3600), "step": "60"}))
        out.append((name, "/api/v1/query", {"query": q, "time": str(prom.end_s - 2 * 3600 + 7)}))
    return out


def _check_equal(prom: Any, proxy: Promaccel) -> None:
    problems = []
    for i, (name, path, params) in enumerate(_requests(prom)):
        direct = httpx.post(prom.url + path, data=params, timeout=60)
        # Alternate GET and POST on the client side; promaccel signs both kinds backend-side.
        proxied = (httpx.get(proxy.url + path, params=params, timeout=120) if i % 2
                   else httpx.post(proxy.url + path, data=params, timeout=120))
        diff = response_problems(direct, proxied)
        if diff:
            problems.append(f"{name} {path}: {diff[:3]}")
    assert problems == []


def _metrics(proxy: Promaccel) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


@pytest.mark.prom
def test_dashboard_through_amp_equals_prometheus(prom: Any, stacks: dict[str, Stack]) -> None:
    stack = stacks["clean"]
    stack.amp.reset()
    _check_equal(prom, stack.proxy)
    stats = stack.amp.stats()
    assert stats["rejected"] == {} and stats["forwarded"] > len(DASHBOARD) * 2
    assert set(stats["by_status"]) == {"200"}


@pytest.mark.prom
def test_metadata_through_amp_equals_prometheus(prom_scraped: Any, stacks: dict[str, Stack]) -> None:
    prom = prom_scraped
    proxy = stacks["clean"].proxy
    full = httpx.get(prom.url + "/api/v1/metadata", timeout=60).json()["data"]
    window = {"start": str(prom.end_s - 3 * 3600), "end": str(prom.end_s - 3600)}
    cases = [
        ("/api/v1/series", [("match[]", "DCGM_FI_DEV_XID_ERRORS"), ("match[]", 'kube_pod_status_phase{phase="Running"}'),
                            *window.items()]),
        ("/api/v1/labels", [("match[]", "DCGM_FI_DEV_GPU_UTIL"), *window.items()]),
        ("/api/v1/label/Hostname/values", list(window.items())),
        ("/api/v1/metadata", [("limit", "5")]),
        ("/api/v1/metadata", [("limit_per_metric", "1")]),
        ("/api/v1/metadata", [("metric", "prometheus_http_requests_total")]),
        ("/api/v1/metadata", []),
    ]
    for path, params in cases:
        direct = httpx.get(prom.url + path, params=params, timeout=60)
        replies = [httpx.get(proxy.url + path, params=params, timeout=60)]
        if path in ("/api/v1/series", "/api/v1/labels"):
            replies.append(httpx.post(proxy.url + path, content=str(httpx.QueryParams(params)).encode(),
                                      headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60))
        for proxied in replies:
            assert proxied.status_code == direct.status_code == 200, (path, proxied.text)
            d, p = direct.json(), proxied.json()
            assert d["data"], (path, params, "the reference answer is empty: nothing compared")
            if path == "/api/v1/series":
                key = lambda s: sorted(s.items())  # noqa: E731
                assert sorted(d["data"], key=key) == sorted(p["data"], key=key)
            elif path == "/api/v1/metadata":
                assert metadata_problems(params, d, p, full) == [], params
            else:
                assert d == p, path


@pytest.mark.prom
def test_throttled_amp_still_answers_right(prom: Any, stacks: dict[str, Stack], record_property: Any) -> None:
    stack = stacks["throttled"]
    stack.amp.reset()
    t0 = time.monotonic()
    _check_equal(prom, stack.proxy)
    elapsed = time.monotonic() - t0
    stats = stack.amp.stats()
    _, samples = _metrics(stack.proxy)
    retried = sum(v for (n, labels), v in samples.items()
                  if n == "promaccel_backend_throttled_total" and ("outcome", "retried") in labels)
    gave_up = sum(v for (n, labels), v in samples.items()
                  if n == "promaccel_backend_throttled_total" and ("outcome", "gave_up") in labels)
    wait = sum(v for (n, _), v in samples.items() if n == "promaccel_backend_throttle_wait_seconds_total")
    record_property("throttled_calls", stats["throttled"])
    record_property("elapsed_s", round(elapsed, 2))
    record_property("throttle_wait_s", round(wait, 3))
    # About 30% of calls were throttled, every one retried, none more than the budget allows.
    assert stats["throttled"] >= 0.15 * stats["requests"]
    assert stats["max_attempts"] <= 8 + 1
    assert stats["requests"] == stats["distinct_requests"] + stats["throttled"]
    assert gave_up == 0 and retried >= stats["throttled"]  # >=: metrics count since start
    assert set(stats["by_status"]) <= {"200", "429"}


@pytest.mark.prom
def test_buildinfo_answered_although_amp_404s(stacks: dict[str, Stack]) -> None:
    stack = stacks["clean"]
    signer = SigV4Signer("us-east-1", "aps", CredentialSource(credentials=Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY)))
    url = stack.amp.workspace + "/api/v1/status/buildinfo"
    host = url.split("/")[2]
    signed = signer.sign("GET", url, [("host", host)], b"")
    direct = httpx.get(signed.url, headers=signed.headers, timeout=10)
    assert direct.status_code == 404
    stack.amp.reset()
    resp = httpx.get(stack.proxy.url + "/api/v1/status/buildinfo", timeout=10)
    assert resp.status_code == 200
    data = resp.json()["data"]
    assert data["version"] == "2.42.0" and "promaccel" in data
    assert stack.amp.stats()["by_status"] == {"404": 1}  # it asked, AMP said no


@pytest.mark.prom
def test_sample_thresholds_reach_amp(prom: Any, stacks: dict[str, Stack]) -> None:
    stack = stacks["clean"]
    stack.amp.reset()
    q = "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"
    instant = {"query": q, "time": str(prom.end_s - 3600), **THRESHOLDS}
    ranged = {"query": q, "start": str(prom.end_s - 3 * 3600), "end": str(prom.end_s - 3600), "step": "120",
              **THRESHOLDS}
    assert httpx.post(stack.proxy.url + "/api/v1/query", data=instant, timeout=60).status_code == 200
    assert httpx.get(stack.proxy.url + "/api/v1/query_range", params=ranged, timeout=60).status_code == 200
    stats = stack.amp.stats()
    for name in THRESHOLDS:
        # Every query call carried them (label-value lookups for sharding do not).
        assert stats["params"].get(name) == stats["params"]["query"], stats["params"]


@pytest.mark.prom
def test_wrong_region_is_refused_and_relayed(prom: Any, stacks: dict[str, Stack]) -> None:
    proxy = stacks["wrong_region"].proxy
    resp = httpx.post(proxy.url + "/api/v1/query", data={"query": "up", "time": str(prom.end_s - 60)}, timeout=30)
    # AWS's own error shape becomes Prometheus's, naming the backend and keeping AWS's message.
    assert resp.status_code == 403
    assert resp.json() == {"status": "error", "errorType": "unavailable",
                           "error": "backend 'amp' answered /api/v1/query with HTTP 403: "
                                    "Credential should be scoped to a valid region. "}
    assert httpx.get(proxy.url + "/-/ready", timeout=10).status_code == 503


@pytest.mark.prom
def test_no_secret_in_promaccel_logs_or_metrics(stacks: dict[str, Stack]) -> None:
    for name, stack in stacks.items():
        text, _ = _metrics(stack.proxy)
        log = stack.proxy.log.read_text(errors="replace")
        ui = httpx.get(stack.proxy.url + "/ui/data.json", timeout=10).text
        assert '"backends":[{"name":"amp","kind":"amp"' in ui  # the operator page names it, no more
        assert stack.amp.workspace.split("//")[1] not in ui
        for secret in (TEST_SECRET_KEY, SESSION_SECRET, SESSION_TOKEN, "Signature=", "AWS4-HMAC-SHA256"):
            assert secret not in log, (name, secret)
            assert secret not in text, (name, secret)
            assert secret not in ui, (name, secret)


@pytest.mark.prom
def test_samples_processed_reported(prom: Any, stacks: dict[str, Stack]) -> None:
    """AMP bills by samples processed: planned calls carry stats=all, and promaccel reports the
    count per answer (header) and per backend (/metrics), matching Prometheus's own count."""
    proxy = stacks["clean"].proxy
    q = "sum by (namespace) (DCGM_FI_DEV_POWER_USAGE)"
    start, end = prom.end_s - 3 * 3600, prom.end_s - 600
    _, before = _metrics(proxy)
    r = httpx.post(proxy.url + "/api/v1/query_range", data={
        "query": q, "start": str(start), "end": str(end), "step": "60"}, timeout=60)
    assert r.status_code == 200
    reported = int(r.headers["X-Promaccel-Samples-Processed"])
    direct = httpx.post(prom.url + "/api/v1/query_range", data={
        "query": q, "start": str(start), "end": str(end), "step": "60", "stats": "all"}, timeout=60).json()
    expected = direct["data"]["stats"]["samples"]["totalQueryableSamples"]
    # Pieces and shards each count their own samples; each time piece re-reads the lookback
    # before its first step, so the total is a little above one whole query's.
    assert expected > 0 and expected <= reported <= expected * 1.1
    assert "stats" not in r.json()["data"]
    _, after = _metrics(proxy)
    key = ("promaccel_backend_samples_processed_total", (("backend", "amp"),))
    assert after.get(key, 0) - before.get(key, 0) == reported
    # The operator page lists it with the same count.
    recent = httpx.get(proxy.url + "/ui/data.json", timeout=10).json()["data"]["recent"]
    row = next(q for q in recent if q["query_id"] == r.headers["X-Promaccel-Query-Id"])
    assert row["samples_processed"] == reported and row["query"] == q


@pytest.mark.prom
@pytest.mark.parametrize(("query", "refused"), [
    ("sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h]))", True),
    ("scalar(sum(rate(node_network_receive_bytes_total[3h])))", True),
    # split into 1 h windows by the planner: never refused
    ("max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[150m]))", False),
])
def test_long_instant_windows_use_the_range_form(prom: Any, stacks: dict[str, Stack], query: str,
                                                 refused: bool) -> None:
    """AMP answers instant queries over long windows with 422 "only supported for range type
    queries": promaccel splits them where that is exact, and otherwise asks them as a
    one-step range query; either way it answers as Prometheus would."""
    stack = stacks["clean"]
    stack.amp.reset()
    params = {"query": query, "time": str(prom.end_s - 1200)}
    direct = httpx.post(prom.url + "/api/v1/query", data=params, timeout=60)
    proxied = httpx.post(stack.proxy.url + "/api/v1/query", data=params, timeout=60)
    assert proxied.status_code == direct.status_code == 200, proxied.text[:300]
    assert response_problems(direct, proxied) == []
    by_status = stack.amp.stats()["by_status"]
    assert (by_status.get("422", 0) >= 1) == refused and by_status.get("200", 0) >= 1, by_status
