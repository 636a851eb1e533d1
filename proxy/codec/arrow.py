"""QueryResult <-> Arrow: the cache's payload and the public Arrow stream.

The only module of promaccel that imports pyarrow.
- `to_table()` / `from_table()`: one row per sample, columns `series` int32 (index into the
  label list), `t_ms` int64, `value` float64; the schema metadata holds `promaccel.version`
  ("1"), `promaccel.result_type`, `promaccel.labels` (JSON list of label objects, written as
  Prometheus writes label sets, flagged by `promaccel.labels_canonical`), `promaccel.warnings`,
  `promaccel.infos` (JSON lists) and, for string results, `promaccel.string_value`.
  `to_ipc_bytes()` / `from_ipc_bytes()` write / read that table as an Arrow IPC stream with
  zstd (or lz4) buffer compression: this is what the cache stores. There a label list of
  `PACK_LABELS_MIN_BYTES` or more is `promaccel.labels_zstd` (zstd level 1) with its size in
  `promaccel.labels_size` instead of `promaccel.labels` (cache FORMAT_VERSION 2).
- `encode_arrow_stream(result)`: the public Arrow shape for clients that send
  `Accept: application/vnd.apache.arrow.stream`: one row per sample with columns
  `series` int32, `timestamp` timestamp[ms, UTC], `value` float64 and
  `labels` dictionary<int32, map<utf8, utf8>> (the full label set of the row's series,
  dictionary-encoded by series: one map per series on the wire), schema metadata
  `promaccel.result_type`, `promaccel.warnings`, `promaccel.infos` and, for strings,
  `promaccel.string_value`. Uncompressed, so any Arrow reader can open it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
from numba import njit

from proxy.result import QueryResult
from proxy.result.concat import increasing_within
from proxy.result.label_sets import LABEL_CACHE, BadLabelJSON
from proxy.result.query_result import LazySamples

from .errors import MalformedAnswer
from .json_scan import array_element_spans

__all__ = ["PackedPiece", "encode_arrow_stream", "from_ipc_bytes", "from_table", "pack", "release_unused", "to_ipc_bytes",
           "to_ipc_view", "to_table", "use_system_pool"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def to_table(result: QueryResult, *, pack_labels: bool = False) -> pa.Table:
    """`pack_labels`: the label list zstd-compressed (`promaccel.labels_zstd`), as the cache
    stores it; else plain JSON (`promaccel.labels`)."""
    block = b"[" + b",".join(result.canonical_keys()) + b"]"
    meta = {
        b"promaccel.version": b"1",
        b"promaccel.result_type": result.result_type.encode(),
        b"promaccel.labels_canonical": b"1",
        b"promaccel.warnings": orjson.dumps(result.warnings),
        b"promaccel.infos": orjson.dumps(result.infos),
    }
    if pack_labels and len(block) >= PACK_LABELS_MIN_BYTES:
        meta[b"promaccel.labels_zstd"] = _PACKED.pack(block)
        meta[b"promaccel.labels_size"] = str(len(block)).encode()
    else:
        # The label list as Prometheus writes label sets (the same JSON value as
        # orjson.dumps(labels)), so that a cached piece is not formatted again.
        meta[b"promaccel.labels"] = block
    if result.string_value is not None:
        meta[b"promaccel.string_value"] = result.string_value.encode()
    schema = pa.schema(
        [("series", pa.int32()), ("t_ms", pa.int64()), ("value", pa.float64())],
        metadata=meta,
    )
    return pa.Table.from_arrays(
        [pa.array(result.series), pa.array(result.t_ms), pa.array(result.value)], schema=schema
    )


# A cache payload's label list is compressed from this size on. Arrow's buffer compression
# does not cover schema metadata, and a 2,048-GPU panel's hour cell carried ~1 MB of label
# JSON beside ~0.3 MB of compressed samples: 78% of a warm 24 h read (issue 15). zstd at
# level 1 makes it ~14x smaller for ~0.8 ms a megabyte.
PACK_LABELS_MIN_BYTES = 1024
# A decoded piece keeps its label list's JSON up to this size (`from_table`).
KEEP_LABEL_BLOCK_BYTES = 64 << 10
# Largest label list a payload may unpack to, and to how many times its packed size (its own
# size field is checked against both before anything is allocated; label JSON packs ~14x).
UNPACK_LABELS_MAX_BYTES = 1 << 30
UNPACK_MAX_RATIO = 1024
# A payload's label list names at most this many series more than it has rows (a series
# without float samples): a forged list of millions of `{}` is refused before it is split
# (issue 26; proxy/cache/bound.py bounds the rows and the list's bytes before decoding).
SERIES_WITHOUT_SAMPLES = 65_536


class _PackedLabels:
    """Label list JSON <-> its zstd form. zstd's output for the same input and level is the
    same, so the hour cells of a day that carry the same list hit the reader's
    `_LABEL_LISTS` on their packed bytes (not unpacked again). Nothing is memoised on the
    writing side: a memo keyed by the lists held ~14 MiB after a burst (and the lists of a
    day's cells mostly differ: series come and go)."""

    def __init__(self) -> None:
        self._codec: Any = None

    def codec(self) -> Any:
        if self._codec is None:
            self._codec = pa.Codec("zstd", compression_level=1)
        return self._codec

    def pack(self, block: bytes) -> bytes:
        packed: bytes = self.codec().compress(block, asbytes=True)
        return packed

    def unpack(self, packed: bytes, size: bytes | None) -> bytes:
        try:
            n = int(size or b"")
        except ValueError:
            raise ValueError("bad promaccel.labels_size") from None
        if not 0 < n <= min(UNPACK_LABELS_MAX_BYTES, max(len(packed) * UNPACK_MAX_RATIO, 1 << 20)):
            raise ValueError(f"promaccel.labels_size {n} out of bounds")
        try:
            out: bytes = self.codec().decompress(packed, decompressed_size=n, asbytes=True)
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"packed label list: {exc}") from None
        if len(out) != n:
            raise ValueError("packed label list: not of its size")
        return out


