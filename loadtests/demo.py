"""`make demo`: a generated GPU fleet in a real Prometheus, promaccel in front of it.

Builds (once) a dataset ending at the current hour so Grafana's "Last 24 hours" shows data,
starts Prometheus and promaccel on loopback ports, times a sample panel directly and through
promaccel, prints the URL to put in Grafana, and serves until Ctrl-C (`--once`: exit after
the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from loadtests.gen import FleetSpec
from loadtests.load import build_tsdb, read_manifest, start_prometheus, stop_prometheus

ROOT = Path(__file__).resolve().parent.parent
PANEL = "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)"


def _port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def _post(url: str, form: dict[str, str]) -> tuple[float, bytes]:
    data = urllib.parse.urlencode(form).encode()
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=300) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.demo", description=__doc__)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--data-dir", default=str(ROOT / ".cache" / "demo"))
    ap.add_argument("--port", type=int, default=9091, help="promaccel port (next free if taken)")
    ap.add_argument("--prometheus-port", type=int, default=9090)
    ap.add_argument("--once", action="store_true", help="exit after the timing")
    args = ap.parse_args(argv)

    manifest = read_manifest(args.data_dir)
    if manifest and manifest.get("spec", {}).get("nodes") == args.nodes:
        spec = FleetSpec.from_dict(manifest["spec"])
        print(f"reusing the dataset in {args.data_dir}", flush=True)
    else:
        end = int(time.time()) // 3600 * 3600
        spec = FleetSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, hours=args.hours, end=end)
        print(f"building a {args.nodes}-node x {args.gpus_per_node}-GPU, {args.hours} h dataset "
              f"(one-off, about a minute) ...", flush=True)
        build_tsdb(spec, args.data_dir, verbose=True)

    prom = start_prometheus(args.data_dir, _port(args.prometheus_port))
    pa_port = _port(args.port)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", "--backend", prom.url,  # type: ignore[attr-defined]
         "--host", "127.0.0.1", "--port", str(pa_port), "--split-interval", "1h"],
        cwd=str(ROOT),
    )
    pa_url = f"http://127.0.0.1:{pa_port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(pa_url + "/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        form = {"query": PANEL, "start": str(spec.end - 24 * 3600 if spec.hours >= 24 else spec.start),
                "end": str(spec.end), "step": "60"}
        direct = [_post(prom.url + "/api/v1/query_range", form)[0] for _ in range(3)]  # type: ignore[attr-defined]
        cold, body_p = _post(pa_url + "/api/v1/query_range", form)
        warm = [_post(pa_url + "/api/v1/query_range", form)[0] for _ in range(3)]
        _, body_d = _post(prom.url + "/api/v1/query_range", form)  # type: ignore[attr-defined]
        same = json.loads(body_p)["data"] == json.loads(body_d)["data"]
        d, w = statistics.median(direct), statistics.median(warm)
        print()
        print(f"dataset: {spec.nodes} nodes x {spec.gpus_per_node} GPUs, "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(spec.start))} .. "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(spec.end))} UTC")
        print(f"sample panel: {PANEL}, {form['start']}..{form['end']} step 60s")
        print(f"  direct Prometheus : {d * 1000:8.1f} ms (median of 3)")
        print(f"  promaccel, first  : {cold * 1000:8.1f} ms")
        print(f"  promaccel, again  : {w * 1000:8.1f} ms (median of 3)  ratio {w / d:.2f}x")
        print(f"  same answer       : {'yes' if same else 'NO'}")
        print()
        print(f"Prometheus (direct): {prom.url}")  # type: ignore[attr-defined]
        print(f"Grafana data source URL (Prometheus type): {pa_url}")
        print("  Grafana in Docker on this machine: http://host.docker.internal:"
              f"{pa_port} (or run `docker compose up` for the full stack)")
        if args.once:
            return 0 if same else 1
        print("serving; Ctrl-C to stop", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        proxy.terminate()
        try:
            proxy.wait(10)
        except subprocess.TimeoutExpired:
            proxy.kill()
        stop_prometheus(prom)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
