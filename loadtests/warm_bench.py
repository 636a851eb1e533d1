"""Warm answers before and after a change, side by side in one run (issue 28): promaccel at two
commits, each with its own Redis, and direct Prometheus, on a copy of the bench dataset.

    python -m loadtests.warm_bench [--before 91d29ec] [--rounds 7] [--reps 5]

Data: the bench dataset (`loadtests.gen.BENCH_SPEC`, 256 nodes x 8 GPUs x 24 h), built by
`make bench` / `python -m loadtests.load build --dataset bench` into .cache/bench/256x8x24h
(`--data`). It is not built here and never written: its blocks are copied into a scratch
directory and that copy is served (Prometheus locks and compacts the directory it serves).

Before: a git worktree of `--before` (removed at the end), served by this venv's python from
its own directory; after: this checkout. Both run with defaults and a Redis of their own.
Every request asks for gzip, as Grafana does, and is timed until its last byte is read
(aiohttp, loopback); the body is decompressed and compared after the timer stops.

Measurements, each warm: every window a timed ask uses was asked once, untimed, before (the
miss that fills the cache), and the windows slide 30 s per request as a refreshing panel does;
a window asked again is answered with the bytes kept whole (pipeline/answer_memo.py), so (1)
and (2) are also measured on windows never asked, their cells warm (", new window": windows
ending 1 s off the others, the untimed asks NEW_SHIFT s earlier):

1. large: `avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)` and `max by (Hostname)
   (DCGM_FI_DEV_POWER_USAGE)`, 1 h at a 10 s step (256 series x 361 points, about 2 MB of
   JSON each). Reported: ms, JSON and gzip bytes, JSON MB/s.
2. tiny: a 1-series panel (`up{...}`, 1 h at 10 s: 361 points) through each mode, and
   `vector(1)` (instant) through each mode; the target compares promaccel's tiny panel with
   direct Prometheus's `vector(1)`, the floor of any answer on this client.
3. after a miss: a 1-series panel never asked before (per round another node's `up`, 1 h at
   10 s from the data's start; the same for both versions, each with its own caches), asked
   10 times in a row `--gap` apart; the 2nd ask (the first warm one) against the 10th.

In (1) and (2), `--rounds` rounds: in each, the modes (before, after, direct) take turns in an
order rotated per round, `--reps` asks each, so that noise from the shared machine hits all
alike; medians. Every answer is compared with direct Prometheus's for the same window
(loadtests.compare.diff_answers); a mismatch is reported and fails the run. Each promaccel's
CPU time per ask is user + system from /proc over its timed asks, divided (10 ms ticks: only
meaningful summed over many asks). Bounded: every ask has a timeout, the run a deadline
(`--deadline`), and the number of asks is fixed by the arguments. Everything runs on 127.0.0.1
and is stopped at the end (the worktree removed); a failed run keeps its logs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.compare import diff_answers
from loadtests.crossstore_bench import Worktree, cpu_ms, head_commit, loadavg
from loadtests.gen import BENCH_SPEC
from loadtests.load import is_built, start_prometheus, stop_prometheus
from loadtests.services import Promaccel, RedisServer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / ".cache" / "bench" / "256x8x24h"

SPEC = BENCH_SPEC
END = SPEC.end - 12  # the data's last hour, a window end off the step grid as "now" is
SPAN, SLIDE, STEP = 3600, 30, 10
LARGE = {
    "large: avg by (Hostname) GPU_UTIL": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "large: max by (Hostname) POWER_USAGE": "max by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
}
TINY_QUERY = 'up{job="node-exporter",instance="gpu-node-0000:9100"}'
TINY, VECTOR1 = "tiny: 1-series panel", "tiny: vector(1) instant"
MISS = "after a miss"
# The same measures on windows never asked before, ending 1 s off the others (their cells warm:
# every hour cell was read by the windows asked untimed, NEW_SHIFT s earlier): no whole answer
# kept for them.
NEW, NEW_SHIFT = ", new window", 5
VERSIONS = ("before", "after")
MODES = ("before", "after", "direct")
MISS_ASKS = 10
# Targets of issue 28 ("Done when"), as (numerator, denominator, bound).
LARGE_BOUND, TINY_BOUND, MISS_BOUND = 1 / 3, 1.5, 1.5


@dataclass
class Sample:
    ms: list[float] = field(default_factory=list)
    json_bytes: list[int] = field(default_factory=list)
    wire_bytes: list[int] = field(default_factory=list)
    cpu_ms: float = 0.0  # summed over the timed asks of `ms`
    cpu_asks: int = 0
    x_cache: list[str] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.ms) if self.ms else float("nan")

    def cpu_per_ask(self) -> float | None:
        return self.cpu_ms / self.cpu_asks if self.cpu_asks else None

    def mb_per_s(self) -> float | None:
        """JSON bytes served per second of wall time, at the medians."""
        if not self.json_bytes or not self.ms:
            return None
        return statistics.median(self.json_bytes) / 1e6 / (self.median() / 1e3)


Results = dict[tuple[str, str], Sample]  # (measure, mode | "before 2nd" ...)


def range_form(query: str, end: int) -> dict[str, str]:
    return {"query": query, "start": str(end - SPAN), "end": str(end), "step": str(STEP)}


def sliding_ends(last_end: int, n: int, slide: int = SLIDE) -> list[int]:
    """n window ends `slide` s apart, moving forward in time, the last at `last_end`."""
    return [last_end - slide * (n - 1 - j) for j in range(n)]


def miss_query(k: int) -> str:
    """Round k's panel for the miss phase: one series no other ask reads (another node than
    TINY_QUERY's), so that its first ask is a miss in every cache, whatever their cells. Plain
    nodes (n % 16 == 4): not gen's special ones (0000-0003 join, leave, miss scrapes; n % 16
    == 9 reboot)."""
    return f'up{{job="node-exporter",instance="gpu-node-{20 + 16 * k:04d}:9100"}}'


MISS_END = SPEC.start + SPAN + 600  # far from the last hours that (1) and (2) ask


def rotated(modes: tuple[str, ...], k: int) -> list[str]:
    i = k % len(modes)
    return list(modes[i:] + modes[:i])


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b != b or a != a or b == 0:
        return None
    return a / b


def _fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def table(results: Results) -> list[str]:
    """The Markdown table: per measure and mode, medians and after/before."""
    out = ["| measure | mode | median ms | JSON bytes | gzip bytes | JSON MB/s | promaccel CPU ms/ask "
           "| after/before |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    measures = list(dict.fromkeys(m for m, _ in results))
    for measure in measures:
        for mode in [m for m in (*MODES, *(f"{v} {n}" for v in VERSIONS for n in ("1st", "2nd", "10th")))
                     if (measure, m) in results]:
            s = results[(measure, mode)]
            rel = ""
            if mode.startswith("after") and (measure, mode.replace("after", "before")) in results:
                rel = f"**{_fmt(ratio(s.median(), results[(measure, mode.replace('after', 'before'))].median()), '.2f')}x**"
            jb = _fmt(statistics.median(s.json_bytes), ",.0f") if s.json_bytes else "-"
            wb = _fmt(statistics.median(s.wire_bytes), ",.0f") if s.wire_bytes else "-"
            prec = ",.2f" if s.median() < 10 else ",.1f"
            out.append(f"| {measure} | {mode} | {_fmt(s.median(), prec)} | {jb} | {wb} | {_fmt(s.mb_per_s())} | "
                       f"{_fmt(s.cpu_per_ask(), ',.2f')} | {rel} |")
    return out


def targets(results: Results) -> list[str]:
    """Issue 28's targets, each with the measured ratio, for both versions, met or not."""
    def get(measure: str, mode: str) -> float | None:
        s = results.get((measure, mode))
        return s.median() if s is not None and s.ms else None

    out = []
    for label in LARGE:
        r = ratio(get(label, "after"), get(label, "before"))
        out.append(f"- {label}: after/before {_fmt(r, '.2f')}x (target <= {LARGE_BOUND:.2f}x): {_met(r, LARGE_BOUND)}")
    for v in VERSIONS:
        r = ratio(get(TINY, v), get(VECTOR1, "direct"))
        out.append(f"- {v}: warm tiny panel / direct vector(1) {_fmt(r, '.2f')}x (target <= {TINY_BOUND}x): "
                   f"{_met(r, TINY_BOUND)}")
    for v in VERSIONS:
        r = ratio(get(MISS, f"{v} 2nd"), get(MISS, f"{v} 10th"))
        out.append(f"- {v}: 2nd ask after a miss / 10th {_fmt(r, '.2f')}x (target <= {MISS_BOUND}x): "
                   f"{_met(r, MISS_BOUND)}")
    return out


