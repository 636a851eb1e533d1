"""What a dead Redis costs a query: promaccel with `--redis` at a port nothing listens on,
beside promaccel with its in-process cache and direct Prometheus, measured side by side.

    python -m loadtests.redis_down [--requests 200] [--shards 8]

Instant `sum(DCGM_FI_DEV_GPU_UTIL)` on the small dataset, a new evaluation time per request
(every request misses the cache and fans out to the backend); prints p50/p95 per mode.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.gen import CI_SPEC
from loadtests.load import build_tsdb, free_port, running_prometheus
from loadtests.services import Promaccel

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--shards", default="8")
    ap.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "bench" / "16x4x6h")
    args = ap.parse_args(argv)
    build_tsdb(CI_SPEC, str(args.data_dir))
    work = Path(tempfile.mkdtemp(prefix="promaccel-redis-down-"))
    flags = ["--split-interval", "1h", "--shards", args.shards]
    with running_prometheus(str(args.data_dir)) as prom:
        dead = f"redis://127.0.0.1:{free_port()}/0"
        servers = {"redis down": Promaccel.start(prom.url, flags, work / "down", redis_url=dead),
                   "in-process cache": Promaccel.start(prom.url, flags, work / "mem")}
        try:
            end = CI_SPEC.end - 600
            urls = [("direct", prom.url), *((n, s.url) for n, s in servers.items())]
            took: dict[str, list[float]] = {n: [] for n, _ in urls}
            with httpx.Client(timeout=30) as client:
                for i in range(args.requests + 20):
                    form = {"query": "sum(DCGM_FI_DEV_GPU_UTIL)", "time": str(end - i)}
                    for name, url in urls:
                        t0 = time.perf_counter()
                        r = client.post(url + "/api/v1/query", data=form)
                        if r.status_code != 200:
                            raise RuntimeError(f"{name}: HTTP {r.status_code}")
                        if i >= 20:  # the first 20: warm-up
                            took[name].append((time.perf_counter() - t0) * 1000)
        finally:
            for s in servers.values():
                s.stop()
    print("| mode | p50 ms | p95 ms |\n|---|---:|---:|")
    for name, values in took.items():
        values.sort()
        print(f"| {name} | {statistics.median(values):.2f} | {values[int(len(values) * 0.95)]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