_PACKED = _PackedLabels()


def from_table(table: pa.Table, *, values: bool = True) -> QueryResult:
    """`values` False: a table read without its value column (`from_ipc_bytes` packing a
    piece, which keeps none of the samples): the result's values are left unset."""
    meta = table.schema.metadata or {}
    try:
        if meta.get(b"promaccel.version") != b"1":
            raise MalformedAnswer("not a promaccel result table (version)")
        rtype = meta[b"promaccel.result_type"].decode()
        labels, block = _label_list(meta, table.num_rows + SERIES_WITHOUT_SAMPLES)
        warnings = orjson.loads(meta.get(b"promaccel.warnings", b"[]"))
        infos = orjson.loads(meta.get(b"promaccel.infos", b"[]"))
        sv = meta.get(b"promaccel.string_value")
        series = _column_numpy(table, "series", np.int32)
        t = _column_numpy(table, "t_ms", np.int64)
        v = _column_numpy(table, "value", np.float64) if values else np.empty(len(t), dtype=np.float64)
    except (KeyError, ValueError, orjson.JSONDecodeError, pa.ArrowException) as exc:
        raise MalformedAnswer(f"bad promaccel result table: {exc}") from exc
    n = len(labels) if labels is not None else len(block[0])
    offsets = np.zeros(n + 1, dtype=np.int64)
    if not _offsets_of_series(series, offsets):
        raise MalformedAnswer("bad promaccel result table: series column out of order")
    out = QueryResult(
        rtype,
        labels,
        offsets,
        t,
        v,
        list(warnings),
        list(infos),
        string_value=sv.decode() if sv is not None else None,
        keys=None if block is None else block[0],
    )
    if block is not None:
        # The keys are the process's shared ones; the list's JSON stays with the piece only
        # when small: an hour of a 2,048-GPU panel carries ~1 MB of it, and series come and
        # go from hour to hour, so 24 cells of a day held 24 different copies (issue 15).
        # An encoder asking for the block has it joined from the keys.
        keys, kept = block
        out.set_canonical_keys(keys, kept if kept is not None and len(kept[0]) <= KEEP_LABEL_BLOCK_BYTES else None)
    return out


