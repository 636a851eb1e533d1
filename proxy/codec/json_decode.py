"""Prometheus JSON answer -> `QueryResult`: `decode_prometheus_json`.

No Python object per sample: the compiled scanner (json_scan.py) fills numpy arrays, and
orjson parses only the label objects, each distinct label JSON once per process (series
recur from piece to piece and refresh to refresh: proxy/result/label_sets.py). When the backend's label
JSON is byte for byte what Prometheus writes, it is kept as the result's canonical keys and
written back verbatim by the encoder. Anything the scanner does not expect (escapes in a
value, exponents in a timestamp, more than 3 decimals of a second, odd structure) sends the
whole answer down an exact slow path built on orjson. Native histograms raise `Undecodable`:
the caller passes such an answer through untouched.
"""

from __future__ import annotations

import asyncio
import gc
import math
import re
import threading
from typing import Any

import numpy as np
import orjson

from proxy.result import QueryResult
from proxy.result.label_sets import LABEL_CACHE, BadLabelJSON

from .errors import MalformedAnswer, Undecodable
from .json_scan import literal_bytes, parse_series_list, scan_members, skip_value

__all__ = ["decode_prometheus_json"]


class SlowPath(Exception):
    pass


def decode_prometheus_json(body: bytes | bytearray) -> QueryResult:
    """A successful /api/v1/query or /api/v1/query_range answer -> QueryResult (from the
    bytearray a large body was read into, too: nothing kept refers to it).

    Raises Undecodable for native histograms, MalformedAnswer for anything that is not a
    successful query answer."""
    try:
        return _decode_fast(body)
    except SlowPath:
        return _decode_slow(body)


_K_DATA = literal_bytes(b"data")
_K_RESULT = literal_bytes(b"result")
_K_NONE = literal_bytes(b"")


def _collect(body: bytes | bytearray, rows: Any, k: int, into: dict[bytes, tuple[int, int]]) -> None:
    for ks, ke, vs, ve in rows[:k].tolist():
        key = bytes(body[ks:ke])
        if key in into or b"\\" in key:
            raise SlowPath
        into[key] = (vs, ve)


def _str_list(body: bytes | bytearray, span: tuple[int, int] | None, what: str) -> list[str]:
    if span is None:
        return []
    val = _loads(body[span[0] : span[1]], what)
    if val is None:
        return []
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise MalformedAnswer(f"{what} is not a list of strings")
    return val


def _loads(part: bytes | bytearray, what: str) -> Any:
    """A part of the answer the scanner only delimited (a scalar or string result, warnings),
    parsed: not JSON is the codec's MalformedAnswer, not orjson's ValueError (which would
    reach the client as a 500 instead of a 502 naming the backend)."""
    try:
        return orjson.loads(part)
    except orjson.JSONDecodeError as exc:
        raise MalformedAnswer(f"{what} is not JSON: {exc}") from exc


