"""`QueryResult` -> the JSON answer, byte for byte as Prometheus 2.42 writes it.

`encode_prometheus_json` (one piece) and `iter_prometheus_json` (chunks of ~16k samples,
for streaming large answers) write (checked against a real 2.42):
- `{"status":"success","data":{"resultType":...,"result":...}}`, then `"warnings":[...]`
  and `"infos":[...]` after `data`, each only when non-empty; no whitespace, no newline.
- timestamps: unix seconds, then `.` and exactly 3 digits of milliseconds when the
  millisecond part is not zero (`1700000000`, `1700000000.500`, `-1.500`).
- values: Go's `strconv.AppendFloat(v, 'f', -1, 64)`, except `'e'` when |v| < 1e-6 or
  |v| >= 1e21 (`"0.000001"`, `"1e-07"`, `"100000000000000000000"`, `"1e+21"`, `"-0"`),
  and `"NaN"`, `"+Inf"`, `"-Inf"`.
- label sets: as proxy/result/labels.py writes them (the result's canonical keys, so labels
  decoded from Prometheus or merged are not formatted again).
Integral values (|v| < 2**53) are written by a compiled kernel; the digits of the others
come from orjson's shortest round-trip formatting of all of them in one call, and the kernel
rewrites each into Go's notation while it assembles the answer. One difference cannot be
avoided: Prometheus writes an invalid UTF-8 byte in a label as the escape `\\ufffd`;
decoded, that is the character U+FFFD, which Prometheus (and we) write raw.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import orjson
from numba import njit

from proxy.result import QueryResult
from proxy.result.labels import go_json_string

from .json_scan import literal_bytes

__all__ = ["encode_prometheus_json", "encode_samples", "format_timestamp", "format_value", "head_tail",
           "iter_prometheus_json"]

_W_METRIC = literal_bytes(b'{"metric":')
_W_VALUES = literal_bytes(b',"values":[')
_W_VALUE = literal_bytes(b',"value":')
_W_NAN = literal_bytes(b"NaN")
_W_PINF = literal_bytes(b"+Inf")
_W_NINF = literal_bytes(b"-Inf")
_D4 = np.array([[ord(c) for c in f"{i:04d}"] for i in range(10000)], dtype=np.uint8)


def format_value(v: float) -> str:
    """One value as Prometheus writes it (the reference for the vectorised encoder)."""
    if v != v:
        return "NaN"
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        return repr(v)  # Python's repr here is Go's 'e' with shortest digits: 1e-07, 1e+21
    r = repr(v)
    if "e" not in r:
        return r[:-2] if r.endswith(".0") else r
    mant, _, exp_s = r.partition("e")
    neg = mant.startswith("-")
    digits = mant.lstrip("-").replace(".", "")
    point = mant.lstrip("-").find(".")
    dp = (point if point >= 0 else len(mant.lstrip("-"))) + int(exp_s)
    digits = digits.rstrip("0") or "0"
    if dp <= 0:
        s = "0." + "0" * (-dp) + digits
    elif dp >= len(digits):
        s = digits + "0" * (dp - len(digits))
    else:
        s = digits[:dp] + "." + digits[dp:]
    return "-" + s if neg else s


def format_timestamp(t_ms: int) -> str:
    """One timestamp as Prometheus writes it (jsonutil.MarshalTimestamp)."""
    sign = ""
    if t_ms < 0:
        sign, t_ms = "-", -t_ms
    sec, frac = divmod(t_ms, 1000)
    return f"{sign}{sec}.{frac:03d}" if frac else f"{sign}{sec}"


# --------------------------------------------------------------------------------------

@njit(cache=True, inline='always')
def _put(out, o, lit):  # type: ignore[no-untyped-def]
    for j in range(len(lit)):
        out[o + j] = lit[j]
    return o + len(lit)


@njit(cache=True)
def _put_uint(out, o, x):  # type: ignore[no-untyped-def]
    if x == 0:
        out[o] = 48
        return o + 1
    n = 0
    y = x
    while y > 0:
        y //= 10
        n += 1
    p = o + n - 1
    while x > 0:
        out[p] = 48 + x % 10
        x //= 10
        p -= 1
    return o + n


@njit(cache=True)
def _put_value(out, o, v, tok, p, q, dig):  # type: ignore[no-untyped-def]
    """Write v in Prometheus notation; tok[p:q] is orjson's shortest repr of v (finite v)."""
    if v != v:
        return _put(out, o, _W_NAN)
    if v == np.inf:
        return _put(out, o, _W_PINF)
    if v == -np.inf:
        return _put(out, o, _W_NINF)
    neg = False
    i = p
    if tok[i] == 45:
        neg = True
        i += 1
    nd = 0
    dp = 0
    seen_dot = False
    while i < q and tok[i] != 101 and tok[i] != 69:
        c = tok[i]
        if c == 46:
            seen_dot = True
        elif nd == 0 and c == 48:
            if seen_dot:
                dp -= 1
        else:
            dig[nd] = c
            nd += 1
            if not seen_dot:
                dp += 1
        i += 1
    if i < q:  # exponent
        i += 1
        eneg = False
        if tok[i] == 45 or tok[i] == 43:
            eneg = tok[i] == 45
            i += 1
        ev = 0
        while i < q:
            ev = ev * 10 + (tok[i] - 48)
            i += 1
        dp += -ev if eneg else ev
    while nd > 0 and dig[nd - 1] == 48:
        nd -= 1
    if neg:
        out[o] = 45
        o += 1
    if nd == 0:
        out[o] = 48
        return o + 1
    a = abs(v)
    if a < 1e-6 or a >= 1e21:
        out[o] = dig[0]
        o += 1
        if nd > 1:
            out[o] = 46
            o += 1
            for j in range(1, nd):
                out[o] = dig[j]
                o += 1
        out[o] = 101
        x = dp - 1
        if x < 0:
            out[o + 1] = 45
            x = -x
        else:
            out[o + 1] = 43
        o += 2
        if x < 10:
            out[o] = 48
            o += 1
        return _put_uint(out, o, x)
    if dp <= 0:
        out[o] = 48
        out[o + 1] = 46
        o += 2
        for _ in range(-dp):
            out[o] = 48
            o += 1
        for j in range(nd):
            out[o] = dig[j]
            o += 1
        return o
    if dp >= nd:
        for j in range(nd):
            out[o] = dig[j]
            o += 1
        for _ in range(dp - nd):
            out[o] = 48
            o += 1
        return o
    for j in range(dp):
        out[o] = dig[j]
        o += 1
    out[o] = 46
    o += 1
    for j in range(dp, nd):
        out[o] = dig[j]
        o += 1
    return o


