"""What a cached payload may decode to, checked before anything is decompressed (issue 26).

A payload is an Arrow IPC stream (proxy/codec/arrow.py): a schema message, then record
batches whose buffers are zstd or lz4 compressed, each prefixed with its decompressed size.
Arrow allocates that size before it inflates, so a forged 26 KB value declaring 40 M rows
took a process to 11 GB of RSS. `check_payload` walks the stream's message headers (the
flatbuffers, read here with `struct`: no pyarrow, nothing inflated, microseconds a batch) and
refuses, as a `CorruptValue` (a miss, deleted), a payload that

- declares more rows than `PayloadLimits.max_rows` (`cache.max_piece_samples`), or, for a
  range piece, more than the key's grid points times the series its label list can hold
  (a range answer has at most one sample per step and series; a label set is at least
  `{},`, so a list of L bytes holds at most (L-1)/3 of them);
- declares a label list over `PayloadLimits.max_label_bytes` (`cache.max_piece_label_bytes`);
- declares a buffer that inflates to more than 8 bytes a row (the widest column), or lies
  outside its message body;
- is not a well-formed stream of one schema and record batches (no dictionaries: the
  payload's schema has none).

The HMAC of the frame (frame.py) already keeps foreign values out; this bound holds even
against someone who has the key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .frame import CorruptValue
from .keys import CacheKey, Payload

__all__ = ["PayloadLimits", "check_payload"]

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")
_U8 = struct.Struct("<B")

# Message header types (Arrow's Message.fbs, MessageHeader union).
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3
# Widest value a column of the payload's schema holds (int64 / float64), and Arrow's slack.
_MAX_WIDTH = 8
_BUFFER_SLACK = 64


@dataclass(frozen=True)
class PayloadLimits:
    """max_rows: samples a piece may decode to; max_label_bytes: size of its label list."""

    max_rows: int
    max_label_bytes: int


class _Bad(Exception):
    pass


class _Fb:
    """Bounds-checked reads of one flatbuffer."""

    __slots__ = ("buf", "n")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.n = len(buf)

    def _at(self, fmt: struct.Struct, pos: int) -> int:
        if pos < 0 or pos + fmt.size > self.n:
            raise _Bad("out of bounds")
        value: int = fmt.unpack_from(self.buf, pos)[0]
        return value

    def root(self) -> int:
        return self._deref(0)

    def _deref(self, pos: int) -> int:
        return pos + self._at(_U32, pos)

    def field(self, table: int, index: int) -> int | None:
        """Position of field `index` of the table at `table`, None when absent."""
        vtable = table - self._at(_I32, table)
        vt_len = self._at(_U16, vtable)
        slot = 4 + 2 * index
        if slot + 2 > vt_len:
            return None
        off = self._at(_U16, vtable + slot)
        return table + off if off else None

    def scalar(self, table: int, index: int, fmt: struct.Struct, default: int = 0) -> int:
        pos = self.field(table, index)
        return default if pos is None else self._at(fmt, pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else self._deref(pos)

    def vector(self, table: int, index: int) -> tuple[int, int]:
        """(position of the first element, length) of a vector field; (0, 0) when absent."""
        pos = self.table(table, index)
        if pos is None:
            return 0, 0
        return pos + 4, self._at(_U32, pos)

    def struct_i64(self, start: int, i: int, size: int, member: int) -> int:
        return self._at(_I64, start + i * size + 8 * member)

    def string(self, pos: int) -> memoryview:
        start, length = pos + 4, self._at(_U32, pos)
        if start + length > self.n:
            raise _Bad("out of bounds")
        return self.buf[start : start + length]


def _labels(fb: _Fb, schema: int, limits: PayloadLimits) -> int:
    """Bytes of the label list the schema's metadata declares (unpacked)."""
    start, count = fb.vector(schema, 2)  # custom_metadata: [KeyValue]
    plain = packed_size = None
    for i in range(count):
        kv = fb._deref(start + 4 * i)
        kpos, vpos = fb.table(kv, 0), fb.table(kv, 1)
        if kpos is None or vpos is None:
            continue
        key = bytes(fb.string(kpos))
        if key == b"promaccel.labels":
            plain = len(fb.string(vpos))
        elif key == b"promaccel.labels_size":
            text = bytes(fb.string(vpos))
            if not text.isdigit() or len(text) > 18:
                raise _Bad("bad promaccel.labels_size")
            packed_size = int(text)
    size = packed_size if packed_size is not None else plain
    if size is None:
        raise _Bad("no label list")
    if size > limits.max_label_bytes:
        raise CorruptValue("too_large")
    return size


