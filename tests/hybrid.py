"""Hybrid fixtures: real Prometheus backends that each hold a slice of one generated fleet.

The CI fleet (`loadtests.gen.CI_SPEC`: 16 nodes x 4 GPUs, 2026-10-31T18:00Z .. 2026-11-01T00:00Z)
is generated once per slice with a `loadtests.load.Selection` (time windows, metric names)
and loaded with promtool into its own TSDB under `.cache/testdata/hybrid/<scenario>-<backend>`
(rebuilt only when the generator, the spec or the selection changes; each session serves a
copy of it). The reference is the session's `prom` fixture: the same generation, everything.

Scenarios (T = start + 3 h = 2026-10-31T21:00Z; local is primary in each):

    by_time    amp    data [start, T+30m]              holds {until: 2026-10-31T21:30:00Z}
               local  data [T, end)                    holds {since: 2026-10-31T21:00:00Z}
    by_metric  amp    DCGM_* only, all the window      holds {metrics: [DCGM_.*]}
               local  node_*, kube_*, up, all window   holds {metrics: [node_.*, kube_.*, up]}
    overlap    amp    everything but its outage        holds {metrics: ["*"]}
                      [22:40, 23:55)
               local  the last 4 h [20:00, end) but    holds {since: 2026-10-31T20:00:00Z}
                      its outage [20:10, 21:25)

The "amp" backend of each scenario sits behind the project's SigV4-verifying AMP endpoint
(`python -m loadtests.amp_endpoint`, fixed test credentials); promaccel is started with a YAML
config listing both backends (`kind: amp` with env credentials for amp), time-split by the
hour and sharded in 4 (`PLANNED`).

Fixtures (registered in tests/conftest.py):
    hybrid_slices     session: {(scenario, backend): SliceServer} - the six slice Prometheus
    hybrid            session: {scenario: Scenario} - AMP endpoint + promaccel per scenario
    hybrid_throttled  session: Scenario over by_metric's slices, its AMP endpoint answering
                      30% of requests with 429 (Retry-After 0)
    amp_down          function: a scenario (indirect param, default by_time) with its AMP
                      endpoint stopped; `.amp.restart()` brings it back on the same port
                      (always restarted at teardown)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY
from loadtests.gen import CI_SPEC, FleetSpec, iso_utc
from loadtests.load import Selection, start_prometheus, stop_prometheus
from tests.servers import ROOT, Promaccel, built_tsdb, free_port, require, serving_copy, stop, wait_http

DATA_ROOT = Path(os.environ.get("PROMACCEL_TEST_DATA", ROOT / ".cache" / "testdata"))

SPEC: FleetSpec = CI_SPEC
START, END = SPEC.start, SPEC.end
HOUR, MIN = 3600, 60
T = START + 3 * HOUR  # 2026-10-31T21:00:00Z, on a 1 h boundary
BY_TIME_AMP_UNTIL = T + 30 * MIN  # amp holds samples <= this time (closed window)
OVERLAP_SINCE = END - 4 * HOUR  # local holds the last 4 h in `overlap`
# Whole-backend outages, 75 min each and 75 min apart: longer than the longest read window of
# the corpus (65 min), so each shows as missing steps that the overlap merge can see. (A gap
# shorter than a query's read window never leaves a step without data: proxy/result/overlap.py's
# documented limit.)
LOCAL_OUTAGE = (OVERLAP_SINCE + 10 * MIN, OVERLAP_SINCE + 85 * MIN)  # [20:10, 21:25)
AMP_OUTAGE = (END - 80 * MIN, END - 5 * MIN)  # [22:40, 23:55)
LOCAL_METRICS = ["node_.*", "kube_.*", "up"]
PLANNED = ("--split-interval", "1h", "--shards", "4")
WORKSPACE = "ws-test"
REGION = "us-east-1"


@dataclass(frozen=True)
class SliceSpec:
    """One backend of a scenario: what its Prometheus holds (`select`, data) and what its
    promaccel config says it holds (`holds`)."""

    scenario: str
    backend: str  # "amp" | "local"
    select: Selection
    holds: dict[str, Any] | list[dict[str, Any]]
    primary: bool

    @property
    def key(self) -> tuple[str, str]:
        return (self.scenario, self.backend)


def _slices() -> list[SliceSpec]:
    def win(*pairs: tuple[int, int]) -> Selection:
        return Selection(windows=tuple(pairs))

    return [
        SliceSpec("by_time", "local", win((T, END)), {"since": iso_utc(T)}, True),
        # [from, to) in whole seconds: `to` one past the last held second (closed `until`).
        SliceSpec("by_time", "amp", win((START, BY_TIME_AMP_UNTIL + 1)), {"until": iso_utc(BY_TIME_AMP_UNTIL)}, False),
        SliceSpec("by_metric", "local", Selection(metrics="|".join(LOCAL_METRICS)), {"metrics": LOCAL_METRICS}, True),
        SliceSpec("by_metric", "amp", Selection(metrics="DCGM_.*"), {"metrics": ["DCGM_.*"]}, False),
        SliceSpec("overlap", "local", win((OVERLAP_SINCE, LOCAL_OUTAGE[0]), (LOCAL_OUTAGE[1], END)),
                  {"since": iso_utc(OVERLAP_SINCE)}, True),
        SliceSpec("overlap", "amp", win((START, AMP_OUTAGE[0]), (AMP_OUTAGE[1], END)), {"metrics": ["*"]}, False),
        # both at once: DCGM_* moved to AMP, which holds it until T+30m; local holds node_*,
        # kube_*, up at all times and DCGM_* since T
        SliceSpec("both", "local",
                  Selection(union=(Selection(metrics="|".join(LOCAL_METRICS)),
                                   Selection(windows=((T, END),), metrics="DCGM_.*"))),
                  [{"metrics": LOCAL_METRICS}, {"metrics": ["DCGM_.*"], "since": iso_utc(T)}], True),
        SliceSpec("both", "amp", Selection(windows=((START, BY_TIME_AMP_UNTIL + 1),), metrics="DCGM_.*"),
                  {"metrics": ["DCGM_.*"], "until": iso_utc(BY_TIME_AMP_UNTIL)}, False),
    ]


SLICES: list[SliceSpec] = _slices()
SCENARIOS = ("by_time", "by_metric", "overlap", "both")


def aws_env() -> dict[str, str]:
    """promaccel's environment for the AMP backend: the endpoint's fixed test credentials,
    and nothing that would send botocore off the loopback or into a developer's files."""
    return {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds"}


# --- processes ------------------------------------------------------------------------------


@dataclass
class SliceServer:
    spec: SliceSpec
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    manifest: dict[str, Any]


@dataclass
class AmpProcess:
    """The AMP-compatible endpoint as a subprocess; restartable on the same port."""

    upstream: str
    port: int
    log: Path
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def workspace(self) -> str:
        return f"{self.url}/workspaces/{WORKSPACE}"

    @classmethod
    def start(cls, upstream: str, workdir: Path, *args: str) -> "AmpProcess":
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        amp = cls(upstream, port, workdir / f"amp-{port}.log", tuple(args))
        amp.restart()
        return amp

    def restart(self) -> None:
        if self.running:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_ENDPOINT_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loadtests.amp_endpoint", "--upstream", self.upstream, "--port", str(self.port),
                 "--region", REGION, "--workspace", WORKSPACE, *self.args],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env,
            )
        wait_http(self.url + "/__stats", self.proc, timeout=60, log=self.log)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/__stats", timeout=10).json())

    def reset(self) -> None:
        httpx.post(self.url + "/__reset", timeout=10)