@njit(cache=True, inline='always')
def _put_small(out, o, x):  # type: ignore[no-untyped-def]
    """0 <= x < 10000 without leading zeros."""
    if x < 10:
        out[o] = 48 + x
        return o + 1
    skip = 2 if x < 100 else (1 if x < 1000 else 0)
    for j in range(skip, 4):
        out[o] = _D4[x, j]
        o += 1
    return o


@njit(cache=True, nogil=True)
def _non_integral(v):  # type: ignore[no-untyped-def]
    """The values the encoder does not write itself (its predicate exactly), in order, for
    orjson to format; NaN and infinities become 0.0 placeholders (orjson would write null;
    the encoder writes them itself)."""
    out = np.empty(len(v), dtype=np.float64)
    n = 0
    for k in range(len(v)):
        x = v[k]
        if abs(x) < 9007199254740992.0 and np.floor(x) == x:
            continue
        out[n] = x if np.isfinite(x) else 0.0
        n += 1
    return out[:n]


@njit(cache=True, inline='always')
def _put_sample(out, o, t, x, tok, p, dig, hi_dig, hi):  # type: ignore[no-untyped-def]
    """One sample `[t,"x"]` at o. tok[p:] is orjson's dump of the non-integral values from
    this one on (their tokens in order); hi holds the digits of the timestamp's seconds above
    the last four written last time (their value, their length in hi_dig). Returns (end, p)."""
    out[o] = 91
    o += 1
    # Timestamp: the digits above the last four repeat from sample to sample.
    if t < 0:
        out[o] = 45
        o += 1
        t = -t
    sec = t // 1000
    frac = t - sec * 1000
    h = sec // 10000
    lo = sec - h * 10000
    if h > 0:
        if h != hi[0]:
            hi[0] = h
            hi[1] = _put_uint(hi_dig, 0, h)
        n = hi[1]
        for j in range(n):
            out[o + j] = hi_dig[j]
        o += n
        for j in range(4):
            out[o + j] = _D4[lo, j]
        o += 4
    else:
        o = _put_small(out, o, lo)
    if frac != 0:
        out[o] = 46
        out[o + 1] = _D4[frac, 1]
        out[o + 2] = _D4[frac, 2]
        out[o + 3] = _D4[frac, 3]
        o += 4
    out[o] = 44
    out[o + 1] = 34
    o += 2
    a = abs(x)
    if a < 9007199254740992.0 and np.floor(x) == x:
        if x < 0 or (x == 0 and math.copysign(1.0, x) < 0):
            out[o] = 45
            o += 1
        ia = np.int64(a)
        if ia < 10000:
            o = _put_small(out, o, ia)
        else:
            o = _put_uint(out, o, ia)
    else:
        # Copy orjson's token while looking for its end (one pass); its
        # positional form is Go's, but for a trailing ".0"; rewrite the others.
        q = p
        o0 = o
        has_e = False
        c = tok[q]
        while c != 44 and c != 93:
            out[o] = c
            o += 1
            has_e = has_e or c == 101
            q += 1
            c = tok[q]
        if x != x or a == np.inf or has_e:
            o = _put_value(out, o0, x, tok, p, q, dig)
        elif q - p >= 2 and tok[q - 1] == 48 and tok[q - 2] == 46:
            o -= 2
        p = q + 1
    out[o] = 34
    out[o + 1] = 93
    o += 2
    return o, p