def x_cache_counts(sample: Sample) -> str:
    """e.g. "HIT x35" or "HIT x34, PARTIAL x1": how warm the timed asks really were."""
    return ", ".join(f"{x} x{n}" for x, n in Counter(sample.x_cache).most_common())


def _met(r: float | None, bound: float) -> str:
    if r is None:
        return "not measured"
    return "met" if r <= bound else "NOT met"


# --------------------------------------------------------------------------- running

@dataclass
class Reply:
    ms: float
    status: int
    body: bytes  # decompressed
    wire: int
    x_cache: str


class Bench:
    """The asks of one run: servers' URLs and pids, a client session, the results."""

    def __init__(self, session: Any, urls: dict[str, str], pids: dict[str, int], reps: int, rounds: int,
                 gap_s: float, deadline: float) -> None:
        self.session, self.urls, self.pids = session, urls, pids
        self.reps, self.rounds, self.gap_s, self.deadline = reps, rounds, gap_s, deadline
        self.results: Results = {}
        self.mismatches: list[str] = []
        self.compared = 0

    async def ask(self, mode: str, path: str, form: dict[str, str]) -> Reply:
        if time.monotonic() > self.deadline:
            raise TimeoutError("the run's --deadline passed")
        t0 = time.perf_counter()
        async with self.session.post(self.urls[mode] + path, data=form, headers={"Accept-Encoding": "gzip"}) as r:
            raw = await r.read()
            ms = (time.perf_counter() - t0) * 1000
            gz = r.headers.get("Content-Encoding", "") == "gzip"
            reply = Reply(ms, r.status, b"", len(raw), r.headers.get("X-Cache", "-"))
        reply.body = gzip.decompress(raw) if gz else raw
        return reply

    def compare(self, what: str, ref: Reply, got: Reply) -> None:
        self.compared += 1
        if ref.status != 200:
            raise RuntimeError(f"{what}: direct answered HTTP {ref.status}: {ref.body[:300]!r}")
        reference = json.loads(ref.body)
        if not reference["data"]["result"]:
            raise RuntimeError(f"{what}: direct answered no series: a case must compare data")
        problems = ([f"HTTP {got.status}: {got.body[:200]!r}"] if got.status != 200
                    else diff_answers(reference, json.loads(got.body)))
        if problems:
            self.mismatches.append(f"{what}: {problems[:2]}")

    async def warm(self, measure: str, path: str, forms: list[dict[str, str]],
                   timed: list[dict[str, str]] | None = None) -> None:
        """Rounds over `forms` (len rounds x reps), each asked untimed by each promaccel first;
        `timed`: the windows asked in the rounds instead (others than those asked untimed)."""
        for form in forms:
            for v in VERSIONS:
                await self.ask(v, path, form)
        await self.ask("direct", path, forms[0])  # connection, page cache
        await asyncio.sleep(0.5)  # background work of the misses (cache writes) done
        forms = timed or forms
        for k in range(self.rounds):
            replies: dict[tuple[str, int], Reply] = {}
            for mode in rotated(MODES, k):
                sample = self.results.setdefault((measure, mode), Sample())
                c0 = cpu_ms(self.pids[mode]) if mode in self.pids else 0.0
                for r in range(self.reps):
                    j = k * self.reps + r
                    reply = await self.ask(mode, path, forms[j])
                    replies[(mode, j)] = reply
                    sample.ms.append(reply.ms)
                    sample.json_bytes.append(len(reply.body))
                    sample.wire_bytes.append(reply.wire)
                    sample.x_cache.append(reply.x_cache)
                if mode in self.pids:
                    sample.cpu_ms += cpu_ms(self.pids[mode]) - c0
                    sample.cpu_asks += self.reps
            for (mode, j), reply in replies.items():  # outside the timed asks
                if mode != "direct":
                    self.compare(f"{measure} {mode} window {j}", replies[("direct", j)], reply)

    async def after_miss(self) -> None:
        """Per round a fresh window, asked MISS_ASKS times in a row by each version (taking
        turns, the order alternating), `gap_s` apart; direct once for the reference."""
        for k in range(self.rounds):
            form = range_form(miss_query(k), MISS_END)
            ref = await self.ask("direct", "/api/v1/query_range", form)
            for i in range(MISS_ASKS):
                for v in (VERSIONS if (i + k) % 2 else VERSIONS[::-1]):
                    reply = await self.ask(v, "/api/v1/query_range", form)
                    nth = {0: "1st", 1: "2nd", MISS_ASKS - 1: "10th"}.get(i)
                    if nth is not None:
                        sample = self.results.setdefault((MISS, f"{v} {nth}"), Sample())
                        sample.ms.append(reply.ms)
                        sample.x_cache.append(reply.x_cache)
                    self.compare(f"{MISS} {v} round {k} ask {i + 1}", ref, reply)
                await asyncio.sleep(self.gap_s)


