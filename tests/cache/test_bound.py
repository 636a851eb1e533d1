"""proxy/cache/bound.py: `check_payload` reads the rows a stored payload declares from its
Arrow message headers, and refuses (CorruptValue) a payload over its bounds ("too_large") or
not shaped like a payload ("payload") -- before anything is inflated, and without any other
exception whatever the bytes (tests/cache/test_cache_integrity.py covers the 40 M-row value
and the stores; this file the bound itself)."""

from __future__ import annotations

import dataclasses
import random
import struct
import time

import numpy as np
import pyarrow as pa
import pytest

from proxy.cache.bound import PayloadLimits, check_payload
from proxy.cache.frame import CorruptValue
from proxy.cache.keys import CacheKey
from proxy.codec.arrow import to_ipc_bytes
from proxy.result import QueryResult
from shardplanner.plan import Span

STEP = 30_000
POINTS = 10
RANGE = CacheKey(query="up", span=Span.range(0, (POINTS - 1) * STEP, STEP), route=("prometheus",))
INSTANT = dataclasses.replace(RANGE, span=Span.instant(0))
ROOMY = PayloadLimits(max_rows=1 << 30, max_label_bytes=1 << 30)


def labels_json(n: int) -> bytes:
    """The smallest label list of n series: `[{},{},...]` (3 bytes a series, plus the brackets' 1)."""
    return b"[" + b",".join([b"{}"] * n) + b"]"