def release_unused() -> None:
    """Give the blocks Arrow's memory pool keeps of freed buffers back to the system (its
    bundled mimalloc keeps 25-60 MiB of a burst's payloads otherwise)."""
    pa.default_memory_pool().release_unused()


def use_system_pool() -> str:
    """Arrow allocates with malloc from now on (proxy/runtime/memory.py says why); the pool's name."""
    pa.set_memory_pool(pa.system_memory_pool())
    return str(pa.default_memory_pool().backend_name)


def to_ipc_bytes(result: QueryResult, compression: Literal["zstd", "lz4"] | None = "zstd") -> bytes:
    return to_ipc_view(result, compression).tobytes()


def to_ipc_view(result: QueryResult, compression: Literal["zstd", "lz4"] | None = "zstd") -> memoryview:
    """`to_ipc_bytes` without its copy: a view of Arrow's own buffer (the cache frames it,
    copying it once; a heavy answer's payloads are megabytes each). A piece packed with the
    same compression (`pack`) gives its payload."""
    if isinstance(result, PackedPiece) and result.compression is not None and result.compression == compression:
        return memoryview(result.payload)
    table = to_table(result, pack_labels=True)
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=opts) as writer:
        # In batches, each compressed on its own: a large cell can be read back a batch at a
        # time (`PackedPiece`).
        writer.write_table(table, max_chunksize=PAYLOAD_BATCH_ROWS)
    return memoryview(sink.getvalue())


# Cache payloads are written in record batches of this many rows (~160 KB of columns).
PAYLOAD_BATCH_ROWS = 8192


def from_ipc_bytes(data: bytes | memoryview, *, pack_from: int = 0) -> QueryResult:
    """A cache payload back to a result. `pack_from` > 0: a matrix of that many samples or
    more comes back as a `PackedPiece` (checked like any other, then its samples left in
    `data`; read a batch at a time, so a payload written in one batch, as before batches,
    is read whole when it is read)."""
    # A payload that may hold pack_from samples is read without its values first: a packed
    # piece keeps none, and reads them when streamed. Below 2 bytes a sample (lz4 packs a
    # fleet's samples into 3-8) it is unlikely to hold that many, and is read whole at once
    # (unpacked, whatever it holds): the aggregated panels' cells (~15 k samples, ~130 KB)
    # are not read in two steps.
    first_without_values = 0 < 2 * pack_from <= len(data)
    try:
        options = pa.ipc.IpcReadOptions(included_fields=[0, 1]) if first_without_values else None
        table = pa.ipc.open_stream(pa.py_buffer(data), options=options).read_all()
    except pa.ArrowException as exc:
        raise MalformedAnswer(f"bad Arrow IPC stream: {exc}") from exc
    out = from_table(table, values=not first_without_values)
    del table
    if pack_from > 0 and out.result_type == "matrix" and out.n_samples >= pack_from:
        return PackedPiece.of(out, data)
    if first_without_values:  # not packed after all: its values alone are read now
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data), options=_VALUES).read_all()
            v = _column_numpy(table, "value", np.float64)
        except (KeyError, ValueError, pa.ArrowException) as exc:
            raise MalformedAnswer(f"bad promaccel result table: {exc}") from exc
        if len(v) != out.n_samples:
            raise MalformedAnswer("bad promaccel result table: columns of different lengths")
        out.value = v
    return out


_VALUES = pa.ipc.IpcReadOptions(included_fields=[2])


def pack(result: QueryResult, compression: Literal["zstd", "lz4"], pack_from: int) -> QueryResult:
    """A matrix of `pack_from` (> 0) samples or more as a `PackedPiece` of its cache payload
    (a fetched cell on its way to the cache: its payload is made once, and the answer reads
    it back a batch at a time); anything else as it is."""
    if (pack_from <= 0 or result.result_type != "matrix" or result.n_samples < pack_from
            or isinstance(result, PackedPiece)):
        return result
    payload = to_ipc_view(result, compression)
    out = PackedPiece.of(result, payload)
    out.compression = compression
    return out