async def run_asks(args: argparse.Namespace, urls: dict[str, str], pids: dict[str, int],
                   progress: Callable[[str], None]) -> Bench:
    import aiohttp  # the client Grafana-like asks use; imported here so the pure parts need none

    n = args.rounds * args.reps
    timeout = aiohttp.ClientTimeout(total=args.ask_timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout,
                                     auto_decompress=False) as session:
        bench = Bench(session, urls, pids, args.reps, args.rounds, args.gap, time.monotonic() + args.deadline)
        for label, query in LARGE.items():
            await bench.warm(label, "/api/v1/query_range", [range_form(query, e) for e in sliding_ends(END, n)])
            progress(label)
        for label, query in LARGE.items():  # cells warm, the window itself never asked
            await bench.warm(f"{label}{NEW}", "/api/v1/query_range",
                             [range_form(query, e) for e in sliding_ends(END - NEW_SHIFT, n)],
                             [range_form(query, e) for e in sliding_ends(END - 1, n)])
            progress(f"{label}{NEW}")
        # The tiny panel slides over an hour of its own (the large panels' windows are other queries).
        await bench.warm(TINY, "/api/v1/query_range", [range_form(TINY_QUERY, e) for e in sliding_ends(END, n)])
        await bench.warm(f"{TINY}{NEW}", "/api/v1/query_range",
                         [range_form(TINY_QUERY, e) for e in sliding_ends(END - NEW_SHIFT, n)],
                         [range_form(TINY_QUERY, e) for e in sliding_ends(END - 1, n)])
        await bench.warm(VECTOR1, "/api/v1/query", [{"query": "vector(1)", "time": str(e)}
                                                    for e in sliding_ends(END, n)])
        progress("tiny")
        await bench.after_miss()
        progress(MISS)
    return bench


