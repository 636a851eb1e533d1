"""Cross-store evaluation before and after a change, side by side in one run (issue 27): the
CI fleet split across two stores as the hybrid tests split it (`by_time`: a window straddling
the stores' boundary; `by_metric`: joins of DCGM_* held by one store with node_*/up held by the
other), asked of promaccel at two commits and of direct Prometheus over the whole data.

    python -m loadtests.crossstore_bench [--before 601647b] [--rounds 7]

Data: the CI fleet (`loadtests.gen.CI_SPEC`, 16 nodes x 4 GPUs x 6 h) sliced as tests/hybrid.py
slices it (T = start + 3 h):

    by_time    amp    [start, T+30m]        holds {until: T+30m}
               local  [T, end)              holds {since: T}     (primary)
    by_metric  amp    DCGM_.*               holds {metrics: [DCGM_.*]}
               local  node_.*, kube_.*, up  holds {metrics: [node_.*, kube_.*, up]}  (primary)

The TSDBs built by the test suite (.cache/testdata/hybrid/<scenario>-<backend>, .cache/testdata/ci)
are used when their manifests match; otherwise they are built under .cache/bench/crossstore/.
Each Prometheus serves its own copy. Both stores are plain `kind: prometheus` backends.

Before: a git worktree of `--before` (removed at the end), served by this venv's python from its
own directory; after: this checkout. Both get the same config files and `--split-interval 1h
--shards 4` (tests/hybrid.py's PLANNED). Each version runs two promaccel per scenario:

- cold: `cache: {enabled: false}` -- every ask fetches every piece and raw window from the
  stores again and evaluates (in-process metadata such as the metric-name list stays warm);
- warm: the default in-process cache, filled by a first ask that is not timed -- the repeats
  read pieces and raw windows from the cache and evaluate again.

Every server is asked each query once before timing (numba compilation, connections). Then
`--rounds` rounds; in each, the modes (before, after, direct) take turns in an order rotated
per round, so that noise from the shared machine hits all alike. Every answer is compared with
direct Prometheus's (loadtests.compare.diff_answers); a mismatch is reported and fails the run.
A last case, answered whole by one store (nothing evaluated in process), is the control: what
the rest of the request path costs in each version.

Prints a Markdown table: median wall time per mode and phase, after/before ratios, and each
promaccel's CPU time per ask (user + system from /proc over all its timed asks, divided: less
sensitive than wall time to the other load of a shared machine). Everything runs on 127.0.0.1
and is stopped at the end (the worktree removed); a failed run keeps its logs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.compare import diff_answers
from loadtests.gen import CI_SPEC, iso_utc
from loadtests.load import Selection, build_tsdb, is_built, start_prometheus, stop_prometheus
from loadtests.services import Promaccel

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = Path(os.environ.get("PROMACCEL_TEST_DATA", ROOT / ".cache" / "testdata"))
BENCH_DATA = ROOT / ".cache" / "bench" / "crossstore"

SPEC = CI_SPEC
START, END = SPEC.start, SPEC.end
HOUR, MIN = 3600, 60
T = START + 3 * HOUR  # 2026-10-31T21:00:00Z
AMP_UNTIL = T + 30 * MIN
LOCAL_METRICS = ["node_.*", "kube_.*", "up"]
PLANNED = ("--split-interval", "1h", "--shards", "4")


@dataclass(frozen=True)
class Slice:
    scenario: str
    backend: str  # "amp" | "local"
    select: Selection
    holds: dict[str, Any]
    primary: bool

    @property
    def name(self) -> str:
        return f"{self.scenario}-{self.backend}"


# The same selections as tests/hybrid.py's SLICES (so that its cached builds match).
SLICES = [
    Slice("by_time", "local", Selection(windows=((T, END),)), {"since": iso_utc(T)}, True),
    Slice("by_time", "amp", Selection(windows=((START, AMP_UNTIL + 1),)), {"until": iso_utc(AMP_UNTIL)}, False),
    Slice("by_metric", "local", Selection(metrics="|".join(LOCAL_METRICS)), {"metrics": LOCAL_METRICS}, True),
    Slice("by_metric", "amp", Selection(metrics="DCGM_.*"), {"metrics": ["DCGM_.*"]}, False),
]


@dataclass(frozen=True)
class Case:
    scenario: str
    label: str
    query: str
    start: int | None = None  # None: an instant query at `end`
    end: int = 0
    step: int = 0

    def form(self) -> dict[str, str]:
        if self.start is None:
            return {"query": self.query, "time": str(self.end)}
        return {"query": self.query, "start": str(self.start), "end": str(self.end), "step": str(self.step)}

    @property
    def path(self) -> str:
        return "/api/v1/query" if self.start is None else "/api/v1/query_range"


INCREASE = "sum by (Hostname) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h]))"
MAX_TEMP = "max_over_time(DCGM_FI_DEV_GPU_TEMP[2h])"
JOIN = ('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left label_replace(sum by (instance) '
        '(rate(node_network_receive_bytes_total[5m])), "Hostname", "$1", "instance", "(.+):9100")')
RATIO = "sum(DCGM_FI_DEV_POWER_USAGE) / sum(node_load1)"
QUANTILE = ('quantile(0.9, DCGM_FI_DEV_GPU_UTIL * on(Hostname) group_left() '
            'label_replace(up, "Hostname", "$1", "instance", "(.*):\\\\d+"))')
CASES = [
    Case("by_time", "increase[3h] range", INCREASE, T + 35 * MIN, T + 2 * HOUR, 53),
    Case("by_time", "max_over_time[2h] range", MAX_TEMP, T + 35 * MIN, T + 2 * HOUR, 53),
    Case("by_time", "increase[3h] instant", INCREASE, None, T + HOUR),
    Case("by_metric", "join rate range 6h", JOIN, START, END, 60),
    Case("by_metric", "power / load range 6h", RATIO, START, END, 60),
    Case("by_metric", "quantile join instant", QUANTILE, None, START + 4 * HOUR),
    # Control: one store answers it whole (routed, nothing evaluated in process).
    Case("by_metric", "control: one store, range 6h", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", START, END, 60),
]
VERSIONS = ("before", "after")


@contextlib.contextmanager
def _locked(data_dir: Path, exclusive: bool) -> Iterator[None]:
    """The lock tests/servers.py's built_tsdb takes beside a cached TSDB (a test session may be
    building it): shared while we read it, exclusive while we build."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(data_dir.with_name(data_dir.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def serving_copy(name: str, select: Selection | None, dest: Path) -> str:
    """A copy of the built TSDB for `select` for one Prometheus to serve (it locks and compacts
    its directory): the test suite's build when it matches, else ours (built if missing)."""
    tested = TEST_DATA / ("ci" if select is None else f"hybrid/{name}")
    ours = BENCH_DATA / name
    with _locked(tested, exclusive=False):
        if is_built(SPEC, str(tested), select):
            source = tested
        else:
            source = ours
    if source is ours:
        with _locked(ours, exclusive=True):
            build_tsdb(SPEC, str(ours), select=select)
    with _locked(source, exclusive=False):
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head", "queries.active"))
    return f"{source.relative_to(ROOT) if source.is_relative_to(ROOT) else source}"


