"""`make demo`: a generated GPU fleet mid-migration to AMP, promaccel in front of it.

Builds (once, and again when the one built ends over REUSE_HOURS before the current hour) a
dataset ending at the current hour so Grafana's "Last 24 hours" shows data, and the hybrid
topology of a fleet moving to Amazon Managed Service for Prometheus, all on loopback ports:

    reference Prometheus   the whole fleet (what the answers are checked against)
    "amp"                  DCGM_* history only, a Prometheus behind promaccel's own
                           AMP-compatible endpoint (SigV4 verified for real, test credentials)
    "local"                node, kube and up metrics, only the last 6 hours (short retention)
    promaccel              both backends: DCGM panels read AMP, node panels the local
                           Prometheus, and joins of GPU and node metrics are evaluated by
                           promaccel across the two stores

promaccel caches in a Redis of its own when redis-server is installed (`make setup` installs
it), in-process otherwise. Times a sample panel and a cross-store join directly (reference)
and through promaccel, checks the answers are the same, prints commands to try and the Grafana
data-source settings, and serves until Ctrl-C, SIGTERM or SIGHUP (`--once`: exit after the
timing). `--single`: promaccel over the reference only.

Everything it starts stops with it: on those signals, on an error, and (Linux) even when the
demo itself is killed (each child is tied to it with PR_SET_PDEATHSIG). promaccel and the
reference Prometheus keep their ports (9091, 9090) across restarts; a port another process
holds is an error naming the flag that changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY
from loadtests.gen import FleetSpec
from loadtests.load import Selection, build_tsdb, die_with_parent, read_manifest, start_prometheus
from loadtests.services import RedisServer, free_port, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
PANEL = "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)"
# GPU utilisation (AMP) per node against its network receive rate (node_exporter, local).
JOIN = ('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left () '
        'label_replace(sum by (instance) (rate(node_network_receive_bytes_total[5m])) > 0, '
        '"Hostname", "$1", "instance", "(.*):.*")')
LOCAL_HOURS = 6
# A dataset is reused while it ends at most this many hours before the current hour: the last
# hours (Grafana's "Last 6 hours", the README's examples, which ask for the last 6 h) hold data.
REUSE_HOURS = 4
LOCAL_METRICS = "node_.*|kube_.*|up"


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _same(a: bytes, b: bytes) -> bool:
    def norm(body: bytes) -> list[tuple[str, str]]:
        data = json.loads(body)["data"]["result"]
        return sorted((json.dumps(s["metric"], sort_keys=True), json.dumps(s.get("values") or s.get("value")))
                      for s in data)
    return norm(a) == norm(b)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived: unwind, stopping every child on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise Stopped wherever the demo is (building, starting,
    serving); once one arrived the others are ignored, so the cleanup runs to its end."""
    def handler(signum: int, frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


class PortTaken(Exception):
    pass


def _port(preferred: int, flag: str) -> int:
    """`preferred` if nothing listens on it (0: any free port). SO_REUSEADDR, as the servers
    bind: connections of a previous run in TIME_WAIT do not make the port look taken."""
    if preferred == 0:
        return free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError as exc:
            raise PortTaken(f"port {preferred} on 127.0.0.1 is in use by another process ({exc.strerror}): "
                            f"stop it, or choose another port with {flag} N (0: any free port)") from None
    return preferred


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
    ap.add_argument("--port", type=int, default=9091, help="promaccel port (0: any free port)")
    ap.add_argument("--prometheus-port", type=int, default=9090,
                    help="the reference Prometheus's port (0: any free port)")
    ap.add_argument("--no-redis", action="store_true", help="in-process cache even when redis-server is installed")
    ap.add_argument("--once", action="store_true", help="exit after the timing")
    ap.add_argument("--single", action="store_true", help="promaccel over one Prometheus (no AMP)")
    args = ap.parse_args(argv)

    # Every child is stopped on the way out (a signal, an error); each is also tied to the
    # demo, so the kernel sends it SIGTERM if the demo dies without getting here (SIGKILL).
    procs: list[subprocess.Popen] = []
    _stop_on_signals()
    die_with_parent()  # `kill` of the `make demo` running it stops it too (SIGTERM)
    try:
        pa_port = _port(args.port, "--port")
        prom_port = _port(args.prometheus_port, "--prometheus-port")
        return _run(args, pa_port, prom_port, procs)
    except PortTaken as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except Stopped as stop_:
        print(f"\nstopping ({signal.Signals(stop_.signum).name}) ...", flush=True)
        return 0
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        for p in reversed(procs):
            stop(p)
        if procs:
            print(f"stopped the {len(procs)} processes the demo started", flush=True)


def _run(args: argparse.Namespace, pa_port: int, prom_port: int, procs: list[subprocess.Popen]) -> int:
    manifest = read_manifest(args.data_dir)
    hour = int(time.time()) // 3600 * 3600
    built = FleetSpec.from_dict(manifest["spec"]) if manifest and "spec" in manifest else None
    if built is not None and reusable(built, args.nodes, hour):
        spec = built
        print(f"reusing the dataset in {args.data_dir} (it ends at {_iso(spec.end)})", flush=True)
    else:
        if built is not None and built.nodes == args.nodes:
            print(f"the dataset in {args.data_dir} ends at {_iso(built.end)}, more than {REUSE_HOURS} h ago: "
                  "building it again, to end at this hour", flush=True)
        end = hour
        spec = FleetSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, hours=args.hours, end=end)
        print(f"building a {args.nodes}-node x {args.gpus_per_node}-GPU, {args.hours} h dataset "
              f"(one-off, about a minute) ...", flush=True)
        build_tsdb(spec, args.data_dir, verbose=True)

    prom = start_prometheus(args.data_dir, prom_port, tied=True)
    procs.append(prom)
    prom_url: str = prom.url  # type: ignore[attr-defined]
    pa_url = f"http://127.0.0.1:{pa_port}"
    env = dict(os.environ)
    env.pop("PROMACCEL_CONFIG", None)
    if args.single:
        serve = ["--backend", prom_url]
    else:
        cfg, env = _hybrid(spec, args.data_dir, procs)
        serve = ["--config", cfg]
    cache = "in-process (redis-server is not installed; `make setup` installs it)"
    if not args.no_redis and shutil.which("redis-server"):
        redis = RedisServer.start(Path(args.data_dir + "-redis"), tied=True)
        procs.append(redis.proc)
        serve += ["--redis", redis.url]
        cache = f"Redis at {redis.url} (a redis-server of the demo's own)"
    elif args.no_redis:
        cache = "in-process (--no-redis)"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", *serve,
         "--host", "127.0.0.1", "--port", str(pa_port), "--split-interval", "1h", "--log-level", "warning"],
        cwd=str(ROOT), env=env, preexec_fn=die_with_parent,
    )
    procs.append(proxy)
    wait_http(pa_url + "/-/ready", proxy, timeout=300)
    print(f"  promaccel : {pa_url}  cache: {cache}")
    ok = _report(spec, prom_url, pa_url, args.single)
    _try_this(spec, prom_url, pa_url, args.single)
    if args.once:
        return 0 if ok else 1
    print("serving; Ctrl-C (or SIGTERM, SIGHUP) stops the demo and everything it started", flush=True)
    while True:  # until a stop signal raises Stopped
        signal.pause()


