"""proxy.codec: Prometheus JSON <-> QueryResult <-> Arrow, in process.

The reference encoder here is written straightforwardly from Prometheus's Go code
(util/jsonutil/marshal.go, jsoniter's string escaping); the golden answers were captured
from a real Prometheus 2.42 (`/usr/bin/prometheus`, empty TSDB).
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import json_decode, json_encode
from proxy.codec.arrow import encode_arrow_stream
from proxy.codec.errors import MalformedAnswer, Undecodable
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.result import QueryResult
from proxy.result.labels import labels_json

# --------------------------------------------------------------------------------------
# Reference encoder (slow, obviously right)
# --------------------------------------------------------------------------------------


def ref_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        return repr(v)  # shortest digits, 'e' with a sign and >= 2 exponent digits
    d = Decimal(repr(v))  # shortest round-trip digits
    s = format(d.normalize(), "f")
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return s


def ref_ts(t_ms: int) -> str:
    neg = t_ms < 0
    t = -t_ms if neg else t_ms
    s = str(t // 1000)
    if t % 1000:
        s += "." + str(t % 1000).rjust(3, "0")
    return ("-" if neg else "") + s


def ref_str(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or ch in "<>&" or o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def ref_labels(d: dict[str, str]) -> str:
    keys = sorted(d, key=lambda k: k.encode())
    return "{" + ",".join(f"{ref_str(k)}:{ref_str(d[k])}" for k in keys) + "}"


def ref_encode(
    rtype: str,
    series: list[tuple[dict[str, str], list[int], list[float]]],
    warnings: list[str] = (),  # type: ignore[assignment]
    infos: list[str] = (),  # type: ignore[assignment]
    string: str | None = None,
) -> bytes:
    if rtype == "matrix":
        res = (
            "["
            + ",".join(
                '{"metric":'
                + ref_labels(d)
                + ',"values":['
                + ",".join(f'[{ref_ts(t)},"{ref_value(v)}"]' for t, v in zip(ts, vs))
                + "]}"
                for d, ts, vs in series
            )
            + "]"
        )
    elif rtype == "vector":
        res = (
            "["
            + ",".join(
                '{"metric":' + ref_labels(d) + f',"value":[{ref_ts(ts[0])},"{ref_value(vs[0])}"]}}'
                for d, ts, vs in series
            )
            + "]"
        )
    elif rtype == "scalar":
        res = f'[{ref_ts(series[0][1][0])},"{ref_value(series[0][2][0])}"]'
    else:
        res = f"[{ref_ts(series[0][1][0])},{ref_str(string or '')}]"
    out = '{"status":"success","data":{"resultType":"' + rtype + '","result":' + res + "}"
    if warnings:
        out += ',"warnings":[' + ",".join(ref_str(w) for w in warnings) + "]"
    if infos:
        out += ',"infos":[' + ",".join(ref_str(w) for w in infos) + "]"
    return (out + "}").encode()


def same_floats(a: Any, b: Any) -> bool:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)  # any NaN payload is "NaN" on the wire
    return bool(np.array_equal(na, nb) and np.all(a[~na].view(np.uint64) == b[~nb].view(np.uint64)))


# --------------------------------------------------------------------------------------
# Golden answers from Prometheus 2.42
# --------------------------------------------------------------------------------------

GOLDEN = [
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.500,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.050,"1e-07"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000.001,"1e+21"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"100000000000000000000"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"123456789.12345679"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"-0"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"NaN"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"+Inf"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"-Inf"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"1.7976931348623157e+308"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"5e-324"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[-1.500,"0.000001"]}]}}',
    b'{"status":"success","data":{"resultType":"scalar","result":[1700000000.123,"1700000000.123"]}}',
    b'{"status":"success","data":{"resultType":"string","result":[1700000000.123,"str"]}}',
    b'{"status":"success","data":{"resultType":"string","result":[1700000000.123,"a\\"b\\\\c\xc3\xa9\\n\\u003c\\u003e\\u0026"]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"h","Zed":"z","__name__":"foo","abc":"x"},"value":[1700000000,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"foo","_a":"h"},"value":[1700000000,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"\\u003c\\u0026\\u003e\\"\\\\\\u2028\xc3\xa9\\t\\u0001"},"value":[1700000000,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"\\u2028\\u2029\\u0008\\u000c\x7f\xc3\xa9\\u001f/"},"value":[1700000000,"1"]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"x"},"values":[[1700000000,"3"],[1700000015,"3"],[1700000030,"3"]]},{"metric":{"a":"y"},"values":[[1700000000,"2"],[1700000015,"2"],[1700000030,"2"]]},{"metric":{"b":"x"},"values":[[1700000000,"1"],[1700000015,"1"],[1700000030,"1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1700000000.500,"1"],[1700000000.750,"1"],[1700000001,"1"]]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
    b'{"status":"success","data":{"resultType":"vector","result":[]}}',
]


@pytest.mark.parametrize("body", GOLDEN)
def test_golden_round_trip(body: bytes) -> None:
    r = decode_prometheus_json(body)
    assert encode_prometheus_json(r) == body
    assert b"".join(iter_prometheus_json(r, batch_samples=1)) == body
    # The slow exact path agrees with the fast one.
    s = json_decode._decode_slow(body)
    assert s.labels == r.labels and s.result_type == r.result_type
    assert np.array_equal(s.t_ms, r.t_ms) and same_floats(s.value, r.value)
    assert encode_prometheus_json(s) == body


def test_invalid_utf8_label_comes_back_as_a_raw_replacement_character() -> None:
    # Prometheus writes an invalid UTF-8 byte of a label as the escape \ufffd but a real
    # U+FFFD raw; once decoded the two are the same string, and we write it raw.
    body = (
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"\\ufffd"},'
        b'"value":[1700000000,"1"]}]}}'
    )
    r = decode_prometheus_json(body)
    assert r.labels == [{"a": "\ufffd"}]
    assert encode_prometheus_json(r) == body.replace(b"\\ufffd", "\ufffd".encode())


def test_golden_values_decode() -> None:
    vals = [decode_prometheus_json(b).value[0] for b in GOLDEN[:12]]
    assert vals[1] == 1e-07 and vals[2] == 1e21 and vals[3] == 1e20
    assert math.copysign(1, vals[5]) < 0 and vals[5] == 0
    assert math.isnan(vals[6]) and vals[7] == math.inf and vals[8] == -math.inf
    assert vals[10] == 5e-324
    assert decode_prometheus_json(GOLDEN[11]).t_ms[0] == -1500
    assert decode_prometheus_json(GOLDEN[0]).t_ms[0] == 1_700_000_000_500


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


def _bits_to_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**64 - 1).map(_bits_to_float),
    st.integers(-(10**22), 10**22).map(float),
    st.decimals(min_value=-(10**6), max_value=10**6, places=4, allow_nan=False).map(float),
)


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


def test_value_strings_other_backends_write() -> None:
    # Spellings Prometheus does not write but Go's ParseFloat accepts.
    toks = ["1.0", "1E5", "1e+05", "-0.0", "00012", ".5", "5.", "1.5e-310", "123456789012345678901234",
            "0.000000000000000000000000000001", "0.0006867644672947648", "1234567890123456789",
            "12345678901234567890", "9007199254740993", "Inf", "-inf", "+1.5", "1e400", "-1e400"]
    body = ref_encode("vector", [({}, [0], [0.0])]).replace(b'"0"', b'"%s"')
    for tok in toks:
        r = decode_prometheus_json(body % tok.encode())
        assert same_floats(r.value, [float(tok)]), tok


@pytest.mark.parametrize("tok", ["", "abc", "1.2.3", "0x10", "1_000", "--1", "1e", "NaNa"])
def test_bad_values_are_malformed(tok: str) -> None:
    body = ref_encode("vector", [({}, [0], [0.0])]).replace(b'"0"', b'"' + tok.encode() + b'"')
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)


# --------------------------------------------------------------------------------------
# Series with hard labels
# --------------------------------------------------------------------------------------

hard_text = st.lists(
    st.one_of(
        st.sampled_from(['"', "\\", "]", "[", "}", "{", ",", ":", "\n", "\t", "\x00", "\x08", "\x0c",
                         "\x7f", "<", ">", "&", "\u2028", "\u2029", "é", "\U0001f600",
                         '"values":[', '{"metric":{', "\\u0041"]),
        st.characters(codec="utf-8"),
    ),
    max_size=8,
).map("".join)
label_name = st.text(alphabet="abcXYZ_:0", min_size=1, max_size=6)
label_set = st.dictionaries(label_name, hard_text, max_size=5)


@st.composite
def matrices(draw: Any) -> list[tuple[dict[str, str], list[int], list[float]]]:
    sets = draw(st.lists(label_set, max_size=6, unique_by=lambda d: tuple(sorted(d.items()))))
    out = []
    for d in sets:
        ts = sorted(draw(st.sets(st.integers(-(10**13), 10**13), min_size=1, max_size=8)))
        vs = draw(st.lists(any_float, min_size=len(ts), max_size=len(ts)))
        out.append((d, ts, vs))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matrices(), st.lists(hard_text, max_size=2))
def test_matrix_round_trip_hard_labels(series: Any, warnings: list[str]) -> None:
    body = ref_encode("matrix", series, warnings)
    r = decode_prometheus_json(body)
    assert r.result_type == "matrix" and r.warnings == warnings
    assert r.labels == [d for d, _, _ in series]
    assert r.t_ms.tolist() == [t for _, ts, _ in series for t in ts]
    assert same_floats(r.value, [v for _, _, vs in series for v in vs])
    assert encode_prometheus_json(r) == body
    assert b"".join(iter_prometheus_json(r, batch_samples=3)) == body
    # Through the cache format and back.
    back = QueryResult.from_ipc_bytes(r.to_ipc_bytes())
    assert encode_prometheus_json(back) == body


@settings(max_examples=100, deadline=None)
@given(matrices())
def test_vector_round_trip(series: Any) -> None:
    vec = [(d, ts[:1], vs[:1]) for d, ts, vs in series]
    body = ref_encode("vector", vec)
    r = decode_prometheus_json(body)
    assert r.labels == [d for d, _, _ in vec]
    assert encode_prometheus_json(r) == body


@settings(max_examples=100, deadline=None)
@given(matrices())
def test_decoder_ignores_formatting(series: Any) -> None:
    """Whitespace, other key orders and extra keys (other backends, stats=all)."""
    doc = {
        "data": {
            "result": [{"values": [[t / 1000, ref_value(v)] for t, v in zip(ts, vs)], "metric": d}
                       for d, ts, vs in series],
            "stats": {"timings": {"evalTotalTime": 0.1}},
            "resultType": "matrix",
        },
        "status": "success",
    }
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    r = decode_prometheus_json(body)
    assert encode_prometheus_json(r) == ref_encode("matrix", series)


# --------------------------------------------------------------------------------------
# Shapes the decoder refuses or routes to the slow path
# --------------------------------------------------------------------------------------


def test_histograms_are_undecodable() -> None:
    body = (
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},'
        b'"histogram":[1700000000,{"count":"1","sum":"2","buckets":[[0,"0","1","1"]]}]}]}}'
    )
    with pytest.raises(Undecodable):
        decode_prometheus_json(body)
    with pytest.raises(Undecodable):
        json_decode._decode_slow(body)
    body = (
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},'
        b'"values":[[1,"1"]],"histograms":[[2,{"count":"1","sum":"2"}]]}]}}'
    )
    with pytest.raises(Undecodable):
        decode_prometheus_json(body)


@pytest.mark.parametrize(
    "metric,labels",
    [
        (b'{"b":"1","a":"2"}', {"a": "2", "b": "1"}),  # names out of order
        (b'{"a":"x\\/y"}', {"a": "x/y"}),  # needless escape
        (b'{"a":"\\u0041"}', {"a": "A"}),
        (b'{"a":"\\u003C"}', {"a": "<"}),  # uppercase hex
        (b'{"a":"<&>"}', {"a": "<&>"}),  # not escaped
        (b'{"a":"\\b\\f"}', {"a": "\b\f"}),  # short escapes jsoniter does not use
        (b'{"a":"\xe2\x80\xa8"}', {"a": "\u2028"}),  # raw U+2028
        (b'{"a":"\\ud83d\\ude00"}', {"a": "\U0001f600"}),  # surrogate pair
        (b'{ "a" : "1" }', {"a": "1"}),  # whitespace
        (b'{"a":"1","a":"2"}', {"a": "2"}),  # duplicate name: JSON's last one wins
    ],
)
def test_labels_in_other_spellings_are_rewritten(metric: bytes, labels: dict[str, str]) -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":%s,"value":[1,"1"]}]}}' % metric
    r = decode_prometheus_json(body)
    assert r.labels == [labels]
    assert encode_prometheus_json(r) == ref_encode("vector", [(labels, [1000], [1.0])])


def test_label_text_that_looks_like_structure() -> None:
    d = {"a": '"},"values":[[1,"2"]]},{"metric":{', "histogram": "x", "b": '\\"'}
    body = ref_encode("matrix", [(d, [1000], [1.0])])
    r = decode_prometheus_json(body)
    assert r.labels == [d] and encode_prometheus_json(r) == body


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"status":"error","errorType":"bad_data","error":"x"}',
        b'{"status":"success"}',
        b'{"status":"success","data":{"resultType":"matrix","result":{}}}',
        b'{"status":"success","data":{"resultType":"nope","result":[]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":1},"values":[]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,2]]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"],[1,"2"]]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]',
    ],
)
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)


def test_timestamps_sharing_digits_with_the_previous_sample() -> None:
    # The scanner reuses the first 6 digits of the previous 10-digit timestamp: shorter,
    # longer, fractional and negative neighbours must not confuse it.
    toks = ["-1700000000.5", "-1", "0", "170000003", "1700000000", "1700000000.250", "1700000000.5",
            "1700000001.001", "1700009999.999", "1700010000", "1799999999", "1800000000", "9999999999.999",
            "17000000020", "17000000020.5"]
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},"values":['
            + b",".join(b'[%s,"%d"]' % (t.encode(), i) for i, t in enumerate(toks)) + b"]}]}}")
    r = decode_prometheus_json(body)
    want = [round(float(t) * 1000) for t in toks]
    assert r.t_ms.tolist() == want and r.value.tolist() == [float(i) for i in range(len(toks))]
    assert encode_prometheus_json(r) == ref_encode("matrix", r.to_pylist())
    vec = (b'{"status":"success","data":{"resultType":"vector","result":['
           + b",".join(b'{"metric":{"i":"%d"},"value":[%s,"1"]}' % (i, t.encode()) for i, t in enumerate(toks))
           + b"]}}")
    assert decode_prometheus_json(vec).t_ms.tolist() == want


def test_stream_chunks_bound_memory() -> None:
    series = [({"i": str(i)}, list(range(0, 40_000, 1000)), [0.5] * 40) for i in range(2000)]
    r = QueryResult.from_series("matrix", series)
    chunks = list(iter_prometheus_json(r))
    assert b"".join(chunks) == encode_prometheus_json(r)
    assert len(chunks) >= 4 and max(map(len, chunks)) < 2 * json_encode._STREAM_BATCH_SAMPLES * 40


def test_slow_path_timestamps_and_order() -> None:
    # More than 3 decimals, exponents, unsorted samples: exact slow path, sorted output.
    body = (
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":'
        b'[[1.7e9,"1"],[1700000000.0014,"2"],[1699999999.5,"3"]]}]}}'
    )
    r = decode_prometheus_json(body)
    assert r.t_ms.tolist() == [1_699_999_999_500, 1_700_000_000_000, 1_700_000_000_001]
    assert r.value.tolist() == [3.0, 1.0, 2.0]


def test_slow_path_duplicate_after_rounding_is_malformed() -> None:
    body = (
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":'
        b'[[1.7e9,"1"],[1700000000.0004,"2"]]}]}}'
    )
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)


# --------------------------------------------------------------------------------------
# Arrow
# --------------------------------------------------------------------------------------


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
    back = QueryResult.from_ipc_bytes(r.to_ipc_bytes(compression))
    assert back.labels == r.labels and back.warnings == ["w"] and back.result_type == "matrix"
    assert np.array_equal(back.offsets, r.offsets) and np.array_equal(back.t_ms, r.t_ms)
    assert same_floats(back.value, r.value)


def test_cached_labels_are_not_formatted_again() -> None:
    d = {"__name__": "up", "a": "<x> \"y\" \u2028", "Z": "é"}
    r = QueryResult.from_series("matrix", [(d, [1000], [1.0]), ({}, [1000], [2.0])])
    back = QueryResult.from_ipc_bytes(r.to_ipc_bytes())
    assert back._label_block is not None and back.labels == r.labels
    assert back.canonical_keys() == [labels_json(d), b"{}"]
    assert encode_prometheus_json(back) == encode_prometheus_json(r) == ref_encode("matrix", r.to_pylist())
    # A table written without the canonical marker (an older cache entry) still decodes.
    t = r.to_arrow_table()
    meta = {k: v for k, v in t.schema.metadata.items() if k != b"promaccel.labels_canonical"}
    old = QueryResult.from_arrow_table(t.replace_schema_metadata(meta))
    assert old._label_block is None and encode_prometheus_json(old) == encode_prometheus_json(r)


def _fleet_hour(n_series: int = 256, pod: str = "p") -> QueryResult:
    series = []
    for i in range(n_series):
        labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": f"gpu-node-{i // 8:04d}", "gpu": str(i % 8),
                  "UUID": f"GPU-{i:08x}-16cf-fc95-3621", "modelName": "NVIDIA H100 80GB HBM3", "pod": f"{pod}-{i}"}
        series.append((labels, [0, 30_000, 60_000], [float(i), float(i) + 0.5, 100.0]))
    return QueryResult.from_series("matrix", series)


def test_cached_label_lists_are_packed_and_unpacked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.codec import arrow

    r = _fleet_hour()
    payload = r.to_ipc_bytes("lz4")
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
        back = QueryResult.from_ipc_bytes(payload)
        assert back.labels == r.labels and back.canonical_keys() == r.canonical_keys()
        assert np.array_equal(back.t_ms, r.t_ms) and np.array_equal(back.value, r.value)
        assert encode_prometheus_json(back) == encode_prometheus_json(r)
    assert unpacked == [1]
    other = _fleet_hour(pod="q")  # another list: unpacked too
    assert QueryResult.from_ipc_bytes(other.to_ipc_bytes("zstd")).labels == other.labels
    assert unpacked == [1, 1]
    # A short list stays plain JSON.
    small = _sample_result()
    small_meta = pa.ipc.open_stream(small.to_ipc_bytes()).read_all().schema.metadata
    assert b"promaccel.labels_zstd" not in small_meta and small_meta[b"promaccel.labels"].startswith(b"[")


@pytest.mark.parametrize("size", [b"", b"x", b"0", b"-5", str(1 << 31).encode(), b"12", b"1000000", str(900 << 20).encode()])
def test_a_packed_label_list_of_a_wrong_size_is_malformed(size: bytes) -> None:
    from proxy.codec import arrow

    t = arrow.to_table(_fleet_hour(pod=f"size{size!r}"), pack_labels=True)
    meta = dict(t.schema.metadata)
    meta[b"promaccel.labels_size"] = size
    sink = pa.BufferOutputStream()
    bad = t.replace_schema_metadata(meta)
    with pa.ipc.new_stream(sink, bad.schema) as w:
        w.write_table(bad)
    with pytest.raises(MalformedAnswer):
        QueryResult.from_ipc_bytes(sink.getvalue().to_pybytes())


def test_arrow_table_schema() -> None:
    t = _sample_result().to_arrow_table()
    assert t.schema.names == ["series", "t_ms", "value"]
    assert t.column("series").to_pylist() == [0, 0, 1]
    assert t.schema.metadata[b"promaccel.result_type"] == b"matrix"
    with pytest.raises(MalformedAnswer):
        QueryResult.from_ipc_bytes(b"garbage")


def test_scalar_and_string_through_ipc() -> None:
    for body in (GOLDEN[12], GOLDEN[14]):
        r = decode_prometheus_json(body)
        assert encode_prometheus_json(QueryResult.from_ipc_bytes(r.to_ipc_bytes())) == body


def test_public_arrow_stream() -> None:
    r = _sample_result()
    table = pa.ipc.open_stream(encode_arrow_stream(r)).read_all()
    assert table.schema.names == ["series", "timestamp", "value", "labels"]
    assert table.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    assert table.column("labels").to_pylist()[2] == [("Hostname", "n2"), ("__name__", "up")]
    assert table.schema.field("labels").type == pa.dictionary(pa.int32(), pa.map_(pa.utf8(), pa.utf8()))
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [1000, 2000, 1000]
    assert table.schema.metadata[b"promaccel.warnings"] == b'["w"]'


def test_query_result_validates_shape() -> None:
    with pytest.raises(ValueError):
        QueryResult("matrix", [{}], np.array([0, 2]), np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError):
        QueryResult("table", [], np.array([0]), np.array([], dtype=np.int64), np.array([]))  # type: ignore[arg-type]


def test_large_answer_streams_in_chunks() -> None:
    rng = np.random.default_rng(3)
    series = [({"__name__": "m", "i": str(i)}, list(range(0, 100_000, 1000)), rng.random(100).tolist())
              for i in range(50)]
    r = QueryResult.from_series("matrix", series)
    chunks = list(iter_prometheus_json(r, batch_samples=1000))
    assert len(chunks) > 3
    assert b"".join(chunks) == encode_prometheus_json(r) == ref_encode("matrix", series)


def test_label_sets_share_one_key_and_their_values_between_answers() -> None:
    """Hour cells of one day hold one copy of each label set's JSON and value strings:
    the key a result adopts is the table's, and values repeat as one string object."""
    body = (b'{"status":"success","data":{"resultType":"vector","result":['
            b'{"metric":{"gpu":"0","host":"node-17","model":"H100 80GB HBM3 sharing-test"},"value":[1700000000,"1"]},'
            b'{"metric":{"gpu":"1","host":"node-17","model":"H100 80GB HBM3 sharing-test"},"value":[1700000000,"2"]}]}}')
    a, b = decode_prometheus_json(body), decode_prometheus_json(bytes(bytearray(body)))
    assert a.labels == b.labels == [{"gpu": "0", "host": "node-17", "model": "H100 80GB HBM3 sharing-test"},
                                     {"gpu": "1", "host": "node-17", "model": "H100 80GB HBM3 sharing-test"}]
    assert all(x is y for x, y in zip(a.canonical_keys(), b.canonical_keys()))
    assert a.labels[0]["model"] is a.labels[1]["model"] and a.labels[0]["host"] is b.labels[1]["host"]
    # Read back from the cache's Arrow payload: the same key objects, and the same bytes out.
    c = QueryResult.from_ipc_bytes(memoryview(a.to_ipc_view("lz4")))
    assert all(x is y for x, y in zip(a.canonical_keys(), c.canonical_keys()))
    assert encode_prometheus_json(c) == encode_prometheus_json(a) == body


