"""Prometheus JSON <-> columnar query results, and Arrow at the edges.

The only module of promaccel that imports pyarrow. Everything between the backends and the
client passes one wrapper type around, `QueryResult`:

    result_type   "matrix" | "vector" | "scalar" | "string"
    labels        list[dict[str, str]], one label set per series (thousands, not millions)
    offsets       int64[n_series + 1]: the samples of series i are [offsets[i], offsets[i+1])
    t_ms          int64[n_samples]   sample timestamps, milliseconds since the epoch
    value         float64[n_samples] sample values (NaN, +Inf, -Inf as IEEE values)
    warnings      list[str]          Prometheus's "warnings", carried along
    infos         list[str]          newer Prometheus's "infos", carried along
    string_value  str | None         only for result_type "string"

Invariants: the samples of a series are contiguous, in series order, and strictly
increasing in time within a series. A scalar or string result is one pseudo-series with an
empty label set and one sample (a string's value is NaN, its text is `string_value`).

Decoding (`decode_prometheus_json`) does not create a Python object per sample: a compiled
(numba) scanner walks the answer once, parses timestamps to integer milliseconds and the
quoted values to float64 (exact: Clinger's fast path, then the Eisel-Lemire algorithm as in
Go's strconv; the rare value neither can decide goes through Python's float()), and records
the byte span of each series' "metric" object, which orjson then parses (labels are few).
Anything the scanner does not expect (escapes in a value, exponents in a timestamp,
more than 3 decimals of a second, odd structure) sends the whole answer down an exact slow
path built on orjson. Native histograms raise `Undecodable`: the caller passes such an
answer through untouched.
Label sets are looked up by their JSON text in a bounded process-wide table (series recur
from piece to piece and refresh to refresh), so the dicts in `labels` are shared between
results: never mutate them. When the backend's label JSON is byte for byte what Prometheus
writes (the scanner checks: compact, names in byte order, jsoniter escaping), it is kept as
the result's canonical keys and written back verbatim by the encoder.
Where the time goes (profiled with py-spy --native and per-stage CPU time; numbers in
loadtests/codec_bench.py): the scanner's sample loop has Prometheus's compact layout
written out in the loop itself (an inlined wrapper around it that also held the general
call ran twice as slow), reuses the first 6 digits of the previous 10-digit timestamp, and
checks label objects with one table load per plain byte (other spellings go to a general
scanner); its output arrays are per-thread scratch reused between answers (fresh pages
cost as much as parsing), and the results are copied out at their exact size.

The kernels are compiled by numba on first use and cached on disk next to this file
(`cache=True`): a cold compile costs ~20-30 s of CPU, a cached load well under 1 s, and
editing this file invalidates the cache (see proxy/warmup.py).

Encoding (`encode_prometheus_json`, `iter_prometheus_json`) writes byte for byte what
Prometheus 2.42 writes (checked against a real 2.42):
- `{"status":"success","data":{"resultType":...,"result":...}}`, then `"warnings":[...]`
  and `"infos":[...]` after `data`, each only when non-empty; no whitespace, no newline.
- timestamps: unix seconds, then `.` and exactly 3 digits of milliseconds when the
  millisecond part is not zero (`1700000000`, `1700000000.500`, `-1.500`).
- values: Go's `strconv.AppendFloat(v, 'f', -1, 64)`, except `'e'` when |v| < 1e-6 or
  |v| >= 1e21 (`"0.000001"`, `"1e-07"`, `"100000000000000000000"`, `"1e+21"`, `"-0"`),
  and `"NaN"`, `"+Inf"`, `"-Inf"`.
- label sets: keys sorted by bytes (so `Hostname` < `__name__` < `abc`), strings escaped as
  jsoniter does: `<`, `>`, `&`, U+2028, U+2029 and control characters other than \\n \\r \\t as
  `\\u00XX` (lowercase hex), DEL and other non-ASCII raw.
Integral values (|v| < 2**53) are written directly; the digits of the others come from
orjson's shortest round-trip formatting of all of them in one call, and a compiled pass
rewrites each number into Go's notation while it assembles the answer. Label JSON comes
from the canonical keys when a result has them (decoded from Prometheus, or merged), so it
is not formatted again. `iter_prometheus_json` writes ~16k samples (~0.4 MB) per chunk:
streaming a 20 MB answer peaks at a few MB above the result, the one-shot encoder at about
2.5x the answer (scratch + the bytes + orjson's tokens); the compiled kernels release the
GIL. One difference
cannot be avoided: Prometheus writes an invalid UTF-8 byte in a label as the escape
`\ufffd`; decoded, that is the character U+FFFD, which Prometheus (and we) write raw.

Arrow:
- `QueryResult.to_arrow_table()` / `from_arrow_table()`: one row per sample, columns
  `series` int32 (index into the label list), `t_ms` int64, `value` float64; the schema
  metadata holds `promaccel.version` ("1"), `promaccel.result_type`, `promaccel.labels`
  (JSON list of label objects), `promaccel.warnings`, `promaccel.infos` (JSON lists) and,
  for string results, `promaccel.string_value`. `to_ipc_bytes()` / `from_ipc_bytes()`
  write / read that table as an Arrow IPC stream with zstd (or lz4) buffer compression:
  this is what the cache stores.
- `encode_arrow_stream(result)`: the public Arrow shape for clients that send
  `Accept: application/vnd.apache.arrow.stream`: one row per sample with columns
  `series` int32, `timestamp` timestamp[ms, UTC], `value` float64 and
  `labels` dictionary<int32, map<utf8, utf8>> (the full label set of the row's series,
  dictionary-encoded by series: one map per series on the wire), schema metadata
  `promaccel.result_type`, `promaccel.warnings`, `promaccel.infos` and, for strings,
  `promaccel.string_value`. Uncompressed, so any Arrow reader can open it.
"""

from __future__ import annotations

import gc
import math
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
from numba import njit

__all__ = [
    "CodecError",
    "MalformedAnswer",
    "QueryResult",
    "ResultType",
    "Undecodable",
    "decode_prometheus_json",
    "encode_arrow_stream",
    "encode_prometheus_json",
    "format_value",
    "iter_prometheus_json",
    "labels_json",
]

ResultType = Literal["matrix", "vector", "scalar", "string"]
_RESULT_TYPES = ("matrix", "vector", "scalar", "string")

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


# Exceptions:
#   CodecError
#    ├── Undecodable      valid answer we do not model (native histograms): pass it through
#    └── MalformedAnswer  not a successful Prometheus query answer, or not JSON at all
class CodecError(Exception):
    pass


class Undecodable(CodecError):
    pass


class MalformedAnswer(CodecError):
    pass


# --------------------------------------------------------------------------------------
# QueryResult
# --------------------------------------------------------------------------------------


