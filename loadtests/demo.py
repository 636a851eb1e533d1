"""`make demo`: a generated GPU fleet mid-migration to AMP, promaccel in front of it.

Builds (once) a dataset ending at the current hour so Grafana's "Last 24 hours" shows data,
and the hybrid topology of a fleet moving to Amazon Managed Service for Prometheus, all on
loopback ports:

    reference Prometheus   the whole fleet (what the answers are checked against)
    "amp"                  DCGM_* history only, a Prometheus behind promaccel's own
                           AMP-compatible endpoint (SigV4 verified for real, test credentials)
    "local"                node, kube and up metrics, only the last 6 hours (short retention)
    promaccel              both backends: DCGM panels read AMP, node panels the local
                           Prometheus, and joins of GPU and node metrics are evaluated by
                           promaccel across the two stores

Times a sample panel and a cross-store join directly (reference) and through promaccel,
checks the answers are the same, prints the URL to put in Grafana, and serves until Ctrl-C
(`--once`: exit after the timing). `--single`: promaccel over the reference only.
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

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY
from loadtests.gen import FleetSpec
from loadtests.load import Selection, build_tsdb, read_manifest, start_prometheus, stop_prometheus
from loadtests.services import free_port, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
PANEL = "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)"
# GPU utilisation (AMP) per node against its network receive rate (node_exporter, local).
JOIN = ('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left () '
        'label_replace(sum by (instance) (rate(node_network_receive_bytes_total[5m])) > 0, '
        '"Hostname", "$1", "instance", "(.*):.*")')
LOCAL_HOURS = 6
LOCAL_METRICS = "node_.*|kube_.*|up"


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _same(a: bytes, b: bytes) -> bool:
    def norm(body: bytes) -> list[tuple[str, str]]:
        data = json.loads(body)["data"]["result"]
        return sorted((json.dumps(s["metric"], sort_keys=True), json.dumps(s.get("values") or s.get("value")))
                      for s in data)
    return norm(a) == norm(b)


def _port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))  # 0: any free port
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
    ap.add_argument("--single", action="store_true", help="promaccel over one Prometheus (no AMP)")
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
    procs: list[subprocess.Popen] = []
    pa_port = _port(args.port)
    pa_url = f"http://127.0.0.1:{pa_port}"
    env = dict(os.environ)
    try:
        if args.single:
            serve = ["--backend", prom.url]  # type: ignore[attr-defined]
        else:
            cfg, env = _hybrid(spec, args.data_dir, procs)
            serve = ["--config", cfg]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", *serve,
             "--host", "127.0.0.1", "--port", str(pa_port), "--split-interval", "1h", "--log-level", "warning"],
            cwd=str(ROOT), env=env,
        )
        procs.append(proxy)
        wait_http(pa_url + "/-/ready", proxy, timeout=300)
        ok = _report(spec, prom.url, pa_url, args.single)  # type: ignore[attr-defined]
        print(f"Prometheus (reference, direct): {prom.url}")  # type: ignore[attr-defined]
        print(f"Grafana data source URL (Prometheus type): {pa_url}")
        print("  Grafana in Docker on this machine: http://host.docker.internal:"
              f"{pa_port} (or run `docker compose up` for the full stack)")
        if args.once:
            return 0 if ok else 1
        print("serving; Ctrl-C to stop", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        for p in reversed(procs):
            stop(p)
        stop_prometheus(prom)


def _hybrid(spec: FleetSpec, data_dir: str, procs: list[subprocess.Popen]) -> tuple[str, dict[str, str]]:
    """Build and start the two slices and the AMP endpoint; write promaccel's config."""
    since = spec.end - LOCAL_HOURS * 3600
    amp_dir, local_dir = data_dir + "-amp", data_dir + "-local"
    print("building the AMP slice (DCGM_* only) and the local slice "
          f"(node_*, kube_*, up; last {LOCAL_HOURS} h) (one-off) ...", flush=True)
    build_tsdb(spec, amp_dir, select=Selection(metrics="DCGM_.*"))
    build_tsdb(spec, local_dir, select=Selection(windows=((since, spec.end + 1),), metrics=LOCAL_METRICS))
    amp_prom = start_prometheus(amp_dir)
    procs.append(amp_prom)
    local_prom = start_prometheus(local_dir)
    procs.append(local_prom)
    amp_port = free_port()
    amp = subprocess.Popen(
        [sys.executable, "-m", "loadtests.amp_endpoint", "--upstream", amp_prom.url,  # type: ignore[attr-defined]
         "--port", str(amp_port), "--region", "us-east-1", "--workspace", "ws-demo"],
        cwd=str(ROOT), stdout=subprocess.DEVNULL,
    )
    procs.append(amp)
    wait_http(f"http://127.0.0.1:{amp_port}/__stats", amp, timeout=60)
    cfg = {
        "backends": [
            {"name": "local", "url": local_prom.url, # type: ignore[attr-defined]
             "holds": {"metrics": LOCAL_METRICS.split("|"), "since": _iso(since)}},
            {"name": "amp", "kind": "amp", "region": "us-east-1",
             "url": f"http://127.0.0.1:{amp_port}/workspaces/ws-demo",
             "holds": {"metrics": ["DCGM_.*"], "since": _iso(spec.start)}},
        ],
    }
    path = os.path.join(data_dir + "-promaccel.yaml")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)  # JSON is YAML
    env = {**os.environ, "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
           "AWS_REGION": "us-east-1"}
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_PROFILE", None)
    print(f"  amp   : {cfg['backends'][1]['url']} (SigV4) -> {amp_prom.url}  DCGM_* since {_iso(spec.start)}")  # type: ignore[attr-defined]
    print(f"  local : {local_prom.url}  {LOCAL_METRICS} since {_iso(since)}")  # type: ignore[attr-defined]
    return path, env