def test_only_the_event_loops_thread_keeps_a_decode_scratch() -> None:
    import asyncio
    import threading

    body = orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"a": str(i)}, "values": [[1, "1"], [2, "2"]]} for i in range(50)]}})
    kept: dict[str, bool] = {}

    def in_worker() -> None:  # a worker thread (asyncio.to_thread): fresh arrays, nothing kept
        assert decode_prometheus_json(body).n_samples == 100
        kept["worker"] = getattr(json_decode._DECODE_SCRATCH, "arrays", None) is not None

    async def on_loop() -> None:
        assert decode_prometheus_json(body).n_samples == 100
        kept["loop"] = getattr(json_decode._DECODE_SCRATCH, "arrays", None) is not None

    def loop_thread() -> None:
        asyncio.run(on_loop())

    for target in (in_worker, loop_thread):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    assert kept == {"worker": False, "loop": True}


def _raw_answer(pod: str, n: int = 40) -> bytes:
    """A raw selector's answer as Prometheus writes it (canonical label JSON)."""
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"Hostname": f"node-{i // 8}", "__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": str(i % 8),
                    "pod": f"{pod}-{i}"},
         "values": [[1700000000 + 60 * k, str(i + k)] for k in range(3)]} for i in range(n)]}})


def test_raw_answers_are_merged_and_written_without_parsing_their_label_sets() -> None:
    """A decoded answer in Prometheus's own label JSON keeps its keys and parses its label
    dicts only when they are read: a merge of raw series (cut, concatenated, cached, read
    back) hashes, sorts and writes the keys alone (a 24 h panel of 2,048 GPUs has 18,500
    label sets, ~22 MB as dicts; issue 15). Read, they are the very dicts Prometheus sent."""
    from proxy.result.concat import concat
    from proxy.result.pieces import split_time

    body = _raw_answer("lazy-labels")
    r = decode_prometheus_json(body)
    assert r.parsed_labels() is None and r.n_series == 40
    halves = split_time(r, [(1700000000_000, 1700000060_000), (1700000120_000, 1700000120_000)])
    assert all(h.parsed_labels() is None for h in halves)
    cached = [QueryResult.from_ipc_bytes(h.to_ipc_bytes("lz4")) for h in halves]
    packed = [QueryResult.from_ipc_bytes(h.to_ipc_bytes("lz4"), pack_from=1) for h in halves]
    assert all(c.parsed_labels() is None for c in cached + packed)
    for parts in (halves, cached, packed):
        merged = concat(parts[::-1], lazy=True)
        assert merged.parsed_labels() is None
        assert encode_prometheus_json(merged) == body
        assert merged.parsed_labels() is None  # writing it did not parse them either
    expected = [s["metric"] for s in orjson.loads(body)["data"]["result"]]
    assert r.labels == expected and r.parsed_labels() is not None
    # Parsed once, shared: another answer with the same label sets gets the same dicts.
    again = decode_prometheus_json(bytes(body))
    assert again.parsed_labels() is None
    assert all(x is y for x, y in zip(again.labels, r.labels))
    # Label sets in another spelling are parsed at once (their keys are made from them).
    spaced = decode_prometheus_json(body.replace(b'"gpu":', b'"gpu": '))
    assert spaced.parsed_labels() == expected and encode_prometheus_json(spaced) == body