@njit(cache=True, nogil=True)
def _encode_series_block(out, o, lab_buf, lab_s, lab_e, offsets, s0, s1, t_ms, v, tok, is_matrix):  # type: ignore[no-untyped-def]
    """Series s0..s1-1 as Prometheus result elements joined by ','. Integral values
    (|v| < 2**53) are written here; tok is orjson's dump of the other values of
    v[offsets[s0]:offsets[s1]], in order, non-finite ones replaced by 0. Returns the end."""
    dig = np.empty(40, dtype=np.uint8)
    hi_dig = np.empty(24, dtype=np.uint8)
    hi = np.array([-1, 0], dtype=np.int64)  # the digits in hi_dig: their value, their length
    p = 1  # after '['
    for s in range(s0, s1):
        if s > s0:
            out[o] = 44
            o += 1
        o = _put(out, o, _W_METRIC)
        for j in range(lab_s[s], lab_e[s]):
            out[o] = lab_buf[j]
            o += 1
        o = _put(out, o, _W_VALUES if is_matrix else _W_VALUE)
        for k in range(offsets[s], offsets[s + 1]):
            if k > offsets[s]:
                out[o] = 44
                o += 1
            o, p = _put_sample(out, o, t_ms[k], v[k], tok, p, dig, hi_dig, hi)
        if is_matrix:
            out[o] = 93
            o += 1
        out[o] = 125
        o += 1
    return o


_STREAM_BATCH_SAMPLES = 16_384  # ~0.4 MB chunks: bounded memory, no CPU cost measured
_WINDOW_SAMPLES = 65_536  # samples gathered at a time from a merged answer's pieces (~1 MB; 4 MB cost as much time)


def encode_prometheus_json(result: QueryResult) -> bytes:
    """The whole answer as Prometheus 2.42 writes it."""
    return b"".join(iter_prometheus_json(result, None))


def iter_prometheus_json(
    result: QueryResult, batch_samples: int | None = _STREAM_BATCH_SAMPLES
) -> Iterator[bytes]:
    """The same bytes as `encode_prometheus_json`, in chunks of about `batch_samples`
    samples (whole series per chunk; None: one chunk), for streaming large answers."""
    head, tail = head_tail(result)
    if result.result_type in ("scalar", "string"):
        yield head + _small_body(result) + tail
    elif result.n_series == 0:
        yield head + tail
    else:
        yield from _iter_blocks(result, batch_samples, head, tail)


def head_tail(result: QueryResult) -> tuple[bytes, bytes]:
    head = b'{"status":"success","data":{"resultType":"' + result.result_type.encode() + b'","result":'
    tail = b"}"
    if result.warnings:
        tail += b',"warnings":' + _go_str_list(result.warnings)
    if result.infos:
        tail += b',"infos":' + _go_str_list(result.infos)
    tail += b"}"
    if result.result_type in ("matrix", "vector"):
        return head + b"[", b"]" + tail
    return head, tail


def _go_str_list(items: list[str]) -> bytes:
    return ("[" + ",".join(go_json_string(s) for s in items) + "]").encode()


def _small_body(result: QueryResult) -> bytes:
    t = format_timestamp(int(result.t_ms[0]))
    if result.result_type == "string":
        return f"[{t},{go_json_string(result.string_value or '')}]".encode()
    return f'[{t},"{format_value(float(result.value[0]))}"]'.encode()


_SCRATCH = threading.local()
_SCRATCH_MAX = 64 << 20


def _scratch(size: int) -> npt.NDArray[np.uint8]:
    """A per-thread output buffer, kept between answers: writing tens of megabytes into
    fresh memory costs about as much in page faults as formatting them. Its content is
    copied out (tobytes) before any caller code runs, so interleaved streams are safe."""
    buf: npt.NDArray[np.uint8] | None = getattr(_SCRATCH, "buf", None)
    if buf is not None and len(buf) >= size:
        return buf
    buf = np.empty(max(size, 1 << 20), dtype=np.uint8)
    if size <= _SCRATCH_MAX:
        _SCRATCH.buf = buf
    return buf


