"""`make demo` end to end at a tiny size (4 nodes x 2 GPUs, 8 h; the dataset is built once for
the module): the hybrid topology starts with a Redis cache, the sample panel and the
cross-store join give the reference's answers, explain shows where the join runs, and every
command the demo prints works as printed. Stopped by SIGINT, SIGTERM or SIGHUP -- or killed
outright -- it leaves no process behind, and it comes back on the same fixed ports at once
(the previous run's connections still in TIME_WAIT). A port another process holds is an
error naming the flag."""

from __future__ import annotations

import calendar
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.corpus import QUERIES
from tests.servers import ROOT, free_port, require

pytestmark = pytest.mark.prom

TINY = ["--nodes", "4", "--gpus-per-node", "2", "--hours", "8"]
# the demo's children: reference, amp slice and local slice Prometheus, the AMP endpoint,
# redis-server, promaccel
CHILDREN = 6


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("prometheus")
    require("promtool")
    require("redis-server")
    return tmp_path_factory.mktemp("demo") / "demo"


@pytest.fixture(scope="module")
def fixed_ports() -> tuple[int, int]:
    """promaccel's and the reference's ports, the same for every run of the module."""
    return free_port(), free_port()


class Demo:
    """The demo as a child of this process, or (`under_parent`) of a shell that waits for it, as
    `make demo` is a child of make."""

    def __init__(self, data_dir: Path, ports: tuple[int, int], log: Path, under_parent: bool = False) -> None:
        self.log = log
        self.ports = ports
        command = [sys.executable, "-m", "loadtests.demo", *TINY, "--data-dir", str(data_dir),
                   "--port", str(ports[0]), "--prometheus-port", str(ports[1])]
        if under_parent:
            command = ["sh", "-c", 'exec 0</dev/null; "$@"; exit $?', "sh", *command]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(command, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while "serving; Ctrl-C" not in self.text:
            assert self.proc.poll() is None, f"the demo exited with {self.proc.returncode}:\n{self.text[-3000:]}"
            assert time.monotonic() < deadline, self.text[-3000:]
            time.sleep(0.2)

    def demo(self) -> psutil.Process:
        """The demo's own process (under a shell: the shell's one child)."""
        me = psutil.Process(self.proc.pid)
        if "loadtests.demo" in " ".join(me.cmdline()) and me.name() != "sh":
            return me
        (child,) = me.children()
        return child

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _alive(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# (signal, sent to): the demo itself, or the shell it runs under (`kill` of `make demo`).
STOPS = [(signal.SIGINT, "demo"), (signal.SIGTERM, "demo"), (signal.SIGHUP, "demo"),
         (signal.SIGKILL, "demo"), (signal.SIGTERM, "parent")]


@pytest.mark.parametrize(("sig", "target"), STOPS, ids=[f"{signal.Signals(s).name}-to-{t}" for s, t in STOPS])
def test_demo_serves_and_stops_everything(demo_dir: Path, fixed_ports: tuple[int, int], sig: int, target: str,
                                          tmp_path: Path) -> None:
    demo = Demo(demo_dir, fixed_ports, tmp_path / "demo.log", under_parent=target == "parent")
    try:
        demo.wait_serving()
        text = demo.text
        pa_url = f"http://127.0.0.1:{fixed_ports[0]}"
        # the same fixed ports on every run: a restart right after the previous one's stop
        assert f"Prometheus server URL {pa_url}" in text, text[-3000:]
        assert f"http://127.0.0.1:{fixed_ports[1]}" in text
        assert text.count("same answer       : yes") == 2, text[-3000:]
        assert "cache: Redis at redis://127.0.0.1:" in text and "(SigV4)" in text
        assert "route             : single amp" in text
        assert "route             : cross_store amp, local" in text, text[-3000:]
        assert re.search(r"promaccel evaluates: \* on \(Hostname\) group_left \(\) over\n"
                         r"    amp \(\d+ pieces\): avg by \(Hostname\) \(DCGM_FI_DEV_GPU_UTIL\)\n"
                         r"    local \(\d+ pieces\): label_replace\(", text), text[-3000:]
        assert "host.docker.internal" not in text
        main = demo.demo()
        direct, children = main.children(), main.children(recursive=True)
        assert len(direct) == CHILDREN, [c.cmdline()[:3] for c in direct]
        if (sig, target) == (signal.SIGTERM, "demo"):
            _try_what_it_prints(text, pa_url)
            _explain_agrees_in_the_demo_topology(pa_url, f"http://127.0.0.1:{fixed_ports[1]}", text)
        os.kill(demo.proc.pid, sig)
        survivors = _alive([main, *children], timeout=60)
        assert survivors == [], [(p.pid, p.cmdline()[:4]) for p in survivors]
        demo.proc.wait(10)
        if sig != signal.SIGKILL:
            assert f"stopped the {len(direct)} processes the demo started" in demo.text, demo.text[-2000:]
        if target == "demo" and sig != signal.SIGKILL:
            assert demo.proc.returncode == 0, demo.text[-2000:]
    finally:
        demo.kill()  # the demo's children are tied to it (PR_SET_PDEATHSIG)


def _try_what_it_prints(text: str, pa_url: str) -> None:
    """Every `$ ` line of the demo's "try this" block, run in a shell as printed; the README's
    Arrow example with the demo's times."""
    commands = [line.split("$ ", 1)[1] for line in text.splitlines() if line.startswith("  $ ")]
    assert len(commands) == 3, text[-3000:]
    outputs = []
    for command in commands:
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (command, out.stdout[-500:], out.stderr[-2000:])
        outputs.append(out.stdout)
    query, explain, arrow = outputs
    assert query.startswith('{"status":"success","data":{"resultType":"matrix","result":[{'), query[:300]
    assert '"kind":"cross_store"' in explain and '"evaluate":"* on (Hostname) group_left ()"' in explain, explain[:500]
    assert "labels: dictionary<values=map<string, string>, indices=int32" in arrow, arrow
    assert int(re.search(r"^(\d+) rows$", arrow, re.M).group(1)) > 0, arrow  # type: ignore[union-attr]
    # The README's Arrow example as printed (a shell command, run from the checkout), but for
    # the port: this demo's promaccel is not on 9091. Its times come from the clock, and the
    # demo's data ends at the hour it was built: a non-zero row count.
    example = readme_arrow_example()
    assert example.count("http://127.0.0.1:9091") == 1, example
    out = subprocess.run(["bash", "-c", example.replace("http://127.0.0.1:9091", pa_url)], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (example, out.stderr[-2000:])
    assert "labels: dictionary<values=map<string, string>" in out.stdout, out.stdout
    rows = re.search(r"^(\d+) rows$", out.stdout, re.M)
    assert rows and int(rows.group(1)) > 0, out.stdout[-500:]


def readme_arrow_example() -> str:
    """The README's Arrow example: the shell block under the `Accept: ...arrow.stream` bullet."""
    readme = (ROOT / "README.md").read_text()
    example = readme[readme.index("- `Accept: application/vnd.apache.arrow.stream`"):]
    example = example[example.index("```sh\n") + 6:]
    return textwrap.dedent(example[:example.index("```")])


def _explained(url: str, path: str, params: dict[str, str], reference: str) -> dict[str, Any]:
    """Explain's data for `params`, and the query itself answered: a query explain routes as
    unroutable is answered with that reason as its 422; any other error must be the reference
    Prometheus's too (PromQL's own, such as many-to-many matching)."""
    answer = httpx.post(url + path, data=params, timeout=120)
    explained = httpx.post(url + "/api/v1/explain", data=params, timeout=120)
    where = (answer.status_code, answer.text[:300], path, params)
    assert explained.status_code == 200, (*where, explained.text[:500])
    data: dict[str, Any] = explained.json()["data"]
    route = data.get("route") or {}
    assert route, (*where, "no route in explain")
    if route["kind"] == "unroutable":
        assert (answer.status_code, answer.json()["error"]) == (422, route["reason"]), (*where, route)
    elif answer.status_code != 200:
        direct = httpx.post(reference + path, data=params, timeout=120)
        assert (answer.status_code, answer.json().get("errorType")) == (
            direct.status_code, direct.json().get("errorType")), (*where, route, direct.text[:300])
    if route["kind"] == "cross_store":
        assert data["piece_count"] == int(answer.headers["X-Promaccel-Pieces"]), (*where, data["piece_count"])
    return data


def _explain_agrees_in_the_demo_topology(pa_url: str, prom_url: str, text: str) -> None:
    """The corpus over the demo's whole range (DCGM_* in amp throughout; node metrics only in
    the local Prometheus's last 6 h) and at an instant before the local one starts: explain and
    the query agree on what promaccel answers."""
    m = re.search(r"dataset: .*, (\S+ \S+) \.\. (\S+ \S+) UTC", text)
    assert m, text[-3000:]
    start, end = (calendar.timegm(time.strptime(g, "%Y-%m-%d %H:%M")) for g in m.groups())
    kinds: dict[str, int] = {}
    for query in QUERIES.values():
        for path, params in (("/api/v1/query_range", {"start": str(start + 600), "end": str(end), "step": "120"}),
                             ("/api/v1/query", {"time": str(start + 3600 + 7)})):
            data = _explained(pa_url, path, {"query": query, **params}, prom_url)
            kind = data["route"]["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
    # the topology is exercised (parts answered by one store, evaluation across the stores)
    # and every query of the corpus is answered
    assert {"single", "cross_store"} <= set(kinds) and "unroutable" not in kinds, kinds


def test_demo_rebuilds_a_dataset_that_ends_too_long_ago() -> None:
    """The README's examples ask for the last 6 h: a dataset that ends more than REUSE_HOURS
    (< 6) before the current hour is built again, to end at it (issue 30)."""
    from loadtests.demo import REUSE_HOURS, reusable
    from loadtests.gen import FleetSpec

    hour = int(time.time()) // 3600 * 3600
    assert REUSE_HOURS < 6
    for age, nodes, reused in ((0, 4, True), (REUSE_HOURS, 4, True), (REUSE_HOURS + 1, 4, False),
                               (48, 4, False), (0, 5, False)):
        spec = FleetSpec(nodes=nodes, gpus_per_node=2, hours=8, end=hour - age * 3600)
        assert reusable(spec, 4, hour) is reused, (age, nodes)


def test_demo_names_a_taken_port(demo_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as held:
        port = free_port()
        held.bind(("127.0.0.1", port))
        held.listen()
        out = subprocess.run(
            [sys.executable, "-m", "loadtests.demo", "--once", *TINY, "--data-dir", str(tmp_path / "unused"),
             "--port", str(port), "--prometheus-port", "0"],
            cwd=str(ROOT), capture_output=True, text=True, timeout=60,
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"port {port} on 127.0.0.1 is in use by another process" in out.stderr
    assert "--port N" in out.stderr
    assert not (tmp_path / "unused").exists()  # refused before building anything
