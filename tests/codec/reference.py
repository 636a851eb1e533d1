"""A reference encoder of Prometheus's JSON answers (slow, obviously right: written
straightforwardly from Prometheus's Go code, util/jsonutil/marshal.go and jsoniter's string
escaping), golden answers captured from a real Prometheus 2.42 (`/usr/bin/prometheus`, empty
TSDB), and the hypothesis strategies the codec tests share (tests/codec/test_json_*.py,
test_arrow.py)."""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any

import numpy as np
from hypothesis import strategies as st

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


def _bits_to_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**64 - 1).map(_bits_to_float),
    st.integers(-(10**22), 10**22).map(float),
    st.decimals(min_value=-(10**6), max_value=10**6, places=4, allow_nan=False).map(float),
)


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
