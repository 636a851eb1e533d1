"""Compiling the hot path before serving (proxy/codec/warmup.py): after `warm_up()` in a fresh
process, answers of other shapes and sizes -- decoded, encoded, streamed, merged, cut, cached
and spliced as the query path does -- need no kernel signature that warm-up did not already
compile (or load from numba's disk cache): a first query never pays a compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: in this one, other tests may already have compiled anything.
PROBE = r'''
import importlib, json, sys
from numba.core.dispatcher import Dispatcher

MODULES = ["proxy.codec.json_scan", "proxy.codec.json_encode", "proxy.codec.json_splice",
           "proxy.codec.json_decode", "proxy.codec.arrow", "proxy.codec.go_float", "proxy.result.merge",
           "proxy.result.concat", "proxy.result.pieces", "proxy.result.aggops", "proxy.result.overlap",
           "proxy.result.query_result", "proxy.result.labels"]

def signatures():
    out = {}
    for name in MODULES:
        for attr, value in vars(importlib.import_module(name)).items():
            if isinstance(value, Dispatcher):
                out[f"{name}.{attr}"] = len(value.signatures)
    return out

from proxy.codec.warmup import warm_up
warm_up()
warmed = signatures()

import orjson
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.codec import arrow
from proxy.codec.arrow import PAYLOAD_BATCH_ROWS
from proxy.codec.json_splice import splice_prometheus_json
from proxy.result import QueryResult
from proxy.result.merge import merge
from proxy.result.pieces import slice_time
from shardplanner.plan import MergeRecipe

T = 1_700_003_600
def matrix(hosts, t0):
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": f"gpu-node-{h:04d}", "gpu": str(g)},
         "values": [[t0 + 30 * k, str(1 + (h * 8 + g) * k / 7)] for k in range(120)]}
        for h in hosts for g in range(8)]}})

# A large backend body arrives as the bytearray it was read into (backends/transports.py).
decode_prometheus_json(bytearray(matrix(range(0, 40), T)))
a = decode_prometheus_json(matrix(range(0, 20), T))
b = decode_prometheus_json(matrix(range(10, 30), T + 3600))
# The cell read back from the cache: one record batch, or several (a cell over
# PAYLOAD_BATCH_ROWS samples, as an hour of a large fleet is).
cell = b if sys.argv[1] == "large" else decode_prometheus_json(matrix(range(10, 12), T + 3600))
assert (len(cell.t_ms) > PAYLOAD_BATCH_ROWS) == (sys.argv[1] == "large")
pretty = decode_prometheus_json(orjson.dumps(orjson.loads(matrix(range(3), T)), option=orjson.OPT_INDENT_2))
vec = decode_prometheus_json(b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1700003600,"7"]}]}}')
for r in (a, b, pretty, vec):
    encode_prometheus_json(r)
    b"".join(iter_prometheus_json(r, batch_samples=500))
encode_prometheus_json(merge([(None, a), (None, b)], MergeRecipe(kind="concat")))
for op in ("sum", "max", "count"):
    encode_prometheus_json(merge([(None, a), (None, b)], MergeRecipe(kind="aggregate", op=op, grouping=("gpu",))))
encode_prometheus_json(merge([("sum", a), ("count", a)], MergeRecipe(kind="aggregate", op="avg", grouping=())))
encode_prometheus_json(merge([(None, a), (None, b)], MergeRecipe(kind="aggregate", op="topk", param=3.0)))
cached = arrow.from_ipc_bytes(arrow.to_ipc_bytes(cell, "lz4"))
edge = slice_time(a, (T + 600) * 1000, (T + 3000) * 1000)
splice_prometheus_json(merge([(None, edge), (None, cached)], MergeRecipe(kind="concat"), lazy=True))
# Kept cells cut lazily for a window, read back whole and packed (pipeline/cache_read.py).
packed = arrow.from_ipc_bytes(arrow.to_ipc_bytes(cell, "lz4"), pack_from=1)
for c in (cached, packed):
    c.keeps_json = True
    cut = slice_time(c, (T + 3700) * 1000, (T + 4500) * 1000, lazy=True)
    splice_prometheus_json(merge([(None, edge), (None, cut)], MergeRecipe(kind="concat"), lazy=True))
    encode_prometheus_json(cut)
# A warm answer of kept cells only, as the cache reader keeps them: spliced (its cells'
# samples encoded and kept) and gzipped from its runs.
from proxy.codec.deflate import gzip_spliced
from proxy.codec.json_splice import spliced_runs
kept = [arrow.from_ipc_bytes(arrow.to_ipc_bytes(r, "lz4")) for r in (a, b)]
for c in kept:
    c.keeps_json = True
for _ in range(3):
    warm = merge([(None, slice_time(kept[0], (T + 60) * 1000, (T + 3600) * 1000, lazy=True)), (None, kept[1])],
                 MergeRecipe(kind="concat"), lazy=True)
    with spliced_runs(warm) as sp:
        assert sp is not None
        gzip_spliced(sp)

after = signatures()
print(json.dumps({k: [warmed.get(k, 0), n] for k, n in after.items() if n != warmed.get(k, 0)}))
'''


def _grown_after_warm_up(cell: str) -> dict[str, list[int]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, cell], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown: dict[str, list[int]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return grown


def test_no_kernel_compiles_after_warm_up() -> None:
    grown = _grown_after_warm_up("small")
    assert grown == {}, f"kernels given a new signature after warm_up() (before, after): {grown}"


def test_no_kernel_compiles_after_warm_up_for_a_cell_of_several_batches() -> None:
    grown = _grown_after_warm_up("large")
    assert grown == {}, f"kernels given a new signature after warm_up() (before, after): {grown}"
