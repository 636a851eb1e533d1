"""proxy/result/labels.py: label sets written as Prometheus writes them (jsoniter,
ConfigCompatibleWithStandardLibrary, i.e. Go 1.19's encoding/json string rules: `"` and `\\`
escaped, \\n \\r \\t short, other bytes below 0x20 as \\u00XX -- \\b and \\f included --,
`<`, `>`, `&` as \\u003c \\u003e \\u0026 (HTML escaping), U+2028 and U+2029 as \\u2028 \\u2029,
DEL and every other character raw; object keys sorted by bytes). `_go_string` below is a
transcription of encoding/json's encodeState.string for valid UTF-8, the reference."""

from __future__ import annotations

import json

import pytest

from proxy.result.labels import go_json_string, label_block, labels_json


def _go_string(s: str) -> str:
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x20 or ch in "<>&" or c in (0x2028, 0x2029):
            out.append(f"\\u{c:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _go_object(labels: dict[str, str]) -> bytes:
    keys = sorted(labels, key=lambda k: k.encode())
    return ("{" + ",".join(f"{_go_string(k)}:{_go_string(labels[k])}" for k in keys) + "}").encode()


TRICKY = [
    "plain", "", 'quote"back\\slash', "a<b>&c", "\b\f\x00\x01\x1f", "\n\r\t", "\x7f", "line\u2028para\u2029",
    "héllo 日本 😀", "</script>", "\u0085\u00a0",
]


@pytest.mark.parametrize("text", TRICKY)
def test_go_json_string(text: str) -> None:
    assert go_json_string(text) == _go_string(text)
    assert json.loads(go_json_string(text)) == text  # still valid JSON for the same text


def test_known_spellings() -> None:
    assert go_json_string("<&>") == '"\\u003c\\u0026\\u003e"'  # lowercase hex
    assert go_json_string("\b\f") == '"\\u0008\\u000c"'  # not \b \f (Go 1.19)
    assert go_json_string("\x7f\u2029") == '"\x7f\\u2029"'


def test_keys_sorted_by_bytes() -> None:
    d = {"abc": "1", "__name__": "m", "Hostname": "h", "Z": "z", "_": "u", "é": "e"}
    assert labels_json(d) == b'{"Hostname":"h","Z":"z","_":"u","__name__":"m","abc":"1","\xc3\xa9":"e"}'


@pytest.mark.parametrize("labels", [
    {},
    {"job": "api", "instance": "10.0.0.1:9100"},
    {"a": "x<y", "b": "\b"},
    {"msg": "say \"hi\"\n", "k<": "&"},
    {"u": "\u2028"},
    {"u": "\u00e2\u0080"},  # the bytes e2 80 in UTF-8 of other characters: no false alarm
])
def test_labels_json(labels: dict[str, str]) -> None:
    assert labels_json(labels) == _go_object(labels)


def test_label_block_spans() -> None:
    sets = [{"job": "a", "i": str(i)} for i in range(5)] + [{}]
    raw, starts, ends = label_block(sets)
    assert [raw[s:e] for s, e in zip(starts.tolist(), ends.tolist())] == [_go_object(d) for d in sets]
    # With one set that needs Go's escaping, every span still holds its own set.
    mixed = [{"job": "a"}, {"q": "x>1"}, {"c": "\f"}, {"v": '"'}]
    raw, starts, ends = label_block(mixed)
    assert [raw[s:e] for s, e in zip(starts.tolist(), ends.tolist())] == [_go_object(d) for d in mixed]
    raw, starts, ends = label_block([])
    assert len(starts) == len(ends) == 0
