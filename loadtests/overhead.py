"""promaccel's own cost per request on a warm cache, for two checkouts side by side.

    python -m loadtests.overhead --baseline ../other-checkout [--requests 300] [--rounds 5]

Serves the small dataset (16 nodes x 4 GPUs x 6 h, built if missing) with one Prometheus,
starts this checkout's promaccel and the baseline's (in-process cache, default settings),
warms both, then in alternating rounds sends sequential requests and records, per request,
promaccel's CPU time (user + system of its process) and the latency a Python client sees:
- small panel: a cached 48-series range answer (61 points each);
- refresh: the 14-panel GPU fleet dashboard over 1 h, every panel cached.
Medians over the rounds are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.dashboard import load_dashboard, panel_requests
from loadtests.gen import CI_SPEC
from loadtests.load import build_tsdb, running_prometheus
from loadtests.services import Promaccel, cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
SMALL = 'DCGM_FI_DEV_GPU_TEMP{gpu!="3"}'


def _requests(prom_end_s: int) -> dict[str, list[tuple[str, dict[str, str]]]]:
    end = prom_end_s - 600
    small = [("/api/v1/query_range", {"query": SMALL, "start": str(end - 3600), "end": str(end), "step": "60"})]
    refresh = [(r.path, r.form()) for r in panel_requests(load_dashboard(), end - 3600, end)]
    return {"small panel": small, "refresh": refresh}


def _measure(client: httpx.Client, server: Promaccel, reqs: list[tuple[str, dict[str, str]]], n: int) -> tuple[float, float]:
    """(CPU ms, client ms) per round trip of `reqs`: the process's CPU over all n round trips
    divided by n (the kernel counts CPU in 10 ms ticks), and the median latency."""
    wall = []
    c0 = cpu_seconds(server.pid)
    for _ in range(n):
        t0 = time.perf_counter()
        for path, form in reqs:
            r = client.post(server.url + path, data=form)
            if r.status_code != 200:
                raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:200]}")
        wall.append((time.perf_counter() - t0) * 1000)
    return (cpu_seconds(server.pid) - c0) * 1000 / n, statistics.median(wall)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of promaccel")
    ap.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "bench" / "16x4x6h")
    ap.add_argument("--requests", type=int, default=500, help="requests per round and kind (default 500)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    build_tsdb(CI_SPEC, str(args.data_dir))
    work = Path(tempfile.mkdtemp(prefix="promaccel-overhead-"))
    with running_prometheus(str(args.data_dir)) as prom:
        servers = {"this checkout": Promaccel.start(prom.url, [], work / "new"),
                   "baseline": Promaccel.start(prom.url, [], work / "base", code_dir=args.baseline.resolve())}
        try:
            kinds = _requests(CI_SPEC.end)
            results: dict[tuple[str, str], list[tuple[float, float]]] = {}
            with httpx.Client(timeout=60) as client:
                for server in servers.values():  # warm: every piece cached
                    for reqs in kinds.values():
                        for _ in range(3):
                            _measure(client, server, reqs, 1)
                        time.sleep(0.5)
                for _ in range(args.rounds):
                    for kind, reqs in kinds.items():
                        for name, server in servers.items():
                            n = max(1, args.requests // len(reqs))
                            results.setdefault((kind, name), []).append(_measure(client, server, reqs, n))
        finally:
            for s in servers.values():
                s.stop()
    print("| request | checkout | promaccel CPU ms | client ms |")
    print("|---|---|---:|---:|")
    for (kind, name), rows in results.items():
        print(f"| {kind} | {name} | {statistics.median(r[0] for r in rows):.2f} | "
              f"{statistics.median(r[1] for r in rows):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