def promaccel_config(scenario: str, urls: dict[str, str], cache: bool) -> dict[str, Any]:
    """Keys that both versions know: name, kind, url, holds, primary; cache.enabled."""
    backends = [{"name": s.backend, "kind": "prometheus", "url": urls[s.name], "holds": s.holds, "primary": s.primary}
                for s in SLICES if s.scenario == scenario]
    return {"backends": backends, "cache": {"enabled": cache}}


@dataclass
class Worktree:
    path: Path
    commit: str

    @classmethod
    def add(cls, path: Path, rev: str) -> Worktree:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                                check=True, capture_output=True, text=True).stdout.strip()
        if path.exists():
            raise SystemExit(f"{path} exists: remove it (git worktree remove --force {path}) or pass --worktree")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
                       check=True, capture_output=True)
        tree = cls(path, commit)
        # The worktree's own proxy package must be the one imported there (the editable install
        # of this checkout comes after the working directory on sys.path).
        where = subprocess.run([sys.executable, "-c", "import proxy; print(proxy.__file__)"], cwd=path,
                               check=True, capture_output=True, text=True).stdout.strip()
        if not Path(where).resolve().is_relative_to(path.resolve()):
            tree.remove()
            raise SystemExit(f"in {path}, python imports proxy from {where}, not from the worktree")
        return tree

    def remove(self) -> None:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.path)],
                       check=False, capture_output=True)


