"""Load generated fleet telemetry into a Prometheus TSDB and serve it.

    python -m loadtests.load build --data-dir DIR [--dataset ci|bench|bench-long | fleet args]
    python -m loadtests.load serve --data-dir DIR [--port P]
    python -m loadtests.load sizes [--measure]

`build` generates the fleet (loadtests.gen) in 2 h slices cut on the epoch's 2 h grid, which
is promtool's block grid, and runs `promtool tsdb create-blocks-from openmetrics` on each,
two at a time (promtool is single-threaded), each into its own scratch directory, then moves
the blocks into DIR. Slice files are deleted as soon as promtool is done with them.
promtool 2.42 reads its whole input once to find the time range and once more per 2 h
block it writes, so one slice per block keeps that to two passes, and memory to about 1.3x
the slice file. promtool silently drops out-of-order and duplicate samples (exit code 0), so
every slice's block sample counts are checked against what the generator wrote.
DIR/promaccel-dataset.json (written last) records the FleetSpec and generator version; a
build whose manifest matches is skipped.

`serve` / `start_prometheus()` runs Debian's `prometheus` on 127.0.0.1 with the TSDB in DIR,
no scrape targets, and retention 100y, so blocks dated weeks ago are neither deleted nor
"out of bounds" (retention counts from the newest block, not from now). Prometheus compacts
the 2 h blocks into bigger ones in the background about a minute after start; answers do
not change, timings may. One Prometheus per DIR (started with --storage.tsdb.use-lockfile,
and `build` refuses to wipe a DIR whose lock is held); copy DIR for a second instance.

Datasets (2-core / 24 GiB development machine; data window ends at gen.DEFAULT_END):

| dataset | fleet                    | window (UTC)                        | samples | series  | OpenMetrics | TSDB    |
|---------|--------------------------|-------------------------------------|---------|---------|-------------|---------|
| ci      | 16 nodes x 4 GPUs, 6 h   | 2026-10-31T18:00Z .. 2026-11-01T00Z | 0.80 M  | 3,430   | 191 MiB     | 2.9 MiB |
| bench   | 256 nodes x 8 GPUs, 24 h | 2026-10-31T00:00Z .. 2026-11-01T00Z | 89.2 M  | 251,656 | 22.7 GiB    | 322 MiB |
| bench-long | 32 nodes x 8 GPUs, 168 h | 2026-10-25T00:00Z .. 2026-11-01T00Z | 77.1 M | 599,226* | 19.6 GiB | 278 MiB |

(* summed over the 2 h slices.) bench-long is loadtests.bench's second dataset, for
dashboard windows longer than 24 h (7d).

Measured times:
- ci: generation 0.3 s (to /dev/null, ~3 M samples/s); `build` 2.6-2.8 s on a quiet
  machine, 5-9 s while other test suites ran; 150 MiB peak RSS.
- bench: generation 27 s to /dev/null (3.3 M samples/s, 0.6 GiB RSS), 12 slices of 7.4 M
  samples / 1.9 GiB each. One slice alone: writing it ~5-8 s, promtool 33-43 s at 2.5 GiB
  RSS (mostly the mmapped input). Whole `build`: 812 s (13.5 min) measured while another
  bench build and two test suites ran on the same 2 cores (it got 0.64 of a core); it
  used 526 s of CPU (generation + 12 promtools), so ~4.5 min on 2 idle cores. Peak ~6 GiB
  RAM (2 promtools) and ~6 GiB of scratch disk in DIR. Prometheus then compacts the 12 blocks to 18 h + 3 x 2 h (289 MiB).
  Direct 24 h range queries on it took 1.2-3.9 s (`avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)`
  at step 60 s: 3.9 s, 8.5 MB of JSON) on the busy machine.
- bench-long: 84 slices of ~0.91 M samples / 236 MiB. Whole `build`: 915 s (15 min) on a
  busy machine (load average 3-9), 619 s of CPU. Generation is ~60% of it here: the
  counters (energy, NVLink) are recomputed from the window's start for every slice, so slice
  i costs O(i) (0.16 s CPU for the first, 3.1 s for the last). Prometheus then compacts the 84
  blocks (to 237 MiB) in ~105 s on first start (the bench waits for it once).
promtool 2.42 is the bottleneck (single-threaded, ~230 k samples/s); GOGC made no clear
difference.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from loadtests.exporters import write_fleet
from loadtests.gen import (
    BENCH_SPEC,
    CI_SPEC,
    GENERATOR_VERSION,
    Fleet,
    FleetSpec,
    Stats,
    add_fleet_args,
    iso_utc,
    slice_bounds,
    spec_from_args,
)
from loadtests.ports import PORTS_ENV, free_port, port_bindable, port_range  # noqa: F401

MANIFEST = "promaccel-dataset.json"
CONFIG = "promaccel-prometheus.yml"
# The bench's second dataset (loadtests.bench --long-*): a smaller fleet over 7 days, for
# dashboard windows longer than the bench dataset's 24 h; same end, so the same virtual now.
BENCH_LONG_SPEC = FleetSpec(nodes=32, gpus_per_node=8, hours=168)
DATASETS = {"ci": CI_SPEC, "bench": BENCH_SPEC, "bench-long": BENCH_LONG_SPEC}
SLICE_SECONDS = 2 * 3600
_ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
# what a TSDB directory that we may wipe can contain
_OURS = re.compile(r"^([0-9A-HJKMNP-TV-Z]{26}|wal|chunks_head|lock|queries\.active|"
                   r"promaccel-.*|prometheus-\d+\.log|\.promaccel-.*)$")


class LoadError(RuntimeError):
    pass


def _which(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else None)
    if not path:
        raise LoadError(f"{tool} not found: apt-get install --no-install-recommends prometheus")
    return path


def read_manifest(data_dir: str) -> dict | None:
    try:
        with open(os.path.join(data_dir, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _wanted(spec: FleetSpec, select: "Selection | None" = None) -> dict:
    out = {"generator_version": GENERATOR_VERSION, "spec": spec.to_dict()}
    out["select"] = select.to_dict() if select is not None else None
    return out


def is_built(spec: FleetSpec, data_dir: str, select: "Selection | None" = None) -> bool:
    m = read_manifest(data_dir)
    return m is not None and all(m.get(k) == v for k, v in _wanted(spec, select).items())


@dataclass(frozen=True)
class Selection:
    """A part of a fleet's data (for backends that hold slices of one fleet, tests/hybrid.py):
    the samples whose time lies in one of `windows` ([from, to) unix seconds; None: all the
    window) and whose metric name fully matches `metrics` (a regex; None: every metric)."""

    windows: tuple[tuple[int, int], ...] | None = None
    metrics: str | None = None
    # Non-empty: this selection is the union of these (disjoint: no sample in two of them),
    # e.g. node_* at all times and DCGM_* since T; `windows`/`metrics` are then unused.
    union: tuple["Selection", ...] = ()

    def to_dict(self) -> dict:
        if self.union:
            return {"union": [u.to_dict() for u in self.union]}
        return {"windows": [list(w) for w in self.windows] if self.windows is not None else None,
                "metrics": self.metrics}

    def parts(self, a: int, b: int) -> "list[tuple[int, int, Callable[[str], bool] | None]]":
        """The parts of [a, b) to generate: (from, to, which metrics)."""
        if self.union:
            return [p for u in self.union for p in u.parts(a, b)]
        keep = self.keep()
        return [(lo, hi, keep) for lo, hi in self.pieces(a, b)]

    def keep(self) -> "Callable[[str], bool] | None":
        if self.metrics is None:
            return None
        pattern = re.compile(self.metrics)
        return lambda name: pattern.fullmatch(name) is not None

    def pieces(self, a: int, b: int) -> list[tuple[int, int]]:
        """The parts of [a, b) this selection keeps, in time order."""
        if self.windows is None:
            return [(a, b)]
        out = [(max(a, lo), min(b, hi)) for lo, hi in sorted(self.windows)]
        return [(lo, hi) for lo, hi in out if lo < hi]


def _assert_no_prometheus(data_dir: str) -> None:
    """A Prometheus started by start_prometheus (--storage.tsdb.use-lockfile) holds
    flock(DIR/lock) while it runs; never rebuild under it."""
    lock = os.path.join(data_dir, "lock")
    if not os.path.exists(lock):
        return
    with open(lock, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise LoadError(f"a Prometheus is running on {data_dir}; stop it before rebuilding") from exc
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _wipe(data_dir: str) -> None:
    if not os.path.isdir(data_dir):
        return
    _assert_no_prometheus(data_dir)
    names = os.listdir(data_dir)
    foreign = [n for n in names if not _OURS.match(n)]
    if foreign:
        raise LoadError(f"refusing to wipe {data_dir}: it holds {foreign[:5]}, not only a TSDB")
    for n in names:
        p = os.path.join(data_dir, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


@dataclass
class _Job:
    index: int
    path: str
    out: str
    stats: Stats
    proc: subprocess.Popen
    log: str
    started: float


def _block_samples(dir_: str) -> tuple[int, list[str]]:
    total, blocks = 0, []
    for n in sorted(os.listdir(dir_)):
        meta = os.path.join(dir_, n, "meta.json")
        if _ULID.match(n) and os.path.exists(meta):
            with open(meta) as f:
                total += int(json.load(f)["stats"]["numSamples"])
            blocks.append(n)
    return total, blocks


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def build_tsdb(spec: FleetSpec, data_dir: str, *, slice_seconds: int = SLICE_SECONDS,
               jobs: int | None = None, force: bool = False, verbose: bool = False,
               select: Selection | None = None) -> dict:
    """Make data_dir a TSDB holding `spec`'s data; skip if its manifest already matches.

    `select`: only that part of the data (time windows, metric names); each slice is cut
    into the windows' parts, one promtool run each.
    Returns the manifest. Raises LoadError if promtool fails or drops samples.
    """
    data_dir = os.path.abspath(data_dir)
    if not force and is_built(spec, data_dir, select):
        return read_manifest(data_dir)  # type: ignore[return-value]
    promtool = _which("promtool")
    jobs = jobs or max(1, min(2, os.cpu_count() or 1))
    _wipe(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".promaccel-build-", dir=data_dir)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *a: None)
    t0 = time.perf_counter()
    gen_s = 0.0
    total = Stats()
    blocks: list[str] = []
    running: deque[_Job] = deque()

    def finish(job: _Job) -> None:
        rc = job.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(job.path)
        if rc != 0:
            raise LoadError(f"promtool failed (exit {rc}) on slice {job.index}:\n{_tail(job.log)}")
        got, names = _block_samples(job.out)
        if got != job.stats.samples:
            raise LoadError(f"slice {job.index}: generated {job.stats.samples} samples but promtool "
                            f"wrote {got} (out-of-order or duplicate samples are dropped silently)")
        for n in names:
            os.rename(os.path.join(job.out, n), os.path.join(data_dir, n))
        blocks.extend(names)
        shutil.rmtree(job.out, ignore_errors=True)
        say(f"slice {job.index}: {got} samples, promtool {time.perf_counter() - job.started:.1f} s")

    try:
        fleet = Fleet(spec)
        parts = [p for a, b in slice_bounds(spec, slice_seconds)
                 for p in (select.parts(a, b) if select is not None else [(a, b, None)])]
        for i, (a, b, keep) in enumerate(parts):
            path = os.path.join(scratch, f"slice-{i:03d}.om")
            tg = time.perf_counter()
            with open(path, "wb", buffering=1 << 20) as f:
                st = write_fleet(fleet, f, a, b, keep=keep)
            gen_s += time.perf_counter() - tg
            total.add(st)
            say(f"slice {i}: generated {st.samples} samples, {st.bytes / 2**20:.0f} MiB "
                f"in {time.perf_counter() - tg:.1f} s")
            if st.samples == 0:
                os.unlink(path)
                continue
            while len(running) >= jobs:
                finish(running.popleft())
            out = os.path.join(scratch, f"blocks-{i:03d}")
            os.makedirs(out)
            log = os.path.join(scratch, f"promtool-{i:03d}.log")
            with open(log, "wb") as lf:
                proc = subprocess.Popen([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", path, out],
                                        stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            running.append(_Job(i, path, out, st, proc, log, time.perf_counter()))
        while running:
            finish(running.popleft())
    except BaseException:
        for job in running:
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    manifest = {
        **_wanted(spec, select),
        "start": spec.start, "end": spec.end,
        "start_iso": iso_utc(spec.start), "end_iso": iso_utc(spec.end),
        "samples": total.samples, "series_summed_over_slices": total.series,
        # Prometheus compacts these into bigger blocks once it runs on the directory
        "openmetrics_bytes": total.bytes, "blocks_built": len(blocks),
        "gen_seconds": round(gen_s, 2), "build_seconds": round(time.perf_counter() - t0, 2),
    }
    tmp = os.path.join(data_dir, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(data_dir, MANIFEST))
    return manifest


# --------------------------------------------------------------------------- prometheus

# Ports: loadtests/ports.py (one implementation for the harness and the suite); these names
# stay importable from here (chaos, faults, redis_down, amp_endpoint, tests use them).


_CONFIG_TEXT = """\
# Written by loadtests.load: serve backfilled blocks only, scrape nothing.
global:
  scrape_interval: 30s
  evaluation_interval: 30s
