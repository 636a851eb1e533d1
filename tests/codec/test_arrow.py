"""QueryResult <-> Arrow (proxy/codec/arrow.py), in process: the cache's IPC payloads round
trip exactly, their label lists are packed and unpacked once, bad payloads are malformed, and
the public Arrow stream's schema."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from proxy.codec import arrow
from proxy.codec.arrow import encode_arrow_stream
from proxy.codec.errors import MalformedAnswer
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json
from proxy.result import QueryResult
from proxy.result.labels import labels_json
from tests.codec.reference import GOLDEN, ref_encode, same_floats


def _sample_result() -> QueryResult:
    return QueryResult.from_series(
        "matrix",
        [({"__name__": "up", "Hostname": "n1"}, [1000, 2000], [1.0, math.nan]),
         ({"__name__": "up", "Hostname": "n2"}, [1000], [-math.inf])],
        warnings=["w"],
    )


@pytest.mark.parametrize("compression", ["zstd", "lz4", None])
def test_ipc_round_trip(compression: Any) -> None:
    r = _sample_result()
    back = arrow.from_ipc_bytes(arrow.to_ipc_bytes(r, compression))
    assert back.labels == r.labels and back.warnings == ["w"] and back.result_type == "matrix"
    assert np.array_equal(back.offsets, r.offsets) and np.array_equal(back.t_ms, r.t_ms)
    assert same_floats(back.value, r.value)


def test_cached_labels_are_not_formatted_again() -> None:
    d = {"__name__": "up", "a": "<x> \"y\" \u2028", "Z": "é"}
    r = QueryResult.from_series("matrix", [(d, [1000], [1.0]), ({}, [1000], [2.0])])
    back = arrow.from_ipc_bytes(arrow.to_ipc_bytes(r))
    assert back._label_block is not None and back.labels == r.labels
    assert back.canonical_keys() == [labels_json(d), b"{}"]
    assert encode_prometheus_json(back) == encode_prometheus_json(r) == ref_encode("matrix", r.to_pylist())
    # A table written without the canonical marker (an older cache entry) still decodes.
    t = arrow.to_table(r)
    meta = {k: v for k, v in t.schema.metadata.items() if k != b"promaccel.labels_canonical"}
    old = arrow.from_table(t.replace_schema_metadata(meta))
    assert old._label_block is None and encode_prometheus_json(old) == encode_prometheus_json(r)


def _fleet_hour(n_series: int = 256, pod: str = "p") -> QueryResult:
    series = []
    for i in range(n_series):
        labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": f"gpu-node-{i // 8:04d}", "gpu": str(i % 8),
                  "UUID": f"GPU-{i:08x}-16cf-fc95-3621", "modelName": "NVIDIA H100 80GB HBM3", "pod": f"{pod}-{i}"}
        series.append((labels, [0, 30_000, 60_000], [float(i), float(i) + 0.5, 100.0]))
    return QueryResult.from_series("matrix", series)


def test_cached_label_lists_are_packed_and_unpacked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _fleet_hour()
    payload = arrow.to_ipc_bytes(r, "lz4")
    meta = pa.ipc.open_stream(payload).read_all().schema.metadata
    assert b"promaccel.labels" not in meta and int(meta[b"promaccel.labels_size"]) > 30_000
    plain = b"[" + b",".join(r.canonical_keys()) + b"]"
    assert len(meta[b"promaccel.labels_zstd"]) * 5 < len(plain)  # arrow's compression skips metadata
    assert len(payload) * 3 < len(plain)
    unpacked = []
    real = arrow._PACKED.unpack
    monkeypatch.setattr(arrow._PACKED, "unpack", lambda p, n: unpacked.append(1) or real(p, n))
    monkeypatch.setattr(arrow, "_LABEL_LISTS", arrow._LabelLists())
    for _ in range(3):  # the hour cells of one day: the same list, unpacked and parsed once
        back = arrow.from_ipc_bytes(payload)
        assert back.labels == r.labels and back.canonical_keys() == r.canonical_keys()
        assert np.array_equal(back.t_ms, r.t_ms) and np.array_equal(back.value, r.value)
        assert encode_prometheus_json(back) == encode_prometheus_json(r)
    assert unpacked == [1]
    other = _fleet_hour(pod="q")  # another list: unpacked too
    assert arrow.from_ipc_bytes(arrow.to_ipc_bytes(other, "zstd")).labels == other.labels
    assert unpacked == [1, 1]
    # A short list stays plain JSON.
    small = _sample_result()
    small_meta = pa.ipc.open_stream(arrow.to_ipc_bytes(small)).read_all().schema.metadata
    assert b"promaccel.labels_zstd" not in small_meta and small_meta[b"promaccel.labels"].startswith(b"[")


@pytest.mark.parametrize("size", [b"", b"x", b"0", b"-5", str(1 << 31).encode(), b"12", b"1000000", str(900 << 20).encode()])
def test_a_packed_label_list_of_a_wrong_size_is_malformed(size: bytes) -> None:
    t = arrow.to_table(_fleet_hour(pod=f"size{size!r}"), pack_labels=True)
    meta = dict(t.schema.metadata)
    meta[b"promaccel.labels_size"] = size
    sink = pa.BufferOutputStream()
    bad = t.replace_schema_metadata(meta)
    with pa.ipc.new_stream(sink, bad.schema) as w:
        w.write_table(bad)
    with pytest.raises(MalformedAnswer):
        arrow.from_ipc_bytes(sink.getvalue().to_pybytes())


def test_arrow_table_schema() -> None:
    t = arrow.to_table(_sample_result())
    assert t.schema.names == ["series", "t_ms", "value"]
    assert t.column("series").to_pylist() == [0, 0, 1]
    assert t.schema.metadata[b"promaccel.result_type"] == b"matrix"
    with pytest.raises(MalformedAnswer):
        arrow.from_ipc_bytes(b"garbage")


def test_scalar_and_string_through_ipc() -> None:
    for body in (GOLDEN[12], GOLDEN[14]):
        r = decode_prometheus_json(body)
        assert encode_prometheus_json(arrow.from_ipc_bytes(arrow.to_ipc_bytes(r))) == body


def test_public_arrow_stream() -> None:
    r = _sample_result()
    table = pa.ipc.open_stream(encode_arrow_stream(r)).read_all()
    assert table.schema.names == ["series", "timestamp", "value", "labels"]
    assert table.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    assert table.column("labels").to_pylist()[2] == [("Hostname", "n2"), ("__name__", "up")]
    assert table.schema.field("labels").type == pa.dictionary(pa.int32(), pa.map_(pa.utf8(), pa.utf8()))
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [1000, 2000, 1000]
    assert table.schema.metadata[b"promaccel.warnings"] == b'["w"]'


def test_cached_label_lists_keep_no_large_json() -> None:
    """An hour cell's label list is split once and remembered as the shared keys; its JSON
    (~1 MB an hour for 2,048 GPUs) is not kept."""
    lists = arrow._LabelLists()
    big = _fleet_hour(600, pod="big-list")
    payload = arrow.to_ipc_bytes(big, "lz4")
    table = pa.ipc.open_stream(payload).read_all()
    stored = table.schema.metadata[b"promaccel.labels_zstd"]
    raw = arrow._PACKED.unpack(stored, table.schema.metadata[b"promaccel.labels_size"])
    assert len(raw) > arrow.KEEP_LABEL_BLOCK_BYTES
    keys, block = arrow._canonical_label_list(raw, stored, 1 << 20)
    lists.put(stored, keys, block)
    got = lists.get(stored)
    assert got is not None and got[1] is None and got[0] == big.canonical_keys()
    small = _fleet_hour(4, pod="small-list")
    t2 = arrow.to_table(small)
    s_raw = t2.schema.metadata[b"promaccel.labels"]
    s_keys, s_block = arrow._canonical_label_list(s_raw, s_raw, 1 << 20)
    lists.put(s_raw, s_keys, s_block)
    hit = lists.get(s_raw)
    assert hit is not None and hit[1] is not None and hit[1][0] == s_raw