def _report(spec: FleetSpec, prom_url: str, pa_url: str, single: bool) -> bool:
    start = spec.end - 24 * 3600 if spec.hours >= 24 else spec.start
    panels = [("GPU utilisation by namespace, 24 h", PANEL, str(start))]
    if not single:
        panels.append((f"GPU util x node network (cross-store), last {LOCAL_HOURS - 1} h", JOIN,
                       str(spec.end - (LOCAL_HOURS - 1) * 3600)))
    print()
    print(f"dataset: {spec.nodes} nodes x {spec.gpus_per_node} GPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(spec.start))} .. "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(spec.end))} UTC")
    ok = True
    for title, query, panel_start in panels:
        form = {"query": query, "start": panel_start, "end": str(spec.end), "step": "60"}
        direct = [_post(prom_url + "/api/v1/query_range", form)[0] for _ in range(3)]
        cold, body_p = _post(pa_url + "/api/v1/query_range", form)
        warm = [_post(pa_url + "/api/v1/query_range", form)[0] for _ in range(3)]
        _, body_d = _post(prom_url + "/api/v1/query_range", form)
        same = _same(body_p, body_d)
        ok = ok and same
        d, w = statistics.median(direct), statistics.median(warm)
        print(f"{title}: {query}")
        print(f"  direct (reference): {d * 1000:8.1f} ms (median of 3)")
        print(f"  promaccel, first  : {cold * 1000:8.1f} ms")
        print(f"  promaccel, again  : {w * 1000:8.1f} ms (median of 3)  ratio {w / d:.2f}x")
        print(f"  same answer       : {'yes' if same else 'NO'}")
        if not single:
            with urllib.request.urlopen(pa_url + "/api/v1/explain?" + urllib.parse.urlencode(form), timeout=60) as r:
                route = json.loads(r.read())["data"].get("route") or {}
            parts = route.get("parts") or []
            where = ", ".join(f"{'+'.join(p[2])} {time.strftime('%H:%M', time.gmtime(p[0] / 1000))}-"
                              f"{time.strftime('%H:%M', time.gmtime(p[1] / 1000))}" for p in parts)
            print(f"  route             : {route.get('kind')} {where or ', '.join(route.get('backends') or [])}")
    print()
    return ok


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
