"""proxy/result/label_sets.py: the process-wide table of label sets (each label JSON kept once,
its dict parsed once, on demand), bounded."""

from __future__ import annotations

import pytest

from proxy.result.label_sets import BadLabelJSON, LabelSets, labels_of_keys


def test_the_label_table_keeps_keys_and_parses_dicts_on_demand() -> None:
    table = LabelSets(max_bytes=1 << 20)
    spans = [b'{"a":"1"}', b'{"a":"2"}']
    table.intern(spans)
    assert all(e[1] is None for e in table.map.values()) and table.bytes == 18
    kept = list(spans)
    again = [bytes(bytearray(b'{"a":"1"}'))]
    table.intern(again)
    assert again[0] is kept[0]
    dicts = table.lookup([b'{"a":"2"}', b'{"a":"1"}'])
    assert dicts == [{"a": "2"}, {"a": "1"}] and table.lookup([b'{"a":"1"}'])[0] is dicts[1]
    assert table.bytes == 18 + 3 * 18  # the dicts are counted once parsed
    big = [f'{{"k":"{i:0200d}"}}'.encode() for i in range(6000)]  # ~1.2 MB: over the bound
    table.intern(big)
    assert len(table.map) == 6000 and kept[0] not in table.map  # cleared, then the new ones


def test_bad_label_json_is_refused_and_the_table_is_unchanged() -> None:
    table = LabelSets()
    with pytest.raises(BadLabelJSON):
        table.intern([b'{"a":"\xff"}'])  # not UTF-8
    with pytest.raises(BadLabelJSON):
        table.lookup([b'{"a":'])  # not JSON: cannot be parsed
    assert table.map == {} and table.bytes == 0


def test_values_repeat_as_one_string_object() -> None:
    """A fleet's label sets repeat the same hostnames: each value string is kept once."""
    table = LabelSets()
    a, b = table.lookup([b'{"host":"node-17","gpu":"0"}', b'{"host":"node-17","gpu":"1"}'])
    assert a["host"] == b["host"] == "node-17" and a["host"] is b["host"]
    assert a["gpu"] == "0" and b["gpu"] == "1"


def test_the_entry_count_bound_clears_the_table() -> None:
    table = LabelSets(limit=3)
    table.intern([b'{"a":"1"}', b'{"a":"2"}', b'{"a":"3"}'])
    assert len(table.map) == 3
    table.intern([b'{"a":"4"}'])  # a fourth would pass the limit: cleared first
    assert list(table.map) == [b'{"a":"4"}'] and table.bytes == len(b'{"a":"4"}')


def test_labels_of_keys_parses_from_the_shared_table() -> None:
    keys = [b'{"job":"x","i":"1"}', b'{}']
    assert labels_of_keys(keys) == [{"job": "x", "i": "1"}, {}]
    assert labels_of_keys(keys)[0] is labels_of_keys(keys)[0]  # parsed once, then shared