class PackedPiece(LazySamples):
    """A cached matrix whose samples stay in its Arrow payload (compressed: a 24 h panel of
    2,048 GPUs is ~47 MB of columns decoded and a fraction of that packed, issue 15). Its
    labels, offsets and each series' first and last timestamps are at hand (the payload was
    decoded and checked once, `of`); the samples are read back a batch at a time through
    `cursor()` (a merge streaming its pieces: result/concat.py), or all at once, and kept,
    the first time `t_ms` or `value` is read."""

    def __init__(self, base: QueryResult, payload: bytes | memoryview, firsts: I64, lasts: I64) -> None:
        super().__init__(base.result_type, base.parsed_labels(), base.offsets, base.warnings, base.infos,
                         base._ckeys, base._label_block)
        self.payload = payload
        self.compression: str | None = None  # known when packed here (`pack`), not when read
        self.packed = _Packed(payload, firsts, lasts)

    def packed_samples(self) -> _Packed | None:
        return self.packed if self._samples is None else None

    def series_bounds(self) -> tuple[I64, I64] | None:
        return self.packed.firsts, self.packed.lasts  # checked in time order (`of`)

    @classmethod
    def of(cls, r: QueryResult, payload: bytes | memoryview) -> PackedPiece:
        """`r`, just decoded from `payload`, with its samples let go."""
        if not increasing_within(r.t_ms, r.offsets):
            raise MalformedAnswer("bad promaccel result table: a series is not in time order")
        counts = r.counts
        starts = r.offsets[:-1]
        firsts = np.where(counts > 0, r.t_ms[np.minimum(starts, max(r.n_samples - 1, 0))], 0)
        lasts = np.where(counts > 0, r.t_ms[np.maximum(r.offsets[1:] - 1, 0)], 0)
        return cls(r, payload, firsts, lasts)

    def _load(self) -> tuple[I64, F64]:
        table = pa.ipc.open_stream(pa.py_buffer(self.payload)).read_all()
        return _column_numpy(table, "t_ms", np.int64), _column_numpy(table, "value", np.float64)

    def sample_windows(self, max_samples: int) -> Iterator[tuple[int, int, I64, F64]]:
        if self._samples is not None:
            yield from super().sample_windows(max_samples)
            return
        offsets = self.offsets
        cur = self.packed.cursor()
        for s0, s1 in self.window_bounds(max_samples):
            a, b = int(offsets[s0]), int(offsets[s1])
            t, v, base = cur.rows(a, b)
            yield s0, s1, t[a - base : b - base], v[a - base : b - base]


class _Packed:
    """The samples of a `PackedPiece`: its payload, each series' first and last timestamp
    (0 for a series without samples), and cursors reading it a few batches at a time."""

    __slots__ = ("payload", "firsts", "lasts")

    def __init__(self, payload: bytes | memoryview, firsts: I64, lasts: I64) -> None:
        self.payload = payload
        self.firsts = firsts
        self.lasts = lasts

    def cursor(self) -> _Cursor:
        return _Cursor(self.payload)


# A cursor reads the timestamps and values of a payload, not its series column.
_T_AND_VALUES = pa.ipc.IpcReadOptions(included_fields=[1, 2])


