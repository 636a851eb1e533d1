"""Soak test: the GPU fleet dashboard replayed against promaccel by many users for a long time.

    python -m loadtests.soak --minutes 30 --users 50        # = make soak
    python -m loadtests.soak --minutes 5 --users 50 --full  # the bench dataset (256 x 8 GPUs x 24 h)

It starts Prometheus over a generated GPU fleet (the small CI fleet, 16 nodes x 4 GPUs x 6 h, by
default; built once and cached under .cache/bench/ like `make bench`), Redis and promaccel on
free loopback ports (or uses --prometheus URL), then runs --users virtual Grafana users for
--minutes: each refreshes the dashboard (`loadtests.dashboard.panel_requests`, POST forms, at
most 6 requests in flight per user, as the bench's users) again and again, --think-s apart,
while the dashboard window slides through the data at a constant pace, so each refresh reads
a little new data the way a live dashboard does. Every --sample-s seconds it samples
promaccel's RSS (process tree) and CPU, the requests finished since the last sample (count,
failures, latency p50/p95/p99/max) and promaccel's piece cache hit ratio; every --check-s one
refresh is also sent straight to Prometheus and every answer compared (a soak that degrades
into wrong answers is not stable). It writes soak.csv, soak.png and summary.md to
loadtests/results/soak-<time>/ (or --out) and exits 1 on a failed request or a mismatch.

Bounds: users <= 200, minutes <= 240, --max-requests requests in all; only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .bench import dataset_dir
from .client import Answer, Budget, Client, compare_answers, user_refresh
from .dashboard import DEFAULT_DASHBOARD, load_dashboard, panel_requests
from .services import Promaccel, RedisServer, RssSampler, assert_loopback, cpu_seconds, free_port
from .stats import Progress, cache_lookups, hit_ratio, parse_metrics, percentile
from .timeline import PHASE_S

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MAX_USERS = 200
MAX_MINUTES = 240.0
COLUMNS = ("elapsed_s", "rss_mib", "cpu_percent", "requests", "failures", "p50_ms", "p95_ms", "p99_ms", "max_ms",
           "cache_hit_ratio")


@dataclass
class Window:
    """Finished requests since the last sample."""

    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    def add(self, answers: Sequence[Answer]) -> None:
        for a in answers:
            self.latencies.append(a.latency_s)
            self.failures += a.failed


@dataclass
class Run:
    window: Window = field(default_factory=Window)
    rows: list[dict[str, float]] = field(default_factory=list)
    requests: int = 0
    failures: int = 0
    failed_examples: list[str] = field(default_factory=list)
    compared: int = 0
    mismatches: list[str] = field(default_factory=list)
    refreshes: int = 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to replay (default 30, at most 240)")
    p.add_argument("--users", type=int, default=50, help="virtual Grafana users (default 50, at most 200)")
    p.add_argument("--think-s", type=float, default=1.0, help="pause between a user's refreshes (default 1 s)")
    p.add_argument("--sample-s", type=float, default=5.0, help="sampling interval (default 5 s)")
    p.add_argument("--check-s", type=float, default=60.0, help="compare one refresh with Prometheus this often")
    p.add_argument("--window", default="1h", help="dashboard time range (default 1h)")
    p.add_argument("--full", action="store_true", help="the bench dataset (256 x 8 GPUs x 24 h) instead of the small one")
    p.add_argument("--data-dir", type=Path, help="a built TSDB of that dataset (default: .cache/bench/...)")
    p.add_argument("--prometheus", help="use this running Prometheus (127.0.0.1) over the dataset instead of starting one")
    p.add_argument("--no-redis", action="store_true", help="promaccel's in-process cache instead of Redis")
    p.add_argument("--promaccel-args", default="--split-interval 1h --shards auto",
                   help='`promaccel serve` flags (default "--split-interval 1h --shards auto")')
    p.add_argument("--max-requests", type=int, default=5_000_000, help="hard cap on requests sent")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    p.add_argument("--out", type=Path, help="output directory (default loadtests/results/soak-<time>)")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not 1 <= args.users <= MAX_USERS:
        raise SystemExit(f"--users must be 1..{MAX_USERS}")
    if not 0 < args.minutes <= MAX_MINUTES:
        raise SystemExit(f"--minutes must be in (0, {MAX_MINUTES:g}]")
    if args.sample_s <= 0 or args.think_s < 0:
        raise SystemExit("--sample-s must be > 0 and --think-s >= 0")
    return args


def virtual_now(t_s: float, duration_s: float, first_now_s: float, last_now_s: float) -> float:
    """The dashboard's "now" t_s seconds into the run: from first_now_s to last_now_s at a
    constant pace over the run (the window slides through the data as on a live dashboard)."""
    if duration_s <= 0:
        return last_now_s
    return first_now_s + (last_now_s - first_now_s) * min(1.0, max(0.0, t_s / duration_s))


async def _user(client: Client, dashboard: dict[str, Any], run: Run, clock: Any, stop_at: float, think_s: float,
                delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    while time.monotonic() < stop_at:
        start, end = clock()
        reqs = panel_requests(dashboard, start, end, 1920)
        if client.budget.sent + len(reqs) > client.budget.max_requests:
            return
        refresh = await user_refresh(client, reqs)
        run.window.add(refresh.answers)
        run.requests += len(refresh.answers)
        run.refreshes += 1
        for r, a in zip(reqs, refresh.answers):
            if a.failed:
                run.failures += 1
                if len(run.failed_examples) < 5:
                    run.failed_examples.append(f"{r.title}: {a.status} {a.error or a.body[:200]!r}")
        await asyncio.sleep(think_s)


async def _check(direct: Client, proxied: Client, dashboard: dict[str, Any], run: Run, clock: Any, stop_at: float,
                 every_s: float) -> None:
    """One refresh straight to Prometheus and through promaccel, every answer compared."""
    while time.monotonic() + every_s < stop_at:
        await asyncio.sleep(every_s)
        start, end = clock()
        reqs = panel_requests(dashboard, start, end, 1920)
        d = await user_refresh(direct, reqs)
        p = await user_refresh(proxied, reqs)
        for r, x, y in zip(reqs, d.answers, p.answers):
            run.compared += 1
            problems = compare_answers(x, y)
            if problems and len(run.mismatches) < 20:
                run.mismatches.append(f"{r.title}: {problems[:2]}")


async def _sampler(pa: Promaccel, run: Run, rss: RssSampler, t0: float, stop_at: float, every_s: float,
                   progress: Progress) -> None:
    before = parse_metrics(pa.metrics_text())
    cpu_before, t_before = cpu_seconds(pa.pid), time.monotonic()
    while True:
        now = time.monotonic()
        await asyncio.sleep(max(0.0, min(every_s, stop_at - now + 0.01)) if now < stop_at else every_s)
        after = parse_metrics(await asyncio.to_thread(pa.metrics_text))
        cpu, t = cpu_seconds(pa.pid), time.monotonic()
        window, run.window = run.window, Window()
        lat = sorted(window.latencies)
        ms = [percentile(lat, q) * 1000 if lat else math.nan for q in (50, 95, 99, 100)]
        row = {"elapsed_s": round(t - t0, 2), "rss_mib": rss.rss() / 2**20,
               "cpu_percent": 100 * (cpu - cpu_before) / max(t - t_before, 1e-9), "requests": len(lat),
               "failures": window.failures, "p50_ms": ms[0], "p95_ms": ms[1], "p99_ms": ms[2], "max_ms": ms[3],
               "cache_hit_ratio": hit_ratio(cache_lookups(before, after))}
        run.rows.append(row)
        before, cpu_before, t_before = after, cpu, t
        progress.update(f"soak {row['elapsed_s']:.0f}/{stop_at - t0:.0f} s: {run.requests:,} requests, "
                        f"{run.failures} failed, RSS {row['rss_mib']:.0f} MiB, p95 {row['p95_ms']:.0f} ms")
        if t >= stop_at:
            return


async def soak(args: argparse.Namespace, prom_url: str, pa: Promaccel, data_start_s: float, data_end_s: float,
               progress: Progress) -> Run:
    dashboard = load_dashboard(DEFAULT_DASHBOARD)
    window_s = _seconds(args.window)
    last_now = data_end_s - PHASE_S
    first_now = max(data_start_s + window_s, last_now - max(0.0, data_end_s - data_start_s - window_s))
    duration_s = args.minutes * 60
    t0 = time.monotonic()
    stop_at = t0 + duration_s

    def clock() -> tuple[float, float]:
        now = virtual_now(time.monotonic() - t0, duration_s, first_now, last_now)
        return now - window_s, now

    run = Run()
    budget = Budget(args.max_requests)
    rss = RssSampler(pa.pid, interval_s=args.sample_s)
    async with Client(pa.url, budget, args.timeout) as proxied, Client(prom_url, budget, args.timeout) as direct:
        stagger = min(5.0, args.sample_s)  # users start spread over a few seconds, as people do
        tasks = [asyncio.create_task(_user(proxied, dashboard, run, clock, stop_at, args.think_s,
                                           stagger * i / args.users)) for i in range(args.users)]
        tasks.append(asyncio.create_task(_check(direct, proxied, dashboard, run, clock, stop_at, args.check_s)))
        await _sampler(pa, run, rss, t0, stop_at, args.sample_s, progress)
        await asyncio.gather(*tasks)
    return run


def _seconds(text: str) -> float:
    from .dashboard import parse_grafana_duration_ns

    return parse_grafana_duration_ns(text) / 1e9


def write_csv(rows: Sequence[dict[str, float]], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.3f}" if isinstance(r[k], float) else r[k]) for k in COLUMNS})


def plot(rows: Sequence[dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["elapsed_s"] / 60 for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax1.plot(t, [r["rss_mib"] for r in rows], color="tab:purple")
    ax1.set_ylabel("promaccel RSS (MiB)")
    ax1.set_ylim(bottom=0)
    for key, color in (("p50_ms", "tab:green"), ("p95_ms", "tab:orange"), ("p99_ms", "tab:red")):
        ax2.plot(t, [r[key] for r in rows], label=key[:-3], color=color)
    ax2.set_ylabel("request latency (ms)")
    ax2.set_yscale("log")
    ax2.legend(loc="upper left")
    spans = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip([{"elapsed_s": 0.0}, *rows], rows)]
    ax3.plot(t, [r["requests"] / max(w, 1e-9) for r, w in zip(rows, spans)], color="tab:blue", label="requests/s")
    ax3.plot(t, [r["failures"] / max(w, 1e-9) for r, w in zip(rows, spans)], color="tab:red", label="failures/s")
    ax3.set_ylabel("per second")
    ax3.set_xlabel("minutes")
    ax3.legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summarize(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    rows = run.rows
    rss = [r["rss_mib"] for r in rows]
    n = max(1, len(rows) // 5)
    first, last = rows[:n], rows[-n:]

    def med(rs: Sequence[dict[str, float]], key: str) -> float:
        vals = [r[key] for r in rs if not math.isnan(r[key])]
        return percentile(vals, 50) if vals else math.nan

    return {
        "minutes": args.minutes, "users": args.users, "requests": run.requests, "refreshes": run.refreshes,
        "failures": run.failures, "compared": run.compared, "mismatches": len(run.mismatches),
        "rss_mib_first": rss[0] if rss else math.nan, "rss_mib_max": max(rss, default=math.nan),
        "rss_mib_last": rss[-1] if rss else math.nan,
        "p50_ms_first_fifth": med(first, "p50_ms"), "p50_ms_last_fifth": med(last, "p50_ms"),
        "p95_ms_first_fifth": med(first, "p95_ms"), "p95_ms_last_fifth": med(last, "p95_ms"),
        "requests_per_s": run.requests / max(rows[-1]["elapsed_s"], 1e-9) if rows else math.nan,
        "cpu_percent_median": med(rows, "cpu_percent"), "cache_hit_ratio_median": med(rows, "cache_hit_ratio"),
    }


def summary_md(s: dict[str, Any], command: str, run: Run) -> str:
    lines = [
        f"# Soak: {s['users']} users x {s['minutes']:g} min", "", f"`{command}`", "",
        f"- {s['requests']:,} requests ({s['requests_per_s']:.1f}/s) in {s['refreshes']:,} refreshes; "
        f"{s['failures']} failed; {s['compared']} answers compared with Prometheus, {s['mismatches']} mismatches",
        f"- promaccel RSS: {s['rss_mib_first']:.0f} MiB at the first sample, {s['rss_mib_max']:.0f} MiB max, "
        f"{s['rss_mib_last']:.0f} MiB at the end",
        f"- latency, median of the per-sample p50 / p95: first fifth {s['p50_ms_first_fifth']:.0f} / "
        f"{s['p95_ms_first_fifth']:.0f} ms, last fifth {s['p50_ms_last_fifth']:.0f} / {s['p95_ms_last_fifth']:.0f} ms",
        f"- promaccel CPU (median per sample): {s['cpu_percent_median']:.0f}%; piece cache hit ratio (median): "
        f"{s['cache_hit_ratio_median']:.2f}",
    ]
    lines += [f"- failed: {x}" for x in run.failed_examples] + [f"- mismatch: {x}" for x in run.mismatches[:5]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from . import load
    from .gen import BENCH_SPEC, CI_SPEC

    args = parse_args(argv)
    spec = BENCH_SPEC if args.full else CI_SPEC
    started = dt.datetime.now(dt.timezone.utc)
    out = (args.out or RESULTS_DIR / started.strftime("soak-%Y%m%d-%H%M%S")).resolve()  # redis-server chdirs
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    command = "python -m loadtests.soak " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    prom = None
    redis: RedisServer | None = None
    pa: Promaccel | None = None
    try:
        if args.prometheus:
            prom_url = args.prometheus
        else:
            data_dir = args.data_dir or dataset_dir(spec)
            progress.update(f"dataset {spec.nodes}x{spec.gpus_per_node} GPUs x {spec.hours:g} h in {data_dir}", force=True)
            load.build_tsdb(spec, str(data_dir), verbose=True)
            prom = load.start_prometheus(str(data_dir), free_port(), log_path=str(out / "prometheus.log"))
            prom_url = prom.url
        assert_loopback(prom_url)
        if not args.no_redis:
            redis = RedisServer.start(out / "redis")
        pa = Promaccel.start(prom_url, shlex.split(args.promaccel_args), out, redis.url if redis else None)
        progress.update(f"promaccel {pa.url} in front of {prom_url}: {args.users} users for {args.minutes:g} min",
                        force=True)
        run = asyncio.run(soak(args, prom_url, pa, float(spec.start), float(spec.end), progress))
    finally:
        if pa is not None:
            pa.stop()
        if redis is not None:
            redis.stop()
        if prom is not None:
            load.stop_prometheus(prom)
    write_csv(run.rows, out / "soak.csv")
    plot(run.rows, out / "soak.png", f"promaccel soak: {args.users} users, {args.minutes:g} min "
                                     f"({spec.nodes}x{spec.gpus_per_node} GPUs, {args.window} dashboard)")
    s = summarize(run, args)
    (out / "summary.md").write_text(summary_md(s, command, run))
    progress.done(f"soak done: {s['requests']:,} requests, {s['failures']} failed, {s['mismatches']} mismatches, "
                  f"RSS {s['rss_mib_first']:.0f} -> {s['rss_mib_last']:.0f} MiB (max {s['rss_mib_max']:.0f}); "
                  f"{out / 'summary.md'}")
    return 1 if s["failures"] or s["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