_DECODE_SCRATCH = threading.local()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _decode_scratch(cap_series: int, cap_samples: int) -> tuple[tuple[Any, ...], bool]:
    """Output arrays of the series scanner (met_s, met_e, counts, t, v, fb_idx, fb_s, fb_e),
    and whether they are the thread's kept scratch (to be copied out of) rather than fresh
    arrays for this answer alone (whose t and v are shrunk in place and handed over)."""
    have = getattr(_DECODE_SCRATCH, "arrays", None)
    if have is not None and len(have[0]) >= cap_series and len(have[3]) >= cap_samples:
        return have, True
    cs, cv = max(cap_series, 1 << 12), max(cap_samples, 1 << 16)
    arrays = (
        np.empty(cs, dtype=np.int64),
        np.empty(cs, dtype=np.int64),
        np.empty(cs, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.float64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
        np.empty(cv, dtype=np.int64),
    )
    if cap_samples <= _DECODE_SCRATCH_MAX and _on_event_loop():
        _DECODE_SCRATCH.arrays = arrays
        return arrays, True
    return arrays, False


# Samples: answers up to ~1.8 MB of JSON decode into the thread's kept scratch (fresh pages
# would cost as much as parsing such a small answer) and are copied out at their exact size.
# Only the event loop's thread keeps one: the worker threads (answers over 1 MiB are decoded
# there) each kept up to ~10 MB resident for the life of the process (issue 15).
# Larger answers get arrays of their own, shrunk in place to their exact size (realloc, no
# copy): no second copy of a big answer at the decode's peak, and no big scratch kept
# resident for the life of the process (the kept scratch is at most 4 MB touched).
_DECODE_SCRATCH_MAX = 1 << 18


def _decode_fast(body: bytes | bytearray) -> QueryResult:
    buf = np.frombuffer(body, dtype=np.uint8)
    n = len(buf)
    rows = np.empty((64, 4), dtype=np.int64)
    top: dict[bytes, tuple[int, int]] = {}
    dm: dict[bytes, tuple[int, int]] = {}
    st, k, pos = scan_members(buf, 0, n, True, _K_DATA, rows)
    if st != 1:
        raise SlowPath
    _collect(body, rows, k - 1, top)
    data_start = pos
    st, k, pos = scan_members(buf, data_start, n, True, _K_RESULT, rows)
    if st != 1:
        raise SlowPath
    _collect(body, rows, k - 1, dm)
    rt_span = dm.get(b"resultType")
    if rt_span is None:
        raise SlowPath  # resultType after result: not Prometheus's layout
    rtype = body[rt_span[0] : rt_span[1]].strip(b'"').decode("ascii", "replace")
    res_start = pos
    parsed = None
    if rtype in ("matrix", "vector"):
        # Upper bounds (a sample takes >= 7 bytes, a series >= 25); untouched pages of
        # these allocations are never mapped in.
        cap_series = (n - res_start) // 12 + 2
        cap_samples = (n - res_start) // 7 + 2
        # Per-thread scratch, kept between answers (fresh pages cost as much as parsing);
        # the results are copied out at their exact size.
        scratch, kept = _decode_scratch(cap_series, cap_samples)
        met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e = scratch
        del scratch
        canon = np.ones(1, dtype=np.uint8)
        code, ns, nk, nfb, unsorted, res_end = parse_series_list(
            buf, res_start, n, rtype == "matrix", met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canon
        )
        if code == 2:
            raise Undecodable("native histograms are not decoded")
        if code != 0 or unsorted:
            raise SlowPath
        parsed = (ns, nk, nfb, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, bool(canon[0]), kept)
    elif rtype in ("scalar", "string"):
        res_end = skip_value(buf, res_start, n)
    else:
        raise MalformedAnswer(f"unknown resultType {rtype!r}")
    if res_end < 0:
        raise SlowPath
    dm[b"result"] = (res_start, res_end)
    st, k, pos = scan_members(buf, res_end, n, False, _K_NONE, rows)
    if st != 0:
        raise SlowPath
    _collect(body, rows, k, dm)
    st, k, pos = scan_members(buf, pos, n, False, _K_NONE, rows)
    if st != 0:
        raise SlowPath
    _collect(body, rows, k, top)
    status = top.get(b"status")
    if status is None or body[status[0] : status[1]] != b'"success"':
        raise SlowPath  # the slow path produces the precise error
    warnings = _str_list(body, top.get(b"warnings"), "warnings")
    infos = _str_list(body, top.get(b"infos"), "infos")
    if parsed is None:
        return _small_result(rtype, _loads(body[res_start:res_end], f"the {rtype} result"), warnings, infos)
    ns, nk, nfb, met_s, met_e, counts, t_out, v_out, fb_idx, fb_s, fb_e, canonical, kept = parsed
    del parsed
    if kept:
        t = t_out[:nk].copy()
        v = v_out[:nk].copy()
    else:
        # Arrays of this answer alone (nothing else refers to them): shrink in place.
        t_out.resize(nk, refcheck=False)
        v_out.resize(nk, refcheck=False)
        t, v = t_out, v_out
    for k, a, b in zip(fb_idx[:nfb].tolist(), fb_s[:nfb].tolist(), fb_e[:nfb].tolist()):
        v[k] = _py_float(body[a:b])
    # The scanner checked every metric is a flat object of strings: look the label sets
    # up by their JSON (series recur from piece to piece and refresh to refresh), parse
    # the others with one orjson call.
    starts = met_s[:ns].tolist()
    ends = met_e[:ns].tolist()
    # bytes (bytes(x) of a bytes slice is that slice): kept as keys, unlike the body.
    spans = [bytes(body[a:b]) for a, b in zip(starts, ends)]
    if -1 in starts:  # a series without "metric"
        spans = [sp if a >= 0 else b"{}" for sp, a in zip(spans, starts)]
    offsets = np.zeros(ns + 1, dtype=np.int64)
    np.cumsum(counts[:ns], out=offsets[1:])
    try:
        if canonical:
            # The backend's label JSON is what we would write: keep it for encoding and
            # merging, and parse the dicts only if they are asked for.
            LABEL_CACHE.intern(spans)
            return QueryResult(rtype, None, offsets, t, v, warnings, infos, keys=spans)  # type: ignore[arg-type]
        labels = LABEL_CACHE.lookup(spans)
    except BadLabelJSON as exc:  # not UTF-8: the slow path produces the precise error
        raise SlowPath from exc
    return QueryResult(rtype, labels, offsets, t, v, warnings, infos)  # type: ignore[arg-type]


def _check_labels(labels: list[dict[str, Any]]) -> None:
    for d in labels:
        for val in d.values():
            if type(val) is not str:
                raise MalformedAnswer("label values must be strings")


_GO_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf(?:inity)?|NaN|nan)")


