"""Go standard-library functions whose exact results reach Prometheus's answers.

    go_pow(x, y)     math.Pow, elementwise (PromQL `^`)
    go_atan2(y, x)   math.Atan2, elementwise, bit for bit (PromQL `atan2`)
    go_quote(s)      strconv.Quote (label values in Prometheus's error texts)
    go_parse_float(s) strconv.ParseFloat(s, 64) (le labels, API times and durations)
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

import numpy as np
import numpy.typing as npt

__all__ = [
    "go_abs_seconds", "go_acos", "go_asin", "go_atan", "go_atan2", "go_date_fields", "go_days_in_month",
    "go_float_to_int64", "go_format_f", "go_format_v", "go_is_leap", "go_label_name_ok", "go_max",
    "go_min", "go_parse_float", "go_pow", "go_quote",
]

F64 = npt.NDArray[np.float64]

# [0-9], not \d: Python's \d (and float()) take any Unicode digit, Go only ASCII ones.
_DEC = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_HEX = re.compile(r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+\Z")
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
            "+infinity": math.inf, "-infinity": -math.inf, "nan": math.nan}  # Go: no signed NaN


def _underscore_ok(s: str) -> bool:
    """strconv's underscoreOK: an underscore only between digits, or a base prefix and a digit."""
    saw, i = "^", 0
    if s[:1] in ("+", "-"):
        s = s[1:]
    hexa = False
    if len(s) >= 2 and s[0] == "0" and s[1].lower() in "box":
        i, saw, hexa = 2, "0", s[1].lower() == "x"
    for c in s[i:]:
        if "0" <= c <= "9" or hexa and "a" <= c.lower() <= "f":
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def go_parse_float(s: str) -> float | None:
    """strconv.ParseFloat(s, 64), or None where Go returns an error (syntax, or a finite
    number too large: ErrRange). Underscores between digits are Go's digit separators."""
    if "_" in s:
        if not _underscore_ok(s):
            return None
        s = s.replace("_", "")
    special = _SPECIAL.get(s.lower())
    if special is not None:
        return special
    if _DEC.match(s):
        v = float(s)
    elif _HEX.match(s):
        try:
            v = float.fromhex(s)
        except OverflowError:
            return None
    else:
        return None
    return None if math.isinf(v) else v


def _is_odd_int(y: F64) -> npt.NDArray[np.bool_]:
    frac, whole = np.modf(y)
    small = np.abs(y) < 2.0**53
    wi = np.where(small, whole, 0.0).astype(np.int64)
    return small & (frac == 0) & ((wi & 1) == 1)