def reusable(built: FleetSpec, nodes: int, hour: int) -> bool:
    """Is a dataset built earlier the one to serve at `hour` (a whole hour, unix s)? The same
    size, and its data ends at most REUSE_HOURS before that hour."""
    return built.nodes == nodes and built.end >= hour - REUSE_HOURS * 3600


def _try_this(spec: FleetSpec, prom_url: str, pa_url: str, single: bool) -> None:
    """Commands that work as printed (each line after `$ ` runs in a shell)."""
    start, end = _iso(spec.end - 6 * 3600), _iso(spec.end)
    curl = (f"curl -s {pa_url}/api/v1/query_range --data-urlencode {shlex.quote('query=' + PANEL)} "
            f"-d start={start} -d end={end} -d step=60")
    join = JOIN if not single else PANEL
    explain = f"{pa_url}/api/v1/explain?" + urllib.parse.urlencode(
        {"query": join, "start": _iso(spec.end - (LOCAL_HOURS - 1) * 3600), "end": end, "step": "60"})
    form = json.dumps({"query": PANEL, "start": start, "end": end, "step": "60"})
    arrow = ("import httpx, pyarrow as pa; "
             f'r = httpx.post("{pa_url}/api/v1/query_range", data={form}, '
             'headers={"Accept": "application/vnd.apache.arrow.stream"}); '
             't = pa.ipc.open_stream(r.content).read_all(); print(t.schema); print(t.num_rows, "rows")')
    print(f"try this (data from {_iso(spec.start)} to {end}):")
    print("  # a panel's query, as Grafana sends it (Prometheus JSON)")
    print(f"  $ {curl}")
    print("  # the plan: pieces, cache, and for the cross-store join where each part runs" if not single
          else "  # the plan: pieces, shards, cache")
    print(f"  $ curl -s {shlex.quote(explain)}")
    print("  # the same panel as an Arrow stream")
    print(f"  $ {shlex.quote(sys.executable)} -c {shlex.quote(arrow)}")
    print(f"  # the reference Prometheus, direct: {prom_url}")
    print("Grafana (on this machine): add a data source of type Prometheus, Prometheus server URL "
          f"{pa_url}, HTTP method POST (the default), no authentication; Explore or a dashboard "
          f"over {_iso(spec.start)} .. {end}. promaccel listens on 127.0.0.1 only, so Grafana in a "
          "container cannot reach it; `docker compose up` runs a stack with its own Grafana "
          "(http://127.0.0.1:3000).")


