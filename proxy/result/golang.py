"""Go standard-library functions whose exact results reach Prometheus's answers.

    go_pow(x, y)     math.Pow, elementwise (PromQL `^`)
    go_atan2(y, x)   math.Atan2, elementwise, bit for bit (PromQL `atan2`)
    go_quote(s)      strconv.Quote (label values in Prometheus's error texts)
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["go_atan2", "go_pow", "go_quote"]

F64 = npt.NDArray[np.float64]


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