class _Cursor:
    """Rows of a payload, read forward a batch at a time: `rows(lo, hi)` gives arrays that
    hold rows lo..hi-1 from `base` on. Each batch read is copied once into the cursor's own
    arrays, which keep the rows from lo on (so a merge window's rows are contiguous without
    joining batches again at every window). Asked for rows before those it holds, it starts
    again from the first batch."""

    def __init__(self, payload: bytes | memoryview) -> None:
        self.payload = payload
        self.reader: Any = None
        self.t: I64 = np.empty(0, dtype=np.int64)
        self.v: F64 = np.empty(0, dtype=np.float64)
        self.start = self.end = 0  # the rows held are t[start:end], from row `base` on
        self.base = 0
        self.next_row = 0

    def _restart(self) -> None:
        self.reader = pa.ipc.open_stream(pa.py_buffer(self.payload), options=_T_AND_VALUES)
        self.start = self.end = self.base = self.next_row = 0

    def _room(self, m: int) -> None:
        """Room for `m` more rows after those held (moved to the front, or to larger arrays)."""
        held = self.end - self.start
        if self.end + m <= len(self.t):
            return
        if held + m <= len(self.t):
            self.t[:held] = self.t[self.start:self.end]  # numpy copies overlapping ranges right
            self.v[:held] = self.v[self.start:self.end]
        else:
            cap = max(held + m + (held + m) // 4, 1 << 14)  # a quarter spare, not double: 25 cursors at once
            t, v = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.float64)
            t[:held], v[:held] = self.t[self.start:self.end], self.v[self.start:self.end]
            self.t, self.v = t, v
        self.start, self.end = 0, held

    def rows(self, lo: int, hi: int) -> tuple[I64, F64, int]:
        if self.reader is None or lo < self.base:
            self._restart()
        if lo > self.base:  # rows before lo are not asked for again
            drop = min(lo, self.next_row) - self.base
            self.start += drop
            self.base += drop
        try:
            while self.next_row < hi:
                batch = self.reader.read_next_batch()
                m = batch.num_rows
                if self.next_row + m <= lo:  # wholly before lo: skipped
                    self.next_row += m
                    self.base, self.start, self.end = self.next_row, 0, 0
                    continue
                self._room(m)
                self.t[self.end:self.end + m] = batch.column(0).to_numpy()
                self.v[self.end:self.end + m] = batch.column(1).to_numpy()
                self.end += m
                self.next_row += m
        except StopIteration:
            raise MalformedAnswer("packed piece: fewer rows than its offsets") from None
        return self.t[self.start:self.end], self.v[self.start:self.end], self.base