def test_a_label_value_that_is_not_utf8_is_never_relayed() -> None:
    """Label JSON kept unparsed must still be valid: a value that is not UTF-8 gets the
    decoder's error, as when every label set was parsed at once."""
    body = _raw_answer("utf8-check", 3).replace(b'"utf8-check-1"', b'"utf8-\xff-1"')
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)
    ok = _raw_answer("utf8-check-\u00e9", 3)  # valid non-ASCII stays unparsed and exact
    r = decode_prometheus_json(ok)
    assert r.parsed_labels() is None and encode_prometheus_json(r) == ok
    assert r.labels[0]["pod"] == "utf8-check-\u00e9-0"


def test_the_label_table_keeps_keys_and_parses_dicts_on_demand() -> None:
    table = json_decode._LabelSets(max_bytes=1 << 20)
    spans = [b'{"a":"1"}', b'{"a":"2"}']
    table.intern(spans)
    assert all(e[1] is None for e in table.map.values()) and table.bytes == 18
    kept = list(spans)
    again = [bytes(bytearray(b'{"a":"1"}'))]
    table.intern(again)
    assert again[0] is kept[0]
    dicts = table.lookup([b'{"a":"2"}', b'{"a":"1"}'])
    assert dicts == [{"a": "2"}, {"a": "1"}] and table.lookup([b'{"a":"1"}'])[0] is dicts[1]
    assert table.bytes == 18 + 3 * 18  # the dicts are counted once parsed
    big = [f'{{"k":"{i:0200d}"}}'.encode() for i in range(6000)]  # ~1.2 MB: over the bound
    table.intern(big)
    assert len(table.map) == 6000 and kept[0] not in table.map  # cleared, then the new ones


def test_cached_label_lists_keep_no_large_json() -> None:
    """An hour cell's label list is split once and remembered as the shared keys; its JSON
    (~1 MB an hour for 2,048 GPUs) is not kept."""
    from proxy.codec import arrow

    lists = arrow._LabelLists()
    big = _fleet_hour(600, pod="big-list")
    payload = big.to_ipc_bytes("lz4")
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
