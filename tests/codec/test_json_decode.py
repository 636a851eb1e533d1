"""Prometheus JSON -> QueryResult (proxy/codec/json_decode.py), in process: golden answers
of Prometheus 2.42, answers written by the reference encoder (tests/codec/reference.py), other
spellings other backends write, malformed and undecodable answers, and the label sets kept as
their JSON keys."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import arrow, json_decode
from proxy.codec.errors import MalformedAnswer, Undecodable
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from tests.codec.reference import GOLDEN, hard_text, matrices, ref_encode, ref_value, same_floats


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
    back = arrow.from_ipc_bytes(arrow.to_ipc_bytes(r))
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
    c = arrow.from_ipc_bytes(memoryview(arrow.to_ipc_view(a, "lz4")))
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
    cached = [arrow.from_ipc_bytes(arrow.to_ipc_bytes(h, "lz4")) for h in halves]
    packed = [arrow.from_ipc_bytes(arrow.to_ipc_bytes(h, "lz4"), pack_from=1) for h in halves]
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
