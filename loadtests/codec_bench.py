"""Benchmark of the JSON <-> Arrow hot path (proxy.arrowcodec, proxy.merge).

    .venv/bin/python -m loadtests.codec_bench [--series 6000] [--points 128] [--reps 5]

Builds a Prometheus-shaped query_range answer (dcgm-exporter labels, ~6,000 series x 128
points, ~15 MB: integer utilisations, temperatures, 3-decimal power readings and full
precision rate()-like values) and times, median of `reps` runs (wall and CPU time of this
thread, since CI machines are shared):

- orjson.loads with the garbage collector on and off, orjson.dumps (the baseline);
- decode_prometheus_json, encode_prometheus_json (checked to reproduce the input bytes);
- concat of 4 time pieces, sum by (namespace, gpu) over 8 shard pieces;
- the cache format: QueryResult.to_ipc_bytes / from_ipc_bytes; the client Arrow stream;
- end to end: decode 4 time-piece answers + concat + encode.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from proxy.arrowcodec import QueryResult, decode_prometheus_json, encode_arrow_stream, encode_prometheus_json
from proxy.merge import aggregate, concat
from shardplanner.plan import MergeRecipe

STEP_MS = 30_000
START_MS = 1_700_000_040_000


def make_result(n_series: int, n_points: int, seed: int = 1) -> QueryResult:
    rng = np.random.default_rng(seed)
    labels = []
    for i in range(n_series):
        node, gpu = divmod(i, 8)
        labels.append(
            {
                "__name__": "DCGM_FI_DEV_GPU_UTIL",
                "Hostname": f"gpu-node-{node:04d}",
                "UUID": f"GPU-{i:08x}-4a1b-9c3d-{node:012x}",
                "container": "trainer",
                "device": f"nvidia{gpu}",
                "gpu": str(gpu),
                "instance": f"10.42.{node // 250}.{node % 250}:9400",
                "job": "dcgm-exporter",
                "modelName": "NVIDIA H100 80GB HBM3",
                "namespace": f"team-{node % 12}",
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "pod": f"train-job-{node // 4}-worker-{node % 4}",
            }
        )
    n = n_series * n_points
    kind = np.repeat(np.arange(n_series) % 4, n_points)
    v = rng.random(n)
    v = np.where(kind == 0, np.floor(v * 101), v)  # utilisation %
    v = np.where(kind == 1, np.floor(30 + v * 55), v)  # temperature
    v = np.where(kind == 2, np.round(60 + v * 640, 3), v)  # power W, 3 decimals
    v = np.where(kind == 3, v * 1e9 / 7, v)  # rate()-like, full precision
    t = np.tile(START_MS + STEP_MS * np.arange(n_points, dtype=np.int64), n_series)
    offsets = np.arange(0, n + 1, n_points, dtype=np.int64)
    return QueryResult("matrix", labels, offsets, t, v)


def time_split(r: QueryResult, parts: int) -> list[QueryResult]:
    lo, hi = int(r.t_ms.min()), int(r.t_ms.max()) + 1
    cuts = np.linspace(lo, hi, parts + 1).astype(np.int64)
    out = []
    series = r.series
    for a, b in zip(cuts[:-1], cuts[1:]):
        m = (r.t_ms >= a) & (r.t_ms < b)
        counts = np.bincount(series[m], minlength=r.n_series)
        offsets = np.zeros(r.n_series + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        out.append(QueryResult("matrix", r.labels, offsets, r.t_ms[m], r.value[m]))
    return out


def series_split(r: QueryResult, parts: int) -> list[QueryResult]:
    out = []
    for p in range(parts):
        idx = [i for i, d in enumerate(r.labels) if int(d["Hostname"][-4:]) % parts == p]
        counts = r.counts[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        take = np.concatenate([np.arange(r.offsets[i], r.offsets[i + 1]) for i in idx])
        out.append(QueryResult("matrix", [r.labels[i] for i in idx], offsets, r.t_ms[take], r.value[take]))
    return out


def bench(name: str, fn: Callable[[], Any], points: int, reps: int) -> Any:
    walls, cpus = [], []
    result = None
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        result = fn()
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - w0)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(
        f"{name:<34} wall {wall * 1e3:8.1f} ms   cpu {cpu * 1e3:8.1f} ms   "
        f"{points / wall / 1e6:6.2f} M points/s (wall)   {points / cpu / 1e6:6.2f} M points/s (cpu)"
    )
    return result


def loads_gc_off(body: bytes) -> Any:
    gc.disable()
    try:
        return orjson.loads(body)
    finally:
        gc.enable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=6000)
    ap.add_argument("--points", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    full = make_result(args.series, args.points)
    body = encode_prometheus_json(full)
    n = full.n_samples
    print(f"answer: {full.n_series} series, {n} points, {len(body) / 1e6:.1f} MB")
    # Warm up the compiled kernels (first call compiles or loads the numba cache).
    decode_prometheus_json(body[: body.find(b"]]}") + 3] + b"]}}")

    reps = args.reps
    doc = bench("orjson.loads (gc on)", lambda: orjson.loads(body), n, reps)
    bench("orjson.loads (gc off)", lambda: loads_gc_off(body), n, reps)
    bench("orjson.dumps", lambda: orjson.dumps(doc), n, reps)
    del doc
    dec = bench("decode_prometheus_json", lambda: decode_prometheus_json(body), n, reps)

    def encode_fresh() -> bytes:
        dec._label_block = None  # measure label formatting too
        return encode_prometheus_json(dec)

    out = bench("encode_prometheus_json", encode_fresh, n, reps)
    assert out == body, "decode -> encode did not reproduce the answer"

    tpieces = time_split(dec, 4)
    bench("merge: concat 4 time pieces", lambda: concat(tpieces), n, reps)
    spieces = [(None, p) for p in series_split(dec, 8)]
    recipe = MergeRecipe(kind="aggregate", op="sum", grouping=("namespace", "gpu"))
    bench("merge: sum by (namespace,gpu) x8", lambda: aggregate(spieces, recipe), n, reps)
    ipc = bench("cache: to_ipc_bytes (zstd)", dec.to_ipc_bytes, n, reps)
    bench("cache: from_ipc_bytes", lambda: QueryResult.from_ipc_bytes(ipc), n, reps)
    print(f"  IPC size {len(ipc) / 1e6:.1f} MB (JSON {len(body) / 1e6:.1f} MB)")
    bench("client Arrow stream (encode)", lambda: encode_arrow_stream(dec), n, reps)

    bodies = [encode_prometheus_json(p) for p in tpieces]

    def end_to_end() -> bytes:
        merged = concat([decode_prometheus_json(b) for b in bodies])
        return encode_prometheus_json(merged)

    out = bench("end to end: decode 4 + concat + encode", end_to_end, n, reps)
    assert out == body, "end to end did not reproduce the answer"


if __name__ == "__main__":
    main()