def go_pow(x: F64 | float, y: F64 | float) -> F64:
    """Go's math.Pow, elementwise: its special cases in its order, then x**yi by repeated
    squaring of the mantissa (bit for bit Go's result) times exp(yf*log(x)) for the
    fractional part (the C library's exp/log: may differ from Go's by an ulp)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    x = x.astype(np.float64).ravel().copy()
    y = y.astype(np.float64).ravel().copy()
    out = np.full(x.shape, np.nan)
    done = np.zeros(x.shape, dtype=bool)

    def put(mask: npt.NDArray[np.bool_], val: F64 | float) -> None:
        m = mask & ~done
        if np.ndim(val):
            out[m] = np.asarray(val)[m]
        else:
            out[m] = val
        done[m] = True

    with np.errstate(all="ignore"):
        # Pow(-Inf, y) = Pow(-0, -y): rewrite those first, then the generic cases apply.
        neg_inf = np.isneginf(x) & ~((y == 0) | np.isnan(y) | (y == 1) | np.isinf(y))
        x[neg_inf] = -0.0
        y[neg_inf] = -y[neg_inf]
        put((y == 0) | (x == 1), 1.0)
        put(y == 1, x)
        put(np.isnan(x) | np.isnan(y), np.nan)
        zero = x == 0
        odd = _is_odd_int(y)
        signbit = np.signbit(x)
        put(zero & (y < 0) & signbit & odd, -np.inf)
        put(zero & (y < 0), np.inf)
        put(zero & (y > 0) & signbit & odd, x)
        put(zero & (y > 0), 0.0)
        yinf = np.isinf(y)
        put(yinf & (x == -1), 1.0)
        put(yinf & ((np.abs(x) < 1) == np.isposinf(y)), 0.0)
        put(yinf, np.inf)
        xinf = np.isposinf(x)
        put(xinf & (y < 0), 0.0)
        put(xinf & (y > 0), np.inf)
        put(y == 0.5, np.sqrt(x))
        put(y == -0.5, 1.0 / np.sqrt(x))

        rest = ~done
        if rest.any():
            xr, yr = x[rest], y[rest]
            yf, yi = np.modf(np.abs(yr))
            res = np.full(xr.shape, np.nan)
            ok = ~((yf != 0) & (xr < 0))
            big = ok & (yi >= 2.0**63)
            res[big & (xr == -1)] = 1.0
            b2 = big & (xr != -1)
            res[b2 & ((np.abs(xr) < 1) == (yr > 0))] = 0.0
            res[b2 & ((np.abs(xr) < 1) != (yr > 0))] = np.inf
            gen = ok & ~big
            if gen.any():
                xg, yg, yfg, yig = xr[gen], yr[gen], yf[gen], yi[gen]
                hi = yfg > 0.5
                yfg = np.where(hi, yfg - 1.0, yfg)
                yig = np.where(hi, yig + 1.0, yig)
                a1 = np.ones(xg.shape)
                frac = yfg != 0
                a1[frac] = np.exp(yfg[frac] * np.log(xg[frac]))
                x1, xe_ = np.frexp(xg)
                xe = xe_.astype(np.int64)
                ae = np.zeros(xg.shape, dtype=np.int64)
                i = yig.astype(np.int64)
                while True:
                    act = i != 0
                    if not act.any():
                        break
                    over = act & ((xe < -(1 << 12)) | ((1 << 12) < xe))
                    ae[over] += xe[over]
                    i[over] = 0
                    act &= ~over
                    oddb = act & ((i & 1) == 1)
                    a1[oddb] *= x1[oddb]
                    ae[oddb] += xe[oddb]
                    x1[act] *= x1[act]
                    xe[act] <<= 1
                    small = act & (x1 < 0.5)
                    x1[small] += x1[small]
                    xe[small] -= 1
                    i[act] >>= 1
                neg = yg < 0
                a1[neg] = 1.0 / a1[neg]
                ae[neg] = -ae[neg]
                res[gen] = np.ldexp(a1, np.clip(ae, -2200, 2200).astype(np.int32))
            out[rest] = res
    return out


_ATAN_P = (-8.750608600031904122785e-01, -1.615753718733365076637e+01, -7.500855792314704667340e+01,
           -1.228866684490136173410e+02, -6.485021904942025371773e+01)
_ATAN_Q = (+2.485846490142306297962e+01, +1.650270098316988542046e+02, +4.328810604912902668951e+02,
           +4.853903996359136964868e+02, +1.945506571482613964425e+02)
_MOREBITS = 6.123233995736765886130e-17  # pi/2 = PIO2 + morebits
_TAN3PIO8 = 2.41421356237309504880


def _xatan(x: F64) -> F64:
    p0, p1, p2, p3, p4 = _ATAN_P
    q0, q1, q2, q3, q4 = _ATAN_Q
    z = x * x
    z = z * ((((p0 * z + p1) * z + p2) * z + p3) * z + p4) / (((((z + q0) * z + q1) * z + q2) * z + q3) * z + q4)
    return x * z + x


def _satan(x: F64) -> F64:
    out = np.empty_like(x)
    a = x <= 0.66
    b = ~a & (x > _TAN3PIO8)
    c = ~a & ~b
    out[a] = _xatan(x[a])
    out[b] = math.pi / 2 - _xatan(1 / x[b]) + _MOREBITS
    out[c] = math.pi / 4 + _xatan((x[c] - 1) / (x[c] + 1)) + 0.5 * _MOREBITS
    return out


def go_atan2(y: F64 | float, x: F64 | float) -> F64:
    """Go's math.Atan2 (pure Go on amd64: Cephes' atan), elementwise, bit for bit."""
    y, x = np.broadcast_arrays(np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64))
    shape = y.shape
    y, x = y.ravel(), x.ravel()
    out = np.full(y.shape, np.nan)
    done = np.isnan(y) | np.isnan(x)
    with np.errstate(all="ignore"):
        def put(mask: npt.NDArray[np.bool_], val: F64) -> None:
            m = mask & ~done
            out[m] = val[m]
            done[m] = True

        put(y == 0, np.where((x >= 0) & ~np.signbit(x), np.copysign(0.0, y), np.copysign(math.pi, y)))
        put(x == 0, np.copysign(math.pi / 2, y))
        put(np.isposinf(x), np.where(np.isinf(y), np.copysign(math.pi / 4, y), np.copysign(0.0, y)))
        put(np.isneginf(x), np.where(np.isinf(y), np.copysign(3 * math.pi / 4, y), np.copysign(math.pi, y)))
        put(np.isinf(y), np.copysign(math.pi / 2, y))
        rest = ~done
        if rest.any():
            yr, xr = y[rest], x[rest]
            t = yr / xr
            q = np.zeros_like(t)
            pos, neg = t > 0, t < 0
            q[pos] = _satan(t[pos])
            q[neg] = -_satan(-t[neg])
            q[t == 0] = t[t == 0]
            res = np.where(xr < 0, np.where(q <= 0, q + math.pi, q - math.pi), q)
            out[rest] = res
    return out.reshape(shape)


def go_quote(s: str) -> str:
    """Go's strconv.Quote (for error messages)."""
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable() and c != 0x7F:
            out.append(ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append({"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                        "\t": "\\t", "\v": "\\v"}[ch])
        elif c < 0x20 or c == 0x7F:
            out.append(f"\\x{c:02x}")
        elif c < 0x10000:
            out.append(f"\\u{c:04x}")
        else:
            out.append(f"\\U{c:08x}")
    out.append('"')
    return "".join(out)


# --------------------------------------------------------------------------------------
# math.Max / math.Min, math.Atan / Asin / Acos, Log2 / Log10 (PromQL's functions)
# --------------------------------------------------------------------------------------


def go_max(x: F64 | float, y: F64 | float) -> F64:
    """math.Max: +Inf wins over NaN, then NaN, then max(+0, -0) = +0."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    out = np.where(x > y, x, y)
    both_zero = (x == 0) & (y == 0)
    out = np.where(both_zero, np.where(np.signbit(x), y, x), out)
    out = np.where(np.isnan(x) | np.isnan(y), np.nan, out)
    return np.where(np.isposinf(x) | np.isposinf(y), np.inf, out)


def go_min(x: F64 | float, y: F64 | float) -> F64:
    """math.Min: -Inf wins over NaN, then NaN, then min(-0, +0) = -0."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    out = np.where(x < y, x, y)
    both_zero = (x == 0) & (y == 0)
    out = np.where(both_zero, np.where(np.signbit(x), x, y), out)
    out = np.where(np.isnan(x) | np.isnan(y), np.nan, out)
    return np.where(np.isneginf(x) | np.isneginf(y), -np.inf, out)


def go_atan(x: F64) -> F64:
    """math.Atan (pure Go on amd64), bit for bit."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()  # Atan(±0) = ±0
    with np.errstate(all="ignore"):
        pos, neg = x > 0, x < 0
        out[pos] = _satan(x[pos])
        out[neg] = -_satan(-x[neg])
        out[np.isnan(x)] = np.nan
    return out


def go_asin(x: F64) -> F64:
    """math.Asin (pure Go), bit for bit."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()  # Asin(±0) = ±0, NaN stays NaN
    with np.errstate(all="ignore"):
        a = np.abs(x)
        ok = (x != 0) & (a <= 1)
        out[(a > 1)] = np.nan
        av = a[ok]
        temp = np.sqrt(1 - av * av)
        hi = av > 0.7
        res = np.empty_like(av)
        res[hi] = math.pi / 2 - _satan(temp[hi] / av[hi])
        res[~hi] = _satan(av[~hi] / temp[~hi])
        out[ok] = np.where(x[ok] < 0, -res, res)
    return out


def go_acos(x: F64) -> F64:
    """math.Acos = Pi/2 - Asin(x)."""
    return math.pi / 2 - go_asin(x)


# --------------------------------------------------------------------------------------
# time.Unix(sec, 0).UTC() and its calendar fields, as Go's time package computes them
# --------------------------------------------------------------------------------------

_SEC_PER_DAY = 86400
_DAYS_400, _DAYS_100, _DAYS_4 = 365 * 400 + 97, 365 * 100 + 24, 365 * 4 + 1
_ABSOLUTE_ZERO_YEAR = -292277022399
# unixToInternal + internalToAbsolute: 719162 days from year 1 to 1970, plus the
# 292277022400 years (730692556 cycles of 146097 days) from absoluteZeroYear to year 1.
_UNIX_TO_ABS = (719162 + 730692556 * 146097) * _SEC_PER_DAY
_DAYS_BEFORE = np.array([0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365], dtype=np.int64)
_MIN_I64 = -(1 << 63)


def go_float_to_int64(v: F64) -> npt.NDArray[np.int64]:
    """int64(v) as amd64 computes it (CVTTSD2SQ): truncation; NaN and out-of-range values
    give the "integer indefinite" value, math.MinInt64."""
    v = np.asarray(v, dtype=np.float64)
    ok = np.isfinite(v) & (v < 2.0**63) & (v >= -(2.0**63))
    out = np.full(v.shape, _MIN_I64, dtype=np.int64)
    out[ok] = np.trunc(v[ok]).astype(np.int64)
    return out


def go_abs_seconds(unix_sec: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """Time.abs() of time.Unix(sec, 0).UTC(): seconds since Go's absolute zero year, uint64
    with Go's wrap-around."""
    return unix_sec.astype(np.int64).view(np.uint64) + np.uint64(_UNIX_TO_ABS)


def go_date_fields(abs_s: npt.NDArray[np.uint64]) -> dict[str, npt.NDArray[np.int64]]:
    """absDate(abs, true) plus the clock fields: year, month (1-12), day, yday (0-based),
    weekday (0 = Sunday), hour, minute."""
    d = abs_s // np.uint64(_SEC_PER_DAY)
    n = d // np.uint64(_DAYS_400)
    y = np.uint64(400) * n
    d = d - np.uint64(_DAYS_400) * n
    n = d // np.uint64(_DAYS_100)
    n = n - (n >> np.uint64(2))
    y = y + np.uint64(100) * n
    d = d - np.uint64(_DAYS_100) * n
    n = d // np.uint64(_DAYS_4)
    y = y + np.uint64(4) * n
    d = d - np.uint64(_DAYS_4) * n
    n = d // np.uint64(365)
    n = n - (n >> np.uint64(2))
    y = y + n
    d = d - np.uint64(365) * n
    year = y.astype(np.int64) + _ABSOLUTE_ZERO_YEAR
    yday = d.astype(np.int64)
    leap = go_is_leap(year)
    day = yday.copy()
    feb29 = leap & (day == 31 + 29 - 1)
    day = np.where(leap & (day > 31 + 29 - 1), day - 1, day)
    month0 = day // 31
    end = _DAYS_BEFORE[np.minimum(month0 + 1, 12)]
    after = day >= end
    begin = np.where(after, end, _DAYS_BEFORE[month0])
    month0 = np.where(after, month0 + 1, month0)
    month = month0 + 1
    mday = day - begin + 1
    month = np.where(feb29, 2, month)
    mday = np.where(feb29, 29, mday)
    wd = ((abs_s + np.uint64(1 * _SEC_PER_DAY)) % np.uint64(7 * _SEC_PER_DAY)).astype(np.int64) // _SEC_PER_DAY
    hour = (abs_s % np.uint64(_SEC_PER_DAY)).astype(np.int64) // 3600
    minute = (abs_s % np.uint64(3600)).astype(np.int64) // 60
    return {"year": year, "month": month, "day": mday, "yday": yday, "weekday": wd, "hour": hour,
            "minute": minute}


def go_is_leap(year: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    return (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))


def go_days_in_month(year: int, month: int) -> int:
    """32 - time.Date(year, month, 32, 0, 0, 0, 0, time.UTC).Day(), with Go's uint64 day
    arithmetic (daysSinceEpoch) for any year."""
    m = 1 << 64
    yy = (year - _ABSOLUTE_ZERO_YEAR) % m
    n = yy // 400
    yy -= 400 * n
    days = _DAYS_400 * n
    n = yy // 100
    yy -= 100 * n
    days += _DAYS_100 * n
    n = yy // 4
    yy -= 4 * n
    days += _DAYS_4 * n + 365 * yy
    days += int(_DAYS_BEFORE[month - 1])
    if bool(go_is_leap(np.array([year]))[0]) and month >= 3:
        days += 1
    days += 32 - 1
    abs_s = (days * _SEC_PER_DAY) % m
    # unix := int64(abs) + (absoluteToInternal + internalToUnix); Day() recomputes abs from it:
    # the two conversions cancel modulo 2**64.
    fields = go_date_fields(np.array([abs_s], dtype=np.uint64))
    return 32 - int(fields["day"][0])


# --------------------------------------------------------------------------------------
# strconv.FormatFloat
# --------------------------------------------------------------------------------------


def go_format_f(v: float) -> str:
    """strconv.FormatFloat(v, 'f', -1, 64): shortest digits that round-trip, no exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, unique=True, trim="-")


def go_format_v(v: float) -> str:
    """fmt's %v of a float64: strconv 'g' with the shortest digits, %e form when the decimal
    exponent is below -4 or at least 6 (Go's rule for shortest 'g')."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign = "-" if v < 0 else ""
    _, digs, e = Decimal(repr(abs(v))).normalize().as_tuple()
    digits = "".join(map(str, digs))
    exp10 = int(e) + len(digits) - 1
    if exp10 < -4 or exp10 >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    return sign + np.format_float_positional(abs(v), unique=True, trim="-")


def go_label_name_ok(name: str) -> bool:
    """model.LabelName.IsValid of Prometheus 2.42: [a-zA-Z_][a-zA-Z0-9_]*."""
    if not name:
        return False
    for i, c in enumerate(name):
        if not (("a" <= c <= "z") or ("A" <= c <= "Z") or c == "_" or ("0" <= c <= "9" and i > 0)):
            return False
    return True