def _iter_blocks(result: QueryResult, batch_samples: int | None, head: bytes, tail: bytes) -> Iterator[bytes]:
    n = result.n_series
    is_matrix = result.result_type == "matrix"
    first = True
    # A merged answer whose samples are still in its pieces gives them a window at a time,
    # and the label sets of a window are joined for that window alone.
    for w0, w1, t_w, v_w in result.sample_windows(_WINDOW_SAMPLES):
        offsets = result.offsets[w0 : w1 + 1] - result.offsets[w0] if w0 else result.offsets[: w1 + 1]
        raw, lab_s, lab_e = result.label_block_of(w0, w1)
        lab_buf = np.frombuffer(raw, dtype=np.uint8)
        t = np.ascontiguousarray(t_w, dtype=np.int64)
        v = np.ascontiguousarray(v_w, dtype=np.float64)
        m = w1 - w0
        # Batch boundaries on whole series.
        if batch_samples is None:
            bounds = [0, m]
        else:
            targets = np.arange(batch_samples, int(offsets[-1]), batch_samples)
            cut = np.searchsorted(offsets, targets, side="left")
            bounds = sorted({0, m, *[int(c) for c in cut if 0 < c < m]})
        for bi in range(len(bounds) - 1):
            s0, s1 = bounds[bi], bounds[bi + 1]
            a, b = int(offsets[s0]), int(offsets[s1])
            vb = v[a:b]
            # The kernel writes integral values itself; orjson gives the shortest digits of
            # the others (the same predicate as the kernel's, or the tokens go out of step).
            other = _non_integral(vb)
            tok = np.frombuffer(orjson.dumps(other, option=orjson.OPT_SERIALIZE_NUMPY), dtype=np.uint8)
            prefix = head if first else b","
            suffix = tail if w1 == n and bi == len(bounds) - 2 else b""
            first = False
            nbytes = int((lab_e[s0:s1] - lab_s[s0:s1]).sum()) + (s1 - s0) * 24 + (b - a) * 60
            out = _scratch(len(prefix) + nbytes + len(suffix))
            out[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
            end = _encode_series_block(
                out, len(prefix), lab_buf, lab_s, lab_e, offsets, s0, s1, t, v, tok, is_matrix
            )
            out[end : end + len(suffix)] = np.frombuffer(suffix, dtype=np.uint8)
            yield out[: end + len(suffix)].tobytes()


# -- the encoded samples of one result, for splicing (codec/json_splice.py) ------------------

@njit(cache=True, nogil=True)
def _encode_samples(out, at, t_ms, v, tok):  # type: ignore[no-untyped-def]
    """Every sample as `,[t,"v"]`, back to back (series boundaries are the caller's: the
    samples of a series are a contiguous run); at[k] is where sample k's comma is, at[n] the
    end. tok as for `_encode_series_block`, over all of v. Returns the end."""
    dig = np.empty(40, dtype=np.uint8)
    hi_dig = np.empty(24, dtype=np.uint8)
    hi = np.array([-1, 0], dtype=np.int64)
    o = 0
    p = 1
    for k in range(len(t_ms)):
        at[k] = o
        out[o] = 44
        o, p = _put_sample(out, o + 1, t_ms[k], v[k], tok, p, dig, hi_dig, hi)
    at[len(t_ms)] = o
    return o


def encode_samples(t_ms: npt.NDArray[np.int64],
                   value: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.integer]]:
    """The samples as the encoder writes them, each as `,[t,"v"]` (a leading comma), and
    where each starts: samples a..b-1 of a series are `buf[at[a] + 1 : at[b]]` in its
    `"values":[...]`, and runs of one series' samples from several results join as they are."""
    t = np.ascontiguousarray(t_ms, dtype=np.int64)
    v = np.ascontiguousarray(value, dtype=np.float64)
    tok = np.frombuffer(orjson.dumps(_non_integral(v), option=orjson.OPT_SERIALIZE_NUMPY), dtype=np.uint8)
    # Not the thread's scratch buffer: this runs in worker threads too, each of which
    # would keep one.
    out = np.empty(len(t) * 60 + 1, dtype=np.uint8)
    at = np.empty(len(t) + 1, dtype=np.int64)
    end = _encode_samples(out, at, t, v, tok)
    # Kept: positions as int32 (a cell's bytes are far below 2 GiB), half the memory.
    return out[:end].copy(), at.astype(np.int32) if end < 2**31 else at
