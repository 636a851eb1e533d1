"""Dashboard replay benchmark: promaccel against direct Prometheus, side by side, one run.

    python -m loadtests.bench                      # bench dataset (256 nodes x 8 GPUs x 24 h),
                                                   # (b)'s 7d window on the long one (32 x 8 x 168 h)
    python -m loadtests.bench --small              # 16 x 4 x 6 h, a minute or two (no long dataset)
    python -m loadtests.bench --scenario dashboard --window 7d --refreshes 3   # the long dataset only
    python -m loadtests.bench --scenario dashboard --window 24h --refreshes 20
    python -m loadtests.bench --promaccel-args "--split-interval 1h --shards 4"

It builds (once; cached under .cache/bench/) a generated GPU fleet TSDB, starts Prometheus,
Redis and promaccel on free loopback ports, and runs the scenarios of issue 7:

  cold       (a) one heavy 24 h range query, promaccel's cache cold (a fresh instance per rep)
  dashboard  (b) the GPU fleet dashboard refreshed with the window sliding 30 s, per --window
  tiny       (c) `vector(1)` and one-series queries, sequential: the proxy's own added ms
  users      (d) --users users refreshing one dashboard at once: backend calls vs one user's
  heavy      (e) --heavy distinct heavy queries at once: promaccel's peak RSS and failures
  codec      (f) loadtests/codec_bench.py's output, when that file exists
  workers    (g) the --users users' dashboard through 1 vs --workers worker processes vs
             --processes separate promaccel processes (users spread over them), all sharing
             Redis: round wall time, backend calls (counted by Prometheus), answers compared

Virtual users behave like Grafana's server-side Prometheus data source: POST form bodies,
steps and step-aligned windows from `loadtests.dashboard.panel_requests`, all panels of a
refresh at once behind a limit of 6 requests in flight per user (a browser's HTTP/1.1
connection limit per host). Time is virtual: the data ends at a fixed past instant, "now" is
that instant (minus a small phase so windows are not pre-aligned), and refresh i of n sees
now - (n-1-i) * slide, run back to back instead of sleeping.

Two datasets: a dashboard window (b) longer than the main dataset covers (7d on the 24 h
bench dataset) runs on a second, longer one (--long-nodes x --long-gpus-per-node x
--long-hours, default 32 x 8 x 168 h: about as many samples as the main one, so a direct 7 d
refresh stays well inside Prometheus's 2-minute query timeout). It is built (once, cached)
before anything is measured, served by its own Prometheus (started for those windows, stopped
after them) with a fresh promaccel in front, sharing Redis, the bounds and the request budget.
It ends where the main one does, so virtual now is the same; the report says which dataset
each window ran on. Every other scenario uses the main dataset. --no-long (and --small, unless
a --long-* option is given) skips such windows instead.

Direct and promaccel requests alternate refresh by refresh (and swap order each time) so noise
hits both, and every promaccel answer is compared with the direct answer to the same request:
a speed-up of wrong answers is not a speed-up.

Warm answers by size (issue 28): after (b)'s refreshes and (c)'s pairs, their panels are asked
again one at a time, --size-reps times with gzip (as Grafana asks) and as many without; the
report groups them by answer size (tiny < 50 KB, medium, large > 1 MB) with the warm time and
the bytes per second promaccel served.

Bounds: each scenario stops starting refreshes after --duration-limit seconds; the whole run
sends at most --max-requests requests; users <= 200; all targets are 127.0.0.1.

Layout: this module is the CLI; the scenarios are loadtests/scenarios/ (one module each, typed
results), the client and answer comparison loadtests/client.py, virtual time
loadtests/timeline.py, the servers loadtests/services.py, the report loadtests/report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .client import Budget, BudgetExhausted
from .dashboard import DEFAULT_DASHBOARD, load_dashboard
from .report import write_report
from .scenarios import ALIASES, SCENARIOS, codec, cold, dashboard, heavy, tiny, users, workers
from .scenarios.env import Env, LongData, load_module, merge_findings, settle_prometheus
from .scenarios.result import ScenarioResult
from .services import RedisServer, assert_loopback, free_port, http_get
from .stats import Progress, git_info, machine_info
from .timeline import PHASE_S, parse_duration_s

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CACHE_DIR = ROOT / ".cache" / "bench"

MAX_USERS = 200

# The long dataset (--long-nodes, --long-gpus-per-node, --long-hours): 7 days of a fleet an
# eighth the size of the bench dataset, about as many samples (77.1 M against 89.2 M), so a
# direct 7 d refresh (Grafana steps 5-20 min, but every sample of the week is decoded) takes
# about what a 24 h one takes on the main dataset: measured 8-23 s a refresh, the slowest
# panel 19 s, on the shared 2 cores; far from Prometheus's 2-minute query timeout and its
# 50 M samples limit. Same as loadtests.load's "bench-long" dataset.
LONG_DEFAULTS = (32, 8, 168.0)


def fleet_spec(args: argparse.Namespace) -> Any:
    from .gen import BENCH_SPEC, CI_SPEC, FleetSpec

    base = CI_SPEC if args.small else BENCH_SPEC
    return FleetSpec(
        nodes=args.nodes or base.nodes,
        gpus_per_node=args.gpus_per_node or base.gpus_per_node,
        hours=args.hours or base.hours,
        scrape_interval=base.scrape_interval,
        end=base.end,
        seed=base.seed,
    )


def long_fleet_spec(args: argparse.Namespace) -> Any:
    """The long dataset's FleetSpec, or None when it is off (--no-long; --small without any
    --long-* option). Same scrape interval, end and seed as the main dataset, so virtual now
    is the same on both."""
    from .gen import FleetSpec

    if not args.long_enabled:
        return None
    main = fleet_spec(args)
    return FleetSpec(nodes=args.long_nodes, gpus_per_node=args.long_gpus_per_node, hours=args.long_hours,
                     scrape_interval=main.scrape_interval, end=main.end, seed=main.seed)


def dataset_dir(spec: Any) -> Path:
    """Where a dataset is cached by default: .cache/bench/<nodes>x<gpus>x<hours>h."""
    return CACHE_DIR / f"{spec.nodes}x{spec.gpus_per_node}x{spec.hours:g}h"


def window_dataset(window_s: float, main_span_s: float, long_span_s: float | None) -> str | None:
    """Which dataset a dashboard window runs on: "main" when the main dataset covers it, else
    "long" when the long dataset does (None: it is off), else None (the window is skipped)."""
    if window_s <= main_span_s + 1e-6:
        return "main"
    if long_span_s is not None and window_s <= long_span_s + 1e-6:
        return "long"
    return None


def window_plan(args: argparse.Namespace) -> dict[str, str | None]:
    """window_dataset() of every --window, for the datasets `args` asks for."""
    main = fleet_spec(args)
    long = long_fleet_spec(args)
    return {w: window_dataset(parse_duration_s(w), main.hours * 3600,
                              long.hours * 3600 if long is not None else None) for w in args.window}


def dataset_record(spec: Any, data_dir: Path, info: dict[str, Any], build_s: float) -> dict[str, Any]:
    """What the report says about a dataset: its shape, size, where it is, how long it took."""
    return {
        "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node, "gpus": spec.nodes * spec.gpus_per_node,
        "hours": spec.hours, "scrape_interval": spec.scrape_interval, "end": spec.end, "end_iso": _iso(spec.end),
        "data_dir": os.path.relpath(data_dir, ROOT) if data_dir.is_relative_to(ROOT) else str(data_dir),
        "build_s": round(build_s, 1), "samples": info.get("samples"),
        "series": info.get("series_summed_over_slices"),
        # the build that made the cached TSDB (build_s is ~0 when it was cached)
        "built_in_s": info.get("build_seconds"),
    }


def parse_scenarios(values: Sequence[str] | None) -> list[str]:
    if not values:
        return list(SCENARIOS)
    out: list[str] = []
    for v in values:
        for name in v.split(","):
            name = ALIASES.get(name.strip().lower(), name.strip().lower())
            if name not in SCENARIOS:
                raise argparse.ArgumentTypeError(f"unknown scenario {name!r} (choose from {', '.join(SCENARIOS)})")
            if name not in out:
                out.append(name)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    g = p.add_argument_group("dataset")
    g.add_argument("--small", action="store_true", help="the CI dataset: 16 nodes x 4 GPUs x 6 h")
    g.add_argument("--nodes", type=int, help="nodes (default 256; 16 with --small)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node (default 8; 4 with --small)")
    g.add_argument("--hours", type=float, help="hours of data (default 24; 6 with --small)")
    g.add_argument("--data-dir", type=Path, help="TSDB directory (default .cache/bench/<size>)")
    g = p.add_argument_group(
        "long dataset", "dashboard windows (b) longer than the main dataset run on this second dataset, with "
        "its own Prometheus and promaccel (built once before anything is measured; cached)")
    g.add_argument("--long-nodes", type=int, help=f"nodes (default {LONG_DEFAULTS[0]})")
    g.add_argument("--long-gpus-per-node", type=int, help=f"GPUs per node (default {LONG_DEFAULTS[1]})")
    g.add_argument("--long-hours", type=float, help=f"hours of data (default {LONG_DEFAULTS[2]:g} = 7 d)")
    g.add_argument("--long-data-dir", type=Path, help="its TSDB directory (default .cache/bench/<size>)")
    g.add_argument("--no-long", action="store_true",
                   help="no long dataset: skip windows the main one does not cover (the default with --small, "
                        "unless a --long-* option is given)")
    g = p.add_argument_group("load")
    g.add_argument("--scenario", action="append", help=f"{', '.join(SCENARIOS)} or a..g; repeatable or "
                   "comma-separated (default: all)")
    g.add_argument("--window", action="append", help="dashboard time range for (b): 1h, 24h, 7d, ... (repeatable; "
                   "default 1h, 24h, 7d); one longer than the main dataset runs on the long dataset")
    g.add_argument("--refreshes", type=int, default=10, help="dashboard refreshes per window (default 10)")
    g.add_argument("--slide", default="30s", help="how far the window moves per refresh (default 30s)")
    g.add_argument("--users", type=int, default=50, help="concurrent users in (d) (default 50)")
    g.add_argument("--users-refreshes", type=int, default=3, help="refresh rounds in (d) (default 3)")
    g.add_argument("--cold-reps", type=int, default=3, help="repetitions of (a) (default 3)")
    g.add_argument("--tiny-requests", type=int, default=200, help="request pairs per query in (c) (default 200)")
    g.add_argument("--heavy", type=int, default=20, help="concurrent heavy queries in (e) (default 20)")
    g.add_argument("--heavy-direct-at-once", action="store_true",
                   help="in (e), also send the heavy queries to Prometheus all at once (slow; it times out)")
    g.add_argument("--size-reps", type=int, default=5,
                   help="in (b) and (c), warm answers per panel and encoding (gzip, identity) asked one at a "
                        "time afterwards, for the time and bytes per second by panel size (default 5; 0: none)")
    g.add_argument("--width", type=int, default=1920, help="screen width in px the dashboard spans (default 1920)")
    g = p.add_argument_group("bounds")
    g.add_argument("--duration-limit", type=float, default=300.0,
                   help="seconds after which a scenario starts no new refresh/round (default 300)")
    g.add_argument("--max-requests", type=int, default=50_000, help="requests in the whole run (default 50000)")
    g.add_argument("--timeout", type=float, default=300.0, help="per-request timeout in seconds (default 300)")
    g = p.add_argument_group("promaccel")
    g.add_argument("--promaccel-args", default="", help='extra `promaccel serve` flags, e.g. "--split-interval 1h"')
    g.add_argument("--no-redis", action="store_true", help="use promaccel's in-process cache instead of Redis")
    g.add_argument("--workers", type=int, default=2,
                   help="worker processes compared with 1 in (g) (default 2)")
    g.add_argument("--processes", type=int, default=2,
                   help="separate promaccel processes sharing Redis compared with 1 in (g) (default 2; 1: none)")
    g.add_argument("--codec-args", default="", help="arguments for loadtests.codec_bench in (f)")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, help="run directory (default loadtests/results/<UTC time>/)")
    g.add_argument("--no-latest", action="store_true", help="do not update loadtests/results/latest.md")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        a.scenarios = parse_scenarios(a.scenario)
        a.window = a.window or ["1h", "24h", "7d"]
        for w in a.window:
            parse_duration_s(w)
        a.slide_s = parse_duration_s(a.slide)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        p.error(str(exc))
    if not 1 <= a.workers <= 16:
        p.error("--workers must be within 1..16")
    if not 1 <= a.processes <= 8:
        p.error("--processes must be within 1..8")
    if not 1 <= a.users <= MAX_USERS:
        p.error(f"--users must be within 1..{MAX_USERS}")
    for name in ("refreshes", "users_refreshes", "cold_reps", "tiny_requests", "heavy", "max_requests"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.refreshes > 1000 or a.tiny_requests > 100_000 or a.heavy > 200 or not 0 <= a.size_reps <= 100:
        p.error("refreshes <= 1000, tiny-requests <= 100000, heavy <= 200, 0 <= size-reps <= 100")
    explicit = [a.long_nodes, a.long_gpus_per_node, a.long_hours, a.long_data_dir]
    a.long_enabled = not a.no_long and (not a.small or any(x is not None for x in explicit))
    for name, default in zip(("long_nodes", "long_gpus_per_node", "long_hours"), LONG_DEFAULTS):
        if getattr(a, name) is None:
            setattr(a, name, default)
    if a.long_nodes < 1 or a.long_gpus_per_node < 1 or a.long_hours <= 0:
        p.error("--long-nodes, --long-gpus-per-node and --long-hours must be positive")
    try:
        long_fleet_spec(a)
    except ValueError as exc:
        p.error(f"long dataset: {exc}")
    if a.long_enabled and a.data_dir is not None and a.long_data_dir is not None \
            and a.data_dir.resolve() == a.long_data_dir.resolve():
        p.error("--data-dir and --long-data-dir must differ (one Prometheus per TSDB directory)")
    return a


def _iso(t: float) -> str:
    text = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (text[:-7] if float(t).is_integer() else text[:-3]) + "Z"


def _versions(prom_url: str) -> dict[str, str]:
    import proxy

    out = {"promaccel": getattr(proxy, "__version__", "?")}
    status, body = http_get(prom_url + "/api/v1/status/buildinfo")
    if status == 200:
        import orjson

        out["prometheus"] = orjson.loads(body).get("data", {}).get("version", "?")
    return out


async def run_scenario(env: Env, name: str, results: dict[str, Any]) -> None:
    """Runs one scenario (each --window for the dashboard), appending its typed results."""
    found: list[ScenarioResult] = results["scenarios"]
    if name == "dashboard":
        plan = window_plan(env.args)
        try:
            for w in env.args.window:
                on = env.on_long(results["notes"]) if plan[w] == "long" and env.long is not None else env
                found.append(await dashboard.run(on, w))
        finally:
            if env.long is not None:
                env.long.stop()
    elif name == "codec":
        found.append(codec.run(env))
    else:
        runner = {"cold": cold.run, "tiny": tiny.run, "users": users.run, "heavy": heavy.run,
                  "workers": workers.run}[name]
        found.append(await runner(env))


async def run_scenarios(env: Env, results: dict[str, Any]) -> None:
    for name in env.args.scenarios:
        env.progress.update(f"scenario {name} starting", force=True)
        t0 = time.monotonic()
        first_scenario, first_digest, first_log = len(results["scenarios"]), len(env.code_digests), len(env.log_findings)
        try:
            await run_scenario(env, name, results)
        except BudgetExhausted as exc:
            results["notes"].append(f"scenario {name}: {exc}; later scenarios skipped")
            env.stop_promaccel()
            break
        finally:
            digests = list(dict.fromkeys(env.code_digests[first_digest:]))
            merged = merge_findings(env.log_findings[first_log:])
            for s in results["scenarios"][first_scenario:]:
                s.promaccel_code = digests
                s.promaccel_log = merged
        env.progress.update(f"scenario {name} done in {time.monotonic() - t0:.0f} s", force=True)


def command_line(argv: Sequence[str] | None) -> str:
    """The command as typed: the interpreter's own argv when `argv` came from it, else a
    `python -m loadtests.bench` equivalent."""
    orig = list(getattr(sys, "orig_argv", []))
    if argv is None or (orig and argv and list(argv) == orig[len(orig) - len(argv):]):
        return shlex.join(orig or sys.argv)
    return shlex.join(["python", "-m", "loadtests.bench", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    # Absolute: redis-server changes into its --dir before it opens its --logfile.
    out_dir = (args.out or RESULTS_DIR / started.strftime("%Y%m%d-%H%M%S")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    spec = fleet_spec(args)
    data_dir = args.data_dir or dataset_dir(spec)
    long_spec = long_fleet_spec(args)
    plan = window_plan(args)
    long_windows = [w for w in args.window if plan[w] == "long"] if "dashboard" in args.scenarios else []
    long_dir = (args.long_data_dir or dataset_dir(long_spec)) if long_windows else None
    if long_dir is not None and long_dir.resolve() == data_dir.resolve():
        raise SystemExit(f"the long dataset's directory {long_dir} is the main one's: give --long-data-dir")
    command = command_line(argv)
    results: dict[str, Any] = {
        "command": command,
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": machine_info(),
        "git": git_info(),
        "promaccel_args": shlex.split(args.promaccel_args),
        "redis": not args.no_redis,
        "phase_s": PHASE_S,
        "scenarios": [],
        "notes": [],
    }
    load = load_module()
    progress.update(f"dataset {spec.nodes}x{spec.gpus_per_node} GPUs x {spec.hours:g} h in {data_dir} "
                    "(built once, may take minutes)", force=True)
    t0 = time.monotonic()
    build_info = load.build_tsdb(spec, str(data_dir), verbose=True)
    results["dataset"] = dataset_record(spec, data_dir, build_info, time.monotonic() - t0)
    workdir = out_dir / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    long: LongData | None = None
    if long_windows:
        assert long_spec is not None and long_dir is not None and long_spec.end == spec.end
        progress.update(f"long dataset for the {', '.join(long_windows)} window(s): {long_spec.nodes}x"
                        f"{long_spec.gpus_per_node} GPUs x {long_spec.hours:g} h in {long_dir} "
                        "(built once, may take minutes)", force=True)
        t0 = time.monotonic()
        long_info = load.build_tsdb(long_spec, str(long_dir), verbose=True)
        results["long_dataset"] = {**dataset_record(long_spec, long_dir, long_info, time.monotonic() - t0),
                                   "windows": long_windows}
        long = LongData(long_spec, long_dir, workdir, results["long_dataset"])
    prom = load.start_prometheus(str(data_dir), free_port(), log_path=str(workdir / "prometheus.log"))
    redis: RedisServer | None = None
    env: Env | None = None
    try:
        prom_url, prom_pid = prom.url, prom.pid
        assert_loopback(prom_url)
        settle_s = settle_prometheus(prom_url, prom_pid, data_dir, progress)
        if settle_s:
            results["notes"].append(f"waited {settle_s:.0f} s for Prometheus to compact the freshly built blocks "
                                    "(once per dataset)")
        if not args.no_redis:
            redis = RedisServer.start(workdir / "redis")
        env = Env(
            args=args, prom_url=prom_url, prom_pid=prom_pid, data_start_s=float(spec.start),
            now_s=spec.end - PHASE_S, workdir=workdir, promaccel_args=shlex.split(args.promaccel_args),
            redis=redis, progress=progress, budget=Budget(args.max_requests),
            dashboard=load_dashboard(DEFAULT_DASHBOARD), dataset_info=results["dataset"], long=long,
        )
        results["virtual_now_iso"] = _iso(env.now_s)
        results["versions"] = _versions(prom_url)
        asyncio.run(run_scenarios(env, results))
    finally:
        if env is not None:
            env.stop_promaccel()
        if redis is not None:
            redis.stop()
        if long is not None:
            long.stop()
        load.stop_prometheus(prom)
    results["elapsed_s"] = time.monotonic() - t_start
    if env is not None and env.code_digests:
        results["promaccel_code"] = env.code_digests[0]
        if len(set(env.code_digests)) > 1:
            results["notes"].append(
                "promaccel's source (proxy/, shardplanner/) changed while the bench ran: scenarios ran different "
                f"versions ({' -> '.join(dict.fromkeys(env.code_digests))}); rerun on a quiet tree")
    results["requests_sent"] = env.budget.sent if env else 0
    summary = write_report(results, out_dir, None if args.no_latest else RESULTS_DIR / "latest.md")
    mismatches = sum(s.mismatches for s in results["scenarios"])
    failures = sum(s.failures for s in results["scenarios"])
    direct_failures = sum(s.direct_failures for s in results["scenarios"])
    progress.done(f"done in {results['elapsed_s']:.0f} s: {results['requests_sent']:,} requests, "
                  f"{mismatches} mismatches, {failures} promaccel failures ({direct_failures} direct); "
                  f"report {os.path.relpath(summary)}")
    return 1 if mismatches or failures else 0


if __name__ == "__main__":
    sys.exit(main())
