"""Compile the hot path before serving.

The codec and merge kernels are numba-compiled on first use (cached on disk afterwards,
`cache=True`). A first query that pays a cold compile can take tens of seconds on a busy
2-core machine, so `promaccel serve` runs this before it reports healthy, and `make test`
runs it once so that every process after it loads the compiled code from disk.
"""

from __future__ import annotations

import time

from proxy.result.merge import merge
from proxy.result.pieces import slice_time
from shardplanner.plan import MergeRecipe

from . import arrow
from .json_decode import decode_prometheus_json
from .json_encode import encode_prometheus_json
from .json_splice import splice_prometheus_json

_MATRIX = (
    b'{"status":"success","data":{"resultType":"matrix","result":['
    b'{"metric":{"__name__":"x","Hostname":"a","gpu":"0"},"values":[[1700000000,"1.5"],[1700000015.5,"NaN"],'
    b'[1700000030,"+Inf"],[1700000045,"-2e-7"]]},'
    b'{"metric":{"__name__":"x","Hostname":"b","gpu":"1"},"values":[[1700000000,"3"],[1700000015.5,"4.25"]]}]}}'
)
_VECTOR = (
    b'{"status":"success","data":{"resultType":"vector","result":['
    b'{"metric":{"Hostname":"a"},"value":[1700000000,"1"]},{"metric":{"Hostname":"b"},"value":[1700000000,"2.5"]}]},'
    b'"warnings":["w"]}'
)
_SCALAR = b'{"status":"success","data":{"resultType":"scalar","result":[1700000000,"1"]}}'


def _big_matrix(samples: int, start_s: int) -> bytes:
    """One series of `samples` samples, 15 s apart from `start_s`."""
    values = b",".join(b'[%d,"%d"]' % (start_s + 15 * i, i) for i in range(samples))
    return (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"x"},"values":['
            + values + b"]}]}}")


def warm_up() -> float:
    """Exercise every compiled kernel once; returns the seconds it took."""
    t0 = time.perf_counter()
    m, v = decode_prometheus_json(_MATRIX), decode_prometheus_json(_VECTOR)
    s = decode_prometheus_json(_SCALAR)
    # Pretty-printed answers (other backends, proxies) take the whitespace-tolerant path.
    decode_prometheus_json(_MATRIX.replace(b",", b", ").replace(b":", b": "))
    # A large backend body is handed on as the bytearray it was read into
    # (backends/transports.py): writable bytes are another signature than `bytes`' read-only
    # ones (a fresh deploy's first cold dashboard refresh compiled them: 12.9 s, not 5.5 s).
    for body in (_MATRIX, _VECTOR, _SCALAR, _MATRIX.replace(b",", b", ").replace(b":", b": ")):
        decode_prometheus_json(bytearray(body))
    for r in (m, v, s):
        encode_prometheus_json(r)
    later = decode_prometheus_json(_MATRIX.replace(b"17000000", b"17000001"))
    encode_prometheus_json(merge([(None, m), (None, later)], MergeRecipe(kind="concat")))
    # A warm answer spliced from its cells' bytes (json_splice.py): an edge cell cut by time and
    # a cell read back from the cache (read-only arrays: kernels of their own).
    cell = arrow.from_ipc_bytes(arrow.to_ipc_bytes(later, "lz4"))
    # A cached cell of several record batches (over arrow.PAYLOAD_BATCH_ROWS samples, as an
    # hour of a large fleet is): its columns are concatenated into writable arrays on the way
    # back, which the kernels see as another signature than a one-batch cell's read-only ones.
    big = [decode_prometheus_json(_big_matrix(arrow.PAYLOAD_BATCH_ROWS + 1, 1_700_000_000 + 200_000 * i)) for i in (0, 1)]
    big_cells = [arrow.from_ipc_bytes(arrow.to_ipc_bytes(b, "lz4")) for b in big]
    # Spliced only from cells the cache reader keeps (their encoded samples are kept: the
    # first warm refresh after a fresh deploy compiled the splice's kernels, 3.4 s not 0.3).
    cell.keeps_json = True
    for c in big_cells:
        c.keeps_json = True
    splice_prometheus_json(merge([(None, c) for c in big_cells], MergeRecipe(kind="concat"), lazy=True))
    encode_prometheus_json(big_cells[0])
    splice_prometheus_json(merge([(None, slice_time(m, 1_700_000_015_000, 1_700_000_045_000)), (None, cell)],
                                 MergeRecipe(kind="concat"), lazy=True))
    # Kept cells cut lazily for a window (pipeline/cache_read.py): one read back whole, of
    # one batch and of several, and one read back packed (cells of pack_min_samples or more).
    packed = [arrow.from_ipc_bytes(arrow.to_ipc_bytes(r, "lz4"), pack_from=1) for r in (later, big[0])]
    for c in packed:
        c.keeps_json = True
    for c in (cell, big_cells[0], *packed):
        first = int(c.t_ms[0])
        cut = slice_time(c, first + 1, first + 30_000, lazy=True)
        splice_prometheus_json(merge([(None, cut), (None, big_cells[1])], MergeRecipe(kind="concat"), lazy=True))
        encode_prometheus_json(cut)
    for res, time_ms in ((m, None), (v, 1_700_000_000_000)):
        for op in ("sum", "min", "max", "count", "group"):
            encode_prometheus_json(merge([(None, res), (None, res)],
                                         MergeRecipe(kind="aggregate", op=op, grouping=("Hostname",)),
                                         time_ms=time_ms))
        encode_prometheus_json(merge([("sum", res), ("count", res)],
                                     MergeRecipe(kind="aggregate", op="avg", grouping=()), time_ms=time_ms))
        for recipe in (MergeRecipe(kind="aggregate", op="topk", param=1.0),
                       MergeRecipe(kind="aggregate", op="bottomk", param=1.0)):
            encode_prometheus_json(merge([(None, res), (None, res)], recipe, time_ms=time_ms))
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"promaccel hot path compiled in {warm_up():.1f}s")