@dataclass
class Scenario:
    name: str
    local: SliceServer
    amp_slice: SliceServer
    amp: AmpProcess
    proxy: Promaccel
    config: dict[str, Any] = field(default_factory=dict)


def build_slice(spec: SliceSpec) -> tuple[Path, dict[str, Any]]:
    data_dir = DATA_ROOT / "hybrid" / f"{spec.scenario}-{spec.backend}"
    manifest = built_tsdb(SPEC, data_dir, select=spec.select)
    return data_dir, manifest


def promaccel_config(scenario: str, local_url: str, amp_workspace: str) -> dict[str, Any]:
    by_name = {s.backend: s for s in SLICES if s.scenario == scenario}
    loc, amp = by_name["local"], by_name["amp"]
    return {
        "backends": [
            {"name": "local", "kind": "prometheus", "url": local_url, "holds": loc.holds, "primary": loc.primary},
            # No circuit breaker: test_amp_down_warns_and_caches_nothing_partial stops AMP for a
            # few queries and expects whole answers right after its restart (an open breaker
            # would go on answering without AMP for its cooldown, by design).
            {"name": "amp", "kind": "amp", "url": amp_workspace, "region": REGION, "holds": amp.holds,
             "primary": amp.primary, "throttle_retries": 8, "breaker": {"failures": 0}},
        ],
    }


