"""The compiled (numba) scanner of Prometheus's JSON answers (used by json_decode.py).

It walks an answer once: parses timestamps to integer milliseconds and the quoted values to
float64 (exact, as Go's strconv: go_float.py; the rare value it cannot decide is left to
Python's float()), and records the byte span
of each series' "metric" object, checking whether it is spelled exactly as Prometheus writes
label sets (compact, names in byte order, jsoniter escaping). Anything it does not expect
returns a code that sends the answer down json_decode.py's exact slow path.

The kernels are compiled on first use and cached on disk next to this file (`cache=True`;
see proxy/codec/warmup.py). Kernels that call each other live in this one file: numba's
cache notices an edit of a kernel's own file only, not of a callee in another file -- so the
cache of this file is dropped when go_float.py, whose parse_float is inlined here, changes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from . import go_float
from .go_float import parse_float


def _kernels_follow(callee: object) -> None:
    """Drop this file's numba cache when `callee`'s source changed since it was compiled."""
    import hashlib
    from pathlib import Path

    here = Path(__file__)
    cache = here.parent / "__pycache__"
    source = Path(str(getattr(callee, "__file__", "")))
    try:
        digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        stamp = cache / f"{here.stem}.{source.stem}.sha"
        if stamp.exists() and stamp.read_text() == digest:
            return
        for f in cache.glob(f"{here.stem}.*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: numba then compiles in memory or its own cache dir
        pass


_kernels_follow(go_float)


def literal_bytes(s: bytes) -> npt.NDArray[np.uint8]:
    return np.frombuffer(s, dtype=np.uint8).copy()


# Bytes of a label string that need no attention from the label scanner.
_LBL_PLAIN = np.ones(256, dtype=np.uint8)
_LBL_PLAIN[:32] = 0
_LBL_PLAIN[[34, 92, 60, 62, 38, 0xE2]] = 0


_K_METRIC = literal_bytes(b"metric")
_K_VALUES = literal_bytes(b"values")
_K_VALUE = literal_bytes(b"value")
_K_HISTOGRAM = literal_bytes(b"histogram")
_K_HISTOGRAMS = literal_bytes(b"histograms")


@njit(cache=True)
def _skip_ws(b, i, n):  # type: ignore[no-untyped-def]
    while i < n and (b[i] == 32 or b[i] == 10 or b[i] == 13 or b[i] == 9):
        i += 1
    return i


@njit(cache=True)
def _skip_string(b, i, n):  # type: ignore[no-untyped-def]
    """b[i] is an opening quote; index after the closing quote, or -1."""
    i += 1
    while i < n:
        c = b[i]
        if c == 34:
            return i + 1
        if c == 92:
            i += 2
        else:
            i += 1
    return -1


@njit(cache=True)
def skip_value(b, i, n):  # type: ignore[no-untyped-def]
    """Index after the JSON value starting at i (not validated), or -1."""
    if i >= n:
        return -1
    c = b[i]
    if c == 34:
        return _skip_string(b, i, n)
    if c == 123 or c == 91:
        depth = 0
        while i < n:
            c = b[i]
            if c == 34:
                i = _skip_string(b, i, n)
                if i < 0:
                    return -1
                continue
            if c == 123 or c == 91:
                depth += 1
            elif c == 125 or c == 93:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    while i < n:
        c = b[i]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return i
        i += 1
    return i


@njit(cache=True)
def _key_is(b, ks, ke, lit):  # type: ignore[no-untyped-def]
    if ke - ks != len(lit):
        return False
    for j in range(len(lit)):
        if b[ks + j] != lit[j]:
            return False
    return True


@njit(cache=True)
def scan_members(b, i, n, first, stop, out):  # type: ignore[no-untyped-def]
    """Members of a JSON object, from its '{' at i (first) or from just after a member's
    value. Rows (key_start, key_end, value_start, value_end) go to out, key spans inside
    the quotes. Stops before skipping the value of the key `stop` (its value_end is -1), so
    that the big `result` array is walked once, by the series parser.
    Returns (status, rows, pos): 0 the object ended (pos after '}'), 1 stopped at `stop`
    (pos = its value start), -1 not what we expect."""
    k = 0
    i = _skip_ws(b, i, n)
    if first:
        if i >= n or b[i] != 123:
            return -1, 0, i
        i = _skip_ws(b, i + 1, n)
        if i < n and b[i] == 125:
            return 0, 0, i + 1
    else:
        if i < n and b[i] == 125:
            return 0, 0, i + 1
        if i >= n or b[i] != 44:
            return -1, 0, i
        i = _skip_ws(b, i + 1, n)
    while True:
        if i >= n or b[i] != 34 or k >= out.shape[0]:
            return -1, k, i
        ks = i + 1
        i = _skip_string(b, i, n)
        if i < 0:
            return -1, k, i
        ke = i - 1
        i = _skip_ws(b, i, n)
        if i >= n or b[i] != 58:
            return -1, k, i
        i = _skip_ws(b, i + 1, n)
        out[k, 0] = ks
        out[k, 1] = ke
        out[k, 2] = i
        if len(stop) > 0 and _key_is(b, ks, ke, stop):
            out[k, 3] = -1
            return 1, k + 1, i
        i = skip_value(b, i, n)
        if i < 0:
            return -1, k, i
        out[k, 3] = i
        k += 1
        i = _skip_ws(b, i, n)
        if i < n and b[i] == 44:
            i = _skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 125:
            return 0, k, i + 1
        return -1, k, i


@njit(cache=True)
def _hexval(c):  # type: ignore[no-untyped-def]
    """Value of a lowercase hex digit, -1 otherwise (jsoniter writes lowercase)."""
    if 48 <= c <= 57:
        return np.int64(c) - 48
    if 97 <= c <= 102:
        return np.int64(c) - 87
    return -1


@njit(cache=True)
def _label_string(b, i, n):  # type: ignore[no-untyped-def]
    """The string at b[i] == '"' inside a label set: (index after it or -1, canonical),
    canonical meaning: escaped exactly as Prometheus (jsoniter) escapes."""
    canon = True
    i += 1
    while i < n:
        c = b[i]
        if _LBL_PLAIN[c]:  # one table load per ordinary byte
            i += 1
            continue
        if c == 34:
            return i + 1, canon
        if c == 92:
            if i + 1 >= n:
                return -1, False
            e = b[i + 1]
            if e == 34 or e == 92 or e == 110 or e == 114 or e == 116:
                i += 2
                continue
            if e == 117 and i + 5 < n:
                x = 0
                for j in range(i + 2, i + 6):
                    h = _hexval(b[j])
                    if h < 0:
                        canon = False
                        h = 0
                    x = x * 16 + h
                if not (
                    (x < 32 and x != 9 and x != 10 and x != 13)
                    or x == 0x3C
                    or x == 0x3E
                    or x == 0x26
                    or x == 0x2028
                    or x == 0x2029
                ):
                    canon = False
                i += 6
                continue
            canon = False
            i += 2
            continue
        if c < 32:
            return -1, False
        if c == 60 or c == 62 or c == 38:
            canon = False
        elif c == 0xE2 and i + 2 < n and b[i + 1] == 0x80 and (b[i + 2] == 0xA8 or b[i + 2] == 0xA9):
            canon = False
        i += 1
    return -1, False


@njit(cache=True, nogil=True)
def _skip_label_object(b, i, n):  # type: ignore[no-untyped-def]
    """The flat {"name":"value",...} object at i: (end or -1 if it is anything else,
    canonical), canonical meaning byte for byte what Prometheus writes for it (compact,
    names in increasing byte order, jsoniter escaping), so that it can be reused as is.
    Fast path: compact, strings of plain bytes only (one table load per byte); anything
    else goes to the general scanner from the start of the object."""
    start = i
    if i >= n or b[i] != 123:
        return -1, False
    i += 1
    if i < n and b[i] == 125:
        return i + 1, True
    pks = -1
    pke = -1
    while i < n and b[i] == 34:
        ks = i + 1
        j = ks
        while j < n and _LBL_PLAIN[b[j]]:
            j += 1
        if j + 2 >= n or b[j] != 34 or b[j + 1] != 58 or b[j + 2] != 34:
            break
        ke = j
        # Names strictly increasing by bytes (which also rules out duplicates).
        if pks >= 0:
            m = min(ke - ks, pke - pks)
            cmp = 0
            for x in range(m):
                if b[ks + x] != b[pks + x]:
                    cmp = 1 if b[ks + x] > b[pks + x] else -1
                    break
            if cmp < 0 or (cmp == 0 and ke - ks <= pke - pks):
                break
        pks = ks
        pke = ke
        j += 3
        while j < n and _LBL_PLAIN[b[j]]:
            j += 1
        if j + 1 >= n or b[j] != 34:
            break
        c = b[j + 1]
        if c == 44:
            i = j + 2
            continue
        if c == 125:
            return j + 2, True
        break
    return _skip_label_object_general(b, start, n)


@njit(cache=True, nogil=True)
def _skip_label_object_general(b, i, n):  # type: ignore[no-untyped-def]
    """_skip_label_object for any spelling: whitespace, escapes, names out of order."""
    if i >= n or b[i] != 123:
        return -1, False
    canon = True
    i += 1
    if i < n and b[i] == 125:
        return i + 1, True
    pks = -1
    pke = -1
    while True:
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 34:
            return -1, False
        ks = i + 1
        i, c1 = _label_string(b, i, n)
        if i < 0:
            return -1, False
        ke = i - 1
        # Names strictly increasing by bytes (which also rules out duplicates).
        if pks >= 0:
            m = min(ke - ks, pke - pks)
            cmp = 0
            for j in range(m):
                if b[ks + j] != b[pks + j]:
                    cmp = 1 if b[ks + j] > b[pks + j] else -1
                    break
            if cmp < 0 or (cmp == 0 and ke - ks <= pke - pks):
                canon = False
        for j in range(ks, ke):
            if b[j] == 92:
                canon = False
        pks = ks
        pke = ke
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 58:
            return -1, False
        i += 1
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i >= n or b[i] != 34:
            return -1, False
        i, c2 = _label_string(b, i, n)
        if i < 0:
            return -1, False
        canon = canon and c1 and c2
        j = _skip_ws(b, i, n)
        if j != i:
            canon = False
            i = j
        if i < n and b[i] == 44:
            i += 1
            continue
        if i < n and b[i] == 125:
            return i + 1, canon
        return -1, False


@njit(cache=True, inline='always')
def _parse_ts(b, i, n):  # type: ignore[no-untyped-def]
    """A JSON number of seconds at i -> (ok, t_ms, next index). ok False for exponents,
    more than 3 non-zero decimals, or more than 15 integer digits."""
    # Today's timestamps have exactly 10 integer digits: no loop-carried branch.
    if i + 10 < n:
        sec = 0
        ok = True
        for j in range(10):
            d = np.int64(b[i + j]) - 48
            ok = ok and 0 <= d <= 9
            sec = sec * 10 + d
        c = b[i + 10]
        if ok and (c < 48 or c > 57) and c != 101 and c != 69:
            if c != 46:
                return True, sec * 1000, i + 10
            if i + 14 <= n:
                d1 = np.int64(b[i + 11]) - 48
                d2 = np.int64(b[i + 12]) - 48
                d3 = np.int64(b[i + 13]) - 48
                c = b[i + 14] if i + 14 < n else 0
                if 0 <= d1 <= 9 and 0 <= d2 <= 9 and 0 <= d3 <= 9 and (c < 48 or c > 57) and c != 101 and c != 69:
                    return True, sec * 1000 + d1 * 100 + d2 * 10 + d3, i + 14
    return _parse_ts_general(b, i, n)


@njit(cache=True)
def _parse_ts_general(b, i, n):  # type: ignore[no-untyped-def]
    neg = False
    if i < n and b[i] == 45:
        neg = True
        i += 1
    sec = 0
    nd = 0
    while i < n and 48 <= b[i] <= 57:
        sec = sec * 10 + (b[i] - 48)
        nd += 1
        i += 1
    if nd == 0 or nd > 15:
        return False, 0, i
    ms = 0
    if i < n and b[i] == 46:
        i += 1
        fd = 0
        while i < n and 48 <= b[i] <= 57:
            d = b[i] - 48
            if fd < 3:
                ms = ms * 10 + d
            elif d != 0:
                return False, 0, i
            fd += 1
            i += 1
        if fd == 0:
            return False, 0, i
        while fd < 3:
            ms *= 10
            fd += 1
    if i < n and (b[i] == 101 or b[i] == 69):
        return False, 0, i
    t = sec * 1000 + ms
    return True, -t if neg else t, i


# Out-of-line copies for the rarely taken general path (inlining them twice would double
# the compile time of the series parser).
@njit(cache=True)
def _parse_ts_call(b, i, n):  # type: ignore[no-untyped-def]
    return _parse_ts(b, i, n)


@njit(cache=True)
def _parse_float_call(b, s, e, v_out, v_bits, k):  # type: ignore[no-untyped-def]
    return parse_float(b, s, e, v_out, v_bits, k)



@njit(cache=True)
def _parse_sample_general(b, i, n, t_out, v_out, v_bits, k, fb_idx, fb_s, fb_e, nfb):  # type: ignore[no-untyped-def]
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 91:
        return False, i, nfb
    i = _skip_ws(b, i + 1, n)
    ok, t, i = _parse_ts_call(b, i, n)
    if not ok:
        return False, i, nfb
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 44:
        return False, i, nfb
    i = _skip_ws(b, i + 1, n)
    if i >= n or b[i] != 34:
        return False, i, nfb
    vs = i + 1
    j = vs
    while j < n and b[j] != 34:
        if b[j] == 92:
            return False, j, nfb
        j += 1
    if j >= n:
        return False, j, nfb
    if _parse_float_call(b, vs, j, v_out, v_bits, k) != j:
        fb_idx[nfb] = k
        fb_s[nfb] = vs
        fb_e[nfb] = j
        nfb += 1
        v_out[k] = np.nan
    t_out[k] = t
    i = _skip_ws(b, j + 1, n)
    if i >= n or b[i] != 93:
        return False, i, nfb
    return True, i + 1, nfb


@njit(cache=True, nogil=True)
def parse_series_list(b, i, n, is_matrix, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canon):  # type: ignore[no-untyped-def]
    """The `result` array of a matrix or vector answer.
    Returns (status, n_series, n_samples, n_fallback, unsorted, end); status 0 ok, 1 use
    the slow path, 2 native histograms (Undecodable); end is the index after the array.
    canon[0] is cleared when a label set is not byte for byte what Prometheus writes."""
    v_bits = v_out.view(np.uint64)
    ns = 0
    k = 0
    nfb = 0
    unsorted = False
    ph = -1  # where the last timestamp whose first 6 digits were parsed starts
    phi = 0  # and their value
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 91:
        return 1, 0, 0, 0, False, i
    i = _skip_ws(b, i + 1, n)
    if i < n and b[i] == 93:
        return 0, 0, 0, 0, False, i + 1
    while True:
        if i >= n or b[i] != 123 or ns >= counts.shape[0]:
            return 1, ns, k, nfb, unsorted, i
        i = _skip_ws(b, i + 1, n)
        ms = -1
        me = -1
        k0 = k
        got = False
        if i < n and b[i] == 125:
            i += 1
        else:
            while True:
                if i >= n or b[i] != 34:
                    return 1, ns, k, nfb, unsorted, i
                ks = i + 1
                i = _skip_string(b, i, n)
                if i < 0:
                    return 1, ns, k, nfb, unsorted, i
                ke = i - 1
                i = _skip_ws(b, i, n)
                if i >= n or b[i] != 58:
                    return 1, ns, k, nfb, unsorted, i
                i = _skip_ws(b, i + 1, n)
                if _key_is(b, ks, ke, _K_METRIC):
                    if ms >= 0:
                        return 1, ns, k, nfb, unsorted, i
                    ms = i
                    i, c = _skip_label_object(b, i, n)
                    if not c:
                        canon[0] = 0
                    if i < 0:
                        return 1, ns, k, nfb, unsorted, i
                    me = i
                elif _key_is(b, ks, ke, _K_VALUES if is_matrix else _K_VALUE):
                    # A matrix's "values":[[t,"v"],...] or a vector's "value":[t,"v"]; one
                    # call site for the (inlined) sample parser keeps compile time down.
                    if got:
                        return 1, ns, k, nfb, unsorted, i
                    got = True
                    more = True
                    if is_matrix:
                        if i >= n or b[i] != 91:
                            return 1, ns, k, nfb, unsorted, i
                        i = _skip_ws(b, i + 1, n)
                        if i < n and b[i] == 93:
                            i += 1
                            more = False
                    while more:
                        if k >= t_out.shape[0]:
                            return 1, ns, k, nfb, unsorted, i
                        # Fast path written out here (Prometheus's compact layout): going
                        # through an inlined wrapper that also holds the general call
                        # made the whole loop about twice as slow.
                        done = False
                        if i + 16 < n and b[i] == 91:
                            # A 10-digit timestamp: its first 6 digits usually repeat
                            # those of the previous sample (independent byte compares
                            # instead of a serial multiply chain).
                            s0 = i + 1
                            if (
                                ph >= 0
                                and b[s0] == b[ph]
                                and b[s0 + 1] == b[ph + 1]
                                and b[s0 + 2] == b[ph + 2]
                                and b[s0 + 3] == b[ph + 3]
                                and b[s0 + 4] == b[ph + 4]
                                and b[s0 + 5] == b[ph + 5]
                            ):
                                hi = phi
                                ok = True
                            else:
                                hi = 0
                                ok = True
                                for x in range(6):
                                    d = np.int64(b[s0 + x]) - 48
                                    ok = ok and 0 <= d <= 9
                                    hi = hi * 10 + d
                                if ok:
                                    ph = s0
                                    phi = hi
                            d1 = np.int64(b[s0 + 6]) - 48
                            d2 = np.int64(b[s0 + 7]) - 48
                            d3 = np.int64(b[s0 + 8]) - 48
                            d4 = np.int64(b[s0 + 9]) - 48
                            c = b[s0 + 10]
                            ok = (
                                ok and 0 <= d1 <= 9 and 0 <= d2 <= 9 and 0 <= d3 <= 9 and 0 <= d4 <= 9
                                and (c < 48 or c > 57) and c != 101 and c != 69
                            )
                            t = (hi * 10000 + d1 * 1000 + d2 * 100 + d3 * 10 + d4) * 1000
                            j = s0 + 10
                            if ok and c == 46:
                                e1 = np.int64(b[s0 + 11]) - 48
                                e2 = np.int64(b[s0 + 12]) - 48
                                e3 = np.int64(b[s0 + 13]) - 48
                                c = b[s0 + 14]
                                ok = (
                                    0 <= e1 <= 9 and 0 <= e2 <= 9 and 0 <= e3 <= 9
                                    and (c < 48 or c > 57) and c != 101 and c != 69
                                )
                                t += e1 * 100 + e2 * 10 + e3
                                j = s0 + 14
                            if ok and b[j] == 44 and b[j + 1] == 34:
                                end = parse_float(b, j + 2, n, v_out, v_bits, k)
                                if end >= 0 and end + 1 < n and b[end] == 34 and b[end + 1] == 93:
                                    t_out[k] = t
                                    i = end + 2
                                    done = True
                        if not done:
                            ok, i, nfb = _parse_sample_general(
                                b, i, n, t_out, v_out, v_bits, k, fb_idx, fb_s, fb_e, nfb
                            )
                            if not ok:
                                return 1, ns, k, nfb, unsorted, i
                        if k > k0 and t_out[k] <= t_out[k - 1]:
                            unsorted = True
                        k += 1
                        if not is_matrix:
                            break
                        c = b[i] if i < n else 0
                        if c != 44 and c != 93:
                            i = _skip_ws(b, i, n)
                            c = b[i] if i < n else 0
                        if c == 44:
                            i += 1  # the sample parser skips whitespace itself
                            continue
                        if c == 93:
                            i += 1
                            break
                        return 1, ns, k, nfb, unsorted, i
                elif _key_is(b, ks, ke, _K_HISTOGRAM) or _key_is(b, ks, ke, _K_HISTOGRAMS):
                    return 2, ns, k, nfb, unsorted, i
                else:
                    i = skip_value(b, i, n)
                    if i < 0:
                        return 1, ns, k, nfb, unsorted, i
                i = _skip_ws(b, i, n)
                if i < n and b[i] == 44:
                    i = _skip_ws(b, i + 1, n)
                    continue
                if i < n and b[i] == 125:
                    i += 1
                    break
                return 1, ns, k, nfb, unsorted, i
        if not got and not is_matrix:
            return 1, ns, k, nfb, unsorted, i
        met_s[ns] = ms
        met_e[ns] = me
        counts[ns] = k - k0
        ns += 1
        i = _skip_ws(b, i, n)
        if i < n and b[i] == 44:
            i = _skip_ws(b, i + 1, n)
            continue
        if i < n and b[i] == 93:
            return 0, ns, k, nfb, unsorted, i + 1
        return 1, ns, k, nfb, unsorted, i



@njit(cache=True)
def array_element_spans(b, starts, ends):  # type: ignore[no-untyped-def]
    """Spans of the elements of the JSON array b (as orjson writes it: no whitespace)."""
    n = len(b)
    i = 1
    k = 0
    if n < 2 or b[1] == 93:
        return 0
    while i < n:
        j = skip_value(b, i, n)
        if j < 0 or k >= starts.shape[0]:
            return -1
        starts[k] = i
        ends[k] = j
        k += 1
        if j >= n or b[j] != 44:
            break
        i = j + 1
    return k


# --------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------