@dataclass(eq=False)
class QueryResult:
    result_type: ResultType
    labels: list[dict[str, str]]
    offsets: I64
    t_ms: I64
    value: F64
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)
    string_value: str | None = None
    # Caches (labels never change once a result exists): Prometheus-formatted label JSON
    # as (bytes, starts, ends), per-series canonical keys, sortable keys.
    _label_block: tuple[bytes, I64, I64] | None = field(default=None, repr=False)
    _ckeys: list[bytes] | None = field(default=None, repr=False)
    _keys: list[tuple[tuple[str, str], ...]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.result_type not in _RESULT_TYPES:
            raise ValueError(f"unknown result type {self.result_type!r}")
        n = len(self.labels)
        if self.offsets.shape != (n + 1,) or self.offsets[0] != 0:
            raise ValueError("offsets must have n_series + 1 entries starting at 0")
        if int(self.offsets[-1]) != len(self.t_ms) or len(self.t_ms) != len(self.value):
            raise ValueError("offsets, t_ms and value disagree on the sample count")

    # -- constructors ------------------------------------------------------------------

    @classmethod
    def from_series(
        cls,
        result_type: ResultType,
        series: Sequence[tuple[dict[str, str], Sequence[int], Sequence[float]]],
        *,
        warnings: Sequence[str] = (),
        infos: Sequence[str] = (),
    ) -> QueryResult:
        """Build from Python lists: [(labels, t_ms list, value list), ...] (tests, small data)."""
        labels = [dict(s[0]) for s in series]
        counts = [len(s[1]) for s in series]
        offsets = np.zeros(len(series) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        t = np.fromiter((x for s in series for x in s[1]), dtype=np.int64, count=int(offsets[-1]))
        v = np.fromiter((x for s in series for x in s[2]), dtype=np.float64, count=int(offsets[-1]))
        return cls(result_type, labels, offsets, t, v, list(warnings), list(infos))

    @classmethod
    def scalar(cls, t_ms: int, value: float, **kw: Any) -> QueryResult:
        return cls(
            "scalar",
            [{}],
            np.array([0, 1], dtype=np.int64),
            np.array([t_ms], dtype=np.int64),
            np.array([value], dtype=np.float64),
            **kw,
        )

    @classmethod
    def string(cls, t_ms: int, text: str, **kw: Any) -> QueryResult:
        return cls(
            "string",
            [{}],
            np.array([0, 1], dtype=np.int64),
            np.array([t_ms], dtype=np.int64),
            np.array([math.nan], dtype=np.float64),
            string_value=text,
            **kw,
        )

    @classmethod
    def empty(cls, result_type: ResultType = "matrix", **kw: Any) -> QueryResult:
        z = np.zeros(0, dtype=np.int64)
        return cls(result_type, [], np.zeros(1, dtype=np.int64), z, np.zeros(0), **kw)

    # -- views -------------------------------------------------------------------------

    @property
    def n_series(self) -> int:
        return len(self.labels)

    @property
    def n_samples(self) -> int:
        return len(self.t_ms)

    @property
    def counts(self) -> I64:
        return np.diff(self.offsets)

    @property
    def series(self) -> npt.NDArray[np.int32]:
        """Series index of every sample (int32)."""
        return np.repeat(np.arange(self.n_series, dtype=np.int32), self.counts)

    def label_block(self) -> tuple[bytes, I64, I64]:
        """All label sets as Prometheus writes them: (bytes, start, end) per series."""
        if self._label_block is None:
            if self._ckeys is not None:
                keys = self._ckeys
                lens = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
                ends = np.cumsum(lens)
                self._label_block = (b"".join(keys), ends - lens, ends)
            else:
                self._label_block = _label_block(self.labels)
        return self._label_block

    def canonical_keys(self) -> list[bytes]:
        """Per series, its label set as Prometheus writes it (`labels_json`): equal label
        sets give equal keys, whichever backend sent them. Hash these, sort series_keys()."""
        if self._ckeys is None:
            raw, starts, ends = self.label_block()
            self._ckeys = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        return self._ckeys

    def set_canonical_keys(self, keys: list[bytes]) -> None:
        """Adopt keys known to be `canonical_keys()` of these very label sets (a merge
        reusing its pieces' keys), so that encoding does not format the labels again."""
        if len(keys) != self.n_series:
            raise ValueError("one key per series")
        self._label_block = None  # joined from the keys when an encoder asks for it
        self._ckeys = keys

    def series_keys(self) -> list[tuple[tuple[str, str], ...]]:
        """Per series, its label set as sorted (name, value) pairs. Comparing two keys as
        tuples is Prometheus's labels.Compare."""
        if self._keys is None:
            self._keys = [tuple(sorted(d.items())) for d in self.labels]
        return self._keys

    def to_pylist(self) -> list[tuple[dict[str, str], list[int], list[float]]]:
        """Slow, for tests and debugging."""
        out = []
        for i, d in enumerate(self.labels):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append((dict(d), self.t_ms[a:b].tolist(), self.value[a:b].tolist()))
        return out

    # -- Arrow -------------------------------------------------------------------------

    def to_arrow_table(self) -> pa.Table:
        meta = {
            b"promaccel.version": b"1",
            b"promaccel.result_type": self.result_type.encode(),
            # The label list as Prometheus writes label sets (the same JSON value as
            # orjson.dumps(labels)), so that a cached piece is not formatted again.
            b"promaccel.labels": b"[" + b",".join(self.canonical_keys()) + b"]",
            b"promaccel.labels_canonical": b"1",
            b"promaccel.warnings": orjson.dumps(self.warnings),
            b"promaccel.infos": orjson.dumps(self.infos),
        }
        if self.string_value is not None:
            meta[b"promaccel.string_value"] = self.string_value.encode()
        schema = pa.schema(
            [("series", pa.int32()), ("t_ms", pa.int64()), ("value", pa.float64())],
            metadata=meta,
        )
        return pa.Table.from_arrays(
            [pa.array(self.series), pa.array(self.t_ms), pa.array(self.value)], schema=schema
        )

    @classmethod
    def from_arrow_table(cls, table: pa.Table) -> QueryResult:
        meta = table.schema.metadata or {}
        try:
            if meta.get(b"promaccel.version") != b"1":
                raise MalformedAnswer("not a promaccel result table (version)")
            rtype = meta[b"promaccel.result_type"].decode()
            block = _canonical_label_list(meta)
            labels = orjson.loads(meta[b"promaccel.labels"]) if block is None else block[0]
            warnings = orjson.loads(meta.get(b"promaccel.warnings", b"[]"))
            infos = orjson.loads(meta.get(b"promaccel.infos", b"[]"))
            sv = meta.get(b"promaccel.string_value")
            series = _column_numpy(table, "series", np.int32)
            t = _column_numpy(table, "t_ms", np.int64)
            v = _column_numpy(table, "value", np.float64)
        except (KeyError, ValueError, orjson.JSONDecodeError, pa.ArrowException) as exc:
            raise MalformedAnswer(f"bad promaccel result table: {exc}") from exc
        n = len(labels)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if not _offsets_of_series(series, offsets):
            raise MalformedAnswer("bad promaccel result table: series column out of order")
        out = cls(
            rtype,
            labels,
            offsets,
            t,
            v,
            list(warnings),
            list(infos),
            string_value=sv.decode() if sv is not None else None,
        )
        if block is not None:
            out._ckeys = block[1]
            out._label_block = block[2]
        return out

    def to_ipc_bytes(self, compression: Literal["zstd", "lz4"] | None = "zstd") -> bytes:
        table = self.to_arrow_table()
        opts = pa.ipc.IpcWriteOptions(compression=compression)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=opts) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_ipc_bytes(cls, data: bytes) -> QueryResult:
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except pa.ArrowException as exc:
            raise MalformedAnswer(f"bad Arrow IPC stream: {exc}") from exc
        return cls.from_arrow_table(table)


class _LabelLists:
    """Label list JSON of cached pieces -> its parsed form. The pieces of one panel (one
    per hour of a 24 h window) mostly carry the very same series list: parse it once.
    Bounded by the bytes of JSON kept (cleared when full); values are never mutated, and
    callers get their own copies of the lists."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.map: dict[bytes, tuple[list[dict[str, str]], list[bytes], tuple[bytes, I64, I64]]] = {}

    def get(self, raw: bytes) -> Any:
        hit = self.map.get(raw)
        if hit is None:
            return None
        labels, keys, block = hit
        return list(labels), list(keys), block

    def put(self, raw: bytes, value: tuple[list[dict[str, str]], list[bytes], tuple[bytes, I64, I64]]) -> None:
        if len(raw) > self.max_bytes // 4:
            return
        if self.bytes + len(raw) > self.max_bytes:
            self.map.clear()
            self.bytes = 0
        labels, keys, (_, starts, ends) = value
        starts.flags.writeable = False
        ends.flags.writeable = False
        self.map[raw] = (list(labels), list(keys), value[2])
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


def _canonical_label_list(meta: dict[bytes, bytes]) -> Any:
    """A cache table's label list written as Prometheus label JSON (to_arrow_table):
    (labels looked up in the shared label-set table, keys, label block), else None."""
    if meta.get(b"promaccel.labels_canonical") != b"1":
        return None
    raw = meta[b"promaccel.labels"]
    hit = _LABEL_LISTS.get(raw)
    if hit is not None:
        return hit
    buf = np.frombuffer(raw, dtype=np.uint8)
    n_max = len(raw) // 3 + 1  # `{},` per label set at least (untouched pages stay unmapped)
    starts = np.empty(n_max, dtype=np.int64)
    ends = np.empty(n_max, dtype=np.int64)
    n = _array_element_spans(buf, starts, ends) if len(raw) > 2 else 0
    if n < 0:
        return None
    starts, ends = starts[:n].copy(), ends[:n].copy()
    if n and not (np.all(buf[starts] == 123) and np.all(buf[ends - 1] == 125)):
        return None  # not a list of objects
    keys = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    try:
        labels = _LABEL_CACHE.lookup(keys)
    except _SlowPath:
        return None
    _LABEL_LISTS.put(raw, (labels, keys, (raw, starts, ends)))
    return labels, keys, (raw, starts, ends)


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
# Label sets and single values, Prometheus style
# --------------------------------------------------------------------------------------

# jsoniter (ConfigCompatibleWithStandardLibrary, EscapeHTML) escapes these beyond what
# orjson escapes; \b and \f it writes as \u0008 / \u000c.
def _needs_go_fix(raw: bytes) -> bool:
    # Single-byte `in` is memchr; a regex alternation is ~100x slower on megabytes.
    if b"<" in raw or b">" in raw or b"&" in raw:
        return True
    if b"\\" in raw and (b"\\b" in raw or b"\\f" in raw):
        return True
    return b"\xe2" in raw and (b"\xe2\x80\xa8" in raw or b"\xe2\x80\xa9" in raw)

_GO_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_GO_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x22: '\\"', 0x5C: "\\\\"})
_GO_ESCAPES.update({0x3C: "\\u003c", 0x3E: "\\u003e", 0x26: "\\u0026"})
_GO_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def go_json_string(s: str) -> str:
    """A JSON string literal as Prometheus (jsoniter) writes it."""
    return '"' + s.translate(_GO_ESCAPES) + '"'


def labels_json(labels: dict[str, str]) -> bytes:
    """`{"k":"v",...}` with keys sorted by bytes and jsoniter's escaping."""
    raw = orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)
    if not _needs_go_fix(raw):
        return raw
    parts = [f"{go_json_string(k)}:{go_json_string(labels[k])}" for k in sorted(labels)]
    return ("{" + ",".join(parts) + "}").encode()


