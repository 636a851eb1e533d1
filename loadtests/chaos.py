"""Backend faults, measured: promaccel in front of a fault-injecting proxy over a real Prometheus.

    python -m loadtests.chaos [--data-dir .cache/bench/256x8x24h] [--window 6h] [--refreshes 4]
        [--rate 0.2] [--max-requests 400] [--time-limit 900] [--hedge-requests 150]

1. **faults**: promaccel (8 shards, 1 h split, Redis) in front of `loadtests/faults.py`, which
   gives `--rate` of the calls one fault, chosen uniformly among an HTML 502, a JSON 503, a
   closed connection, a body cut short, a 200 with truncated JSON and a 3 s stall. The GPU
   fleet dashboard is replayed (`--refreshes` refreshes of a sliding `--window`, 6 panels in
   flight as a browser sends them); every answer is compared with direct Prometheus's and
   classed: exact, a Prometheus-style JSON error (5xx), or bad (a 200 with a broken or wrong
   body, an error that is not Prometheus's JSON).
2. **healthy**: the proxy stops injecting faults; the same requests again through the same
   promaccel (its Redis cache kept): all must be exact (nothing wrong was cached).
3. **hedging**: a backend that stalls 3 s on 2% of calls, no cache, an instant dashboard
   query (8 shards: 8 calls a query) at a new time per request; p50/p95/p99 without hedging and
   with `hedge_after: p95`, and backend calls per query.

Bounded: at most `--max-requests` replayed requests per phase and `--time-limit` seconds in
all (phases cut short say so). Prints Markdown tables; `--out FILE` also writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadtests.compare import diff_answers
from loadtests.dashboard import PanelRequest, load_dashboard, panel_requests
from loadtests.gen import CI_SPEC
from loadtests.load import build_tsdb, free_port, read_manifest, running_prometheus
from loadtests.services import Promaccel, RedisServer, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 6  # a browser's requests in flight per host
FAULT_MIX = "html502,json503,reset,short,trunc200,stall"


@dataclass
class Tally:
    exact: int = 0
    json_error: int = 0
    bad: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.exact + self.json_error + len(self.bad)

    def row(self, name: str) -> str:
        lat = sorted(self.latencies)
        share = 100 * self.exact / self.total if self.total else 0.0
        return (f"| {name} | {self.total} | {self.exact} ({share:.2f}%) | {self.json_error} | {len(self.bad)} | "
                f"{_pct(lat, 0.5):.0f} | {_pct(lat, 0.95):.0f} | {_pct(lat, 0.99):.0f} |")


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def classify(direct: tuple[int, bytes], status: int, ctype: str, body: bytes) -> tuple[str, str]:
    """("exact" | "json_error" | "bad", detail) of one proxied answer against direct's."""
    try:
        got = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "bad", f"HTTP {status}, a body that is not JSON: {body[:80]!r}"
    if not isinstance(got, dict) or not ctype.startswith("application/json"):
        return "bad", f"HTTP {status} {ctype}: not a Prometheus answer"
    want = orjson.loads(direct[1])
    if status == direct[0] and not diff_answers(want, got):
        return "exact", ""
    if status >= 500 and got.get("status") == "error" and isinstance(got.get("errorType"), str) \
            and isinstance(got.get("error"), str):
        return "json_error", f"{status} {got['error'][:120]}"
    problems = diff_answers(want, got)
    return "bad", f"HTTP {status} (direct {direct[0]}): {problems[:2]}"


