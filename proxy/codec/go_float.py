"""Go's strconv.ParseFloat for the JSON scanner, compiled (numba): Clinger's fast path, then
the Eisel-Lemire algorithm with Go's 128-bit powers of ten; the rare value neither decides is
left to Python's float() by the caller. Exact, as Prometheus's own strconv parse.

`parse_float(b, s, e, v_out, v_bits, k)` is inlined into json_scan.py's kernels: numba's disk
cache of those callers does not notice an edit of this file, so json_scan.py drops its cache
when this file changes (`_kernels_follow`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)
_MASK52 = _U64(0x000FFFFFFFFFFFFF)
_ONE = _U64(1)
_ZERO = _U64(0)
_X1FF = _U64(0x1FF)
_SIGN = _U64(0x8000000000000000)


def _powers_of_ten_128() -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """128-bit mantissas (rounded down) of 10**e for e in [-348, 347], as Go's
    strconv.detailedPowersOfTen: (lo, hi) with the top bit of hi set."""
    lo = np.zeros(696, dtype=np.uint64)
    hi = np.zeros(696, dtype=np.uint64)
    for i, e in enumerate(range(-348, 348)):
        if e >= 0:
            v = 10**e
            bl = v.bit_length()
            v = v >> (bl - 128) if bl > 128 else v << (128 - bl)
        else:
            d = 10 ** (-e)
            v = (1 << (127 + d.bit_length())) // d
        assert v.bit_length() == 128
        hi[i] = v >> 64
        lo[i] = v & 0xFFFFFFFFFFFFFFFF
    return lo, hi


_POW10_LO, _POW10_HI = _powers_of_ten_128()
_POW10_EXACT = np.array([10.0**i for i in range(23)], dtype=np.float64)


@njit(cache=True)
def _mul64(a, b):  # type: ignore[no-untyped-def]
    a_lo = a & _M32
    a_hi = a >> _U64(32)
    b_lo = b & _M32
    b_hi = b >> _U64(32)
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _U64(32)) + (p1 & _M32) + (p2 & _M32)
    lo = (mid << _U64(32)) | (p0 & _M32)
    hi = p3 + (p1 >> _U64(32)) + (p2 >> _U64(32)) + (mid >> _U64(32))
    return hi, lo


@njit(cache=True)
def _eisel_lemire(man, exp10):  # type: ignore[no-untyped-def]
    """Go's strconv.eiselLemire64 for man != 0: (ok, IEEE bits without sign)."""
    if exp10 < -348 or exp10 > 347:
        return False, _ZERO
    clz = 0
    probe = man
    while (probe & _U64(0x8000000000000000)) == _ZERO:
        probe = probe << _ONE
        clz += 1
    man = man << _U64(clz)
    ret_exp2 = ((217706 * exp10) >> 16) + 64 + 1023 - clz
    idx = exp10 + 348
    x_hi, x_lo = _mul64(man, _POW10_HI[idx])
    if (x_hi & _X1FF) == _X1FF and (x_lo + man) < man:
        y_hi, y_lo = _mul64(man, _POW10_LO[idx])
        merged_hi = x_hi
        merged_lo = x_lo + y_hi
        if merged_lo < x_lo:
            merged_hi += _ONE
        if (merged_hi & _X1FF) == _X1FF and (merged_lo + _ONE) == _ZERO and (y_lo + man) < man:
            return False, _ZERO
        x_hi = merged_hi
        x_lo = merged_lo
    msb = x_hi >> _U64(63)
    ret_mant = x_hi >> (msb + _U64(9))
    ret_exp2 -= 1 ^ np.int64(msb)
    if x_lo == _ZERO and (x_hi & _X1FF) == _ZERO and (ret_mant & _U64(3)) == _ONE:
        return False, _ZERO
    ret_mant += ret_mant & _ONE
    ret_mant = ret_mant >> _ONE
    if (ret_mant >> _U64(53)) > _ZERO:
        ret_mant = ret_mant >> _ONE
        ret_exp2 += 1
    if ret_exp2 <= 0 or ret_exp2 >= 0x7FF:
        return False, _ZERO
    return True, (_U64(ret_exp2) << _U64(52)) | (ret_mant & _MASK52)


@njit(cache=True, inline='always')
def parse_float(b, s, e, v_out, v_bits, k):  # type: ignore[no-untyped-def]
    """Parse the number starting at b[s] (bytes up to e) into v_out[k] (v_bits is the same
    memory as uint64). Returns the index of the first byte after the number, or -1 for
    'let Python decide' (more than 19 digits, subnormals, overflow, odd syntax)."""
    i = s
    neg = False
    if i >= e:
        return -1
    c = b[i]
    if c == 45:  # '-'
        neg = True
        i += 1
    elif c == 43:  # '+'
        i += 1
    if i + 3 <= e and b[i] == 73 and b[i + 1] == 110 and b[i + 2] == 102:  # Inf
        v_out[k] = -np.inf if neg else np.inf
        return i + 3
    if i == s and i + 3 <= e and b[i] == 78 and b[i + 1] == 97 and b[i + 2] == 78:  # NaN
        v_out[k] = np.nan
        return i + 3
    # Accumulate every digit; leading zeros leave man at 0 and are counted in `lz`, so
    # that more than 19 significant digits (man overflowed) can be told apart.
    man = _ZERO
    lz = 0
    i0 = i
    while i < e:
        d = np.int64(b[i]) - 48
        if d < 0 or d > 9:
            break
        man = man * _U64(10) + _U64(d)
        lz += man == _ZERO
        i += 1
    digits = i - i0
    exp10 = 0
    if i < e and b[i] == 46:  # '.'
        i += 1
        i1 = i
        while i < e:
            d = np.int64(b[i]) - 48
            if d < 0 or d > 9:
                break
            man = man * _U64(10) + _U64(d)
            lz += man == _ZERO
            i += 1
        exp10 = i1 - i
        digits += i - i1
    if digits == 0:
        return -1
    if digits - lz > 19:
        return -1
    if i < e and (b[i] == 101 or b[i] == 69):  # e E
        i += 1
        eneg = False
        if i < e and (b[i] == 45 or b[i] == 43):
            eneg = b[i] == 45
            i += 1
        ev = 0
        ed = 0
        while i < e and 48 <= b[i] <= 57:
            if ev < 100000:
                ev = ev * 10 + (np.int64(b[i]) - 48)
            ed += 1
            i += 1
        if ed == 0:
            return -1
        exp10 += -ev if eneg else ev
    if man == _ZERO:
        v_out[k] = -0.0 if neg else 0.0
        return i
    if man <= _U64(9007199254740992) and -22 <= exp10 <= 22:
        f = np.float64(man)
        if exp10 >= 0:
            f = f * _POW10_EXACT[exp10]
        else:
            f = f / _POW10_EXACT[-exp10]
        v_out[k] = -f if neg else f
        return i
    ok, bits = _eisel_lemire(man, exp10)
    if not ok:
        return -1
    v_bits[k] = (bits | _SIGN) if neg else bits
    return i