def _label_block(labels: list[dict[str, str]]) -> tuple[bytes, I64, I64]:
    n = len(labels)
    raw = orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)
    if not _needs_go_fix(raw):
        starts = np.empty(n, dtype=np.int64)
        ends = np.empty(n, dtype=np.int64)
        if _array_element_spans(np.frombuffer(raw, dtype=np.uint8), starts, ends) == n:
            return raw, starts, ends
    parts = [labels_json(d) for d in labels]
    lens = np.array([len(x) for x in parts], dtype=np.int64)
    ends = np.cumsum(lens)
    return b"".join(parts), ends - lens, ends


def format_value(v: float) -> str:
    """One value as Prometheus writes it (the reference for the vectorised encoder)."""
    if v != v:
        return "NaN"
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        return repr(v)  # Python's repr here is Go's 'e' with shortest digits: 1e-07, 1e+21
    r = repr(v)
    if "e" not in r:
        return r[:-2] if r.endswith(".0") else r
    mant, _, exp_s = r.partition("e")
    neg = mant.startswith("-")
    digits = mant.lstrip("-").replace(".", "")
    point = mant.lstrip("-").find(".")
    dp = (point if point >= 0 else len(mant.lstrip("-"))) + int(exp_s)
    digits = digits.rstrip("0") or "0"
    if dp <= 0:
        s = "0." + "0" * (-dp) + digits
    elif dp >= len(digits):
        s = digits + "0" * (dp - len(digits))
    else:
        s = digits[:dp] + "." + digits[dp:]
    return "-" + s if neg else s


def format_timestamp(t_ms: int) -> str:
    """One timestamp as Prometheus writes it (jsonutil.MarshalTimestamp)."""
    sign = ""
    if t_ms < 0:
        sign, t_ms = "-", -t_ms
    sec, frac = divmod(t_ms, 1000)
    return f"{sign}{sec}.{frac:03d}" if frac else f"{sign}{sec}"


# --------------------------------------------------------------------------------------
# Compiled kernels (numba). Byte constants are numpy uint8 arrays (frozen at compile time).
# --------------------------------------------------------------------------------------


def _lit(s: bytes) -> npt.NDArray[np.uint8]:
    return np.frombuffer(s, dtype=np.uint8).copy()


# Bytes of a label string that need no attention from the label scanner.
_LBL_PLAIN = np.ones(256, dtype=np.uint8)
_LBL_PLAIN[:32] = 0
_LBL_PLAIN[[34, 92, 60, 62, 38, 0xE2]] = 0


_K_METRIC = _lit(b"metric")
_K_VALUES = _lit(b"values")
_K_VALUE = _lit(b"value")
_K_HISTOGRAM = _lit(b"histogram")
_K_HISTOGRAMS = _lit(b"histograms")
_W_METRIC = _lit(b'{"metric":')
_W_VALUES = _lit(b',"values":[')
_W_VALUE = _lit(b',"value":')
_W_NAN = _lit(b"NaN")
_W_PINF = _lit(b"+Inf")
_W_NINF = _lit(b"-Inf")

_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)
_MASK52 = _U64(0x000FFFFFFFFFFFFF)
_ONE = _U64(1)
_ZERO = _U64(0)
_X1FF = _U64(0x1FF)
_SIGN = _U64(0x8000000000000000)


def _powers_of_ten_128() -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """128-bit mantissas (rounded down) of 10**e for e in [-348, 347], as Go's
    strconv.detailedPowersOfTen: (lo, hi) with the top bit of hi set."""
    lo = np.zeros(696, dtype=np.uint64)
    hi = np.zeros(696, dtype=np.uint64)
    for i, e in enumerate(range(-348, 348)):
        if e >= 0:
            v = 10**e
            bl = v.bit_length()
            v = v >> (bl - 128) if bl > 128 else v << (128 - bl)
        else:
            d = 10 ** (-e)
            v = (1 << (127 + d.bit_length())) // d
        assert v.bit_length() == 128
        hi[i] = v >> 64
        lo[i] = v & 0xFFFFFFFFFFFFFFFF
    return lo, hi


_POW10_LO, _POW10_HI = _powers_of_ten_128()
_D4 = np.array([[ord(c) for c in f"{i:04d}"] for i in range(10000)], dtype=np.uint8)
_POW10_EXACT = np.array([10.0**i for i in range(23)], dtype=np.float64)


@njit(cache=True)
def _mul64(a, b):  # type: ignore[no-untyped-def]
    a_lo = a & _M32
    a_hi = a >> _U64(32)
    b_lo = b & _M32
    b_hi = b >> _U64(32)
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _U64(32)) + (p1 & _M32) + (p2 & _M32)
    lo = (mid << _U64(32)) | (p0 & _M32)
    hi = p3 + (p1 >> _U64(32)) + (p2 >> _U64(32)) + (mid >> _U64(32))
    return hi, lo


@njit(cache=True)
def _eisel_lemire(man, exp10):  # type: ignore[no-untyped-def]
    """Go's strconv.eiselLemire64 for man != 0: (ok, IEEE bits without sign)."""
    if exp10 < -348 or exp10 > 347:
        return False, _ZERO
    clz = 0
    probe = man
    while (probe & _U64(0x8000000000000000)) == _ZERO:
        probe = probe << _ONE
        clz += 1
    man = man << _U64(clz)
    ret_exp2 = ((217706 * exp10) >> 16) + 64 + 1023 - clz
    idx = exp10 + 348
    x_hi, x_lo = _mul64(man, _POW10_HI[idx])
    if (x_hi & _X1FF) == _X1FF and (x_lo + man) < man:
        y_hi, y_lo = _mul64(man, _POW10_LO[idx])
        merged_hi = x_hi
        merged_lo = x_lo + y_hi
        if merged_lo < x_lo:
            merged_hi += _ONE
        if (merged_hi & _X1FF) == _X1FF and (merged_lo + _ONE) == _ZERO and (y_lo + man) < man:
            return False, _ZERO
        x_hi = merged_hi
        x_lo = merged_lo
    msb = x_hi >> _U64(63)
    ret_mant = x_hi >> (msb + _U64(9))
    ret_exp2 -= 1 ^ np.int64(msb)
    if x_lo == _ZERO and (x_hi & _X1FF) == _ZERO and (ret_mant & _U64(3)) == _ONE:
        return False, _ZERO
    ret_mant += ret_mant & _ONE
    ret_mant = ret_mant >> _ONE
    if (ret_mant >> _U64(53)) > _ZERO:
        ret_mant = ret_mant >> _ONE
        ret_exp2 += 1
    if ret_exp2 <= 0 or ret_exp2 >= 0x7FF:
        return False, _ZERO
    return True, (_U64(ret_exp2) << _U64(52)) | (ret_mant & _MASK52)


@njit(cache=True, inline='always')
def _parse_float(b, s, e, v_out, v_bits, k):  # type: ignore[no-untyped-def]
    """Parse the number starting at b[s] (bytes up to e) into v_out[k] (v_bits is the same
    memory as uint64). Returns the index of the first byte after the number, or -1 for
    'let Python decide' (more than 19 digits, subnormals, overflow, odd syntax)."""
    i = s
    neg = False
    if i >= e:
        return -1
    c = b[i]
    if c == 45:  # '-'
        neg = True
        i += 1
    elif c == 43:  # '+'
        i += 1
    if i + 3 <= e and b[i] == 73 and b[i + 1] == 110 and b[i + 2] == 102:  # Inf
        v_out[k] = -np.inf if neg else np.inf
        return i + 3
    if i == s and i + 3 <= e and b[i] == 78 and b[i + 1] == 97 and b[i + 2] == 78:  # NaN
        v_out[k] = np.nan
        return i + 3
    # Accumulate every digit; leading zeros leave man at 0 and are counted in `lz`, so
    # that more than 19 significant digits (man overflowed) can be told apart.
    man = _ZERO
    lz = 0
    i0 = i
    while i < e:
        d = np.int64(b[i]) - 48
        if d < 0 or d > 9:
            break
        man = man * _U64(10) + _U64(d)
        lz += man == _ZERO
        i += 1
    digits = i - i0
    exp10 = 0
    if i < e and b[i] == 46:  # '.'
        i += 1
        i1 = i
        while i < e:
            d = np.int64(b[i]) - 48
            if d < 0 or d > 9:
                break
            man = man * _U64(10) + _U64(d)
            lz += man == _ZERO
            i += 1
        exp10 = i1 - i
        digits += i - i1
    if digits == 0:
        return -1
    if digits - lz > 19:
        return -1
    if i < e and (b[i] == 101 or b[i] == 69):  # e E
        i += 1
        eneg = False
        if i < e and (b[i] == 45 or b[i] == 43):
            eneg = b[i] == 45
            i += 1
        ev = 0
        ed = 0
        while i < e and 48 <= b[i] <= 57:
            if ev < 100000:
                ev = ev * 10 + (np.int64(b[i]) - 48)
            ed += 1
            i += 1
        if ed == 0:
            return -1
        exp10 += -ev if eneg else ev
    if man == _ZERO:
        v_out[k] = -0.0 if neg else 0.0
        return i
    if man <= _U64(9007199254740992) and -22 <= exp10 <= 22:
        f = np.float64(man)
        if exp10 >= 0:
            f = f * _POW10_EXACT[exp10]
        else:
            f = f / _POW10_EXACT[-exp10]
        v_out[k] = -f if neg else f
        return i
    ok, bits = _eisel_lemire(man, exp10)
    if not ok:
        return -1
    v_bits[k] = (bits | _SIGN) if neg else bits
    return i