scrape_configs: []
"""


def die_with_parent() -> None:
    """Popen preexec_fn (Linux): the child gets SIGTERM when the process that started it dies,
    even by SIGKILL, so a crashed harness leaves no server behind. Called in a process itself:
    it gets SIGTERM when its parent dies (`kill` of the `make` running it)."""
    import ctypes

    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)  # Linux only
    if prctl is not None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _config_text(port: int, scrape_self_s: int | None) -> str:
    if not scrape_self_s:
        return _CONFIG_TEXT
    # Itself as a real scrape target: /api/v1/metadata and /targets have real answers. Its
    # samples are at the wall clock, far after any generated fleet window.
    return f"""\
# Written by loadtests.load: serve backfilled blocks, and scrape itself (metadata, targets).
global:
  scrape_interval: {scrape_self_s}s
  evaluation_interval: 30s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


def start_prometheus(data_dir: str, port: int | None = None, *, timeout: float = 60.0,
                     extra_args: tuple[str, ...] = (), log_path: str | None = None,
                     tied: bool = False, scrape_self_s: int | None = None) -> subprocess.Popen:
    """Start prometheus on 127.0.0.1:port over data_dir and wait until /-/ready answers 200.
    With `scrape_self_s` it scrapes itself at that interval (else it scrapes nothing).

    The returned Popen also has `.port`, `.url` and `.log_path`. Raises LoadError with the
    log's tail if prometheus exits or is not ready in `timeout` seconds. Stop it with
    stop_prometheus(). `tied`: it also stops when this process dies (die_with_parent).
    """
    binary = _which("prometheus")
    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    port = port or free_port()
    cfg = os.path.join(data_dir, CONFIG)
    with open(cfg, "w") as f:
        f.write(_config_text(port, scrape_self_s))
    log_path = log_path or os.path.join(data_dir, f"prometheus-{port}.log")
    cmd = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data_dir}",
           "--storage.tsdb.retention.time=100y", "--storage.tsdb.use-lockfile",
           f"--web.listen-address=127.0.0.1:{port}",
           *extra_args]
    with open(log_path, "wb") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=data_dir, preexec_fn=die_with_parent if tied else None)
    url = f"http://127.0.0.1:{port}"
    proc.port, proc.url, proc.log_path = port, url, log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise LoadError(f"prometheus exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            stop_prometheus(proc)
            raise LoadError(f"prometheus not ready after {timeout} s:\n{_tail(log_path)}")
        time.sleep(0.1)


def stop_prometheus(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running_prometheus(data_dir: str, port: int | None = None, **kw: object) -> Iterator[subprocess.Popen]:
    proc = start_prometheus(data_dir, port, **kw)  # type: ignore[arg-type]
    try:
        yield proc
    finally:
        stop_prometheus(proc)


# --------------------------------------------------------------------------- CLI

def _spec(a: argparse.Namespace) -> FleetSpec:
    return DATASETS[a.dataset] if a.dataset else spec_from_args(a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.load", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate + promtool into --data-dir (skipped if already built)")
    b.add_argument("--data-dir", required=True)
    b.add_argument("--dataset", choices=sorted(DATASETS), help="named fleet; overrides fleet args")
    add_fleet_args(b)
    b.add_argument("--slice-hours", type=float, default=SLICE_SECONDS / 3600)
    b.add_argument("--jobs", type=int, default=None, help="concurrent promtool runs (default 2)")
    b.add_argument("--force", action="store_true")
    s = sub.add_parser("serve", help="run prometheus over --data-dir until interrupted")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--port", type=int, default=None,
                   help="default: a free port (9090 may belong to a system Prometheus)")
    z = sub.add_parser("sizes", help="describe the named datasets (ci, bench, bench-long)")
    z.add_argument("--measure", action="store_true", help="generate each to /dev/null and count")
    a = p.parse_args(argv)

    if a.cmd == "build":
        spec = _spec(a)
        if is_built(spec, a.data_dir) and not a.force:
            print(f"{a.data_dir}: already built", file=sys.stderr)
            return 0
        m = build_tsdb(spec, a.data_dir, slice_seconds=int(a.slice_hours * 3600), jobs=a.jobs,
                       force=a.force, verbose=True)
        print(json.dumps(m, indent=1))
        return 0
    if a.cmd == "serve":
        m = read_manifest(a.data_dir)
        if m is None:
            print(f"warning: {a.data_dir} has no {MANIFEST}", file=sys.stderr)
        proc = start_prometheus(a.data_dir, a.port)
        rng = f" data {m['start_iso']} .. {m['end_iso']}" if m else ""
        print(f"prometheus ready at {proc.url}{rng} (log {proc.log_path})", file=sys.stderr, flush=True)
        stop = {"flag": False}

        def handler(signum: int, frame: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        try:
            while not stop["flag"] and proc.poll() is None:
                time.sleep(0.2)
        finally:
            stop_prometheus(proc)
        return 0 if proc.returncode in (0, -signal.SIGTERM) else int(proc.returncode or 1)
    if a.cmd == "sizes":
        print(__doc__[__doc__.index("Datasets"):])
        for name, spec in DATASETS.items():
            print(f"{name}: {spec}  window {iso_utc(spec.start)} .. {iso_utc(spec.end)}")
            if a.measure:
                t = time.perf_counter()
                fl = Fleet(spec)
                tot = Stats()
                with open(os.devnull, "wb") as f:
                    for lo, hi in slice_bounds(spec, SLICE_SECONDS):
                        tot.add(write_fleet(fl, f, lo, hi))
                print(f"  {tot.samples} samples, {tot.series} series (summed over slices), "
                      f"{tot.bytes / 2**20:.0f} MiB, {time.perf_counter() - t:.1f} s")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