def start_promaccel(name: str, cfg: dict[str, Any], workdir: Path) -> Promaccel:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.yaml"
    path.write_text(orjson.dumps(cfg, option=orjson.OPT_INDENT_2).decode())  # JSON is YAML
    return Promaccel.start(None, PLANNED, workdir, config=path, env=aws_env())


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hybrid_slices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], SliceServer]]:
    """The six slice Prometheus (three scenarios x amp/local), each on a free loopback port."""
    require("promtool")
    require("prometheus")
    logs = tmp_path_factory.mktemp("hybrid-prometheus")
    running: dict[tuple[str, str], SliceServer] = {}
    try:
        for spec in SLICES:
            built, manifest = build_slice(spec)
            # its own copy, as `prom` does: Prometheus locks its data directory
            data_dir = serving_copy(built, logs / f"{spec.scenario}-{spec.backend}")
            proc = start_prometheus(str(data_dir), log_path=str(logs / f"{spec.scenario}-{spec.backend}.log"))
            running[spec.key] = SliceServer(spec, proc.url, data_dir, proc, manifest)  # type: ignore[attr-defined]
        yield running
    finally:
        for s in running.values():
            stop_prometheus(s.proc)


@pytest.fixture(scope="session")
def hybrid(prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scenario]]:
    """Per scenario: the AMP endpoint in front of the amp slice, promaccel over both."""
    work = tmp_path_factory.mktemp("hybrid")
    amps: list[AmpProcess] = []
    proxies: list[Promaccel] = []
    try:
        out: dict[str, Scenario] = {}
        for name in SCENARIOS:
            local, amp_slice = hybrid_slices[(name, "local")], hybrid_slices[(name, "amp")]
            amp = AmpProcess.start(amp_slice.url, work, "--seed", "1")
            amps.append(amp)
            cfg = promaccel_config(name, local.url, amp.workspace)
            proxy = start_promaccel(name, cfg, work)
            proxies.append(proxy)
            out[name] = Scenario(name, local, amp_slice, amp, proxy, cfg)
        yield out
    finally:
        for p in proxies:
            p.stop()
        for a in amps:
            a.stop()


@pytest.fixture(scope="session")
def hybrid_throttled(prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """by_metric with its AMP endpoint throttling 30% of requests (429, Retry-After 0)."""
    work = tmp_path_factory.mktemp("hybrid-throttled")
    local, amp_slice = hybrid_slices[("by_metric", "local")], hybrid_slices[("by_metric", "amp")]
    amp = AmpProcess.start(amp_slice.url, work, "--throttle-ratio", "0.3", "--retry-after", "0", "--seed", "7")
    proxy = None
    try:
        cfg = promaccel_config("by_metric", local.url, amp.workspace)
        proxy = start_promaccel("by_metric-throttled", cfg, work)
        yield Scenario("by_metric_throttled", local, amp_slice, amp, proxy, cfg)
    finally:
        if proxy is not None:
            proxy.stop()
        amp.stop()


@pytest.fixture
def amp_down(request: pytest.FixtureRequest, hybrid: dict[str, Scenario]) -> Iterator[Scenario]:
    """A scenario (indirect parameter; default by_time) with its AMP endpoint stopped (call
    `.amp.restart()` to bring it back on the same port); always running again afterwards."""
    scenario = hybrid[getattr(request, "param", "by_time")]
    scenario.amp.stop()
    try:
        yield scenario
    finally:
        scenario.amp.restart()