def serving_copy(source: Path, dest: Path) -> None:
    """The dataset's blocks and manifest, copied for one Prometheus to serve (the source is
    never written: not even Prometheus's lock or a compaction)."""
    if not is_built(SPEC, str(source)):
        raise SystemExit(f"{source} is not a built {SPEC.nodes}x{SPEC.gpus_per_node}x{SPEC.hours:g}h dataset: "
                         f"python -m loadtests.load build --dataset bench --data-dir {source}")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(
        "lock", "wal", "chunks_head", "queries.active", "*.log", "*.tmp", "*.tmp-for-*"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--before", default="91d29ec", help="the commit to compare with (default 91d29ec)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds (1-14; default 7)")
    ap.add_argument("--reps", type=int, default=5, help="asks per mode per round (1-20; default 5)")
    ap.add_argument("--gap", type=float, default=0.05, help="s between the asks after a miss (default 0.05)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--worktree", type=Path, default=Path("/tmp/pa-before-warm"),
                    help="where the before commit is checked out (must not exist; removed at the end)")
    ap.add_argument("--ask-timeout", type=float, default=120.0)
    ap.add_argument("--deadline", type=float, default=1200.0, help="s for all the asks (default 1200)")
    args = ap.parse_args(argv)
    if not (1 <= args.rounds <= 14 and 1 <= args.reps <= 20 and 0 <= args.gap <= 5):
        ap.error("--rounds 1-14, --reps 1-20, --gap 0-5")
    started = time.monotonic()
    load_start = loadavg()
    work = Path(tempfile.mkdtemp(prefix="promaccel-warm-"))
    prom = None
    redis: dict[str, RedisServer] = {}
    servers: dict[str, Promaccel] = {}
    tree: Worktree | None = None
    ok = False

    def progress(what: str) -> None:
        print(f"{what}: done ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

    try:
        serving_copy(args.data, work / "data")
        prom = start_prometheus(str(work / "data"), log_path=str(work / "prometheus.log"))
        tree = Worktree.add(args.worktree, args.before)
        code = {"before": tree.path, "after": ROOT}
        after = head_commit()
        for v in VERSIONS:
            redis[v] = RedisServer.start(work / f"redis-{v}")
            servers[v] = Promaccel.start(prom.url, [], work / f"promaccel-{v}",  # type: ignore[attr-defined]
                                         redis[v].url, code_dir=code[v])
        progress("servers up")
        urls = {**{v: s.url for v, s in servers.items()}, "direct": prom.url}  # type: ignore[attr-defined]
        bench = asyncio.run(run_asks(args, urls, {v: s.pid for v, s in servers.items()}, progress))
        load_end = loadavg()
        print(f"before = {tree.commit[:7]} (worktree), after = {after} (HEAD); bench dataset "
              f"{SPEC.nodes}x{SPEC.gpus_per_node} GPUs x {SPEC.hours:g} h (a copy of {args.data}); "
              f"{args.rounds} rounds x {args.reps} asks per mode, windows 1 h at {STEP} s sliding {SLIDE} s "
              f"per ask, gzip; medians; load average {load_start} at the start, {load_end} at the end; "
              f"{time.monotonic() - started:.0f} s in all")
        print()
        print("\n".join(table(bench.results)))
        print()
        for measure in (*LARGE, *(f"{m}{NEW}" for m in LARGE), TINY, f"{TINY}{NEW}"):
            print(f"X-Cache of the timed asks, {measure}: " + "; ".join(
                f"{v} {x_cache_counts(bench.results[(measure, v)])}" for v in VERSIONS))
        for v in VERSIONS:
            seen = ", ".join("".join(x[:1] for x in bench.results[(MISS, f"{v} {n}")].x_cache) for n in ("1st", "2nd"))
            print(f"X-Cache of the 1st, 2nd asks after a miss per round, {v}: {seen} (H hit, P partial, M miss)")
        print()
        print("Targets (issue 28):")
        print("\n".join(targets(bench.results)))
        print()
        if bench.mismatches:
            print(f"{len(bench.mismatches)} of {bench.compared} answers differ from direct:")
            for m in bench.mismatches[:20]:
                print(f"- {m}")
        else:
            print(f"{bench.compared} answers compared with direct: 0 mismatches")
        ok = True
        return 1 if bench.mismatches else 0
    finally:
        for server in servers.values():
            server.stop()
        for r in redis.values():
            r.stop()
        if prom is not None:
            stop_prometheus(prom)
        if tree is not None:
            tree.remove()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