@njit(cache=True)
def _skip_ws(b, i, n):  # type: ignore[no-untyped-def]
    while i < n and (b[i] == 32 or b[i] == 10 or b[i] == 13 or b[i] == 9):
        i += 1
    return i


@njit(cache=True)
def _skip_string(b, i, n):  # type: ignore[no-untyped-def]
    """b[i] is an opening quote; index after the closing quote, or -1."""
    i += 1
    while i < n:
        c = b[i]
        if c == 34:
            return i + 1
        if c == 92:
            i += 2
        else:
            i += 1
    return -1


@njit(cache=True)
def _skip_value(b, i, n):  # type: ignore[no-untyped-def]
    """Index after the JSON value starting at i (not validated), or -1."""
    if i >= n:
        return -1
    c = b[i]
    if c == 34:
        return _skip_string(b, i, n)
    if c == 123 or c == 91:
        depth = 0
        while i < n:
            c = b[i]
            if c == 34:
                i = _skip_string(b, i, n)
                if i < 0:
                    return -1
                continue
            if c == 123 or c == 91:
                depth += 1
            elif c == 125 or c == 93:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    while i < n:
        c = b[i]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return i
        i += 1
    return i


@njit(cache=True)
def _key_is(b, ks, ke, lit):  # type: ignore[no-untyped-def]
    if ke - ks != len(lit):
        return False
    for j in range(len(lit)):
        if b[ks + j] != lit[j]:
            return False
    return True


@njit(cache=True)
def _scan_members(b, i, n, first, stop, out):  # type: ignore[no-untyped-def]
    """Members of a JSON object, from its '{' at i (first) or from just after a member's
    value. Rows (key_start, key_end, value_start, value_end) go to out, key spans inside
    the quotes. Stops before skipping the value of the key `stop` (its value_end is -1), so
    that the big `result` array is walked once, by the series parser.
    Returns (status, rows, pos): 0 the object ended (pos after '}'), 1 stopped at `stop`
    (pos = its value start), -1 not what we expect."""
    k = 0
    i = _skip_ws(b, i, n)
    if first:
        if i >= n or b[i] != 123:
            return -1, 0, i
        i = _skip_ws(b, i + 1, n)
        if i < n and b[i] == 125:
            return 0, 0, i + 1
    else:
        if i < n and b[i] == 125:
            return 0, 0, i + 1
        if i >= n or b[i] != 44:
            return -1, 0, i
        i = _skip_ws(b, i + 1, n)
    while True:
        if i >= n or b[i] != 34 or k >= out.shape[0]:
            return -1, k, i
        ks = i + 1
        i = _skip_string(b, i, n)
        if i < 0:
            return -1, k, i
        ke = i - 1
        i = _skip_ws(b, i, n)
        if i >= n or b[i] != 58:
            return -1, k, i
        i = _skip_ws(b, i + 1, n)
        out[k, 0] = ks
        out[k, 1] = ke
        out[k, 2] = i
        if len(stop) > 0 and _key_is(b, ks, ke, stop):
            out[k, 3] = -1
            return 1, k + 1, i
        i = _skip_value(b, i, n)
        if i < 0:
            return -1, k, i
        out[k, 3] = i
        k += 1
        i = _skip_ws(b, i, n)
        if i < n and b[i] == 44:
            i = _skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 125:
            return 0, k, i + 1
        return -1, k, i


@njit(cache=True)
def _hexval(c):  # type: ignore[no-untyped-def]
    """Value of a lowercase hex digit, -1 otherwise (jsoniter writes lowercase)."""
    if 48 <= c <= 57:
        return np.int64(c) - 48
    if 97 <= c <= 102:
        return np.int64(c) - 87
    return -1


@njit(cache=True)
def _label_string(b, i, n):  # type: ignore[no-untyped-def]
    """The string at b[i] == '"' inside a label set: (index after it or -1, canonical),
    canonical meaning: escaped exactly as Prometheus (jsoniter) escapes."""
    canon = True
    i += 1
    while i < n:
        c = b[i]
        if _LBL_PLAIN[c]:  # one table load per ordinary byte
            i += 1
            continue
        if c == 34:
            return i + 1, canon
        if c == 92:
            if i + 1 >= n:
                return -1, False
            e = b[i + 1]
            if e == 34 or e == 92 or e == 110 or e == 114 or e == 116:
                i += 2
                continue
            if e == 117 and i + 5 < n:
                x = 0
                for j in range(i + 2, i + 6):
                    h = _hexval(b[j])
                    if h < 0:
                        canon = False
                        h = 0
                    x = x * 16 + h
                if not (
                    (x < 32 and x != 9 and x != 10 and x != 13)
                    or x == 0x3C
                    or x == 0x3E
                    or x == 0x26
                    or x == 0x2028
                    or x == 0x2029
                ):
                    canon = False
                i += 6
                continue
            canon = False
            i += 2
            continue
        if c < 32:
            return -1, False
        if c == 60 or c == 62 or c == 38:
            canon = False
        elif c == 0xE2 and i + 2 < n and b[i + 1] == 0x80 and (b[i + 2] == 0xA8 or b[i + 2] == 0xA9):
            canon = False
        i += 1
    return -1, False


@njit(cache=True, nogil=True)
def _skip_label_object(b, i, n):  # type: ignore[no-untyped-def]
    """The flat {"name":"value",...} object at i: (end or -1 if it is anything else,
    canonical), canonical meaning byte for byte what Prometheus writes for it (compact,
    names in increasing byte order, jsoniter escaping), so that it can be reused as is.
    Fast path: compact, strings of plain bytes only (one table load per byte); anything
    else goes to the general scanner from the start of the object."""
    start = i
    if i >= n or b[i] != 123:
        return -1, False
    i += 1
    if i < n and b[i] == 125:
        return i + 1, True
    pks = -1
    pke = -1
    while i < n and b[i] == 34:
        ks = i + 1
        j = ks
        while j < n and _LBL_PLAIN[b[j]]:
            j += 1
        if j + 2 >= n or b[j] != 34 or b[j + 1] != 58 or b[j + 2] != 34:
            break
        ke = j
        # Names strictly increasing by bytes (which also rules out duplicates).
        if pks >= 0:
            m = min(ke - ks, pke - pks)
            cmp = 0
            for x in range(m):
                if b[ks + x] != b[pks + x]:
                    cmp = 1 if b[ks + x] > b[pks + x] else -1
                    break
            if cmp < 0 or (cmp == 0 and ke - ks <= pke - pks):
                break
        pks = ks
        pke = ke
        j += 3
        while j < n and _LBL_PLAIN[b[j]]:
            j += 1
        if j + 1 >= n or b[j] != 34:
            break
        c = b[j + 1]
        if c == 44:
            i = j + 2
            continue
        if c == 125:
            return j + 2, True
        break
    return _skip_label_object_general(b, start, n)


@njit(cache=True, nogil=True)
def _skip_label_object_general(b, i, n):  # type: ignore[no-untyped-def]
    """_skip_label_object for any spelling: whitespace, escapes, names out of order."""
    if i >= n or b[i] != 123:
        return -1, False
    canon = True
    i += 1
    if i < n and b[i] == 125:
        return i + 1, True
    pks = -1
    pke = -1
    while True:
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 34:
            return -1, False
        ks = i + 1
        i, c1 = _label_string(b, i, n)
        if i < 0:
            return -1, False
        ke = i - 1
        # Names strictly increasing by bytes (which also rules out duplicates).
        if pks >= 0:
            m = min(ke - ks, pke - pks)
            cmp = 0
            for j in range(m):
                if b[ks + j] != b[pks + j]:
                    cmp = 1 if b[ks + j] > b[pks + j] else -1
                    break
            if cmp < 0 or (cmp == 0 and ke - ks <= pke - pks):
                canon = False
        for j in range(ks, ke):
            if b[j] == 92:
                canon = False
        pks = ks
        pke = ke
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 58:
            return -1, False
        i += 1
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 34:
            return -1, False
        i, c2 = _label_string(b, i, n)
        if i < 0:
            return -1, False
        canon = canon and c1 and c2
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i < n and b[i] == 44:
            i += 1
            continue
        if i < n and b[i] == 125:
            return i + 1, canon
        return -1, False