def forged(rows: int, labels: bytes | None = b"[{}]", *, batches: int = 1, compression: str | None = "zstd",
           extra_meta: dict[bytes, bytes] | None = None, columns: dict[str, pa.Array] | None = None) -> bytes:
    """An Arrow IPC stream shaped like a payload, declaring whatever the test needs."""
    meta = {b"promaccel.version": b"1", b"promaccel.result_type": b"matrix", b"promaccel.labels_canonical": b"1",
            b"promaccel.warnings": b"[]", b"promaccel.infos": b"[]"}
    if labels is not None:
        meta[b"promaccel.labels"] = labels
    meta.update(extra_meta or {})
    cols = columns or {"series": pa.array(np.zeros(rows, np.int32)), "t_ms": pa.array(np.zeros(rows, np.int64)),
                       "value": pa.array(np.zeros(rows))}
    table = pa.table(cols).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table, max_chunksize=max(1, -(-rows // batches)))
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def reason(key: CacheKey, payload: bytes | memoryview, limits: PayloadLimits = ROOMY) -> str:
    with pytest.raises(CorruptValue) as info:
        check_payload(key, payload, limits)
    return info.value.reason


def real(n_series: int, points: int) -> QueryResult:
    return QueryResult.from_series("matrix", [
        ({"__name__": "up", "instance": f"node-{i:04d}:9100", "job": "node"},
         [k * STEP for k in range(points)], [float(i * points + k) for k in range(points)])
        for i in range(n_series)])


@pytest.mark.parametrize("compression", ["zstd", "lz4", None])
def test_what_promaccel_writes_passes_with_its_true_row_count(compression: str | None) -> None:
    # Small label lists are stored plain (promaccel.labels); large ones packed, with their
    # unpacked size declared (promaccel.labels_size); 20,000 samples span several batches.
    shapes = [QueryResult.empty("matrix"), real(1, POINTS), real(2_000, POINTS),
              QueryResult.from_series("vector", [({"a": str(i)}, [0], [1.0]) for i in range(50)])]
    for r in shapes:
        payload = to_ipc_bytes(r, compression)  # type: ignore[arg-type]
        key = INSTANT if r.result_type == "vector" else RANGE
        assert check_payload(key, payload, ROOMY) == r.n_samples
        assert check_payload(key, memoryview(payload), ROOMY) == r.n_samples
    # The tightest limits that still admit the big one: its own samples and label bytes.
    big = real(2_000, POINTS)
    payload = to_ipc_bytes(big, compression)  # type: ignore[arg-type]
    label_bytes = len(b"[" + b",".join(big.canonical_keys()) + b"]")
    assert check_payload(RANGE, payload, PayloadLimits(big.n_samples, label_bytes)) == big.n_samples
    assert reason(RANGE, payload, PayloadLimits(big.n_samples - 1, label_bytes)) == "too_large"
    assert reason(RANGE, payload, PayloadLimits(big.n_samples, label_bytes - 1)) == "too_large"


def test_a_range_piece_holds_at_most_one_sample_per_step_and_series() -> None:
    # 10 grid points, 3 series (`[{},{},{}]`, 10 bytes): 30 samples at most.
    three = labels_json(3)
    assert check_payload(RANGE, forged(30, three), ROOMY) == 30
    assert reason(RANGE, forged(31, three)) == "too_large"
    # The configured cap wins when lower than the grid's bound...
    assert check_payload(RANGE, forged(25, three), PayloadLimits(25, 1 << 20)) == 25
    assert reason(RANGE, forged(26, three), PayloadLimits(25, 1 << 20)) == "too_large"
    # ... and an instant piece has no grid: the cap alone (one series, many rows).
    assert check_payload(INSTANT, forged(1_000), PayloadLimits(1_000, 1 << 20)) == 1_000
    assert reason(INSTANT, forged(1_001), PayloadLimits(1_000, 1 << 20)) == "too_large"
    # A longer grid holds more: 20 points x 1 series.
    longer = dataclasses.replace(RANGE, span=Span.range(0, 19 * STEP, STEP))
    assert check_payload(longer, forged(20), ROOMY) == 20
    assert reason(longer, forged(21)) == "too_large"
    # A label list that holds no series (`[]`) holds no samples.
    assert check_payload(RANGE, forged(0, b"[]"), ROOMY) == 0
    assert reason(RANGE, forged(1, b"[]")) == "too_large"


def test_rows_are_counted_over_all_batches() -> None:
    three = labels_json(3)
    assert check_payload(RANGE, forged(30, three, batches=3), ROOMY) == 30
    # Each batch of 31 rows in 4 is within 30; their sum is not.
    assert reason(RANGE, forged(31, three, batches=4)) == "too_large"


def test_the_label_list_is_bounded_plain_or_packed() -> None:
    labels = labels_json(100)  # 300 bytes
    limits = PayloadLimits(1 << 20, len(labels))
    assert check_payload(INSTANT, forged(5, labels), limits) == 5
    assert reason(INSTANT, forged(5, labels), PayloadLimits(1 << 20, len(labels) - 1)) == "too_large"
    # A packed list declares its unpacked size: that is what is bounded (and what bounds the
    # series), not the packed bytes.
    packed = {b"promaccel.labels_size": b"5000", b"promaccel.labels_zstd": b"\x00" * 8}
    assert check_payload(INSTANT, forged(5, None, extra_meta=packed), PayloadLimits(1 << 20, 5000)) == 5
    assert reason(INSTANT, forged(5, None, extra_meta=packed), PayloadLimits(1 << 20, 4999)) == "too_large"
    # 5000 bytes hold 1666 series of 10 points: 16,660 samples at most.
    assert check_payload(RANGE, forged(16_660, None, extra_meta=packed), ROOMY) == 16_660
    assert reason(RANGE, forged(16_661, None, extra_meta=packed)) == "too_large"


@pytest.mark.parametrize("size", [b"-1", b"12a", b"", b"1e3", b" 12", b"9" * 19, "\u0661".encode()])
def test_a_declared_label_size_that_is_not_a_small_decimal_is_refused(size: bytes) -> None:
    meta = {b"promaccel.labels_size": size}
    assert reason(INSTANT, forged(1, None, extra_meta=meta)) == "payload"


def test_a_payload_without_a_label_list_is_refused() -> None:
    assert reason(INSTANT, forged(1, None)) == "payload"


def test_a_buffer_inflating_past_eight_bytes_a_row_is_refused_before_it_is_inflated() -> None:
    # The widest column of a payload holds 8 bytes a row; a 200-byte value in one row
    # declares a buffer Arrow would allocate whole before inflating it.
    wide = {"blob": pa.array([b"x" * 200], type=pa.binary(200))}
    for compression in ("zstd", "lz4", None):
        assert reason(INSTANT, forged(1, columns=wide, compression=compression)) == "too_large"
    # Eight bytes a row is fine.
    fits = {"blob": pa.array([b"x" * 8] * 3, type=pa.binary(8))}
    assert check_payload(INSTANT, forged(3, columns=fits, compression=None), ROOMY) == 3


def schema_len(stream: bytes) -> int:
    """Bytes of the stream's first message (its schema: continuation, size, metadata; no body)."""
    assert stream[:4] == b"\xff\xff\xff\xff"
    return 8 + struct.unpack_from("<i", stream, 4)[0]


def test_streams_of_another_shape_are_refused() -> None:
    one = forged(3)
    end = b"\xff\xff\xff\xff\x00\x00\x00\x00"
    assert one.endswith(end)
    shapes = {
        "empty": b"",
        "end marker only": end,
        "old-style end marker only": b"\x00\x00\x00\x00",
        "no end marker": one[: -len(end)],
        "a batch before the schema": one[schema_len(one):],
        "two schemas": one[: -len(end)] + one,
        "a dictionary batch": forged(2, columns={"d": pa.array(["a", "b"]).dictionary_encode()}),
        "negative message size": b"\xff\xff\xff\xff" + struct.pack("<i", -5) + b"\x00" * 16,
        "message size past the end": b"\xff\xff\xff\xff" + struct.pack("<i", 1 << 30) + b"\x00" * 16,
        "not arrow": b"HTTP/1.1 200 OK\r\n\r\n{}",
    }
    for name, payload in shapes.items():
        assert reason(INSTANT, payload) == "payload", name


def test_every_truncation_of_a_payload_is_refused() -> None:
    payload = to_ipc_bytes(real(3, POINTS), "zstd")
    assert check_payload(RANGE, payload, ROOMY) == 3 * POINTS
    for n in range(len(payload)):
        assert reason(RANGE, payload[:n]) == "payload", n


def test_random_corruption_is_refused_or_stays_within_the_bound() -> None:
    """Whatever the bytes: CorruptValue or a row count within the key's bound, never another
    exception, never a hang (the walk only moves forward)."""
    rng = random.Random(29)
    bases = [to_ipc_bytes(real(3, POINTS), c) for c in ("zstd", "lz4", None)]
    t0 = time.perf_counter()
    outcomes = {"refused": 0, "accepted": 0}
    for i in range(3_000):
        data = bytearray(bases[i % 3])
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        try:
            rows = check_payload(RANGE, bytes(data), ROOMY)
        except CorruptValue:
            outcomes["refused"] += 1
            continue
        outcomes["accepted"] += 1
        # Accepted: never more than the grid times the series its (possibly altered) label
        # list can hold, and that list lies inside the payload (under 1 KB: stored plain).
        assert 0 <= rows <= POINTS * (len(bases[i % 3]) // 3)
    assert outcomes["refused"] > 0 and outcomes["accepted"] > 0, outcomes
    assert time.perf_counter() - t0 < 10


def test_random_bytes_are_refused_without_another_exception() -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        junk = rng.randbytes(rng.randrange(0, 300))
        if rng.random() < 0.5:  # often a plausible start, to get past the first check
            junk = b"\xff\xff\xff\xff" + struct.pack("<i", rng.randrange(0, 64)) + junk
        try:
            check_payload(INSTANT, junk, ROOMY)
        except CorruptValue as exc:
            assert exc.reason in ("payload", "too_large")