def _hybrid(spec: FleetSpec, data_dir: str, procs: list[subprocess.Popen]) -> tuple[str, dict[str, str]]:
    """Build and start the two slices and the AMP endpoint; write promaccel's config."""
    since = spec.end - LOCAL_HOURS * 3600
    amp_dir, local_dir = data_dir + "-amp", data_dir + "-local"
    print("building the AMP slice (DCGM_* only) and the local slice "
          f"(node_*, kube_*, up; last {LOCAL_HOURS} h) (one-off) ...", flush=True)
    build_tsdb(spec, amp_dir, select=Selection(metrics="DCGM_.*"))
    build_tsdb(spec, local_dir, select=Selection(windows=((since, spec.end + 1),), metrics=LOCAL_METRICS))
    amp_prom = start_prometheus(amp_dir, tied=True)
    procs.append(amp_prom)
    local_prom = start_prometheus(local_dir, tied=True)
    procs.append(local_prom)
    amp_port = free_port()
    amp = subprocess.Popen(
        [sys.executable, "-m", "loadtests.amp_endpoint", "--upstream", amp_prom.url,  # type: ignore[attr-defined]
         "--port", str(amp_port), "--region", "us-east-1", "--workspace", "ws-demo"],
        cwd=str(ROOT), stdout=subprocess.DEVNULL, preexec_fn=die_with_parent,
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


def _subqueries(tree: dict[str, Any]) -> list[dict[str, Any]]:
    if "subquery" in tree:
        return [tree["subquery"]]
    return [s for a in tree.get("args", []) for s in _subqueries(a)]


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
                explained = json.loads(r.read())["data"]
            route = explained.get("route") or {}
            parts = route.get("parts") or []
            where = ", ".join(f"{'+'.join(p[2])} {time.strftime('%H:%M', time.gmtime(p[0] / 1000))}-"
                              f"{time.strftime('%H:%M', time.gmtime(p[1] / 1000))}" for p in parts)
            print(f"  route             : {route.get('kind')} {where or ', '.join(route.get('backends') or [])}")
            tree = explained.get("cross_store")
            if tree:
                print(f"  promaccel evaluates: {tree.get('evaluate')} over")
                for sub in _subqueries(tree):
                    print(f"    {'+'.join(sub['route']['backends'])} ({sub['piece_count']} pieces): {sub['query']}")
    print()
    return ok


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