class _LabelLists:
    """Label list JSON of cached pieces -> its keys (and its label block, when small). The
    pieces of one panel mostly carry the very same series list from refresh to refresh:
    split it once. The keys are the shared ones (`LABEL_CACHE.intern`): an entry costs a
    list of references, not the list's JSON again (the hour cells of a 2,048-GPU raw panel
    kept ~9 MB of it, issue 15). Bounded by the bytes of JSON listed (cleared when full);
    values are never mutated, and callers get their own copies of the lists."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.map: dict[bytes, tuple[list[bytes], tuple[bytes, I64, I64] | None]] = {}

    def get(self, raw: bytes) -> tuple[list[bytes], tuple[bytes, I64, I64] | None] | None:
        hit = self.map.get(raw)
        if hit is None:
            return None
        keys, block = hit
        return list(keys), block

    def put(self, stored: bytes, keys: list[bytes], block: tuple[bytes, I64, I64]) -> None:
        """`stored`: the list as a payload holds it (its JSON, or packed); counted at the
        size of its JSON."""
        raw, starts, ends = block
        if len(raw) > self.max_bytes // 4:
            return
        if self.bytes + len(raw) > self.max_bytes:
            self.map.clear()
            self.bytes = 0
        starts.flags.writeable = False
        ends.flags.writeable = False
        self.map[stored] = (list(keys), block if len(raw) <= KEEP_LABEL_BLOCK_BYTES else None)
        self.bytes += len(raw)


_LABEL_LISTS = _LabelLists()


@njit(cache=True, nogil=True)
def _offsets_of_series(series, offsets):  # type: ignore[no-untyped-def]
    """Row offsets per series (offsets has n_series + 1 zeros) from a non-decreasing series
    column; False if it decreases or names a series outside [0, n_series)."""
    n = len(offsets) - 1
    prev = 0
    for i in range(len(series)):
        s = series[i]
        if s < prev or s >= n:
            return False
        offsets[s + 1] += 1
        prev = s
    for s in range(n):
        offsets[s + 1] += offsets[s]
    return True


def _label_list(meta: dict[bytes, bytes], max_series: int) -> tuple[list[dict[str, str]] | None, Any]:
    """A cache table's labels and None, or (when the list was written as Prometheus writes
    label sets) None and (keys, label block): the dicts are parsed from the keys if anyone
    asks for them. The same list as an earlier piece's (one per hour of a 24 h panel) is
    neither unpacked nor split again."""
    packed = meta.get(b"promaccel.labels_zstd")
    stored = packed if packed is not None else meta[b"promaccel.labels"]
    canonical = meta.get(b"promaccel.labels_canonical") == b"1"
    if canonical:
        hit = _LABEL_LISTS.get(stored)
        if hit is not None:
            return None, hit
    raw = stored if packed is None else _PACKED.unpack(packed, meta.get(b"promaccel.labels_size"))
    block = _canonical_label_list(raw, stored, max_series) if canonical else None
    if block is None:
        labels = orjson.loads(raw)
        if not isinstance(labels, list):
            raise ValueError("labels are not a list")
        if len(labels) > max_series:
            raise ValueError("more label sets than the table's rows allow")
        return labels, None
    return None, block


def _canonical_label_list(raw: bytes, stored: bytes, max_series: int) -> Any:
    """The label list `raw`, written as Prometheus label JSON (`to_table`): (keys, the
    process's shared ones, and label block), else None. `stored`: the list as the payload
    holds it (packed or `raw`), what `_LABEL_LISTS` is keyed by. More than `max_series`
    label sets: ValueError."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    n_fit = len(raw) // 3 + 1  # `{},` per label set at least (untouched pages stay unmapped)
    n_max = min(n_fit, max_series + 1)
    starts = np.empty(n_max, dtype=np.int64)
    ends = np.empty(n_max, dtype=np.int64)
    n = array_element_spans(buf, starts, ends) if len(raw) > 2 else 0
    if n > max_series or (n < 0 and n_max < n_fit):
        raise ValueError("more label sets than the table's rows allow")
    if n < 0:
        return None
    starts, ends = starts[:n].copy(), ends[:n].copy()
    if n and not (np.all(buf[starts] == 123) and np.all(buf[ends - 1] == 125)):
        return None  # not a list of objects
    keys = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    try:
        LABEL_CACHE.intern(keys)
    except BadLabelJSON:
        return None
    _LABEL_LISTS.put(stored, keys, (raw, starts, ends))
    return keys, (raw, starts, ends)


def _column_numpy(table: pa.Table, name: str, dtype: Any) -> Any:
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"nulls in column {name}")
    arr = col.to_numpy() if col.num_chunks != 1 else col.chunk(0).to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(arr, dtype=dtype)


def encode_arrow_stream(result: QueryResult) -> bytes:
    """The public Arrow IPC stream (schema in the module docstring)."""
    meta = {
        b"promaccel.result_type": result.result_type.encode(),
        b"promaccel.warnings": orjson.dumps(result.warnings),
        b"promaccel.infos": orjson.dumps(result.infos),
    }
    if result.string_value is not None:
        meta[b"promaccel.string_value"] = result.string_value.encode()
    map_type = pa.map_(pa.utf8(), pa.utf8())
    per_series = pa.array([sorted(d.items()) for d in result.labels], type=map_type)
    series = pa.array(result.series)
    # The label sets are dictionary-encoded by series: one map per series, not per row.
    labels = pa.DictionaryArray.from_arrays(series, per_series)
    schema = pa.schema(
        [
            ("series", pa.int32()),
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("value", pa.float64()),
            ("labels", labels.type),
        ],
        metadata=meta,
    )
    table = pa.Table.from_arrays(
        [series, pa.array(result.t_ms).view(pa.timestamp("ms", tz="UTC")), pa.array(result.value), labels],
        schema=schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# --------------------------------------------------------------------------------------