@njit(cache=True, inline='always')
def _parse_ts(b, i, n):  # type: ignore[no-untyped-def]
    """A JSON number of seconds at i -> (ok, t_ms, next index). ok False for exponents,
    more than 3 non-zero decimals, or more than 15 integer digits."""
    # Today's timestamps have exactly 10 integer digits: no loop-carried branch.
    if i + 10 < n:
        sec = 0
        ok = True
        for j in range(10):
            d = np.int64(b[i + j]) - 48
            ok = ok and 0 <= d <= 9
            sec = sec * 10 + d
        c = b[i + 10]
        if ok and (c < 48 or c > 57) and c != 101 and c != 69:
            if c != 46:
                return True, sec * 1000, i + 10
            if i + 14 <= n:
                d1 = np.int64(b[i + 11]) - 48
                d2 = np.int64(b[i + 12]) - 48
                d3 = np.int64(b[i + 13]) - 48
                c = b[i + 14] if i + 14 < n else 0
                if 0 <= d1 <= 9 and 0 <= d2 <= 9 and 0 <= d3 <= 9 and (c < 48 or c > 57) and c != 101 and c != 69:
                    return True, sec * 1000 + d1 * 100 + d2 * 10 + d3, i + 14
    return _parse_ts_general(b, i, n)


@njit(cache=True)
def _parse_ts_general(b, i, n):  # type: ignore[no-untyped-def]
    neg = False
    if i < n and b[i] == 45:
        neg = True
        i += 1
    sec = 0
    nd = 0
    while i < n and 48 <= b[i] <= 57:
        sec = sec * 10 + (b[i] - 48)
        nd += 1
        i += 1
    if nd == 0 or nd > 15:
        return False, 0, i
    ms = 0
    if i < n and b[i] == 46:
        i += 1
        fd = 0
        while i < n and 48 <= b[i] <= 57:
            d = b[i] - 48
            if fd < 3:
                ms = ms * 10 + d
            elif d != 0:
                return False, 0, i
            fd += 1
            i += 1
        if fd == 0:
            return False, 0, i
        while fd < 3:
            ms *= 10
            fd += 1
    if i < n and (b[i] == 101 or b[i] == 69):
        return False, 0, i
    t = sec * 1000 + ms
    return True, -t if neg else t, i


# Out-of-line copies for the rarely taken general path (inlining them twice would double
# the compile time of the series parser).
@njit(cache=True)
def _parse_ts_call(b, i, n):  # type: ignore[no-untyped-def]
    return _parse_ts(b, i, n)


@njit(cache=True)
def _parse_float_call(b, s, e, v_out, v_bits, k):  # type: ignore[no-untyped-def]
    return _parse_float(b, s, e, v_out, v_bits, k)



@njit(cache=True)
def _parse_sample_general(b, i, n, t_out, v_out, v_bits, k, fb_idx, fb_s, fb_e, nfb):  # type: ignore[no-untyped-def]
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 91:
        return False, i, nfb
    i = _skip_ws(b, i + 1, n)
    ok, t, i = _parse_ts_call(b, i, n)
    if not ok:
        return False, i, nfb
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 44:
        return False, i, nfb
    i = _skip_ws(b, i + 1, n)
    if i >= n or b[i] != 34:
        return False, i, nfb
    vs = i + 1
    j = vs
    while j < n and b[j] != 34:
        if b[j] == 92:
            return False, j, nfb
        j += 1
    if j >= n:
        return False, j, nfb
    if _parse_float_call(b, vs, j, v_out, v_bits, k) != j:
        fb_idx[nfb] = k
        fb_s[nfb] = vs
        fb_e[nfb] = j
        nfb += 1
        v_out[k] = np.nan
    t_out[k] = t
    i = _skip_ws(b, j + 1, n)
    if i >= n or b[i] != 93:
        return False, i, nfb
    return True, i + 1, nfb


@njit(cache=True, nogil=True)
def _parse_series_list(b, i, n, is_matrix, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canon):  # type: ignore[no-untyped-def]
    """The `result` array of a matrix or vector answer.
    Returns (status, n_series, n_samples, n_fallback, unsorted, end); status 0 ok, 1 use
    the slow path, 2 native histograms (Undecodable); end is the index after the array.
    canon[0] is cleared when a label set is not byte for byte what Prometheus writes."""
    v_bits = v_out.view(np.uint64)
    ns = 0
    k = 0
    nfb = 0
    unsorted = False
    ph = -1  # where the last timestamp whose first 6 digits were parsed starts
    phi = 0  # and their value
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 91:
        return 1, 0, 0, 0, False, i
    i = _skip_ws(b, i + 1, n)
    if i < n and b[i] == 93:
        return 0, 0, 0, 0, False, i + 1
    while True:
        if i >= n or b[i] != 123 or ns >= counts.shape[0]:
            return 1, ns, k, nfb, unsorted, i
        i = _skip_ws(b, i + 1, n)
        ms = -1
        me = -1
        k0 = k
        got = False
        if i < n and b[i] == 125:
            i += 1
        else:
            while True:
                if i >= n or b[i] != 34:
                    return 1, ns, k, nfb, unsorted, i
                ks = i + 1
                i = _skip_string(b, i, n)
                if i < 0:
                    return 1, ns, k, nfb, unsorted, i
                ke = i - 1
                i = _skip_ws(b, i, n)
                if i >= n or b[i] != 58:
                    return 1, ns, k, nfb, unsorted, i
                i = _skip_ws(b, i + 1, n)
                if _key_is(b, ks, ke, _K_METRIC):
                    if ms >= 0:
                        return 1, ns, k, nfb, unsorted, i
                    ms = i
                    i, c = _skip_label_object(b, i, n)
                    if not c:
                        canon[0] = 0
                    if i < 0:
                        return 1, ns, k, nfb, unsorted, i
                    me = i
                elif _key_is(b, ks, ke, _K_VALUES if is_matrix else _K_VALUE):
                    # A matrix's "values":[[t,"v"],...] or a vector's "value":[t,"v"]; one
                    # call site for the (inlined) sample parser keeps compile time down.
                    if got:
                        return 1, ns, k, nfb, unsorted, i
                    got = True
                    more = True
                    if is_matrix:
                        if i >= n or b[i] != 91:
                            return 1, ns, k, nfb, unsorted, i
                        i = _skip_ws(b, i + 1, n)
                        if i < n and b[i] == 93:
                            i += 1
                            more = False
                    while more:
                        if k >= t_out.shape[0]:
                            return 1, ns, k, nfb, unsorted, i
                        # Fast path written out here (Prometheus's compact layout): going
                        # through an inlined wrapper that also holds the general call
                        # made the whole loop about twice as slow.
                        done = False
                        if i + 16 < n and b[i] == 91:
                            # A 10-digit timestamp: its first 6 digits usually repeat
                            # those of the previous sample (independent byte compares
                            # instead of a serial multiply chain).
                            s0 = i + 1
                            if (
                                ph >= 0
                                and b[s0] == b[ph]
                                and b[s0 + 1] == b[ph + 1]
                                and b[s0 + 2] == b[ph + 2]
                                and b[s0 + 3] == b[ph + 3]
                                and b[s0 + 4] == b[ph + 4]
                                and b[s0 + 5] == b[ph + 5]
                            ):
                                hi = phi
                                ok = True
                            else:
                                hi = 0
                                ok = True
                                for x in range(6):
                                    d = np.int64(b[s0 + x]) - 48
                                    ok = ok and 0 <= d <= 9
                                    hi = hi * 10 + d
                                if ok:
                                    ph = s0
                                    phi = hi
                            d1 = np.int64(b[s0 + 6]) - 48
                            d2 = np.int64(b[s0 + 7]) - 48
                            d3 = np.int64(b[s0 + 8]) - 48
                            d4 = np.int64(b[s0 + 9]) - 48
                            c = b[s0 + 10]
                            ok = (
                                ok and 0 <= d1 <= 9 and 0 <= d2 <= 9 and 0 <= d3 <= 9 and 0 <= d4 <= 9
                                and (c < 48 or c > 57) and c != 101 and c != 69
                            )
                            t = (hi * 10000 + d1 * 1000 + d2 * 100 + d3 * 10 + d4) * 1000
                            j = s0 + 10
                            if ok and c == 46:
                                e1 = np.int64(b[s0 + 11]) - 48
                                e2 = np.int64(b[s0 + 12]) - 48
                                e3 = np.int64(b[s0 + 13]) - 48
                                c = b[s0 + 14]
                                ok = (
                                    0 <= e1 <= 9 and 0 <= e2 <= 9 and 0 <= e3 <= 9
                                    and (c < 48 or c > 57) and c != 101 and c != 69
                                )
                                t += e1 * 100 + e2 * 10 + e3
                                j = s0 + 14
                            if ok and b[j] == 44 and b[j + 1] == 34:
                                end = _parse_float(b, j + 2, n, v_out, v_bits, k)
                                if end >= 0 and end + 1 < n and b[end] == 34 and b[end + 1] == 93:
                                    t_out[k] = t
                                    i = end + 2
                                    done = True
                        if not done:
                            ok, i, nfb = _parse_sample_general(
                                b, i, n, t_out, v_out, v_bits, k, fb_idx, fb_s, fb_e, nfb
                            )
                            if not ok:
                                return 1, ns, k, nfb, unsorted, i
                        if k > k0 and t_out[k] <= t_out[k - 1]:
                            unsorted = True
                        k += 1
                        if not is_matrix:
                            break
                        c = b[i] if i < n else 0
                        if c != 44 and c != 93:
                            i = _skip_ws(b, i, n)
                            c = b[i] if i < n else 0
                        if c == 44:
                            i += 1  # the sample parser skips whitespace itself
                            continue
                        if c == 93:
                            i += 1
                            break
                        return 1, ns, k, nfb, unsorted, i
                elif _key_is(b, ks, ke, _K_HISTOGRAM) or _key_is(b, ks, ke, _K_HISTOGRAMS):
                    return 2, ns, k, nfb, unsorted, i
                else:
                    i = _skip_value(b, i, n)
                    if i < 0:
                        return 1, ns, k, nfb, unsorted, i
                i = _skip_ws(b, i, n)
                if i < n and b[i] == 44:
                    i = _skip_ws(b, i + 1, n)
                    continue
                if i < n and b[i] == 125:
                    i += 1
                    break
                return 1, ns, k, nfb, unsorted, i
        if not got and not is_matrix:
            return 1, ns, k, nfb, unsorted, i
        met_s[ns] = ms
        met_e[ns] = me
        counts[ns] = k - k0
        ns += 1
        i = _skip_ws(b, i, n)
        if i < n and b[i] == 44:
            i = _skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 93:
            return 0, ns, k, nfb, unsorted, i + 1
        return 1, ns, k, nfb, unsorted, i