def _max_rows(key: CacheKey, label_bytes: int, limits: PayloadLimits) -> int:
    span = key.span
    step = span.step_ms
    if step is None or step <= 0:
        return limits.max_rows
    points = (span.end_ms - span.start_ms) // step + 1
    series = max((label_bytes - 1) // 3, 0)
    return min(limits.max_rows, max(points, 0) * series)


def check_payload(key: CacheKey, payload: Payload, limits: PayloadLimits) -> int:
    """The rows `payload` declares, if it may be decoded for `key`; else CorruptValue
    ("too_large": over a bound; "payload": not a stream of the payload's shape)."""
    try:
        return _check(key, memoryview(payload).cast("B"), limits)
    except _Bad:
        raise CorruptValue("payload") from None
    except (struct.error, ValueError, TypeError, OverflowError):
        raise CorruptValue("payload") from None


def _check(key: CacheKey, data: memoryview, limits: PayloadLimits) -> int:
    n = len(data)
    pos = 0
    rows = 0
    max_rows: int | None = None  # known once the schema is read
    while True:
        if pos + 4 > n:
            raise _Bad("truncated stream")
        size = _I32.unpack_from(data, pos)[0]
        pos += 4
        if size == -1:  # continuation marker, then the metadata size
            if pos + 4 > n:
                raise _Bad("truncated stream")
            size = _I32.unpack_from(data, pos)[0]
            pos += 4
        if size == 0:  # end of stream
            if max_rows is None:
                raise _Bad("no schema")
            return rows
        if size < 0 or pos + size > n:
            raise _Bad("bad message size")
        fb = _Fb(data[pos : pos + size])
        pos += size
        msg = fb.root()
        header_type = fb.scalar(msg, 1, _U8)
        header = fb.table(msg, 2)
        body_len = fb.scalar(msg, 3, _I64)
        if header is None or body_len < 0 or pos + body_len > n:
            raise _Bad("bad message")
        body = data[pos : pos + body_len]
        pos += body_len
        if header_type == _SCHEMA:
            if max_rows is not None:
                raise _Bad("a second schema")
            max_rows = _max_rows(key, _labels(fb, header, limits), limits)
        elif header_type == _RECORD_BATCH:
            if max_rows is None:
                raise _Bad("a record batch before the schema")
            batch_rows = fb.scalar(header, 0, _I64)
            if batch_rows < 0:
                raise _Bad("negative length")
            rows += batch_rows
            if rows > max_rows:
                raise CorruptValue("too_large")
            _check_batch(fb, header, body, batch_rows)
        else:  # dictionary batches, tensors: never in a payload
            raise _Bad("unexpected message")


def _check_batch(fb: _Fb, batch: int, body: memoryview, batch_rows: int) -> None:
    nodes, n_nodes = fb.vector(batch, 1)
    for i in range(n_nodes):
        length = fb.struct_i64(nodes, i, 16, 0)
        if length < 0 or length > batch_rows:
            raise _Bad("a column longer than its batch")
    compressed = fb.table(batch, 3) is not None
    buffers, n_buffers = fb.vector(batch, 2)
    most = batch_rows * _MAX_WIDTH + _BUFFER_SLACK
    for i in range(n_buffers):
        offset = fb.struct_i64(buffers, i, 16, 0)
        length = fb.struct_i64(buffers, i, 16, 1)
        if offset < 0 or length < 0 or offset + length > len(body):
            raise _Bad("a buffer outside its body")
        if length > most and not compressed:
            raise CorruptValue("too_large")
        if compressed and length:
            if length < 8:
                raise _Bad("a compressed buffer without its size")
            inflated = _I64.unpack_from(body, offset)[0]
            if inflated == -1:  # stored uncompressed
                if length - 8 > most:
                    raise CorruptValue("too_large")
            elif inflated < 0:
                raise _Bad("negative buffer size")
            elif inflated > most:
                raise CorruptValue("too_large")