async def replay(client: httpx.AsyncClient, url: str, reqs: list[PanelRequest], direct: dict[str, tuple[int, bytes]],
                 tally: Tally) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(r: PanelRequest) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                resp = await client.post(url + r.path, content=r.body(),
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
                status, ctype, body = resp.status_code, resp.headers.get("content-type", ""), resp.content
            except httpx.HTTPError as exc:
                status, ctype, body = 0, "", f"{type(exc).__name__}".encode()
            tally.latencies.append(time.perf_counter() - t0)
        kind, detail = classify(direct[r.body()], status, ctype, body)
        if kind == "exact":
            tally.exact += 1
        elif kind == "json_error":
            tally.json_error += 1
            key = detail.split(":")[0][:80]
            tally.errors[key] = tally.errors.get(key, 0) + 1
        else:
            tally.bad.append(f"{r.title}: {detail}")

    await asyncio.gather(*(one(r) for r in reqs))


def start_faults(upstream: str, rate: float, faults: str, work: Path, seed: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = (work / f"faults-{port}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "loadtests.faults", "--upstream", upstream, "--port", str(port),
                             "--rate", str(rate), "--faults", faults, "--seed", str(seed)], stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/faults", proc, timeout=30)
    return proc, url


def fault_counts(url: str, set_rate: float | None = None) -> dict[str, Any]:
    if set_rate is not None:
        return dict(httpx.post(f"{url}/-/faults?rate={set_rate}", timeout=10).json())
    return dict(httpx.get(url + "/-/faults", timeout=10).json())


def serving_copy(src: Path, dest: Path) -> Path:
    """The dataset's blocks for our own Prometheus (a Prometheus locks its directory, and the
    bench's may be serving it): large block files hard-linked (Prometheus never writes into a
    block's chunks or index), small ones (meta.json, tombstones) copied; no WAL, no lock, no
    config (start_prometheus writes its own)."""
    def place(a: str, b: str) -> None:
        if os.path.getsize(a) > 1 << 20:
            try:
                os.link(a, b)
                return
            except OSError:
                pass
        shutil.copy2(a, b)

    shutil.copytree(src, dest, copy_function=place, ignore=shutil.ignore_patterns(
        "lock", "wal", "chunks_head", "queries.active", "*.log", "*.yml"))
    return dest


def write_config(path: Path, backend_url: str, extra: str) -> Path:
    path.write_text(f"backends:\n  - name: default\n    url: {backend_url}\n{extra}")
    return path


async def phase_faults(a: argparse.Namespace, prom_url: str, work: Path, windows: list[tuple[float, float]],
                       out: dict[str, Any], deadline: float) -> None:
    dashboard = load_dashboard()
    faults, furl = start_faults(prom_url, a.rate, FAULT_MIX, work, a.seed)
    redis = RedisServer.start(work / "redis")
    cfg = write_config(work / "chaos.yaml", furl, "".join(
        f"    {k}: {v}\n" for k, v in (("retries", a.retries), ("retry_ratio", a.retry_ratio)) if v is not None))
    pa = Promaccel.start(None, ["--config", str(cfg), "--split-interval", "1h", "--shards", "8"], work / "pa",
                         redis.url)
    try:
        async with httpx.AsyncClient(timeout=a.timeout) as client:
            sent: list[PanelRequest] = []
            direct: dict[str, tuple[int, bytes]] = {}
            tally = Tally()
            for i, (start, end) in enumerate(windows):
                reqs = panel_requests(dashboard, start, end)
                if time.monotonic() > deadline or len(sent) + len(reqs) > a.max_requests:
                    out["notes"].append(f"faults: stopped after {i} refreshes (time or request limit)")
                    break
                for r in reqs:  # direct first: the reference, and Prometheus's page cache warmed
                    resp = await client.post(prom_url + r.path, content=r.body(),
                                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                    direct[r.body()] = (resp.status_code, resp.content)
                await replay(client, pa.url, reqs, direct, tally)
                sent += reqs
                print(f"faults: refresh {i + 1}/{len(windows)}: {tally.exact}/{tally.total} exact", flush=True)
            counts = fault_counts(furl, set_rate=0)
            metrics = pa.metrics_text()
            healthy = Tally()
            await replay(client, pa.url, sent, direct, healthy)
            print(f"healthy: {healthy.exact}/{healthy.total} exact", flush=True)
        out["faults"] = {"tally": tally.__dict__, "backend": counts, "metrics": _backend_metrics(metrics)}
        out["healthy"] = {"tally": healthy.__dict__}
        out["rows"] += [tally.row(f"{a.rate:.0%} faults"), healthy.row("healthy again (same cache)")]
    finally:
        pa.stop()
        redis.stop()
        stop(faults)


def _backend_metrics(text: str) -> dict[str, float]:
    keep = ("promaccel_backend_retries_total", "promaccel_backend_retries_denied_total",
            "promaccel_backend_breaker_transitions_total", "promaccel_backend_errors_total")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(keep):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


async def phase_hedging(a: argparse.Namespace, prom_url: str, work: Path, end_s: float, out: dict[str, Any],
                        deadline: float) -> None:
    query = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    modes = {"no hedging": "", "hedge_after: p95": "    hedge_after: p95\n"}
    faults, furl = start_faults(prom_url, a.hedge_stall_rate, "stall", work, a.seed)
    servers = {}
    try:
        for i, (name, extra) in enumerate(modes.items()):
            cfg = write_config(work / f"hedge{i}.yaml", furl, extra + "cache:\n  enabled: false\n")
            servers[name] = Promaccel.start(None, ["--config", str(cfg), "--shards", "8"], work / f"hedge{i}")
        took: dict[str, list[float]] = {n: [] for n in modes}
        calls: dict[str, int] = {n: 0 for n in modes}
        async with httpx.AsyncClient(timeout=a.timeout) as client:
            n_warm = 30
            for i in range(n_warm + a.hedge_requests):
                if time.monotonic() > deadline:
                    out["notes"].append(f"hedging: stopped after {i} requests (time limit)")
                    break
                form = {"query": query, "time": str(end_s - 600 - 7 * i)}
                for name, s in servers.items():
                    before = fault_counts(furl)["calls"]
                    t0 = time.perf_counter()
                    r = await client.post(s.url + "/api/v1/query", data=form)
                    dt = time.perf_counter() - t0
                    if r.status_code != 200:
                        raise RuntimeError(f"hedging, {name}: HTTP {r.status_code} {r.text[:200]}")
                    if i >= n_warm:  # the first: the p95 window fills
                        took[name].append(dt)
                        calls[name] += fault_counts(furl)["calls"] - before
        for name in modes:
            lat = sorted(took[name])
            out["hedging"][name] = {"p50": _pct(lat, 0.5), "p95": _pct(lat, 0.95), "p99": _pct(lat, 0.99),
                                    "n": len(lat), "calls_per_query": calls[name] / max(1, len(lat)),
                                    "metrics": {k: v for k, v in _hedge_metrics(servers[name].metrics_text()).items()}}
    finally:
        for s in servers.values():
            s.stop()
        stop(faults)


def _hedge_metrics(text: str) -> dict[str, float]:
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
            if line.startswith("promaccel_backend_hedges_total")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, help="a built dataset (default: the bench's .cache/bench/256x8x24h "
                    "when built, else the CI fleet's .cache/bench/16x4x6h, built when missing)")
    ap.add_argument("--window", default="6h")
    ap.add_argument("--slide", default="5m", help="how far the window slides between refreshes")
    ap.add_argument("--refreshes", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--retries", type=int, help="backends[].retries of the faults phase (default: promaccel's)")
    ap.add_argument("--retry-ratio", type=float, help="backends[].retry_ratio of the faults phase (default: promaccel's)")
    ap.add_argument("--max-requests", type=int, default=400)
    ap.add_argument("--time-limit", type=float, default=900.0)
    ap.add_argument("--timeout", type=float, default=130.0, help="client timeout per request")
    ap.add_argument("--hedge-requests", type=int, default=150, help="0: no hedging phase")
    ap.add_argument("--hedge-stall-rate", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1, help="which calls get which fault (the same seed, the same faults)")
    ap.add_argument("--skip-faults", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.data_dir is None:
        a.data_dir = ROOT / ".cache" / "bench" / "256x8x24h"
        if read_manifest(str(a.data_dir)) is None:
            a.data_dir = ROOT / ".cache" / "bench" / "16x4x6h"
            build_tsdb(CI_SPEC, str(a.data_dir))
    manifest = read_manifest(str(a.data_dir))
    if manifest is None:
        raise SystemExit(f"{a.data_dir}: no dataset there (python -m loadtests.load builds one)")
    assert manifest is not None
    end_s = float(manifest["end"])
    from loadtests.timeline import parse_duration_s, sliding_windows

    windows = sliding_windows(end_s - 600, parse_duration_s(a.window), parse_duration_s(a.slide), a.refreshes)
    work = Path(tempfile.mkdtemp(prefix="promaccel-chaos-"))
    deadline = time.monotonic() + a.time_limit
    out: dict[str, Any] = {"command": "python -m loadtests.chaos " + " ".join(argv if argv is not None else sys.argv[1:]),
                           "dataset": manifest.get("spec"), "rows": [], "notes": [], "hedging": {}}
    t0 = time.monotonic()
    with running_prometheus(str(serving_copy(a.data_dir, work / "data"))) as prom:
        if not a.skip_faults:
            asyncio.run(phase_faults(a, prom.url, work, windows, out, deadline))
        if a.hedge_requests:
            asyncio.run(phase_hedging(a, prom.url, work, end_s, out, deadline))
    out["took_s"] = time.monotonic() - t0
    print(f"\n{out['command']}  ({out['took_s']:.0f} s; dataset {out['dataset']})\n")
    if out["rows"]:
        print("| phase | answers | exact | Prometheus JSON errors | bad | p50 ms | p95 ms | p99 ms |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(out["rows"]))
        f = out["faults"]
        print(f"\nbackend calls {f['backend']['calls']}, faults injected {f['backend']['faults']} "
              f"{f['backend']['by_fault']}; promaccel: {f['metrics']}")
        for phase in ("faults", "healthy"):
            t = out[phase]["tally"]
            if t["errors"]:
                print(f"{phase}: errors {t['errors']}")
            for b in t["bad"][:10]:
                print(f"{phase}: BAD {b}")
    if out["hedging"]:
        print(f"\nA backend stalling 3 s on {a.hedge_stall_rate:.0%} of calls; instant query, 8 shards, no cache:\n")
        print("| mode | queries | p50 ms | p95 ms | p99 ms | backend calls / query |\n|---|---:|---:|---:|---:|---:|")
        for name, h in out["hedging"].items():
            print(f"| {name} | {h['n']} | {h['p50']:.0f} | {h['p95']:.0f} | {h['p99']:.0f} | "
                  f"{h['calls_per_query']:.2f} |")
        print({n: h["metrics"] for n, h in out["hedging"].items()})
    for note in out["notes"]:
        print("note:", note)
    if a.out:
        a.out.write_text(json.dumps(out, indent=1, default=str))
    bad = out.get("faults", {}).get("tally", {}).get("bad", []) + out.get("healthy", {}).get("tally", {}).get("bad", [])
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
