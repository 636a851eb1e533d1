"""Benchmark of the JSON <-> Arrow hot path (proxy.codec, proxy.result.merge).

    .venv/bin/python -m loadtests.codec_bench [--series 6000] [--points 128] [--reps 7]

Builds a Prometheus-shaped query_range answer (dcgm-exporter labels, 6,000 series x 128
points = 768,000 points, ~20 MB: integer utilisations, temperatures, 3-decimal power
readings and full precision rate()-like values) and prints one table: CPU time of this
thread (the machines are shared: wall time is noise), median and minimum of `reps` runs,
and points/s at the median:

- baseline: orjson.loads with the garbage collector on and off, orjson.dumps, and a
  loads + dumps round trip (gc on / off);
- stages: decode, encode, concat of 4 time pieces, sum by (namespace, gpu) of 8 shard
  pieces, the cache format (Arrow IPC), the client Arrow stream;
- end to end (gc on, as served): (a) decode + encode of the one answer, (b) decode 4 time
  pieces + concat + encode, (c) decode 8 shard pieces + sum aggregate + encode, (d) the
  warm refresh: 4 pieces from the cache format + concat + encode; each checked to
  reproduce the expected bytes;
- peak RSS above the decoded result of encoding the answer in one piece vs streaming it
  (iter_prometheus_json, chunks sent on and dropped), each in a fresh process.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from proxy.codec import arrow
from proxy.codec.arrow import encode_arrow_stream
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.codec.warmup import warm_up
from proxy.result import QueryResult
from proxy.result.merge import aggregate, concat
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


ROWS: list[tuple[str, float, float, int]] = []


def bench(name: str, fn: Callable[[], Any], points: int, reps: int) -> Any:
    """Median and minimum CPU time (this thread) of `reps` runs; the row goes to ROWS."""
    cpus = []
    result = None
    for _ in range(reps):
        result = None
        c0 = time.thread_time()
        result = fn()
        cpus.append(time.thread_time() - c0)
    ROWS.append((name, statistics.median(cpus), min(cpus), points))
    return result


def section(title: str) -> None:
    ROWS.append((title, -1.0, -1.0, 0))


def print_table() -> None:
    print(f"{'':<52} {'CPU ms':>9} {'(min)':>8} {'M points/s':>11}")
    for name, med, mn, points in ROWS:
        if med < 0:
            print(f"{name}")
            continue
        print(f"  {name:<50} {med * 1e3:9.1f} {mn * 1e3:8.1f} {points / med / 1e6:11.2f}")


def without_gc(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        gc.disable()
        try:
            return fn()
        finally:
            gc.enable()

    return run


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_child(mode: str, path: str) -> None:
    """Decode the answer in `path`, then encode it (`oneshot` / `stream`); print the peak
    RSS above the RSS just before encoding, in bytes."""
    with open(path, "rb") as f:
        body = f.read()
    result = decode_prometheus_json(body)
    encode_prometheus_json(decode_prometheus_json(body[: body.find(b"]]}") + 3] + b"]}}"))
    del body
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current RSS
    except OSError:
        pass
    base = _status("VmRSS")
    sent = 0
    if mode == "oneshot":
        out = encode_prometheus_json(result)
        sent = len(out)
        del out
    else:
        for chunk in iter_prometheus_json(result):
            sent += len(chunk)  # a server writes it to the socket and drops it
    print(orjson.dumps({"peak_above_base": _status("VmHWM") - base, "base": base, "bytes": sent}).decode())


def measure_rss(body: bytes) -> dict[str, dict[str, int]]:
    out = {}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        for mode in ("oneshot", "stream"):
            proc = subprocess.run(
                [sys.executable, "-m", "loadtests.codec_bench", "--rss-child", mode, f.name],
                capture_output=True, check=True, text=True,
            )
            out[mode] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=6000)
    ap.add_argument("--points", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rss-child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(*args.rss_child)
        return

    full = make_result(args.series, args.points)
    body = encode_prometheus_json(full)
    n = full.n_samples
    reps = max(args.reps, 5)
    print(f"answer: {full.n_series} series, {n} points, {len(body) / 1e6:.1f} MB; "
          f"CPU time of one thread, median of {reps} runs")
    # Warm up the compiled kernels (first call compiles or loads the numba cache).
    warm_up()

    section("baseline (orjson, a Python object per sample)")
    doc = bench("orjson.loads (gc on)", lambda: orjson.loads(body), n, reps)
    bench("orjson.loads (gc off)", without_gc(lambda: orjson.loads(body)), n, reps)
    bench("orjson.dumps", lambda: orjson.dumps(doc), n, reps)  # noqa: F821 -- called before the del below
    del doc
    bench("orjson.loads + dumps (gc on)", lambda: orjson.dumps(orjson.loads(body)), n, reps)
    bench("orjson.loads + dumps (gc off)", without_gc(lambda: orjson.dumps(orjson.loads(body))), n, reps)

    section("stages")
    dec = bench("decode_prometheus_json", lambda: decode_prometheus_json(body), n, reps)

    parsed = dec.labels  # a decoded answer parses its label sets on first use: now, untimed

    def encode_fresh() -> bytes:
        dec.labels = parsed
        dec._label_block = None  # measure label formatting too
        dec._ckeys = None
        return encode_prometheus_json(dec)

    out = bench("encode_prometheus_json (labels formatted)", encode_fresh, n, reps)
    assert out == body, "decode -> encode did not reproduce the answer"
    dec = decode_prometheus_json(body)
    out = bench("encode_prometheus_json (backend's label JSON)", lambda: encode_prometheus_json(dec), n, reps)
    assert out == body
    out = bench("iter_prometheus_json (streamed, joined)", lambda: b"".join(iter_prometheus_json(dec)), n, reps)
    assert out == body
    del out

    tpieces = time_split(full, 4)
    tbodies = [encode_prometheus_json(p) for p in tpieces]
    tdec = bench("decode 4 time pieces", lambda: [decode_prometheus_json(b) for b in tbodies], n, reps)
    bench("concat 4 time pieces", lambda: concat(tdec), n, reps)  # noqa: F821 -- called before the del below
    spieces = series_split(full, 8)
    recipe = MergeRecipe(kind="aggregate", op="sum", grouping=("namespace", "gpu"))
    sbodies = [encode_prometheus_json(p) for p in spieces]
    sdec = bench("decode 8 shard pieces", lambda: [decode_prometheus_json(b) for b in sbodies], n, reps)
    agg = bench("sum by (namespace,gpu) of 8 shard pieces", lambda: aggregate([(None, p) for p in sdec], recipe), n, reps)  # noqa: F821 -- called before the del below
    agg_points = agg.n_samples
    bench(f"encode the sum ({agg_points} points; rate per input point)", lambda: encode_prometheus_json(agg), n, reps)
    want_agg = encode_prometheus_json(aggregate([(None, p) for p in spieces], recipe))
    ipc = bench("cache: to_ipc_bytes (zstd)", lambda: arrow.to_ipc_bytes(dec), n, reps)
    bench("cache: from_ipc_bytes", lambda: arrow.from_ipc_bytes(ipc), n, reps)
    bench("client Arrow stream (encode)", lambda: encode_arrow_stream(dec), n, reps)
    del tdec, sdec

    section("end to end (gc on)")

    def one() -> bytes:
        return encode_prometheus_json(decode_prometheus_json(body))

    def time_pieces() -> bytes:
        return encode_prometheus_json(concat([decode_prometheus_json(b) for b in tbodies]))

    def shard_pieces() -> bytes:
        pieces = [(None, decode_prometheus_json(b)) for b in sbodies]
        return encode_prometheus_json(aggregate(pieces, recipe))

    assert bench("(a) decode + encode, one answer", one, n, reps) == body
    assert bench("(b) decode 4 time pieces + concat + encode", time_pieces, n, reps) == body
    assert bench("(c) decode 8 shard pieces + sum + encode", shard_pieces, n, reps) == want_agg
    tipc = [arrow.to_ipc_bytes(decode_prometheus_json(b)) for b in tbodies]

    def cached_pieces() -> bytes:
        return encode_prometheus_json(concat([arrow.from_ipc_bytes(x) for x in tipc]))

    assert bench("(d) 4 cached pieces (Arrow IPC) + concat + encode", cached_pieces, n, reps) == body
    print_table()
    print(f"  IPC size {len(ipc) / 1e6:.1f} MB (JSON {len(body) / 1e6:.1f} MB)")

    rss = measure_rss(body)
    print(f"peak RSS of encoding the {len(body) / 1e6:.1f} MB answer, above the decoded result "
          f"(fresh process each):")
    for mode, r in rss.items():
        print(f"  {mode:<8} +{r['peak_above_base'] / 1e6:6.1f} MB  (base {r['base'] / 1e6:.0f} MB, "
              f"{r['bytes'] / 1e6:.1f} MB written)")


if __name__ == "__main__":
    main()