@dataclass
class Sample:
    ms: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)
    # The promaccel's CPU time (user + system, all threads) from its first timed ask to half a
    # second after its last: it serves nothing else meanwhile.
    cpu_ms: float = 0.0


_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc (10 ms ticks: summed
    over the rounds, then divided)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_MS


def head_commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--before", default="601647b", help="the commit to compare with (default 601647b)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--worktree", type=Path, default=Path("/tmp/pa-before"),
                    help="where the before commit is checked out (must not exist; removed at the end)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    load_start = loadavg()
    work = Path(tempfile.mkdtemp(prefix="promaccel-crossstore-"))
    proms: dict[str, subprocess.Popen[bytes]] = {}
    servers: dict[tuple[str, str, str], Promaccel] = {}  # (scenario, version, cold|warm)
    tree: Worktree | None = None
    ok = False
    try:
        sources = {}
        for name, select in [("full", None), *((s.name, s.select) for s in SLICES)]:
            sources[name] = serving_copy(name, select, work / "data" / name)
            proc = start_prometheus(str(work / "data" / name), log_path=str(work / f"prometheus-{name}.log"))
            proms[name] = proc
        urls = {name: str(p.url) for name, p in proms.items()}  # type: ignore[attr-defined]
        print(f"data: {', '.join(f'{k} <- {v}' for k, v in sources.items())}", file=sys.stderr)

        tree = Worktree.add(args.worktree, args.before)
        code = {"before": tree.path, "after": ROOT}
        after = head_commit()
        configs: dict[tuple[str, str], Path] = {}
        for scenario in ("by_time", "by_metric"):
            for phase, cache in (("cold", False), ("warm", True)):
                path = work / f"{scenario}-{phase}.yaml"
                path.write_text(json.dumps(promaccel_config(scenario, urls, cache), indent=1))  # JSON is YAML
                configs[(scenario, phase)] = path

        def start(key: tuple[str, str, str]) -> Promaccel:
            scenario, version, phase = key
            return Promaccel.start(None, [*PLANNED, "--config", str(configs[(scenario, phase)])],
                                   work / "-".join(key), code_dir=code[version])

        keys = [(s, v, p) for s in ("by_time", "by_metric") for v in VERSIONS for p in ("cold", "warm")]
        # One of each version first (numba compiles into the worktree's on-disk cache once), then the rest.
        for key in (keys[0], keys[2]):
            servers[key] = start(key)
        with ThreadPoolExecutor(max_workers=3) as pool:
            rest = [k for k in keys if k not in servers]
            for key, server in zip(rest, pool.map(start, rest)):
                servers[key] = server
        print(f"servers up after {time.monotonic() - started:.0f} s", file=sys.stderr)

        results: dict[tuple[str, str, str], Sample] = {}  # (case label, mode, phase)
        mismatches: list[str] = []
        with httpx.Client(timeout=120) as client:

            def ask(url: str, case: Case) -> tuple[float, httpx.Response]:
                t0 = time.perf_counter()
                r = client.post(url + case.path, data=case.form())
                return (time.perf_counter() - t0) * 1000, r

            for case in CASES:
                def url_of(mode: str, phase: str, case: Case = case) -> str:
                    if mode == "direct":
                        return urls["full"]
                    return servers[(case.scenario, mode, phase)].url

                _, ref = ask(urls["full"], case)
                if ref.status_code != 200:
                    raise RuntimeError(f"{case.label}: direct answered HTTP {ref.status_code}: {ref.text[:300]}")
                reference = ref.json()
                if not reference["data"]["result"]:
                    raise RuntimeError(f"{case.label}: direct answered no series: a case must compare data")
                # untimed: compiles, connects, fills the warm servers' caches
                for version in VERSIONS:
                    for phase in ("cold", "warm"):
                        _, r = ask(url_of(version, phase), case)
                        if diff_answers(reference, r.json()):
                            mismatches.append(f"{case.label} {version} {phase} (first ask): "
                                              f"{diff_answers(reference, r.json())[:2]}")
                modes = ["before", "after", "direct"]
                time.sleep(0.5)  # background work of the first asks (cache writes) done
                ours = {(v, p): servers[(case.scenario, v, p)].pid for v in VERSIONS for p in ("cold", "warm")}
                cpu0 = {k: cpu_ms(pid) for k, pid in ours.items()}
                for k in range(args.rounds):
                    order = modes[k % 3:] + modes[:k % 3]
                    for phase in ("cold", "warm"):
                        for mode in order:
                            ms, r = ask(url_of(mode, phase), case)
                            sample = results.setdefault((case.label, mode, phase), Sample())
                            sample.ms.append(ms)
                            if (calls := r.headers.get("X-Promaccel-Backend-Calls")) is not None:
                                sample.calls.append(float(calls))
                            if r.status_code != 200:
                                problems = [f"HTTP {r.status_code}: {r.text[:200]}"]
                            else:
                                problems = diff_answers(reference, r.json())
                            if problems:
                                mismatches.append(f"{case.label} {mode} {phase} round {k}: {problems[:2]}")
                time.sleep(0.5)
                for (version, phase), pid in ours.items():
                    results[(case.label, version, phase)].cpu_ms = cpu_ms(pid) - cpu0[(version, phase)]
                print(f"{case.label}: done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        load_end = loadavg()

        def med(label: str, mode: str, phase: str) -> float:
            return statistics.median(results[(label, mode, phase)].ms)

        print(f"before = {tree.commit[:7]} (worktree), after = {after} (HEAD); CI fleet {SPEC.nodes}x"
              f"{SPEC.gpus_per_node} GPUs x {SPEC.hours} h; {args.rounds} rounds; medians; "
              f"load average {load_start} at the start, {load_end} at the end; "
              f"{time.monotonic() - started:.0f} s in all")
        print()
        print("| scenario | query | mode | cold ms | warm ms | after/before cold | after/before warm "
              "| promaccel CPU ms cold / warm | backend calls cold / warm |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for case in CASES:
            for mode in ("direct", "before", "after"):
                cold, warm = med(case.label, mode, "cold"), med(case.label, mode, "warm")
                ratios = ["", ""]
                if mode == "after":
                    ratios = [f"**{cold / med(case.label, 'before', 'cold'):.2f}x**",
                              f"**{warm / med(case.label, 'before', 'warm'):.2f}x**"]
                calls = cpu = ""
                if mode != "direct":
                    both = [results[(case.label, mode, p)] for p in ("cold", "warm")]
                    calls = " / ".join(f"{statistics.median(x.calls):.0f}" if x.calls else "-" for x in both)
                    cpu = " / ".join(f"{x.cpu_ms / len(x.ms):.1f}" for x in both)
                print(f"| {case.scenario} | {case.label} | {mode} | {cold:,.0f} | {warm:,.0f} | "
                      f"{ratios[0]} | {ratios[1]} | {cpu} | {calls} |")
        print()
        answers = sum(len(s.ms) for s in results.values())
        if mismatches:
            print(f"{len(mismatches)} of {answers} answers differ from direct:")
            for m in mismatches[:20]:
                print(f"- {m}")
        else:
            print(f"{answers} timed answers (and the untimed first asks) compared with direct: 0 mismatches")
        ok = True
        return 1 if mismatches else 0
    finally:
        for server in servers.values():
            server.stop()
        for proc in proms.values():
            stop_prometheus(proc)
        if tree is not None:
            tree.remove()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