@njit(cache=True, inline='always')
def _put(out, o, lit):  # type: ignore[no-untyped-def]
    for j in range(len(lit)):
        out[o + j] = lit[j]
    return o + len(lit)


@njit(cache=True)
def _put_uint(out, o, x):  # type: ignore[no-untyped-def]
    if x == 0:
        out[o] = 48
        return o + 1
    n = 0
    y = x
    while y > 0:
        y //= 10
        n += 1
    p = o + n - 1
    while x > 0:
        out[p] = 48 + x % 10
        x //= 10
        p -= 1
    return o + n


@njit(cache=True)
def _put_value(out, o, v, tok, p, q, dig):  # type: ignore[no-untyped-def]
    """Write v in Prometheus notation; tok[p:q] is orjson's shortest repr of v (finite v)."""
    if v != v:
        return _put(out, o, _W_NAN)
    if v == np.inf:
        return _put(out, o, _W_PINF)
    if v == -np.inf:
        return _put(out, o, _W_NINF)
    neg = False
    i = p
    if tok[i] == 45:
        neg = True
        i += 1
    nd = 0
    dp = 0
    seen_dot = False
    while i < q and tok[i] != 101 and tok[i] != 69:
        c = tok[i]
        if c == 46:
            seen_dot = True
        elif nd == 0 and c == 48:
            if seen_dot:
                dp -= 1
        else:
            dig[nd] = c
            nd += 1
            if not seen_dot:
                dp += 1
        i += 1
    if i < q:  # exponent
        i += 1
        eneg = False
        if tok[i] == 45 or tok[i] == 43:
            eneg = tok[i] == 45
            i += 1
        ev = 0
        while i < q:
            ev = ev * 10 + (tok[i] - 48)
            i += 1
        dp += -ev if eneg else ev
    while nd > 0 and dig[nd - 1] == 48:
        nd -= 1
    if neg:
        out[o] = 45
        o += 1
    if nd == 0:
        out[o] = 48
        return o + 1
    a = abs(v)
    if a < 1e-6 or a >= 1e21:
        out[o] = dig[0]
        o += 1
        if nd > 1:
            out[o] = 46
            o += 1
            for j in range(1, nd):
                out[o] = dig[j]
                o += 1
        out[o] = 101
        x = dp - 1
        if x < 0:
            out[o + 1] = 45
            x = -x
        else:
            out[o + 1] = 43
        o += 2
        if x < 10:
            out[o] = 48
            o += 1
        return _put_uint(out, o, x)
    if dp <= 0:
        out[o] = 48
        out[o + 1] = 46
        o += 2
        for _ in range(-dp):
            out[o] = 48
            o += 1
        for j in range(nd):
            out[o] = dig[j]
            o += 1
        return o
    if dp >= nd:
        for j in range(nd):
            out[o] = dig[j]
            o += 1
        for _ in range(dp - nd):
            out[o] = 48
            o += 1
        return o
    for j in range(dp):
        out[o] = dig[j]
        o += 1
    out[o] = 46
    o += 1
    for j in range(dp, nd):
        out[o] = dig[j]
        o += 1
    return o


@njit(cache=True, inline='always')
def _put_small(out, o, x):  # type: ignore[no-untyped-def]
    """0 <= x < 10000 without leading zeros."""
    if x < 10:
        out[o] = 48 + x
        return o + 1
    skip = 2 if x < 100 else (1 if x < 1000 else 0)
    for j in range(skip, 4):
        out[o] = _D4[x, j]
        o += 1
    return o


@njit(cache=True, nogil=True)
def _non_integral(v):  # type: ignore[no-untyped-def]
    """The values the encoder does not write itself (its predicate exactly), in order, for
    orjson to format; NaN and infinities become 0.0 placeholders (orjson would write null;
    the encoder writes them itself)."""
    out = np.empty(len(v), dtype=np.float64)
    n = 0
    for k in range(len(v)):
        x = v[k]
        if abs(x) < 9007199254740992.0 and np.floor(x) == x:
            continue
        out[n] = x if np.isfinite(x) else 0.0
        n += 1
    return out[:n]


@njit(cache=True, nogil=True)
def _encode_series_block(out, o, lab_buf, lab_s, lab_e, offsets, s0, s1, t_ms, v, tok, is_matrix):  # type: ignore[no-untyped-def]
    """Series s0..s1-1 as Prometheus result elements joined by ','. Integral values
    (|v| < 2**53) are written here; tok is orjson's dump of the other values of
    v[offsets[s0]:offsets[s1]], in order, non-finite ones replaced by 0. Returns the end."""
    dig = np.empty(40, dtype=np.uint8)
    hi_dig = np.empty(24, dtype=np.uint8)
    hi_len = 0
    hi_val = -1
    p = 1  # after '['
    for s in range(s0, s1):
        if s > s0:
            out[o] = 44
            o += 1
        o = _put(out, o, _W_METRIC)
        for j in range(lab_s[s], lab_e[s]):
            out[o] = lab_buf[j]
            o += 1
        o = _put(out, o, _W_VALUES if is_matrix else _W_VALUE)
        for k in range(offsets[s], offsets[s + 1]):
            if k > offsets[s]:
                out[o] = 44
                o += 1
            out[o] = 91
            o += 1
            # Timestamp: the digits above the last four repeat from sample to sample.
            t = t_ms[k]
            if t < 0:
                out[o] = 45
                o += 1
                t = -t
            sec = t // 1000
            frac = t - sec * 1000
            hi = sec // 10000
            lo = sec - hi * 10000
            if hi > 0:
                if hi != hi_val:
                    hi_val = hi
                    hi_len = _put_uint(hi_dig, 0, hi)
                for j in range(hi_len):
                    out[o + j] = hi_dig[j]
                o += hi_len
                for j in range(4):
                    out[o + j] = _D4[lo, j]
                o += 4
            else:
                o = _put_small(out, o, lo)
            if frac != 0:
                out[o] = 46
                out[o + 1] = _D4[frac, 1]
                out[o + 2] = _D4[frac, 2]
                out[o + 3] = _D4[frac, 3]
                o += 4
            out[o] = 44
            out[o + 1] = 34
            o += 2
            x = v[k]
            a = abs(x)
            if a < 9007199254740992.0 and np.floor(x) == x:
                if x < 0 or (x == 0 and math.copysign(1.0, x) < 0):
                    out[o] = 45
                    o += 1
                ia = np.int64(a)
                if ia < 10000:
                    o = _put_small(out, o, ia)
                else:
                    o = _put_uint(out, o, ia)
            else:
                # Copy orjson's token while looking for its end (one pass); its
                # positional form is Go's, but for a trailing ".0"; rewrite the others.
                q = p
                o0 = o
                has_e = False
                c = tok[q]
                while c != 44 and c != 93:
                    out[o] = c
                    o += 1
                    has_e = has_e or c == 101
                    q += 1
                    c = tok[q]
                if x != x or a == np.inf or has_e:
                    o = _put_value(out, o0, x, tok, p, q, dig)
                elif q - p >= 2 and tok[q - 1] == 48 and tok[q - 2] == 46:
                    o -= 2
                p = q + 1
            out[o] = 34
            out[o + 1] = 93
            o += 2
        if is_matrix:
            out[o] = 93
            o += 1
        out[o] = 125
        o += 1
    return o


