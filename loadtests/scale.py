"""The cost model of docs/SCALE.md: inputs measured at small scale, extrapolated to a fleet.

    python -m loadtests.scale [--gpus 16000] [--gpus-per-node 8] [--viewers 50] [--refresh 30]

Measured here, each time it runs:
- samples per scrape: the generator (loadtests/gen.py) writes one hour of four small fleets to
  /dev/null; a least-squares fit samples = a * GPUs + b * nodes + c gives the per-GPU and
  per-node series (DCGM per GPU; node_exporter, kube-state-metrics, up per node);
- pieces per refresh: the 14-panel dashboard (config/grafana/dashboards/gpu-fleet.json)
  through loadtests/dashboard.py panel_requests and shardplanner.planner.plan with the default
  configuration, for 1 h, 24 h and 7 d windows;
- on the CI dataset (16 nodes x 4 GPUs x 6 h, built if missing) served by a Prometheus of its
  own on 127.0.0.1 (stopped on exit, every step bounded in time): each panel's answer for
  every hour cell, encoded as the cache stores it (proxy.codec.arrow.to_ipc_bytes, lz4 above the
  small-piece threshold) = Redis bytes per hour of history; and the samples Prometheus
  processed (`stats=all`, totalQueryableSamples, what AMP bills as query samples processed)
  for each 24 h-window panel request and for the pieces a warm refresh re-fetches.
Read from the benchmark run docs/BENCHMARKS.md reports (loadtests/results/20261130-031459/
results.json): promaccel CPU per warm 24 h refresh and backend calls of 50 users vs 1.
Everything else is arithmetic, printed with its inputs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests.dashboard import load_dashboard, panel_requests
from loadtests.exporters import write_fleet
from loadtests.gen import CI_SPEC, Fleet, FleetSpec
from loadtests.load import build_tsdb, running_prometheus
from proxy.codec import arrow
from proxy.codec.json_decode import decode_prometheus_json
from proxy.config import build_config
from proxy.pipeline.cache_write import COMPRESS_ABOVE_SAMPLES
from proxy.pipeline.planning import planner_settings
from shardplanner.plan import QueryRequest, Span
from shardplanner.planner import plan

ROOT = Path(__file__).resolve().parent.parent
BENCH_RESULTS = ROOT / "loadtests" / "results" / "20261130-031459" / "results.json"
HOUR = 3600
DAY = 86_400
MAX_FRESHNESS_S = 600  # cache.max_freshness default: newer pieces are fetched on every refresh
BENCH_GPUS = 256 * 8  # the bench dataset the results.json figures were measured on


def samples_per_scrape() -> tuple[float, float, float, list[tuple[int, int, int]]]:
    """(per GPU, per node, constant, measured rows (nodes, gpus, samples per scrape))."""
    rows = []
    for nodes, gpn in ((4, 4), (4, 8), (8, 8), (16, 8)):
        spec = FleetSpec(nodes=nodes, gpus_per_node=gpn, hours=1)
        with open(os.devnull, "wb") as f:
            st = write_fleet(Fleet(spec), f)
        rows.append((nodes, nodes * gpn, st.samples // spec.n_scrapes))
    a = np.array([[g, n, 1.0] for n, g, _ in rows])
    y = np.array([s for _, _, s in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2]), rows


def pieces_per_refresh(end_s: int) -> dict[str, tuple[int, int]]:
    """window -> (requests, pieces) of one refresh, default configuration."""
    settings = planner_settings(build_config({}))
    dash = load_dashboard()
    out = {}
    for name, secs in (("1h", HOUR), ("24h", DAY), ("7d", 7 * DAY)):
        reqs = panel_requests(dash, end_s - secs, end_s)
        n = 0
        for r in reqs:
            q = (QueryRequest(r.expr, Span.instant(int(r.end * 1000))) if r.instant else
                 QueryRequest.range(r.expr, int(r.start * 1000), int(r.end * 1000), int(r.step * 1000)))
            n += len(plan(q, settings, {}).pieces)
        out[name] = (len(reqs), n)
    return out


def _query(client: httpx.Client, url: str, path: str, form: dict[str, str]) -> dict[str, Any]:
    r = client.post(url + path, data={**form, "stats": "all"})
    r.raise_for_status()
    body = r.json()
    if body.get("status") != "success":
        raise RuntimeError(f"{form['query']}: {body}")
    return body


def measure_on_ci(data_dir: Path) -> dict[str, Any]:
    build_tsdb(CI_SPEC, str(data_dir))
    settings = planner_settings(build_config({}))
    dash = load_dashboard()
    # "Now" half an hour into the CI window's last hour: a warm refresh re-fetches the pieces
    # newer than max_freshness, i.e. the cell from the hour's start to now (30 min on average).
    now = CI_SPEC.end - 1800
    reqs = panel_requests(dash, now - DAY, now)
    cell_bytes: list[int] = []
    direct_samples = warm_samples = 0
    instant_samples = 0
    t0 = time.monotonic()
    with running_prometheus(str(data_dir)) as prom, httpx.Client(timeout=60) as client:
        url = prom.url  # type: ignore[attr-defined]
        for r in reqs:
            if time.monotonic() - t0 > 300:
                raise TimeoutError("measuring on the CI dataset took over 5 min")
            body = _query(client, url, r.path, r.form())
            n = int(body["data"]["stats"]["samples"]["totalQueryableSamples"])
            if r.instant:  # at "now": passed through by promaccel too, the same cost both ways
                instant_samples += n
                continue
            direct_samples += n
            p = plan(QueryRequest.range(r.expr, int(r.start * 1000), int(r.end * 1000), int(r.step * 1000)), settings, {})
            for piece in p.pieces:
                s, e = piece.span.start_ms // 1000, piece.span.end_ms // 1000
                form = {"query": piece.query, "start": str(s), "end": str(e), "step": str(piece.span.step_ms / 1000)}
                if e >= now - MAX_FRESHNESS_S:  # not cacheable yet: fetched on every refresh
                    warm_samples += int(_query(client, url, "/api/v1/query_range", form)["data"]["stats"]["samples"]["totalQueryableSamples"])
                if CI_SPEC.start + HOUR <= s and e < now - MAX_FRESHNESS_S:  # a whole cell inside the data
                    res = decode_prometheus_json(client.post(url + "/api/v1/query_range", data=form).content)
                    cell_bytes.append(len(arrow.to_ipc_bytes(res, None if res.n_samples <= COMPRESS_ABOVE_SAMPLES else "lz4")))
    data_hours = CI_SPEC.hours - 0.5  # the 24 h window holds the CI data up to "now"
    return {"cells": len(cell_bytes), "bytes_per_cell_median": statistics.median(cell_bytes),
            "bytes_per_cell_mean": statistics.fmean(cell_bytes),
            "requests": len(reqs), "range_requests": len(reqs) - sum(r.instant for r in reqs),
            "direct_samples": direct_samples, "data_hours": data_hours,
            "warm_samples": warm_samples, "instant_samples": instant_samples}


def bench_figures() -> dict[str, float]:
    d = json.loads(BENCH_RESULTS.read_text())
    out: dict[str, float] = {}
    for s in d["scenarios"]:
        if s["name"] == "dashboard" and s.get("window") == "24h":
            out["cpu_warm_24h_s"] = statistics.median(r["promaccel"]["promaccel_cpu_s"] for r in s["refreshes"][1:])
        if s["name"] == "users":
            out["users"] = s["users"]
            out["single_calls"] = s["single_calls"]
            out["users_cold_calls"] = s["rounds"][0]["backend_calls"] if isinstance(s["rounds"][0], dict) else float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=16_000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--scrape", type=int, default=30, help="scrape interval, s")
    ap.add_argument("--viewers", type=int, default=50)
    ap.add_argument("--refresh", type=int, default=30, help="dashboard refresh interval, s")
    ap.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "bench" / "16x4x6h")
    a = ap.parse_args(argv)
    G, N = a.gpus, a.gpus // a.gpus_per_node
    ci_gpus = CI_SPEC.nodes * CI_SPEC.gpus_per_node

    print("## Measured inputs\n")
    per_gpu, per_node, const, rows = samples_per_scrape()
    print("samples per scrape, generator (nodes, GPUs, samples):", rows)
    print(f"  fit: {per_gpu:.2f} per GPU + {per_node:.2f} per node + {const:.1f}")
    pieces = pieces_per_refresh(CI_SPEC.end)
    print("requests / pieces per refresh (default config):",
          ", ".join(f"{w}: {r} / {p}" for w, (r, p) in pieces.items()))
    ci = measure_on_ci(a.data_dir)
    print(f"CI dataset ({CI_SPEC.nodes} nodes x {CI_SPEC.gpus_per_node} GPUs = {ci_gpus} GPUs), 24 h-window refresh, "
          f"{ci['range_requests']} range + {ci['requests'] - ci['range_requests']} instant requests:")
    print(f"  hour cells encoded: {ci['cells']}, bytes per cell median {ci['bytes_per_cell_median']:,.0f}, "
          f"mean {ci['bytes_per_cell_mean']:,.0f}")
    print(f"  samples processed: direct {ci['direct_samples']:,} over {ci['data_hours']} h of data; "
          f"warm refresh's fresh pieces {ci['warm_samples']:,}; instant requests {ci['instant_samples']:,}")
    b = bench_figures()
    print(f"bench run {BENCH_RESULTS.parent.name}: promaccel CPU per warm 24 h refresh (median of 7, "
          f"{BENCH_GPUS} GPUs) {b['cpu_warm_24h_s']:.2f} s; users scenario: {b.get('users')} users, "
          f"one user's calls {b.get('single_calls')}, cold round {b.get('users_cold_calls')}")

    print(f"\n## Extrapolated: {G:,} GPUs = {N:,} nodes x {a.gpus_per_node}, scrape {a.scrape} s, "
          f"{a.viewers} viewers refreshing every {a.refresh} s\n")
    scale = G / ci_gpus
    per_scrape = per_gpu * G + per_node * N + const
    per_day = per_scrape * DAY / a.scrape
    print(f"active series ~{per_scrape:,.0f}; samples per day {per_day / 1e9:.2f} G")
    cells_per_hour = pieces["24h"][1] / 25  # a 24 h window spans 25 hour cells per request
    redis_day = ci["bytes_per_cell_mean"] * scale * cells_per_hour * 24
    print(f"Redis: {cells_per_hour:.0f} cells per hour of history x {ci['bytes_per_cell_mean'] * scale / 2**20:.2f} MiB "
          f"= {redis_day / 2**30:.2f} GiB per day cached (x7 days kept: {7 * redis_day / 2**30:.1f} GiB)")
    direct_24h = ci["direct_samples"] / ci["data_hours"] * 24 * scale + ci["instant_samples"] * scale
    warm_24h = (ci["warm_samples"] + ci["instant_samples"]) * scale
    print(f"AMP samples processed per 24 h refresh: direct {direct_24h / 1e9:.2f} G, "
          f"warm through promaccel {warm_24h / 1e9:.3f} G ({warm_24h / direct_24h:.3f}x)")
    per_viewer_qps = pieces["24h"][0] / a.refresh
    print(f"backend queries/s: direct {a.viewers * per_viewer_qps:.1f} ({pieces['24h'][0]} requests per refresh per viewer); "
          f"promaccel: viewers' refreshes aligned (coalesced, measured 1.0x) {per_viewer_qps:.2f}, "
          f"unaligned at most {a.viewers * per_viewer_qps:.1f} (each call reads only the newest cell)")
    cpu = b["cpu_warm_24h_s"] * G / BENCH_GPUS
    refresh_rate = a.viewers / a.refresh
    replicas = math.ceil(refresh_rate * cpu / 0.7)
    print(f"promaccel CPU per warm 24 h refresh ~{cpu:.2f} s; {refresh_rate:.2f} refreshes/s -> "
          f"{refresh_rate * cpu:.1f} cores -> {replicas} replicas of 1 core at 70%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