def _py_float(tok: bytes | bytearray | str) -> float:
    s = tok if isinstance(tok, str) else tok.decode()
    if not _GO_FLOAT.fullmatch(s):
        raise MalformedAnswer(f"bad sample value {s!r}")
    return float(s)


# Times are int64 milliseconds (numpy arrays): a timestamp beyond them (1e300 seconds) is a
# broken answer, not an OverflowError when the arrays are built.
_MS_MIN, _MS_MAX = -(1 << 63), (1 << 63) - 1


def _py_ts(x: Any) -> int:
    if type(x) is int:
        ms = x * 1000
    elif type(x) is float and math.isfinite(x * 1000):
        ms = round(x * 1000)
    else:
        raise MalformedAnswer(f"bad timestamp {x!r}")
    if not _MS_MIN <= ms <= _MS_MAX:
        raise MalformedAnswer(f"timestamp {x!r} is outside int64 milliseconds")
    return ms


def _small_result(rtype: str, res: Any, warnings: list[str], infos: list[str]) -> QueryResult:
    if not (isinstance(res, list) and len(res) == 2 and isinstance(res[1], str)):
        raise MalformedAnswer(f"bad {rtype} result")
    t = _py_ts(res[0])
    if rtype == "scalar":
        return QueryResult.scalar(t, _py_float(res[1]), warnings=warnings, infos=infos)
    return QueryResult.string(t, res[1], warnings=warnings, infos=infos)


def _decode_slow(body: bytes | bytearray) -> QueryResult:
    """Exact decoding through orjson; the collector is kept out of the way while the
    sample lists exist."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedAnswer(f"answer is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise MalformedAnswer("not a successful Prometheus answer")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise MalformedAnswer("answer has no data")
        rtype = data.get("resultType")
        res = data.get("result")
        warnings = doc.get("warnings") or []
        infos = doc.get("infos") or []
        if not (isinstance(warnings, list) and isinstance(infos, list)
                and all(isinstance(w, str) for w in [*warnings, *infos])):
            raise MalformedAnswer("warnings/infos must be strings")
        if rtype in ("scalar", "string"):
            return _small_result(rtype, res, list(warnings), list(infos))
        if rtype not in ("matrix", "vector") or not isinstance(res, list):
            raise MalformedAnswer(f"bad resultType {rtype!r}")
        labels: list[dict[str, str]] = []
        ts: list[int] = []
        vs: list[float] = []
        counts: list[int] = []
        key = "values" if rtype == "matrix" else "value"
        for el in res:
            if not isinstance(el, dict):
                raise MalformedAnswer("result element is not an object")
            if "histogram" in el or "histograms" in el:
                raise Undecodable("native histograms are not decoded")
            metric = el.get("metric", {})
            if not isinstance(metric, dict):
                raise MalformedAnswer("metric is not an object")
            if key not in el:
                if rtype == "vector":
                    raise MalformedAnswer("vector element without value")
                pts: list[Any] = []
            else:
                pts = el[key] if rtype == "matrix" else [el[key]]
            if not isinstance(pts, list):
                raise MalformedAnswer("bad samples")
            for p in pts:
                if not (isinstance(p, list) and len(p) == 2 and isinstance(p[1], str)):
                    raise MalformedAnswer("bad sample")
                ts.append(_py_ts(p[0]))
                vs.append(_py_float(p[1]))
            labels.append(metric)
            counts.append(len(pts))
        _check_labels(labels)  # type: ignore[arg-type]
    finally:
        if was_enabled:
            gc.enable()
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    t = np.array(ts, dtype=np.int64)
    v = np.array(vs, dtype=np.float64)
    # Per series, samples in time order; a repeated timestamp is a broken answer.
    series = np.repeat(np.arange(len(labels)), counts)
    order = np.lexsort((t, series))
    t, v = t[order], v[order]
    if len(t) > 1:
        same = (np.diff(t) == 0) & (np.diff(series) == 0)
        if same.any():
            raise MalformedAnswer("a series has two samples at the same timestamp")
    return QueryResult(rtype, labels, offsets, t, v, list(warnings), list(infos))


# --------------------------------------------------------------------------------------