@njit(cache=True)
def _array_element_spans(b, starts, ends):  # type: ignore[no-untyped-def]
    """Spans of the elements of the JSON array b (as orjson writes it: no whitespace)."""
    n = len(b)
    i = 1
    k = 0
    if n < 2 or b[1] == 93:
        return 0
    while i < n:
        j = _skip_value(b, i, n)
        if j < 0 or k >= starts.shape[0]:
            return -1
        starts[k] = i
        ends[k] = j
        k += 1
        if j >= n or b[j] != 44:
            break
        i = j + 1
    return k


# --------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------


class _SlowPath(Exception):
    pass


def decode_prometheus_json(body: bytes) -> QueryResult:
    """A successful /api/v1/query or /api/v1/query_range answer -> QueryResult.

    Raises Undecodable for native histograms, MalformedAnswer for anything that is not a
    successful query answer."""
    try:
        return _decode_fast(body)
    except _SlowPath:
        return _decode_slow(body)


_K_DATA = _lit(b"data")
_K_RESULT = _lit(b"result")
_K_NONE = _lit(b"")


def _collect(body: bytes, rows: Any, k: int, into: dict[bytes, tuple[int, int]]) -> None:
    for ks, ke, vs, ve in rows[:k].tolist():
        key = body[ks:ke]
        if key in into or b"\\" in key:
            raise _SlowPath
        into[key] = (vs, ve)


def _str_list(body: bytes, span: tuple[int, int] | None, what: str) -> list[str]:
    if span is None:
        return []
    val = orjson.loads(body[span[0] : span[1]])
    if val is None:
        return []
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise MalformedAnswer(f"{what} is not a list of strings")
    return val


class _LabelSets:
    """Label JSON -> the dict decoded from it, shared between results (label dicts are
    never mutated). Bounded: cleared when it grows past `limit` entries or `max_bytes` of
    label JSON (a dict and its strings take about 3x its JSON: 8 MiB of JSON is ~30 MiB
    held for the life of the process; 500,000 entries alone allowed ~1 GiB)."""

    def __init__(self, limit: int = 500_000, max_bytes: int = 8 << 20) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self.map: dict[bytes, dict[str, str]] = {}

    def lookup(self, spans: list[bytes]) -> list[dict[str, str]]:
        get = self.map.get
        out: list[Any] = [get(k) for k in spans]
        missing = [i for i, d in enumerate(out) if d is None]
        if missing:
            try:
                parsed = orjson.loads(b"[" + b",".join([spans[i] for i in missing]) + b"]")
            except orjson.JSONDecodeError as exc:  # e.g. invalid UTF-8
                raise _SlowPath from exc
            adding = sum(len(spans[i]) for i in missing)
            if len(self.map) + len(missing) > self.limit or self.bytes + adding > self.max_bytes:
                self.map.clear()
                self.bytes = 0
            for i, d in zip(missing, parsed):
                out[i] = d
                self.map[spans[i]] = d
            self.bytes += adding
        return out


_LABEL_CACHE = _LabelSets()


_DECODE_SCRATCH = threading.local()


def _decode_scratch(cap_series: int, cap_samples: int) -> tuple[tuple[Any, ...], bool]:
    """Output arrays of the series scanner (met_s, met_e, counts, t, v, fb_idx, fb_s, fb_e),
    and whether they are the thread's kept scratch (to be copied out of) rather than fresh
    arrays for this answer alone (whose t and v are shrunk in place and handed over)."""
    have = getattr(_DECODE_SCRATCH, "arrays", None)
    if have is not None and len(have[0]) >= cap_series and len(have[3]) >= cap_samples:
        return have, True
    cs, cv = max(cap_series, 1 << 12), max(cap_samples, 1 << 16)
    arrays = (
        np.empty(cs, dtype=np.int64),
        np.empty(cs, dtype=np.int64),
        np.empty(cs, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.float64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
    )
    if cap_samples <= _DECODE_SCRATCH_MAX:
        _DECODE_SCRATCH.arrays = arrays
        return arrays, True
    return arrays, False


# Samples: answers up to ~1.8 MB of JSON decode into the thread's kept scratch (fresh pages
# would cost as much as parsing such a small answer) and are copied out at their exact size.
# Larger answers get arrays of their own, shrunk in place to their exact size (realloc, no
# copy): no second copy of a big answer at the decode's peak, and no big scratch kept
# resident for the life of the process (the kept scratch is at most 4 MB touched).
_DECODE_SCRATCH_MAX = 1 << 18


def _decode_fast(body: bytes) -> QueryResult:
    buf = np.frombuffer(body, dtype=np.uint8)
    n = len(buf)
    rows = np.empty((64, 4), dtype=np.int64)
    top: dict[bytes, tuple[int, int]] = {}
    dm: dict[bytes, tuple[int, int]] = {}
    st, k, pos = _scan_members(buf, 0, n, True, _K_DATA, rows)
    if st != 1:
        raise _SlowPath
    _collect(body, rows, k - 1, top)
    data_start = pos
    st, k, pos = _scan_members(buf, data_start, n, True, _K_RESULT, rows)
    if st != 1:
        raise _SlowPath
    _collect(body, rows, k - 1, dm)
    rt_span = dm.get(b"resultType")
    if rt_span is None:
        raise _SlowPath  # resultType after result: not Prometheus's layout
    rtype = body[rt_span[0] : rt_span[1]].strip(b'"').decode("ascii", "replace")
    res_start = pos
    parsed = None
    if rtype in ("matrix", "vector"):
        # Upper bounds (a sample takes >= 7 bytes, a series >= 25); untouched pages of
        # these allocations are never mapped in.
        cap_series = (n - res_start) // 12 + 2
        cap_samples = (n - res_start) // 7 + 2
        # Per-thread scratch, kept between answers (fresh pages cost as much as parsing);
        # the results are copied out at their exact size.
        scratch, kept = _decode_scratch(cap_series, cap_samples)
        met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e = scratch
        del scratch
        canon = np.ones(1, dtype=np.uint8)
        code, ns, nk, nfb, unsorted, res_end = _parse_series_list(
            buf, res_start, n, rtype == "matrix", met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canon
        )
        if code == 2:
            raise Undecodable("native histograms are not decoded")
        if code != 0 or unsorted:
            raise _SlowPath
        parsed = (ns, nk, nfb, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, bool(canon[0]), kept)
    elif rtype in ("scalar", "string"):
        res_end = _skip_value(buf, res_start, n)
    else:
        raise MalformedAnswer(f"unknown resultType {rtype!r}")
    if res_end < 0:
        raise _SlowPath
    dm[b"result"] = (res_start, res_end)
    st, k, pos = _scan_members(buf, res_end, n, False, _K_NONE, rows)
    if st != 0:
        raise _SlowPath
    _collect(body, rows, k, dm)
    st, k, pos = _scan_members(buf, pos, n, False, _K_NONE, rows)
    if st != 0:
        raise _SlowPath
    _collect(body, rows, k, top)
    status = top.get(b"status")
    if status is None or body[status[0] : status[1]] != b'"success"':
        raise _SlowPath  # the slow path produces the precise error
    warnings = _str_list(body, top.get(b"warnings"), "warnings")
    infos = _str_list(body, top.get(b"infos"), "infos")
    if parsed is None:
        return _small_result(rtype, orjson.loads(body[res_start:res_end]), warnings, infos)
    ns, nk, nfb, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canonical, kept = parsed
    del parsed
    if kept:
        t = t_out[:nk].copy()
        v = v_out[:nk].copy()
    else:
        # Arrays of this answer alone (nothing else refers to them): shrink in place.
        t_out.resize(nk, refcheck=False)
        v_out.resize(nk, refcheck=False)
        t, v = t_out, v_out
    for k, a, b in zip(fb_idx[:nfb].tolist(), fb_s[:nfb].tolist(), fb_e[:nfb].tolist()):
        v[k] = _py_float(body[a:b])
    # The scanner checked every metric is a flat object of strings: look the label sets
    # up by their JSON (series recur from piece to piece and refresh to refresh), parse
    # the others with one orjson call.
    starts = met_s[:ns].tolist()
    ends = met_e[:ns].tolist()
    spans = [body[a:b] for a, b in zip(starts, ends)]
    if -1 in starts:  # a series without "metric"
        spans = [sp if a >= 0 else b"{}" for sp, a in zip(spans, starts)]
    labels = _LABEL_CACHE.lookup(spans)
    offsets = np.zeros(ns + 1, dtype=np.int64)
    np.cumsum(counts[:ns], out=offsets[1:])
    result = QueryResult(rtype, labels, offsets, t, v, warnings, infos)  # type: ignore[arg-type]
    if canonical:
        # The backend's label JSON is what we would write: keep it for encoding/merging.
        result.set_canonical_keys(spans)
    return result


def _check_labels(labels: list[dict[str, Any]]) -> None:
    for d in labels:
        for val in d.values():
            if type(val) is not str:
                raise MalformedAnswer("label values must be strings")


_GO_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf(?:inity)?|NaN|nan)")


