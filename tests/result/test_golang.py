"""proxy/result/golang.py: Go standard-library functions whose exact results reach
Prometheus's answers (Prometheus 2.42 is built with Go 1.19). Expected values come from the Go
documentation's special cases (math.Pow, Atan2, Max, Min, Atan, Asin, Acos;
strconv.ParseFloat's syntax and ErrRange; strconv.Quote; strconv.FormatFloat 'f' and 'g'
with precision -1, which fmt's %v uses; int64(f) on amd64; time.Unix(s, 0).UTC()'s calendar
fields), worked out by hand, or from Python's own calendar for the date fields; math.Pow and
Atan2 of ordinary arguments against golden values printed by Go 1.19.8 itself."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np
import pytest

from proxy.result.golang import (
    go_abs_seconds,
    go_acos,
    go_asin,
    go_atan,
    go_atan2,
    go_date_fields,
    go_days_in_month,
    go_float_to_int64,
    go_format_f,
    go_format_v,
    go_is_leap,
    go_label_name_ok,
    go_max,
    go_min,
    go_parse_float,
    go_pow,
    go_quote,
)

NAN, INF = math.nan, math.inf
PI = math.pi


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def _one(fn, *args: float) -> float:  # type: ignore[no-untyped-def]
    return float(np.asarray(fn(*[np.array([a]) for a in args])).reshape(-1)[0])


# -- strconv.ParseFloat ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("1.", 1.0), ("-0", -0.0), ("1e-400", 0.0),  # underflow is no error
    ("0x1.8p1", 3.0), ("0X1P-1074", 5e-324),
    ("1.7976931348623158e308", 1.7976931348623157e308),  # rounds to the largest double
    ("Inf", INF), ("+INF", INF), ("-Infinity", -INF), ("infinity", INF), ("nan", NAN), ("NaN", NAN),
    ("1_000.5", 1000.5),
])
def test_parse_float(text: str, want: float) -> None:
    got = go_parse_float(text)
    assert got is not None and _same(got, want)


@pytest.mark.parametrize("text", [
    "1.7976931348623159e308", "-1e309", "0x1p1024",  # past the largest double: ErrRange
    "+nan", "-NaN", "infin", "inf ", "", ".", "e1", ".e1", "1e", "0x1", "0x", "1.5.", "--1", "1_", "_1", "0x_",
    "١",  # an Arabic-Indic digit: Go reads ASCII digits only
])
def test_parse_float_errors(text: str) -> None:
    assert go_parse_float(text) is None


# -- math.Pow ------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "y", "want"), [
    (NAN, 0.0, 1.0), (INF, -0.0, 1.0),  # Pow(x, ±0) = 1 for any x
    (1.0, NAN, 1.0), (1.0, INF, 1.0),  # Pow(1, y) = 1 for any y
    (NAN, 1.0, NAN), (-3.5, 1.0, -3.5),  # Pow(x, 1) = x
    (NAN, 2.0, NAN), (2.0, NAN, NAN),
    (0.0, -3.0, INF), (-0.0, -3.0, -INF),  # ±0, odd integer < 0
    (-0.0, -INF, INF), (-0.0, INF, 0.0),
    (-0.0, -2.0, INF), (-0.0, -0.5, INF),  # ±0, finite y < 0 not an odd integer
    (-0.0, 3.0, -0.0), (0.0, 3.0, 0.0),  # ±0, odd integer > 0
    (-0.0, 2.0, 0.0), (-0.0, 0.5, 0.0),  # ±0, finite y > 0 not an odd integer
    (-1.0, INF, 1.0), (-1.0, -INF, 1.0),
    (1.5, INF, INF), (-1.5, -INF, 0.0), (0.5, INF, 0.0), (-0.5, -INF, INF),
    (INF, 0.1, INF), (INF, -0.1, 0.0),
    (-INF, 3.0, -INF), (-INF, 2.0, INF), (-INF, -3.0, -0.0), (-INF, -2.0, 0.0),  # Pow(-0, -y)
    (-8.0, 1.0 / 3.0, NAN), (-2.0, 0.5, NAN),  # finite x < 0, finite non-integer y
    (2.0, 0.5, math.sqrt(2.0)), (2.0, -0.5, 1.0 / math.sqrt(2.0)),
    (10.0, 22.0, 1e22), (-2.0, 3.0, -8.0), (-2.0, -3.0, -0.125), (2.0, -1074.0, 5e-324),
    (2.0, 1024.0, INF), (0.5, 1075.0, 0.0), (-1.0, 2.0**64, 1.0), (1.0000001, 2.0**64, INF),
])
def test_pow(x: float, y: float, want: float) -> None:
    assert _same(_one(go_pow, x, y), want)


def test_pow_broadcasts() -> None:
    assert go_pow(np.array([1.0, 2.0, 3.0]), 2.0).tolist() == [1.0, 4.0, 9.0]
    assert go_pow(2.0, np.array([0.0, 1.0, 10.0])).tolist() == [1.0, 2.0, 1024.0]


# Golden values printed by Go 1.19.8 itself (Debian bookworm's golang-1.19-go, linux/amd64):
# `fmt.Println(strconv.FormatFloat(math.Pow(x, y), 'g', -1, 64))` and the same for Atan2; 'g'
# with precision -1 is the shortest decimal that reads back as the same double. * marks rows
# where the C library (numpy) answers otherwise.
# math.Pow(x, y) with an integer y: repeated squaring, bit for bit
POW_INT = [
    (3.0, 40.0, 1.2157665459056929e+19),
    (1.1, 100.0, 13780.612339822364),  # *
    (10.0, -5.0, 1e-05),  # *
    (1.0000001, 10000000.0, 2.7182816939803724),  # *
    (5.0, 25.0, 2.9802322387695315e+17),
    (-3.0, 33.0, -5559060566555523.0),
    (-1.5, -11.0, -0.011561019943888409),
    (17.0, 17.0, 8.272402618863368e+20),  # *
    (-0.17153802057609724, -24.0, 2.3732885070951793e+18),  # *
    (-4.940515137834116, -18.0, 3.251619970891621e-13),
    (0.07861376913518114, 38.0, 1.0689257089213943e-42),  # *
    (0.2739707566312237, -16.0, 992504887.1659542),  # *
    (9.000030609648412, -29.0, 2.122874847404601e-28),  # *
    (-6.623796049359097, -25.0, -2.9670591554191038e-21),  # *
    (2.31767274127108, 35.0, 5981690705406.103),
    (2.0143645183010115, 10.0, 1099.9694671262578),  # *
    (-3.296571527723213, 30.0, 3482371501306189.0),  # *
    (-8.846677944862746, -35.0, -7.289410173237789e-34),  # *
    (-1.3788013846602265, 17.0, -235.24970358747092),
    (3.6545605632780145, 28.0, 5746250771750918.0),  # *
]
# with a fractional y: Exp(yf * Log(x)) is the C library's here
POW_FRAC = [
    (6.511902106930541, -26.814296182011628, 1.5170376189263133e-22),
    (85.95327284966504, -26.524693635217773, 4.946317071924379e-52),
    (79.15987795615982, 24.203885422960994, 8.937175818170853e+45),
    (38.610623075884725, -11.910149163552184, 1.2649845265512668e-19),
    (2.5, -7.3, 0.0012446233279404014),
    (7.0, 0.3, 1.792789962520997),
    (0.9, 1000.5, 1.6581762636520043e-46),
    (123.456, 7.5, 4856702621551987.0),
    (2.0, 0.1, 1.0717734625362931),
    (1e-05, 3.7, 3.1622776601683743e-19),
    (8.316140342969334, 13.155806648223269, 1265649529591.464),
    (6.732210061246625, -29.891802859349774, 1.7574158301266786e-25),
    (74.18108401168176, -20.97008436029906, 6.0227430241303175e-40),
    (53.196838288344715, -2.1384430140288657, 0.00020384099136731983),
]
ATAN2 = [
    (-8.166911643213275, 73.87057455879838, -0.1101098681380345),
    (-4.283273303057689, -8283.308055110401, -3.1410755566892803),
    (2.3535719879866974, 5.9126919570940295, 0.3788278563418617),
    (-51.46945479166649, -0.006049845383505172, -1.570913869235945),
    (-127.44192063250264, -0.00012193860355328852, -1.5707972836119544),  # *
    (-0.9729521319309982, 0.009047800105783864, -1.5614972677640795),
    (-0.0003257987791369132, -44.87279560642945, -3.141585393093211),
    (0.11470261197310308, 96.4502317602614, 0.0011892408738198277),  # *
    (-270472.6612615882, 512.776883540834, -1.5689004743017154),
    (0.0005554644145476912, -773816.8134404239, 3.141592652871969),
    (0.3561865108263888, -67194.76506178186, 3.1415873527823495),
    (982.3609357030751, -23981.12880965588, 3.100651628045433),
    (-5.715115696249722e-05, 2.4743876340690463, -2.3097091242066697e-05),
    (-0.00012390179991495032, -0.007699059528493624, -3.1255009342372246),
    (-442431.15034984547, -6.7232086803306945, -1.5708115228512196),  # *
    (-0.13008611715214613, 948.0765227661614, -0.0001372105660376799),
    (0.0008485714288068334, -0.00023822316602061777, 1.8444858816441245),
    (-9164.679117761065, -0.0009980032736817037, -1.5707964356915922),  # *
    (0.6208985027382745, -89.24449810016115, 3.1346354909823058),
    (0.012312471803347975, 342.4996177946724, 3.594886288435329e-05),  # *
]


def test_pow_integer_exponents_are_bit_for_bit_go() -> None:
    x = np.array([r[0] for r in POW_INT])
    y = np.array([r[1] for r in POW_INT])
    assert go_pow(x, y).tolist() == [r[2] for r in POW_INT]


def test_pow_fractional_exponents_are_within_two_ulp_of_go() -> None:
    """The module's documented limit: Go's Exp and Log are not ported for the fractional part."""
    x = np.array([r[0] for r in POW_FRAC])
    y = np.array([r[1] for r in POW_FRAC])
    want = np.array([r[2] for r in POW_FRAC])
    assert (np.abs(go_pow(x, y) - want) <= 2 * np.spacing(want)).all()


def test_atan2_is_bit_for_bit_go() -> None:
    y = np.array([r[0] for r in ATAN2])
    x = np.array([r[1] for r in ATAN2])
    assert go_atan2(y, x).tolist() == [r[2] for r in ATAN2]


# -- math.Atan2, Atan, Asin, Acos -------------------------------------------------------------


@pytest.mark.parametrize(("y", "x", "want"), [
    (1.0, NAN, NAN), (NAN, 1.0, NAN),
    (0.0, 1.0, 0.0), (-0.0, 0.0, -0.0),  # ±0, x >= 0 (+0 included)
    (0.0, -0.0, PI), (-0.0, -1.0, -PI),  # ±0, x <= -0
    (2.0, 0.0, PI / 2), (-2.0, -0.0, -PI / 2),
    (INF, INF, PI / 4), (-INF, INF, -PI / 4), (INF, -INF, 3 * PI / 4), (-INF, -INF, -3 * PI / 4),
    (5.0, INF, 0.0), (-5.0, INF, -0.0),
    (5.0, -INF, PI), (-5.0, -INF, -PI),
    (INF, 3.0, PI / 2), (-INF, -3.0, -PI / 2),
    (1.0, 1.0, PI / 4),  # Pi/4 + Morebits/2 rounds back to Pi/4
])
def test_atan2(y: float, x: float, want: float) -> None:
    assert _same(_one(go_atan2, y, x), want)


def test_atan2_is_within_an_ulp_of_the_c_library() -> None:
    rng = np.random.default_rng(3)
    y = rng.normal(size=2_000) * 10.0 ** rng.integers(-5, 5, size=2_000)
    x = rng.normal(size=2_000) * 10.0 ** rng.integers(-5, 5, size=2_000)
    got = go_atan2(y, x)
    want = np.arctan2(y, x)
    assert (np.abs(got - want) <= np.spacing(np.abs(want))).all()
    assert got.shape == (2_000,)


def test_atan_asin_acos() -> None:
    x = np.array([-0.0, 0.0, INF, -INF, NAN, 1.0, -1.0, 1.5])
    atan = go_atan(x).tolist()
    assert all(_same(a, b) for a, b in zip(atan[:5], [-0.0, 0.0, PI / 2, -PI / 2, NAN]))
    assert atan[5] == PI / 4
    asin = go_asin(x).tolist()
    assert all(_same(a, b) for a, b in zip(asin, [-0.0, 0.0, NAN, NAN, NAN, PI / 2, -PI / 2, NAN]))
    acos = go_acos(np.array([1.0, -1.0, 0.0, 2.0])).tolist()
    assert acos[:3] == [0.0, PI, PI / 2] and math.isnan(acos[3])  # Pi/2 - Asin(x)


# -- math.Max, math.Min ----------------------------------------------------------------------


@pytest.mark.parametrize(("x", "y", "mx", "mn"), [
    (NAN, INF, INF, NAN), (-INF, NAN, NAN, -INF),  # ±Inf wins over NaN, in either place
    (NAN, 1.0, NAN, NAN), (1.0, NAN, NAN, NAN),
    (0.0, -0.0, 0.0, -0.0), (-0.0, 0.0, 0.0, -0.0), (-0.0, -0.0, -0.0, -0.0),
    (2.0, 3.0, 3.0, 2.0),
])
def test_max_min(x: float, y: float, mx: float, mn: float) -> None:
    assert _same(_one(go_max, x, y), mx) and _same(_one(go_min, x, y), mn)


# -- int64(f) on amd64 ---------------------------------------------------------------------


def test_float_to_int64() -> None:
    lo = -(2**63)
    got = go_float_to_int64(np.array([2.9, -2.9, -0.9, NAN, INF, -INF, 2.0**63, -(2.0**63), 9223372036854774784.0]))
    assert got.tolist() == [2, -2, 0, lo, lo, lo, lo, lo, 9223372036854774784]


# -- time.Unix(s, 0).UTC() -------------------------------------------------------------------


def test_date_fields_by_hand() -> None:
    secs = np.array([0, -1, 951_782_400, 951_868_800 - 60, 4_107_542_400], dtype=np.int64)
    f = go_date_fields(go_abs_seconds(secs))
    # 1970-01-01 Thu; 1969-12-31 23:59 Wed; 2000-02-29 (a leap day, yday 59); 2000-02-29 23:59;
    # 2100-03-01 (2100 is no leap year: yday 59).
    assert f["year"].tolist() == [1970, 1969, 2000, 2000, 2100]
    assert f["month"].tolist() == [1, 12, 2, 2, 3]
    assert f["day"].tolist() == [1, 31, 29, 29, 1]
    assert f["yday"].tolist() == [0, 364, 59, 59, 59]
    assert f["weekday"].tolist() == [4, 3, 2, 2, 1]
    assert f["hour"].tolist() == [0, 23, 0, 23, 0] and f["minute"].tolist() == [0, 59, 0, 59, 0]


def test_date_fields_agree_with_the_proleptic_gregorian_calendar() -> None:
    rng = np.random.default_rng(11)
    secs = rng.integers(-62_135_596_800, 253_402_300_799, size=3_000, dtype=np.int64)  # years 1..9999
    f = go_date_fields(go_abs_seconds(secs))
    for i, s in enumerate(secs.tolist()):
        d = datetime.fromtimestamp(s, tz=timezone.utc)
        got = (f["year"][i], f["month"][i], f["day"][i], f["yday"][i], f["weekday"][i], f["hour"][i], f["minute"][i])
        assert got == (d.year, d.month, d.day, d.timetuple().tm_yday - 1, (d.weekday() + 1) % 7, d.hour, d.minute), s


def test_leap_years_and_days_in_month() -> None:
    years = np.array([1900, 2000, 2023, 2024, 0, -4, -1, -100, -400], dtype=np.int64)
    assert go_is_leap(years).tolist() == [False, True, False, True, True, True, False, False, True]
    assert [go_days_in_month(y, m) for y, m in [(2024, 2), (2023, 2), (1900, 2), (2000, 2), (2023, 4), (2023, 12),
                                                 (2023, 1)]] == [29, 28, 28, 29, 30, 31, 31]


# -- strconv.Quote, FormatFloat, label names ---------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ('a"b\\c', '"a\\"b\\\\c"'),
    ("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
    ("\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
    ("\u00a0\u2028", '"\\u00a0\\u2028"'),  # not printable for Go: \u escapes
    ("\U000e0001", '"\\U000e0001"'),
    ("héllo 😀 日本", '"héllo 😀 日本"'),  # printable runes stay
    ("", '""'),
])
def test_quote(text: str, want: str) -> None:
    assert go_quote(text) == want


@pytest.mark.parametrize(("v", "want"), [
    (5e-324, "0." + "0" * 323 + "5"),
    (1.7976931348623157e308, "17976931348623157" + "0" * 292),
    (123456789.125, "123456789.125"), (-1.5, "-1.5"), (0.0, "0"), (-0.0, "-0"),
    (0.1 + 0.2, "0.30000000000000004"), (1e21, "1" + "0" * 21), (NAN, "NaN"), (-INF, "-Inf"),
])
def test_format_f(v: float, want: str) -> None:
    assert go_format_f(v) == want


@pytest.mark.parametrize(("v", "want"), [
    (100000.0, "100000"), (999999.0, "999999"), (1e6, "1e+06"), (1234567.0, "1.234567e+06"),
    (0.0001, "0.0001"), (0.00001, "1e-05"), (1.5e300, "1.5e+300"), (-2.5e-7, "-2.5e-07"),
    (5e-324, "5e-324"), (0.30000000000000004, "0.30000000000000004"), (-0.0, "-0"), (INF, "+Inf"),
])
def test_format_v(v: float, want: str) -> None:
    assert go_format_v(v) == want


@pytest.mark.parametrize(("name", "ok"), [
    ("a", True), ("_", True), ("__name__", True), ("a1_B", True),
    ("", False), ("1a", False), ("a-b", False), ("a.b", False), ("é", False), ("a b", False),
])
def test_label_name_ok(name: str, ok: bool) -> None:
    assert go_label_name_ok(name) is ok
