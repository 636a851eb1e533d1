"""Label sets as Prometheus writes them: the canonical keys of a `QueryResult`.

Keys sorted by bytes (so `Hostname` < `__name__` < `abc`), strings escaped as jsoniter does:
`<`, `>`, `&`, U+2028, U+2029 and control characters other than \\n \\r \\t as `\\u00XX`
(lowercase hex), DEL and other non-ASCII raw. Equal label sets give equal bytes, whichever
backend sent them, so these bytes are also the key merges hash and sort series by.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import orjson

__all__ = ["go_json_string", "label_block", "labels_json"]

I64 = npt.NDArray[np.int64]


# jsoniter (ConfigCompatibleWithStandardLibrary, EscapeHTML) escapes these beyond what
# orjson escapes; \b and \f it writes as \u0008 / \u000c.
def _needs_go_fix(raw: bytes) -> bool:
    # Single-byte `in` is memchr; a regex alternation is ~100x slower on megabytes.
    if b"<" in raw or b">" in raw or b"&" in raw:
        return True
    if b"\\" in raw and (b"\\b" in raw or b"\\f" in raw):
        return True
    return b"\xe2" in raw and (b"\xe2\x80\xa8" in raw or b"\xe2\x80\xa9" in raw)

_GO_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_GO_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x22: '\\"', 0x5C: "\\\\"})
_GO_ESCAPES.update({0x3C: "\\u003c", 0x3E: "\\u003e", 0x26: "\\u0026"})
_GO_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def go_json_string(s: str) -> str:
    """A JSON string literal as Prometheus (jsoniter) writes it."""
    return '"' + s.translate(_GO_ESCAPES) + '"'


def labels_json(labels: dict[str, str]) -> bytes:
    """`{"k":"v",...}` with keys sorted by bytes and jsoniter's escaping."""
    raw = orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)
    if not _needs_go_fix(raw):
        return raw
    parts = [f"{go_json_string(k)}:{go_json_string(labels[k])}" for k in sorted(labels)]
    return ("{" + ",".join(parts) + "}").encode()


def label_block(labels: list[dict[str, str]]) -> tuple[bytes, I64, I64]:
    """All label sets as Prometheus writes them: (bytes, start, end) per series."""
    # The compiled span scanner is imported here, on first use, so that QueryResult (and
    # everything that only passes results around) loads without numba.
    from proxy.codec.json_scan import array_element_spans

    n = len(labels)
    raw = orjson.dumps(labels, option=orjson.OPT_SORT_KEYS)
    if not _needs_go_fix(raw):
        starts = np.empty(n, dtype=np.int64)
        ends = np.empty(n, dtype=np.int64)
        if array_element_spans(np.frombuffer(raw, dtype=np.uint8), starts, ends) == n:
            return raw, starts, ends
    parts = [labels_json(d) for d in labels]
    lens = np.array([len(x) for x in parts], dtype=np.int64)
    ends = np.cumsum(lens)
    return b"".join(parts), ends - lens, ends
