"""QueryResult -> Prometheus JSON (proxy/codec/json_encode.py), in process: values written
as Prometheus 2.42 writes them (strconv.FormatFloat 'f'/'e' with the shortest digits, as the
reference encoder in tests/codec/reference.py), warnings and infos, streaming in chunks."""

from __future__ import annotations

import math

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec import json_encode
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.result import QueryResult
from tests.codec.reference import any_float, ref_encode, ref_value, same_floats


def test_warnings_and_infos_follow_data() -> None:
    r = QueryResult.from_series("vector", [({"a": "b"}, [1000], [1.0])], warnings=["w <1>"], infos=["i"])
    body = encode_prometheus_json(r)
    assert body.endswith(b'}]},"warnings":["w \\u003c1\\u003e"],"infos":["i"]}')
    back = decode_prometheus_json(body)
    assert back.warnings == ["w <1>"] and back.infos == ["i"]
    assert body == ref_encode("vector", r.to_pylist(), ["w <1>"], ["i"])


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------

SPECIAL = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 1e-6, float(np.nextafter(1e-6, 0)), 1e-5, 1e-4, 1.5e-5,
    1e15, 1e16, 1e17, 1.2345678901234568e16, 9999999999999998.0, 1e20, 1e21, 9.999999999999999e20,
    123456789.12345679, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
    2**53, 2**53 + 2, 2**63, 1700000000.123, 0.30000000000000004, 100.0, 1e-300,
    math.nan, math.inf, -math.inf,
]
SPECIAL = [float(x) for x in SPECIAL]


def _encode_values(vals: list[float]) -> list[str]:
    r = QueryResult.from_series(
        "matrix", [({"a": "b"}, list(range(1000, 1000 * (len(vals) + 1), 1000)), vals)]
    )
    doc = orjson.loads(encode_prometheus_json(r))
    return [p[1] for p in doc["data"]["result"][0]["values"]]


def test_format_special_values() -> None:
    got = _encode_values(SPECIAL)
    assert got == [ref_value(v) for v in SPECIAL]
    assert [json_encode.format_value(v) for v in SPECIAL] == got
    assert got[:8] == ["0", "-0", "1", "-1", "0.1", "0.3333333333333333", "0.000001", "9.999999999999997e-07"]


@settings(max_examples=300, deadline=None)
@given(st.lists(any_float, min_size=1, max_size=60))
def test_value_format_matches_reference(vals: list[float]) -> None:
    got = _encode_values(vals)
    assert got == [ref_value(v) for v in vals]
    # and decoding what we wrote gives back the very same bits
    body = ref_encode("matrix", [({}, list(range(len(vals))), vals)])
    assert same_floats(decode_prometheus_json(body).value, vals)


def test_many_random_floats_round_trip() -> None:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**63, size=50_000, dtype=np.uint64) | (
        rng.integers(0, 2, size=50_000, dtype=np.uint64) << np.uint64(63)
    )
    vals = bits.view(np.float64)
    vals = vals[np.isfinite(vals)]
    decimals = np.round(rng.random(20_000) * 10.0 ** rng.integers(-8, 22, 20_000), 3)
    vals = np.concatenate([vals, decimals, rng.random(20_000) * 1000])
    r = QueryResult.from_series("matrix", [({}, list(range(len(vals))), vals.tolist())])
    body = encode_prometheus_json(r)
    assert body == ref_encode("matrix", r.to_pylist())
    assert same_floats(decode_prometheus_json(body).value, vals)


def test_stream_chunks_bound_memory() -> None:
    series = [({"i": str(i)}, list(range(0, 40_000, 1000)), [0.5] * 40) for i in range(2000)]
    r = QueryResult.from_series("matrix", series)
    chunks = list(iter_prometheus_json(r))
    assert b"".join(chunks) == encode_prometheus_json(r)
    assert len(chunks) >= 4 and max(map(len, chunks)) < 2 * json_encode._STREAM_BATCH_SAMPLES * 40


def test_large_answer_streams_in_chunks() -> None:
    rng = np.random.default_rng(3)
    series = [({"__name__": "m", "i": str(i)}, list(range(0, 100_000, 1000)), rng.random(100).tolist())
              for i in range(50)]
    r = QueryResult.from_series("matrix", series)
    chunks = list(iter_prometheus_json(r, batch_samples=1000))
    assert len(chunks) > 3
    assert b"".join(chunks) == encode_prometheus_json(r) == ref_encode("matrix", series)