def _py_float(tok: bytes | str) -> float:
    s = tok.decode() if isinstance(tok, bytes) else tok
    if not _GO_FLOAT.fullmatch(s):
        raise MalformedAnswer(f"bad sample value {s!r}")
    return float(s)


def _py_ts(x: Any) -> int:
    if type(x) is int:
        return x * 1000
    if type(x) is float and math.isfinite(x):
        return round(x * 1000)
    raise MalformedAnswer(f"bad timestamp {x!r}")


def _small_result(rtype: str, res: Any, warnings: list[str], infos: list[str]) -> QueryResult:
    if not (isinstance(res, list) and len(res) == 2 and isinstance(res[1], str)):
        raise MalformedAnswer(f"bad {rtype} result")
    t = _py_ts(res[0])
    if rtype == "scalar":
        return QueryResult.scalar(t, _py_float(res[1]), warnings=warnings, infos=infos)
    return QueryResult.string(t, res[1], warnings=warnings, infos=infos)


def _decode_slow(body: bytes) -> QueryResult:
    """Exact decoding through orjson; the collector is kept out of the way while the
    sample lists exist."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedAnswer(f"answer is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise MalformedAnswer("not a successful Prometheus answer")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise MalformedAnswer("answer has no data")
        rtype = data.get("resultType")
        res = data.get("result")
        warnings = doc.get("warnings") or []
        infos = doc.get("infos") or []
        if not all(isinstance(w, str) for w in [*warnings, *infos]):
            raise MalformedAnswer("warnings/infos must be strings")
        if rtype in ("scalar", "string"):
            return _small_result(rtype, res, list(warnings), list(infos))
        if rtype not in ("matrix", "vector") or not isinstance(res, list):
            raise MalformedAnswer(f"bad resultType {rtype!r}")
        labels: list[dict[str, str]] = []
        ts: list[int] = []
        vs: list[float] = []
        counts: list[int] = []
        key = "values" if rtype == "matrix" else "value"
        for el in res:
            if not isinstance(el, dict):
                raise MalformedAnswer("result element is not an object")
            if "histogram" in el or "histograms" in el:
                raise Undecodable("native histograms are not decoded")
            metric = el.get("metric", {})
            if not isinstance(metric, dict):
                raise MalformedAnswer("metric is not an object")
            if key not in el:
                if rtype == "vector":
                    raise MalformedAnswer("vector element without value")
                pts: list[Any] = []
            else:
                pts = el[key] if rtype == "matrix" else [el[key]]
            if not isinstance(pts, list):
                raise MalformedAnswer("bad samples")
            for p in pts:
                if not (isinstance(p, list) and len(p) == 2 and isinstance(p[1], str)):
                    raise MalformedAnswer("bad sample")
                ts.append(_py_ts(p[0]))
                vs.append(_py_float(p[1]))
            labels.append(metric)
            counts.append(len(pts))
        _check_labels(labels)  # type: ignore[arg-type]
    finally:
        if was_enabled:
            gc.enable()
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    t = np.array(ts, dtype=np.int64)
    v = np.array(vs, dtype=np.float64)
    # Per series, samples in time order; a repeated timestamp is a broken answer.
    series = np.repeat(np.arange(len(labels)), counts)
    order = np.lexsort((t, series))
    t, v = t[order], v[order]
    if len(t) > 1:
        same = (np.diff(t) == 0) & (np.diff(series) == 0)
        if same.any():
            raise MalformedAnswer("a series has two samples at the same timestamp")
    return QueryResult(rtype, labels, offsets, t, v, list(warnings), list(infos))


# --------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------

_STREAM_BATCH_SAMPLES = 16_384  # ~0.4 MB chunks: bounded memory, no CPU cost measured


def encode_prometheus_json(result: QueryResult) -> bytes:
    """The whole answer as Prometheus 2.42 writes it."""
    return b"".join(iter_prometheus_json(result, None))


def iter_prometheus_json(
    result: QueryResult, batch_samples: int | None = _STREAM_BATCH_SAMPLES
) -> Iterator[bytes]:
    """The same bytes as `encode_prometheus_json`, in chunks of about `batch_samples`
    samples (whole series per chunk; None: one chunk), for streaming large answers."""
    head, tail = _head_tail(result)
    if result.result_type in ("scalar", "string"):
        yield head + _small_body(result) + tail
    elif result.n_series == 0:
        yield head + tail
    else:
        yield from _iter_blocks(result, batch_samples, head, tail)


def _head_tail(result: QueryResult) -> tuple[bytes, bytes]:
    head = b'{"status":"success","data":{"resultType":"' + result.result_type.encode() + b'","result":'
    tail = b"}"
    if result.warnings:
        tail += b',"warnings":' + _go_str_list(result.warnings)
    if result.infos:
        tail += b',"infos":' + _go_str_list(result.infos)
    tail += b"}"
    if result.result_type in ("matrix", "vector"):
        return head + b"[", b"]" + tail
    return head, tail


def _go_str_list(items: list[str]) -> bytes:
    return ("[" + ",".join(go_json_string(s) for s in items) + "]").encode()


def _small_body(result: QueryResult) -> bytes:
    t = format_timestamp(int(result.t_ms[0]))
    if result.result_type == "string":
        return f"[{t},{go_json_string(result.string_value or '')}]".encode()
    return f'[{t},"{format_value(float(result.value[0]))}"]'.encode()


_SCRATCH = threading.local()
_SCRATCH_MAX = 64 << 20


def _scratch(size: int) -> npt.NDArray[np.uint8]:
    """A per-thread output buffer, kept between answers: writing tens of megabytes into
    fresh memory costs about as much in page faults as formatting them. Its content is
    copied out (tobytes) before any caller code runs, so interleaved streams are safe."""
    buf: npt.NDArray[np.uint8] | None = getattr(_SCRATCH, "buf", None)
    if buf is not None and len(buf) >= size:
        return buf
    buf = np.empty(max(size, 1 << 20), dtype=np.uint8)
    if size <= _SCRATCH_MAX:
        _SCRATCH.buf = buf
    return buf


def _iter_blocks(result: QueryResult, batch_samples: int | None, head: bytes, tail: bytes) -> Iterator[bytes]:
    n = result.n_series
    raw, lab_s, lab_e = result.label_block()
    lab_buf = np.frombuffer(raw, dtype=np.uint8)
    offsets = result.offsets
    t = np.ascontiguousarray(result.t_ms, dtype=np.int64)
    v = np.ascontiguousarray(result.value, dtype=np.float64)
    is_matrix = result.result_type == "matrix"
    # Batch boundaries on whole series.
    if batch_samples is None:
        bounds = [0, n]
    else:
        targets = np.arange(batch_samples, int(offsets[-1]), batch_samples)
        cut = np.searchsorted(offsets, targets, side="left")
        bounds = sorted({0, n, *[int(c) for c in cut if 0 < c < n]})
    for bi in range(len(bounds) - 1):
        s0, s1 = bounds[bi], bounds[bi + 1]
        a, b = int(offsets[s0]), int(offsets[s1])
        vb = v[a:b]
        # The kernel writes integral values itself; orjson gives the shortest digits of
        # the others (the same predicate as the kernel's, or the tokens go out of step).
        other = _non_integral(vb)
        tok = np.frombuffer(orjson.dumps(other, option=orjson.OPT_SERIALIZE_NUMPY), dtype=np.uint8)
        prefix = head if bi == 0 else b","
        suffix = tail if bi == len(bounds) - 2 else b""
        nbytes = int((lab_e[s0:s1] - lab_s[s0:s1]).sum()) + (s1 - s0) * 24 + (b - a) * 60
        out = _scratch(len(prefix) + nbytes + len(suffix))
        out[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        end = _encode_series_block(
            out, len(prefix), lab_buf, lab_s, lab_e, offsets, s0, s1, t, v, tok, is_matrix
        )
        out[end : end + len(suffix)] = np.frombuffer(suffix, dtype=np.uint8)
        yield out[: end + len(suffix)].tobytes()

