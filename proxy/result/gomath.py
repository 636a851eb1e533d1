"""Go 1.19's math.Sin, Cos, Tan (pure Go, Cephes) and math.Log (amd64 assembly), bit for bit,
so that PromQL's sin/cos/tan/ln/log2/log10 answer exactly as Prometheus's. The C library's
versions are more accurate and differ from Go's in the last bit for a third of the inputs.

Arguments of |x| >= 2**29 (Go reduces them with Payne-Hanek, not ported) use the C library's
sin/cos/tan. Exp (amd64 assembly, with an FMA path chosen by the CPU) is not ported.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

__all__ = ["go_cos", "go_log", "go_log2", "go_log10", "go_sin", "go_tan"]

F64 = npt.NDArray[np.float64]

_PI4A = 7.85398125648498535156e-1
_PI4B = 3.77489470793079817668e-8
_PI4C = 2.69515142907905952645e-15
_FOUR_OVER_PI = 1.2732395447351628  # Go's exact constant 4/Pi, rounded once
_REDUCE = float(1 << 29)
_S0, _S1, _S2, _S3, _S4, _S5 = (1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
                                -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1)
_C0, _C1, _C2, _C3, _C4, _C5 = (-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
                                2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2)
_TP0, _TP1, _TP2 = -1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7
_TQ1, _TQ2, _TQ3, _TQ4 = 1.36812963470692954678e4, -1.32089234440210967447e6, 2.50083801823357915839e7, \
    -5.38695755929454629881e7
# 1/Ln2 and 1/Ln10 as Go's constant arithmetic rounds them (exact quotient, rounded once).
_INV_LN2 = 1.4426950408889634
_INV_LN10 = 0.4342944819032518


@njit(cache=True)
def _octant(x):  # type: ignore[no-untyped-def]
    j = np.uint64(x * _FOUR_OVER_PI)
    y = float(j)
    if j & np.uint64(1) == np.uint64(1):
        j += np.uint64(1)
        y += 1.0
    z = ((x - y * _PI4A) - y * _PI4B) - y * _PI4C
    return j, z


@njit(cache=True)
def _sin_poly(z, zz):  # type: ignore[no-untyped-def]
    return z + z * zz * ((((((_S0 * zz) + _S1) * zz + _S2) * zz + _S3) * zz + _S4) * zz + _S5)


@njit(cache=True)
def _cos_poly(zz):  # type: ignore[no-untyped-def]
    return 1.0 - 0.5 * zz + zz * zz * ((((((_C0 * zz) + _C1) * zz + _C2) * zz + _C3) * zz + _C4) * zz + _C5)


@njit(cache=True)
def _sin_cos(v, want_cos):  # type: ignore[no-untyped-def]
    out = np.empty_like(v)
    for i in range(len(v)):
        x = v[i]
        if math.isnan(x) or math.isinf(x):
            out[i] = math.nan
            continue
        if not want_cos and x == 0:
            out[i] = x
            continue
        sign = False
        if want_cos:
            x = abs(x)
        elif x < 0:
            x = -x
            sign = True
        if x >= _REDUCE:
            out[i] = math.cos(v[i]) if want_cos else math.sin(v[i])
            continue
        j, z = _octant(x)
        j &= np.uint64(7)
        if j > np.uint64(3):
            j -= np.uint64(4)
            sign = not sign
        if want_cos and j > np.uint64(1):
            sign = not sign
        zz = z * z
        poly_sin = (j == np.uint64(1) or j == np.uint64(2)) == want_cos
        y = _sin_poly(z, zz) if poly_sin else _cos_poly(zz)
        out[i] = -y if sign else y
    return out


@njit(cache=True, error_model="numpy")
def _tan(v):  # type: ignore[no-untyped-def]
    out = np.empty_like(v)
    for i in range(len(v)):
        x = v[i]
        if x == 0 or math.isnan(x):
            out[i] = x
            continue
        if math.isinf(x):
            out[i] = math.nan
            continue
        sign = False
        if x < 0:
            x = -x
            sign = True
        if x >= _REDUCE:
            out[i] = math.tan(v[i])
            continue
        j, z = _octant(x)
        zz = z * z
        if zz > 1e-14:
            y = z + z * (zz * (((_TP0 * zz) + _TP1) * zz + _TP2) / ((((zz + _TQ1) * zz + _TQ2) * zz + _TQ3) * zz + _TQ4))
        else:
            y = z
        if j & np.uint64(2) == np.uint64(2):
            y = -1 / y
        out[i] = -y if sign else y
    return out


_HSQRT2 = 7.07106781186547524401e-01
_LN2HI, _LN2LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_L1, _L2, _L3, _L4 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, \
    2.222219843214978396e-01
_L5, _L6, _L7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01


@njit(cache=True, error_model="numpy")
def _log(v):  # type: ignore[no-untyped-def]
    """math.archLog (log_amd64.s), instruction for instruction."""
    bits = v.view(np.uint64)
    out = np.empty_like(v)
    cell = np.empty(1, dtype=np.uint64)
    cell_f = cell.view(np.float64)
    for i in range(len(v)):
        b = bits[i]
        if b & np.uint64(0x7FFFFFFFFFFFFFFF) == np.uint64(0):
            out[i] = -math.inf
            continue
        if b >= np.uint64(0x8000000000000000):  # negative (signed compare), -NaN included
            out[i] = math.nan
            continue
        if b >= np.uint64(0x7FF0000000000000):
            out[i] = v[i]
            continue
        f1b = (b & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x3FE0000000000000)
        cell[0] = f1b
        f1 = cell_f[0]
        k = float(np.int64((b >> np.uint64(52)) & np.uint64(0x7FF)) - 0x3FE)
        if not (_HSQRT2 < f1):
            k -= 1.0
            f1 *= 2.0
        f = f1 - 1.0
        s = f / (2.0 + f)
        s2 = s * s
        s4 = s2 * s2
        t1 = s2 * (((_L7 * s4 + _L5) * s4 + _L3) * s4 + _L1)
        t2 = s4 * ((_L6 * s4 + _L4) * s4 + _L2)
        r = t1 + t2
        hfsq = 0.5 * f * f
        out[i] = k * _LN2HI - ((hfsq - (s * (hfsq + r) + k * _LN2LO)) - f)
    return out


def go_sin(x: F64) -> F64:
    return _sin_cos(np.ascontiguousarray(x, dtype=np.float64), False)  # type: ignore[no-any-return]


def go_cos(x: F64) -> F64:
    return _sin_cos(np.ascontiguousarray(x, dtype=np.float64), True)  # type: ignore[no-any-return]


def go_tan(x: F64) -> F64:
    return _tan(np.ascontiguousarray(x, dtype=np.float64))  # type: ignore[no-any-return]


def go_log(x: F64) -> F64:
    return _log(np.ascontiguousarray(x, dtype=np.float64))  # type: ignore[no-any-return]


def go_log10(x: F64) -> F64:
    """math.Log10 = Log(x) * (1/Ln10)."""
    return go_log(x) * _INV_LN10


def go_log2(x: F64) -> F64:
    """math.Log2: Frexp; exact for powers of two, else Log(frac)*(1/Ln2) + exp."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        frac, exp = np.frexp(x)
        out = go_log(frac) * _INV_LN2 + exp.astype(np.float64)
        out = np.where(frac == 0.5, (exp - 1).astype(np.float64), out)
        special = (x <= 0) | ~np.isfinite(x)
        return np.where(special, go_log(x), out)
