"""Session fixtures: a real Prometheus over generated GPU fleet data, real Redis, and
promaccel servers over real HTTP, each on a free loopback port, always stopped at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from loadtests.gen import CI_SPEC, FleetSpec
from tests.faulty import backend  # noqa: F401 -- fixture (a fault-injecting backend)
from tests.hybrid import amp_down, hybrid, hybrid_slices, hybrid_throttled  # noqa: F401 -- fixtures (hybrid fleets)
from tests.servers import ROOT, Promaccel, ProxyPool, RedisServer, built_tsdb, serving_copy

DATA_ROOT = Path(os.environ.get("PROMACCEL_TEST_DATA", ROOT / ".cache" / "testdata"))


def _share_httpx_tls_context() -> None:
    """Every `httpx.post()`/`httpx.get()` and every `httpx.Client()` builds a new default SSL
    context, loading certifi's CA bundle: ~40 ms of CPU each, thousands of times a session,
    although the suite only speaks plain HTTP on the loopback. Build that default context once
    per process and hand the same one to every client (an SSLContext is meant to be shared);
    any other `verify`/`cert` still gets its own. Connections, pools and timeouts are untouched."""
    import functools

    try:
        from httpx._transports import default as transports
    except ImportError:  # another httpx layout: nothing to share, only slower
        return
    original = getattr(transports, "create_ssl_context", None)
    if original is None or getattr(original, "_promaccel_shared", False):
        return
    made: dict[bool, Any] = {}

    @functools.wraps(original)
    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return original(verify=verify, cert=cert, trust_env=trust_env)
        if trust_env not in made:
            made[trust_env] = original(verify=verify, cert=cert, trust_env=trust_env)
        return made[trust_env]

    create_ssl_context._promaccel_shared = True  # type: ignore[attr-defined]
    transports.create_ssl_context = create_ssl_context  # type: ignore[assignment]


_share_httpx_tls_context()


# --- parallel runs: `make test` runs pytest -n 2 --dist loadfile ------------------------------
#
# With --dist loadfile each test file is one unit of work, run whole and in order on one xdist
# worker: its module fixtures start once, and a test that builds on the one before it (a warm
# cache after a cold query) still finds it. On top of xdist's loadfile (pytest_xdist_make_scheduler
# below): files in SPLIT_BY_TEST hold independent tests that are units each (the equivalence
# matrix: one promaccel per cell), and units go out longest first so the workers finish
# together. UNIT_COST is the seconds a file took in a two-worker run on the 2-core machine (per
# test for SPLIT_BY_TEST files), for the files over ~5 s; any other file counts 0.03 s per test.
# Only the order depends on these numbers, never what runs. Session fixtures (Prometheus, Redis,
# promaccel) start once per worker that needs them; cached data under .cache/testdata is built
# under a file lock and served from a per-worker copy (tests/servers.py: built_tsdb,
# serving_copy).

SPLIT_BY_TEST = {"tests/e2e/test_equivalence_matrix.py", "tests/e2e/test_hybrid_matrix.py"}
UNIT_COST: dict[str, float] = {
    "tests/e2e/test_hybrid.py": 240, "tests/e2e/test_hybrid_matrix.py": 45, "tests/cache/test_cache_integration.py": 160, "tests/harness/test_bench.py": 60,
    "tests/backends/test_amp.py": 45, "tests/shardplanner/test_instant_split.py": 45, "tests/e2e/test_hybrid_routing.py": 30,
    "tests/shardplanner/test_serialize.py": 28, "tests/e2e/test_equivalence_matrix.py": 25, "tests/codec/test_json_decode.py": 20,
    "tests/result/test_binop_prometheus.py": 19, "tests/e2e/test_passthrough_equivalence.py": 18,
    "tests/e2e/test_planned_equivalence.py": 16, "tests/api/test_clients.py": 16, "tests/api/test_bad_requests.py": 14,
    "tests/harness/test_gen.py": 12, "tests/result/test_overlap.py": 8, "tests/pipeline/test_step_reuse.py": 8, "tests/harness/test_demo.py": 50,
    "tests/cache/test_cache_redis.py": 7, "tests/shardplanner/test_timesplit.py": 6, "tests/shardplanner/test_planner.py": 6,
    "tests/backends/test_secrets_logging.py": 20, "tests/api/test_server_limits.py": 12, "tests/pipeline/test_security.py": 12,
    "tests/backends/test_tenancy.py": 8, "tests/backends/test_backend_auth.py": 6, "tests/api/test_relay_paths.py": 5,
    "tests/api/test_http_edges.py": 45, "tests/api/test_fuzz_endpoints.py": 35, "tests/pipeline/test_tracing.py": 30, "tests/harness/test_soak.py": 25, "tests/api/test_ui.py": 9, "tests/api/test_ui_browser.py": 8,
    "tests/backends/test_circuit.py": 50, "tests/pipeline/test_refusal_split.py": 35,
}


def _unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPLIT_BY_TEST else path


def _unit_cost(unit: str, tests: int) -> float:
    return UNIT_COST.get(unit.split("::", 1)[0], 0.03 * tests)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with SPLIT_BY_TEST files split and the longest units first. (xdist's
    loadgroup would do the split with markers, but it renames nodeids, which pytest 9 ignores.)"""
    if config.getoption("dist", "no") != "loadfile":
        return None
    try:
        from xdist.scheduler import LoadScopeScheduling
    except ImportError:
        return None

    class FileUnits(LoadScopeScheduling):  # type: ignore[misc,valid-type]
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # first call: schedule() has just filled the queue
                units = sorted(self.workqueue.items(), key=lambda u: _unit_cost(u[0], len(u[1])), reverse=True)
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return FileUnits(config, log)


