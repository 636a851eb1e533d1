"""proxy/codec/json_scan.py: the compiled scanner's kernels on their own (`skip_value`,
`scan_members`, `parse_series_list`, `array_element_spans`), checked against orjson and the
reference encoder, and on hostile bytes: truncated, malformed, deeply nested or oversized input
is a status code (never an index outside the buffer, never a write past an output array, never
a hang), and through the decoder (json_decode.py) the codec's own error, nothing else.
(Decoding answers end to end: tests/codec/test_json_decode.py.)"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np
import orjson
import pytest

from proxy.codec.errors import CodecError, MalformedAnswer
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_scan import array_element_spans, literal_bytes, parse_series_list, scan_members, skip_value
from tests.codec.reference import ref_encode, ref_labels

NOTHING = literal_bytes(b"")
T0 = 1_700_000_000_000


def arr(b: bytes) -> np.ndarray:
    return literal_bytes(b)


# --- skip_value --------------------------------------------------------------------------------

VALUES = [
    b'"plain"',
    b'"with \\"quotes\\" and ]}, inside"',
    b'"ends in a backslash \\\\"',
    b'"\\u005c\\""',
    b"[]",
    b"{}",
    b'[1,"]",{"a":["}"]},[[[]]]]',
    b'{"a":{"b":{"c":"{{{"}},"d":[1,2,3]}',
    b"12345",
    b"-1.5e+300",
    b"true",
    b"null",
]


@pytest.mark.parametrize("value", VALUES)
def test_skip_value_ends_right_after_the_value(value: bytes) -> None:
    for before, after in ((b"", b""), (b"  ", b",\"next\":1}"), (b"[", b"]"), (b":", b"\n}")):
        b = arr(before + value + after)
        assert skip_value(b, len(before), len(b)) == len(before) + len(value)


@pytest.mark.parametrize("value", [v for v in VALUES if v[:1] in b'"[{'])
def test_skip_value_of_a_cut_string_or_container_is_minus_one(value: bytes) -> None:
    for cut in range(1, len(value)):
        b = arr(value[:cut])
        assert skip_value(b, 0, len(b)) == -1, value[:cut]


def test_skip_value_at_the_end_of_the_buffer_is_minus_one() -> None:
    b = arr(b'"x"')
    assert skip_value(b, 3, 3) == -1
    assert skip_value(b, 10, 3) == -1


def test_skip_value_of_deep_nesting_is_bounded_in_time_and_never_recurses() -> None:
    n = 200_000
    closed = arr(b"[" * n + b"]" * n)
    unclosed = arr(b"[" * n + b"]" * (n - 1))
    t0 = time.perf_counter()
    assert skip_value(closed, 0, len(closed)) == 2 * n
    assert skip_value(unclosed, 0, len(unclosed)) == -1
    assert time.perf_counter() - t0 < 1.0


# --- scan_members ------------------------------------------------------------------------------

OBJ = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "2"]}]},
       "warnings": ["a \"quoted\" }]"], "n": -1.5, "t": True, "z": None}


def members(body: bytes, stop: bytes = b"", rows: int = 16) -> tuple[int, list[tuple[bytes, bytes]], int]:
    b = arr(body)
    # The kernel gets the first `rows` rows of a larger array (compiled code has no bounds
    # checks): the rows after them must stay untouched.
    room = np.full((rows + 4, 4), -7, dtype=np.int64)
    out = room[:rows]
    status, k, pos = scan_members(b, 0, len(b), True, arr(stop) if stop else NOTHING, out)
    assert (room[rows:] == -7).all()
    spans = [(body[ks:ke], body[vs:ve] if ve >= 0 else b"") for ks, ke, vs, ve in out[:k].tolist()]
    return status, spans, pos


def test_scan_members_gives_each_key_and_value_span() -> None:
    for body in (orjson.dumps(OBJ), orjson.dumps(OBJ, option=orjson.OPT_INDENT_2)):
        status, spans, pos = members(body)
        assert status == 0 and pos == len(body)
        assert [k for k, _ in spans] == [k.encode() for k in OBJ]
        assert [orjson.loads(v) for _, v in spans] == list(OBJ.values())


def test_scan_members_stops_at_the_key_asked_for_before_its_value() -> None:
    body = orjson.dumps(OBJ)
    status, spans, pos = members(body, stop=b"data")
    assert status == 1
    assert [k for k, _ in spans] == [b"status", b"data"]
    assert spans[-1][1] == b""  # its value is left to the caller ...
    assert body[pos:].startswith(b'{"resultType"')  # ... which starts here
    # Continue after a value: the remaining members.
    b = arr(body)
    out = np.zeros((16, 4), dtype=np.int64)
    end = skip_value(b, pos, len(b))
    status, k, pos = scan_members(b, end, len(b), False, NOTHING, out)
    assert status == 0 and pos == len(body)
    assert [body[ks:ke] for ks, ke, _, _ in out[:k].tolist()] == [b"warnings", b"n", b"t", b"z"]


def test_an_empty_object_has_no_members() -> None:
    assert members(b"{}") == (0, [], 2)
    assert members(b" { } ")[0] == 0


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'"x"', b"{", b'{"a"', b'{"a":', b'{"a":1', b'{"a":1,', b'{"a":1,}', b'{"a" 1}', b"{a:1}",
     b'{"a":1 "b":2}', b'{"a":[1,2}', b'{"a":"unterminated}', b'{,"a":1}', b'{"a":1]'],
)
def test_scan_members_of_a_malformed_object_is_minus_one(body: bytes) -> None:
    status, _, pos = members(body)
    assert status == -1
    assert pos <= len(body)


def test_scan_members_never_writes_more_rows_than_it_was_given() -> None:
    body = orjson.dumps({f"k{i}": i for i in range(100)})
    status, spans, _ = members(body, rows=4)
    assert status == -1 and len(spans) <= 4


# --- parse_series_list -------------------------------------------------------------------------


def scan(body: bytes, cap_series: int | None = None, cap_samples: int | None = None) -> dict[str, Any]:
    """parse_series_list over the `result` array of a Prometheus answer."""
    b = arr(body)
    start = body.index(b'"result":') + len(b'"result":')
    matrix = b'"resultType":"matrix"' in body
    cs = cap_series if cap_series is not None else len(body)
    cv = cap_samples if cap_samples is not None else len(body)
    # Each output array is the first part of a larger one (compiled code has no bounds
    # checks): the part after it must stay untouched.
    rooms = [np.full(cs + 8, -7, np.int64) for _ in range(3)] + [np.full(cv + 8, -7, np.int64) for _ in range(4)]
    met_s, met_e, counts = (r[:cs] for r in rooms[:3])
    t, fb_idx, fb_s, fb_e = (r[:cv] for r in rooms[3:])
    v_room = np.full(cv + 8, -7.0)
    v = v_room[:cv]
    canon = np.ones(1, dtype=np.uint8)
    status, ns, nk, nfb, unsorted, end = parse_series_list(b, start, len(b), matrix, met_s, met_e, counts, t, v,
                                                           fb_idx, fb_s, fb_e, canon)
    assert 0 <= ns <= cs and 0 <= nk <= cv and 0 <= nfb <= nk + 1
    assert all((r[cs:] == -7).all() for r in rooms[:3]) and all((r[cv:] == -7).all() for r in rooms[3:])
    assert (v_room[cv:] == -7.0).all()
    return dict(status=status, ns=ns, nk=nk, nfb=nfb, unsorted=unsorted, end=end, start=start,
                labels=[body[a:b] if a >= 0 else None for a, b in zip(met_s[:ns], met_e[:ns])],
                counts=counts[:ns].tolist(), t=t[:nk].tolist(), v=v[:nk].copy(),
                fallback={int(i): body[a:b] for i, a, b in zip(fb_idx[:nfb], fb_s[:nfb], fb_e[:nfb])},
                canon=bool(canon[0]))


SERIES = [
    ({"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-1", "gpu": "0"},
     [T0 + 30_000 * k for k in range(6)], [0.0, 1.5, -2.25, 1e-7, 123456789.125, 5e300]),
    ({"Hostname": "node-2", "gpu": "1", "weird": 'a "quoted" <tag> & \\ \n value'},
     [T0 + 1, T0 + 15_500, T0 + 999_999], [math.nan, math.inf, -math.inf]),
    ({}, [T0 - 1_600_000_000_000], [42.0]),  # a timestamp of 9 digits of seconds
]


def test_a_matrix_scans_to_its_label_spans_timestamps_and_values() -> None:
    body = ref_encode("matrix", SERIES)
    got = scan(body)
    assert got["status"] == 0 and not got["unsorted"]
    assert body[got["end"] - 1:got["end"]] == b"]" and body[got["start"]:got["end"]].count(b"[") >= 1
    assert got["ns"] == 3 and got["counts"] == [6, 3, 1]
    assert got["labels"] == [ref_labels(d).encode() for d, _, _ in SERIES]
    assert got["canon"]  # the reference spells label sets exactly as Prometheus does
    assert got["t"] == [t for _, ts, _ in SERIES for t in ts]
    expected = [x for _, _, vs in SERIES for x in vs]
    for i, (have, want) in enumerate(zip(got["v"].tolist(), expected)):
        if i in got["fallback"]:  # left to Python's float(): the text is the value's own
            text = got["fallback"][i].decode()
            assert float(text.replace("Inf", "inf")) == want or (math.isnan(want) and text == "NaN")
        else:
            assert have == want or (math.isnan(have) and math.isnan(want)), (i, have, want)


def test_a_vector_scans_one_sample_per_series() -> None:
    series = [(d, ts[:1], vs[:1]) for d, ts, vs in SERIES]
    got = scan(ref_encode("vector", series))
    assert got["status"] == 0 and got["counts"] == [1, 1, 1]
    assert got["t"] == [ts[0] for _, ts, _ in series]


@pytest.mark.parametrize(
    "metric",
    [b'{"b":"1","a":"2"}', b'{ "a":"1"}', b'{"a" : "1"}', b'{"a":"\\u00e9"}', b'{"a":"1","a":"2"}',
     b'{"a":"<"}', b'{"a":"\\/"}'],
)
def test_label_sets_not_spelled_as_prometheus_writes_them_clear_the_canonical_flag(metric: bytes) -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":' + metric + \
        b',"value":[1700000000,"1"]}]}}'
    got = scan(body)
    assert got["status"] == 0 and got["labels"] == [metric]
    assert not got["canon"]


def test_out_of_order_timestamps_are_flagged() -> None:
    body = ref_encode("matrix", [({}, [T0 + 60_000, T0], [1.0, 2.0])])
    assert scan(body)["unsorted"] is True
    dup = ref_encode("matrix", [({}, [T0, T0], [1.0, 2.0])])
    assert scan(dup)["unsorted"] is True


def test_native_histograms_are_status_two() -> None:
    body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},'
            b'"histograms":[[1700000000,{"count":"1","sum":"1","buckets":[]}]]}]}}')
    assert scan(body)["status"] == 2


@pytest.mark.parametrize(
    "result",
    [b"{}", b'[{"metric":{}}', b'[{"metric":{},"value":[1700000000,"1"]},]', b'[{"metric":{},"value":[17e8,"1"]}]',
     b'[{"metric":{"a":1},"value":[1700000000,"1"]}]', b'[{"metric":{},"value":[1700000000,1]}]',
     b'[{"metric":{},"value":[1700000000,"1\\u0030"]}]', b'[{"metric":{},"metric":{},"value":[1,"1"]}]',
     b'[{"metric":{},"value":[1700000000.0001,"1"]}]', b'[{"metric":{},"value":["1700000000","1"]}]',
     b'[{"metric":{}}]', b"[1]", b'[{"metric":{},"value":[1700000000,"1"],"value":[1700000001,"2"]}]'],
)
def test_what_the_scanner_does_not_expect_goes_to_the_slow_path(result: bytes) -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":' + result + b"}}"
    assert scan(body)["status"] == 1


def test_full_output_arrays_send_the_answer_to_the_slow_path_without_overflowing() -> None:
    body = ref_encode("matrix", SERIES)
    assert scan(body, cap_series=2)["status"] == 1
    assert scan(body, cap_samples=9)["status"] == 1
    assert scan(body, cap_series=3, cap_samples=10)["status"] == 0  # exactly enough


def test_every_truncation_of_a_result_array_is_the_slow_path() -> None:
    body = ref_encode("matrix", SERIES)
    full = scan(body)
    for cut in range(full["start"], full["end"]):
        got = scan(body[:cut])
        assert got["status"] == 1, cut


# --- array_element_spans -----------------------------------------------------------------------


def test_array_element_spans_of_a_list_of_label_sets() -> None:
    sets = [{"a": "b"}, {}, {"c": '[",]'}, {"x": "}{"}]
    raw = orjson.dumps(sets)
    starts, ends = np.zeros(4, np.int64), np.zeros(4, np.int64)
    assert array_element_spans(arr(raw), starts, ends) == 4
    assert [orjson.loads(raw[a:b]) for a, b in zip(starts, ends)] == sets
    assert array_element_spans(arr(b"[]"), starts, ends) == 0
    # More elements than room: -1, nothing written past the arrays.
    room_s, room_e = np.full(5, -7, np.int64), np.full(5, -7, np.int64)
    assert array_element_spans(arr(raw), room_s[:3], room_e[:3]) == -1
    assert (room_s[3:] == -7).all() and (room_e[3:] == -7).all()
    # An element cut short: -1.
    assert array_element_spans(arr(raw[:-3]), starts, ends) == -1


# --- through the decoder: hostile answers are the codec's error ---------------------------------


def answers() -> list[bytes]:
    return [ref_encode("matrix", SERIES, warnings=["w"]), ref_encode("vector", [(d, ts[:1], vs[:1]) for d, ts, vs in SERIES]),
            ref_encode("scalar", [({}, [T0], [1.5])]), ref_encode("string", [({}, [T0], [0.0])], string="s")]


def test_every_truncation_of_an_answer_is_malformed() -> None:
    t0 = time.perf_counter()
    for body in answers():
        decode_prometheus_json(body)  # whole: fine
        for cut in range(len(body)):
            with pytest.raises(MalformedAnswer):
                decode_prometheus_json(body[:cut])
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize(
    "body",
    [
        # A label value of 4 MB, a sample value of 100 k digits (read as Go reads it: +Inf).
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"' + b"x" * (4 << 20) +
        b'"},"value":[1700000000,"1"]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"' +
        b"9" * 100_000 + b'"]}]}}',
        # 100 k levels of nesting in a member the decoder does not read.
        b'{"status":"success","data":{"resultType":"matrix","result":[],"extra":' + b"[" * 100_000 + b"]" * 100_000 +
        b"}}",
    ],
)
def test_oversized_parts_decode_in_bounded_time(body: bytes) -> None:
    t0 = time.perf_counter()
    decode_prometheus_json(body)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"success","data":{"resultType":"matrix","result":[],"extra":' + b"[" * 100_000 + b"}}",
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"' + b"\\" * 100_001 +
        b'"]]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[' + b"1" * 10_000 +
        b',"1"]]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"\x00"},"value":[1,"1"]}]}}',
    ],
)
def test_oversized_or_broken_parts_are_malformed_in_bounded_time(body: bytes) -> None:
    t0 = time.perf_counter()
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)
    assert time.perf_counter() - t0 < 5


# Seconds whose milliseconds do not fit int64 (the last: 9223372036854776000 > 2**63 - 1), and
# 1e308, whose milliseconds are not even a finite float.
TS_OUT_OF_RANGE = [b"1" * 20, b"1e300", b"-" + b"9" * 19, b"9223372036854775807", b"9223372036854776", b"1e308"]


def _answers_at(ts: bytes) -> list[bytes]:
    """A vector, a matrix and a scalar answer with one sample at `ts`."""
    return [
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[' + ts + b',"1"]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"],[' + ts +
        b',"1"]]}]}}',
        b'{"status":"success","data":{"resultType":"scalar","result":[' + ts + b',"1"]}}',
    ]


@pytest.mark.parametrize("ts", TS_OUT_OF_RANGE)
def test_a_timestamp_outside_int64_milliseconds_is_malformed(ts: bytes) -> None:
    for body in _answers_at(ts):
        with pytest.raises(MalformedAnswer, match="timestamp"):
            decode_prometheus_json(body)


def test_the_last_timestamps_inside_int64_milliseconds_decode() -> None:
    for ts, ms in [(b"9223372036854775", 9223372036854775000), (b"-9223372036854775", -9223372036854775000)]:
        for body in _answers_at(ts):
            assert ms in decode_prometheus_json(body).t_ms.tolist()


@pytest.mark.parametrize("result", [b'[1700000000"hi"]', b'[17000 00000,"0.5"]'])
def test_a_garbled_scalar_or_string_result_is_malformed(result: bytes) -> None:
    rtype = b"string" if b"hi" in result else b"scalar"
    body = b'{"status":"success","data":{"resultType":"' + rtype + b'","result":' + result + b"}}"
    with pytest.raises(MalformedAnswer):
        decode_prometheus_json(body)


@pytest.mark.parametrize("member", [b'"warnings":"abc"', b'"infos":{"a":"b"}', b'"warnings":["a",1]'])
def test_warnings_or_infos_not_a_list_of_strings_are_malformed_on_either_path(member: bytes) -> None:
    # The second body has an exponent in a timestamp: the slow path decodes it.
    for ts in (b"1", b"1e0"):
        body = (b'{"status":"success",' + member + b',"data":{"resultType":"vector","result":[{"metric":{},'
                b'"value":[' + ts + b',"1"]}]}}')
        with pytest.raises(MalformedAnswer):
            decode_prometheus_json(body)


def mutated(body: bytes, rng: random.Random) -> bytes:
    b = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        p = rng.randrange(len(b))
        op = rng.random()
        c = rng.choice(b'{}[],:"\\0123456789.eE-+ xn')
        if op < 0.5:
            b[p] = c
        elif op < 0.75:
            del b[p]
        else:
            b.insert(p, c)
    return bytes(b)


@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["matrix", "vector", "scalar", "string"])
def test_mutated_answers_decode_or_are_the_codecs_error(which: int) -> None:
    """Random edits of an answer: a QueryResult or CodecError, never another exception, quickly."""
    rng = random.Random(29 + which)
    body = answers()[which]
    outcomes = {"decoded": 0, "codec error": 0}
    t0 = time.perf_counter()
    for _ in range(2_000):
        m = mutated(body, rng)
        try:
            decode_prometheus_json(m)
            outcomes["decoded"] += 1
        except CodecError:
            outcomes["codec error"] += 1
    assert outcomes["decoded"] > 0 and outcomes["codec error"] > 0, outcomes
    assert time.perf_counter() - t0 < 20
