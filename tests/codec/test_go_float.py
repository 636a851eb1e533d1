"""Go's strconv.ParseFloat for the JSON scanner (proxy/codec/go_float.py), called directly:
whatever it decides is the correctly rounded float64 (Go's ParseFloat rounds to nearest even,
as Python's float() does), and what it cannot decide it leaves to the caller (-1)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from proxy.codec.go_float import parse_float


def _parse(text: str, end: int | None = None) -> tuple[int, float]:
    b = np.frombuffer(text.encode(), dtype=np.uint8)
    out = np.zeros(1, dtype=np.float64)
    nxt = parse_float(b, 0, len(b) if end is None else end, out, out.view(np.uint64), 0)
    return int(nxt), float(out[0])


def _bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def _decided_exactly(texts: list[str]) -> int:
    decided = 0
    for t in texts:
        nxt, v = _parse(t)
        if nxt == -1:
            continue
        assert nxt == len(t), t
        assert _bits(v) == _bits(float(t)), t
        decided += 1
    return decided


def test_random_floats_written_as_prometheus_writes_them() -> None:
    # Prometheus writes strconv.FormatFloat(v, 'f', -1, 64) (or 'e' for very large/small):
    # the shortest digits that read back to v. Python's repr gives the same digits.
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**63, size=20_000, dtype=np.uint64)
    vals = [v for v in bits.view(np.float64).tolist() if math.isfinite(v)]
    vals += (rng.random(5_000) * 10.0 ** rng.integers(-8, 20, 5_000)).tolist()
    texts = [repr(v) for v in vals] + [format(v, ".17g") for v in vals[:5_000]]
    decided = _decided_exactly(texts)
    # Eisel-Lemire decides all but a vanishing fraction of 17-digit inputs: the slow path is rare.
    assert decided >= 0.99 * len(texts)


@pytest.mark.parametrize(("text", "want"), [
    ("0", 0.0), ("1", 1.0), ("0.1", 0.1), ("1e21", 1e21), ("1e+21", 1e21), ("1E5", 1e5),
    ("123456789.12345679", 123456789.12345679), ("1.7976931348623157e+308", 1.7976931348623157e308),
    ("00012", 12.0), (".5", 0.5), ("5.", 5.0), ("+1.5", 1.5), ("1700000000.123", 1700000000.123),
])
def test_values(text: str, want: float) -> None:
    nxt, v = _parse(text)
    assert nxt == len(text) and _bits(v) == _bits(want)


def test_specials_as_go_spells_them() -> None:
    # strconv's special(): an optional sign then "Inf"; "NaN" without a sign.
    assert _parse("+Inf") == (4, math.inf) and _parse("-Inf") == (4, -math.inf) and _parse("Inf") == (3, math.inf)
    nxt, v = _parse("NaN")
    assert nxt == 3 and math.isnan(v)
    assert _parse("-NaN")[0] == -1
    nxt, v = _parse("-0")
    assert nxt == 2 and v == 0 and math.copysign(1.0, v) < 0  # -0 keeps its sign
    nxt, v = _parse("-0.000")
    assert nxt == 6 and math.copysign(1.0, v) < 0


def test_it_stops_at_the_first_byte_after_the_number() -> None:
    assert _parse('12.5"]') == (4, 12.5)
    assert _parse("3e2,") == (3, 300.0)
    assert _parse("1234", end=2) == (2, 12.0)  # never reads past `e`


@pytest.mark.parametrize("text", [
    "", "-", ".", "e5", "1e", "1e+", "abc",
    "12345678901234567890",  # 20 significant digits: beyond uint64, the caller decides
    "0.00000000000000000000123456789012345678901",
])
def test_what_it_leaves_to_the_caller(text: str) -> None:
    assert _parse(text)[0] == -1


def test_a_halfway_case_is_exact_or_left_to_the_caller() -> None:
    # 2^53 + 1 lies halfway between two float64s and rounds to even (2^53): Eisel-Lemire
    # cannot tell a halfway case from its truncated mantissa and gives up, never guesses.
    _decided_exactly(["9007199254740993", "9007199254740995", "2.2250738585072011e-308"])  # asserts exactness


def test_leading_zeros_are_not_significant_digits() -> None:
    text = "0.0000000000000000001234567890123456789"  # 19 significant digits after 19 zeros
    nxt, v = _parse(text)
    assert nxt == len(text) and _bits(v) == _bits(float(text))