# --- the equivalence report (tests/equivalence.py) ------------------------------------------
# Each xdist worker hands its tally to the controller in workeroutput; the controller (or a
# run without xdist) prints the sum at the end.

_WORKER_TALLIES: list[dict[str, int]] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.equivalence import TALLY

    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["equivalence_tally"] = {f"{s}\t{k}": n for (s, k), n in TALLY.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    tally = getattr(node, "workeroutput", {}).get("equivalence_tally")
    if tally:
        _WORKER_TALLIES.append(tally)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from collections import Counter

    from tests.equivalence import TALLY, report

    total: Counter[tuple[str, str]] = Counter(TALLY)
    for tally in _WORKER_TALLIES:
        for key, n in tally.items():
            suite, kind = key.split("\t")
            total[(suite, kind)] += n
    lines = report(total)
    if lines:
        terminalreporter.write_sep("=", "equivalence cases by reference answer")
        for line in lines:
            terminalreporter.write_line(line)


@dataclass
class PromServer:
    url: str
    spec: FleetSpec
    data_dir: Path

    @property
    def start_s(self) -> int:
        return self.spec.start

    @property
    def end_s(self) -> int:
        return self.spec.end


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    from loadtests.load import start_prometheus, stop_prometheus

    built = DATA_ROOT / "ci"
    built_tsdb(CI_SPEC, built)
    # Each session (each xdist worker) serves its own copy (3 MB): Prometheus locks its data
    # directory, and two test sessions on one machine must not share one.
    work = tmp_path_factory.mktemp("prometheus")
    data_dir = serving_copy(built, work / "data")
    log = work / "prometheus.log"
    # It scrapes itself every 5 s (a real target: metadata, targets); those samples are at the
    # wall clock, after the generated window every query reads.
    proc = start_prometheus(str(data_dir), log_path=str(log), scrape_self_s=5)
    try:
        yield PromServer(proc.url, CI_SPEC, data_dir)  # type: ignore[attr-defined]
    finally:
        stop_prometheus(proc)


@pytest.fixture(scope="session")
def prom_scraped(prom: PromServer) -> PromServer:
    """`prom` once it has scraped itself: its target is up and /api/v1/metadata holds several
    metrics with several entries' worth of fields (waits at most 60 s)."""
    import time

    import httpx

    deadline = time.monotonic() + 60
    while True:
        targets = httpx.get(prom.url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        metadata = httpx.get(prom.url + "/api/v1/metadata", timeout=10).json()["data"]
        if any(t["health"] == "up" for t in targets) and len(metadata) >= 20:
            return prom
        assert time.monotonic() < deadline, ("no metadata after 60 s", targets, len(metadata))
        time.sleep(0.5)


def _docker_answers() -> bool:
    import shutil
    import subprocess

    if os.environ.get("PROMACCEL_TEST_DOCKER", "auto") == "0" or shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's redis-server on a free loopback port; a testcontainers Redis instead only
    when a Docker engine answers (never the case on the development machines)."""
    if _docker_answers():
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.redis import RedisContainer  # type: ignore[no-redef]

        with RedisContainer("redis:7") as container:
            host, port = container.get_container_host_ip(), int(container.get_exposed_port(6379))
            yield SimpleNamespace(url=f"redis://{host}:{port}/0", port=port, stop=lambda: None)
        return
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def proxies(prom: PromServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyPool]:
    pool = ProxyPool(prom.url, tmp_path_factory.mktemp("promaccel"))
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="session")
def passthrough(proxies: ProxyPool) -> Promaccel:
    """promaccel with no acceleration: every query forwarded whole."""
    return proxies.get("--split-interval", "none", "--shards", "1")


@pytest.fixture(scope="session")
def planned(proxies: ProxyPool) -> Promaccel:
    """promaccel splitting by hour and sharding by node in 8."""
    return proxies.get("--split-interval", "1h", "--shards", "8")
