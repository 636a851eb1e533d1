"""Synthetic GPU-fleet telemetry as OpenMetrics text for `promtool tsdb create-blocks-from`.

The fleet looks like what a Kubernetes GPU cluster scraped every 30 s produces:
dcgm-exporter (default metrics, Kubernetes pod mapping), node_exporter network counters and
kube-state-metrics, plus the `up` series Prometheus itself writes for each scrape target.
Output is deterministic (same `FleetSpec` -> same bytes), streamed, and can be cut into time
slices whose union is exactly the samples of the whole window.

Usage::

    python -m loadtests.gen --nodes 16 --gpus-per-node 4 --hours 6 --out fleet.om
    python -m loadtests.gen --hours 24 --slice-hours 2 --out DIR   # DIR/slice-000.om, ...
    python -m loadtests.gen --nodes 2 --gpus-per-node 2 --hours 0.5 --out - | head

Time
----
Samples lie in [end - hours, end). `end` defaults to DEFAULT_END = 1793491200 =
2026-11-01T00:00:00Z. Every scrape target has a fixed phase of 0..interval-1 whole seconds
(as Prometheus spreads targets), so target X scrapes at `start + phase_X + k * interval`;
sample times are not aligned to any query step grid. Timestamps are whole seconds.

Metrics and labels
------------------
dcgm-exporter, job="dcgm-exporter", instance="10.42.<n // 200>.<n % 200 + 20>:9400", one
series per GPU and per pod that ran on it; labels gpu ("0".."G-1"), UUID ("GPU-<uuid>"),
pci_bus_id ("00000000:18:00.0"...), device ("nvidia<gpu>"), modelName, Hostname
("gpu-node-0007"), and while a pod holds the GPU: namespace (team-llm, team-vision, research,
infra), pod, container. While no pod holds the GPU the series has no namespace/pod/container
labels (as dcgm-exporter does), so every job start or end ends one series and starts another.
  gauges   DCGM_FI_DEV_GPU_UTIL (0..100 int), DCGM_FI_DEV_MEM_COPY_UTIL (0..100 int),
           DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (MiB int; used + free + reserved = total),
           DCGM_FI_DEV_GPU_TEMP (C int), DCGM_FI_DEV_POWER_USAGE (W, 3 decimals),
           DCGM_FI_DEV_SM_CLOCK (MHz int), DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and
           DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio 0..1, 6 decimals),
           DCGM_FI_DEV_XID_ERRORS (last XID code: 0, or 13/31/43/48/79/94 on a few GPUs)
  counters DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since boot, int),
           DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (MB, int); both restart from 0 after a reboot.
           Their TYPE line says `unknown`: OpenMetrics wants counter samples named *_total.
node_exporter, job="node-exporter", instance="gpu-node-0007:9100":
  node_network_receive_bytes_total, node_network_transmit_bytes_total {device="eth0"|"ib0".."ib3"}
  (counters, reset on reboot), node_load1 (gauge, 2 decimals).
kube-state-metrics, job="kube-state-metrics", instance="10.43.0.15:8080":
  kube_pod_status_phase{namespace,pod,uid,phase} 0/1 for Pending/Running/Succeeded/Failed/
  Unknown, from pod creation (Pending up to 2 min before the GPU series appear) to a few
  minutes after it ends; kube_node_status_allocatable{node,resource,unit} for
  resource="nvidia_com_gpu" (unit "integer"; 0 while a node reboots), "cpu" ("core"),
  "memory" ("byte").
up{job,instance}: 1 per successful scrape, 0 per failed one (missed scrape, node down).

Shapes worth testing against (node roles are fixed, times depend only on the window)
-----------------------------------------------------------------------------------------
- gpu-node-0000: DCGM_FI_DEV_POWER_USAGE{gpu="0"} is NaN at scrape indices
  k = T*3//10, T//2, T//2+1, 7*T//10, 7*T//10+1 (T = scrapes in the window); its
  dcgm-exporter misses 6 scrapes from k = 6*T//10 (node-exporter keeps going); its last GPU
  reports XID 13 from k = T//5 for 60 scrapes.
- gpu-node-0001 reboots at 45% of the window (plus every node with n % 16 == 9 at a seeded
  time): ~5 min without dcgm/node-exporter samples (up == 0), counters restart from 0, the
  running pods end as Failed.
- gpu-node-0002 joins at 1/3 of the window; gpu-node-0003 leaves at 2/3 (pods Failed).
- Every target misses about 0.2% of its scrapes at random (up == 0 there).
- modelName: "NVIDIA H100 80GB HBM3"; "NVIDIA A100-SXM4-80GB" on nodes with n % 4 == 3;
  'NVIDIA H100 80GB HBM3 (MIG 3g.40gb)' on the last node and 'NVIDIA Graphics Device "ES\\B0"'
  (a double quote and a backslash) on the second-to-last (fleets of >= 3 nodes).
- Pod names contain dots (e.g. "qwen2.5-72b-pretrain-1a2b3-0", "jupyter-bob.smith-...").
- Backfilled data has no staleness markers: a series that ends stays visible to instant
  selectors for the lookback delta (5 min) after its last sample, in Prometheus too.

promtool 2.42 facts (checked): it accepts TYPE counter without `_total` and interleaved
families, and SILENTLY DROPS out-of-order or duplicate-timestamp samples (exit code 0), so the
loader compares promtool's sample count with `Stats.samples`.

Layout: the fleet's model (`FleetSpec`, `Fleet`) is loadtests/fleet.py; the four exporters'
OpenMetrics writers are loadtests/exporters.py; this module is the API over both (`generate`,
`generate_slices`, `slice_bounds`) and the command line. The names below stay importable from
here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from typing import BinaryIO, Iterator

from .exporters import OpenMetricsWriter, Stats, format_lines, ts_tail, write_fleet
from .fleet import (
    BENCH_SPEC,
    CI_SPEC,
    DEFAULT_END,
    GENERATOR_VERSION,
    KSM_INSTANCE,
    MODEL_A100,
    MODEL_DOTS,
    MODEL_H100,
    MODEL_QUOTE,
    NAMESPACES,
    NET_DEVICES,
    PCI_BUS,
    PHASES,
    XID_CODES,
    Fleet,
    FleetSpec,
    escape_label_value,
    labels_text,
)

__all__ = [
    "BENCH_SPEC", "CI_SPEC", "DEFAULT_END", "GENERATOR_VERSION", "KSM_INSTANCE", "MODEL_A100", "MODEL_DOTS",
    "MODEL_H100", "MODEL_QUOTE", "NAMESPACES", "NET_DEVICES", "PCI_BUS", "PHASES", "XID_CODES", "Fleet",
    "FleetSpec", "OpenMetricsWriter", "Stats", "escape_label_value", "format_lines", "labels_text", "ts_tail",
    "add_fleet_args", "generate", "generate_slices", "iso_utc", "slice_bounds", "spec_from_args", "main",
]


# --------------------------------------------------------------------------- API

def slice_bounds(spec: FleetSpec, slice_seconds: int) -> list[tuple[int, int]]:
    """[t_from, t_to) slices covering the window, cut at multiples of slice_seconds since
    the epoch (2 h multiples line up with promtool's 2 h blocks)."""
    if slice_seconds <= 0:
        raise ValueError("slice_seconds must be > 0")
    out = []
    t = spec.start
    while t < spec.end:
        nxt = min(spec.end, (t // slice_seconds + 1) * slice_seconds)
        out.append((t, nxt))
        t = nxt
    return out


def generate(spec: FleetSpec, fp: BinaryIO, t_from: int | None = None, t_to: int | None = None,
             fleet: Fleet | None = None) -> Stats:
    """Write the OpenMetrics document for `spec` (optionally only [t_from, t_to)) to fp."""
    return write_fleet(fleet or Fleet(spec), fp, t_from, t_to)


def generate_slices(spec: FleetSpec, out_dir: str, slice_seconds: int) -> Iterator[tuple[str, Stats]]:
    """Write DIR/slice-NNN.om files one at a time, yielding (path, stats) after each."""
    fleet = Fleet(spec)
    os.makedirs(out_dir, exist_ok=True)
    for i, (a, b) in enumerate(slice_bounds(spec, slice_seconds)):
        path = os.path.join(out_dir, f"slice-{i:03d}.om")
        with open(path, "wb", buffering=1 << 20) as f:
            st = write_fleet(fleet, f, a, b)
        yield path, st


def iso_utc(t: int) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    d = FleetSpec()
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--hours", type=float, default=d.hours)
    p.add_argument("--scrape-interval", type=int, default=d.scrape_interval, help="seconds")
    p.add_argument("--end", type=int, default=d.end, help=f"unix seconds (default {d.end} = {iso_utc(d.end)})")
    p.add_argument("--seed", type=int, default=d.seed)


def spec_from_args(a: argparse.Namespace) -> FleetSpec:
    return FleetSpec(nodes=a.nodes, gpus_per_node=a.gpus_per_node, hours=a.hours,
                     scrape_interval=a.scrape_interval, end=a.end, seed=a.seed)


def main(argv: list[str] | None = None) -> int:
    import time

    p = argparse.ArgumentParser(prog="python -m loadtests.gen", description=__doc__.split("\n")[0])
    add_fleet_args(p)
    p.add_argument("--out", default="-", help="file, '-' for stdout, or a directory with --slice-hours")
    p.add_argument("--slice-hours", type=float, default=None,
                   help="write DIR/slice-NNN.om files of this many hours (epoch-aligned)")
    a = p.parse_args(argv)
    spec = spec_from_args(a)
    t0 = time.perf_counter()
    total = Stats()
    if a.slice_hours:
        if a.out == "-":
            p.error("--slice-hours needs --out DIR")
        for path, st in generate_slices(spec, a.out, int(a.slice_hours * 3600)):
            total.add(st)
            print(f"{path}: {st.samples} samples, {st.bytes} bytes", file=sys.stderr)
    elif a.out == "-":
        total = generate(spec, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with open(a.out, "wb", buffering=1 << 20) as f:
            total = generate(spec, f)
    dt = time.perf_counter() - t0
    print(f"{total.samples} samples, {total.bytes / 2**20:.1f} MiB, {iso_utc(spec.start)} .. {iso_utc(spec.end)}"
          f" in {dt:.1f} s ({total.samples / max(dt, 1e-9) / 1e6:.2f} M samples/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
