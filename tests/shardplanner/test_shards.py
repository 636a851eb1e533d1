"""Shard matchers partition every possible series: exhaustive, disjoint, bounded in size."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplanner.plan import ShardSpec
from shardplanner.serialize import quote_string
from shardplanner.shards import MAX_MATCHER_BYTES, make_shards, regex_escape, series_in_shard
from tests.servers import require

HOSTS10 = [f"gpu-node-{i:04d}" for i in range(10)]
HOSTS2000 = [f"gpu-node-{i:04d}" for i in range(2000)]
HARD = [
    "",
    "a",
    "a.b",
    "a|b",
    "(x)",
    "[y]",
    "{z}",
    "^$",
    "a*",
    "a+",
    "a?",
    "\\",
    "\\d",
    "a\\.b",
    "-",
    "]",
    "^",
    "a-z",
    "\x00",
    "\n",
    "a\nb",
    " ",
    "é",
    "日本",
    "😀",
    "\U0010ffff",
    "\ufffd",
    "10.42.0.1:9100",
    "gpu-node-0001",
    "gpu-node-0001\n",
    "zz",
    "~",
    "\x7f",
]


def shard_of(labels: dict[str, str], specs: list[ShardSpec]) -> list[int]:
    return [s.index for s in specs if series_in_shard(labels, s)]


# --- regex_escape ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("gpu-node-0001", "gpu-node-0001"),
        ("10.42.0.1:9100", r"10\.42\.0\.1:9100"),
        ("a|b", r"a\|b"),
        (r"\.+*?()|[]{}^$", r"\\\.\+\*\?\(\)\|\[\]\{\}\^\$"),
        ("é日😀", "é日😀"),
    ],
)
def test_regex_escape(value: str, escaped: str) -> None:
    assert regex_escape(value) == escaped


@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=20))
def test_escaped_value_matches_only_itself(value: str) -> None:
    pattern = re.compile(regex_escape(value))
    assert pattern.fullmatch(value)
    assert not pattern.fullmatch(value + "x")
    assert not pattern.fullmatch("x" + value)


# --- schemes --------------------------------------------------------------------------------


def test_listing_scheme_golden() -> None:
    specs = make_shards("Hostname", reversed(HOSTS10), 4)  # input order does not matter
    assert [(s.index, s.count, s.matcher_op, s.matcher_value) for s in specs] == [
        (0, 4, "=~", "gpu-node-0000|gpu-node-0001|gpu-node-0002"),
        (1, 4, "=~", "gpu-node-0003|gpu-node-0004|gpu-node-0005"),
        (2, 4, "=~", "gpu-node-0006|gpu-node-0007"),
        (3, 4, "!~", "|".join(HOSTS10[:8])),
    ]
    assert {s.label for s in specs} == {"Hostname"}


def test_missing_label_and_new_values_go_to_the_complement_shard() -> None:
    specs = make_shards("Hostname", HOSTS10, 4)
    assert shard_of({}, specs) == [3]
    assert shard_of({"Hostname": ""}, specs) == [3]
    assert shard_of({"Hostname": "gpu-node-9999"}, specs) == [3]
    assert shard_of({"Hostname": "gpu-node-0009"}, specs) == [3]
    assert shard_of({"Hostname": "gpu-node-0000"}, specs) == [0]
    assert shard_of({"Hostname": "gpu-node-000"}, specs) == [3]  # anchored: no prefix match


def test_metacharacters_are_escaped_in_listing() -> None:
    specs = make_shards("instance", ["10.0.0.1:9100", "10.0.0.2:9100", "a|b"], 2)
    assert specs[0].matcher_value == r"10\.0\.0\.1:9100|10\.0\.0\.2:9100"
    assert shard_of({"instance": "10x0x0x1:9100"}, specs) == [1]  # '.' is literal
    assert shard_of({"instance": "a"}, specs) == [1]
    assert shard_of({"instance": "a|b"}, specs) == [1]


def test_large_value_sets_switch_to_ranges_and_stay_small_and_balanced() -> None:
    for n in (2, 4, 8, 16, 64):
        specs = make_shards("Hostname", HOSTS2000, n)
        assert len(specs) == n
        assert all(len(s.matcher_value.encode()) <= MAX_MATCHER_BYTES for s in specs)
        assert all("|gpu-node-0001|" not in s.matcher_value for s in specs)  # not a listing
        sizes = [0] * n
        for h in HOSTS2000:
            (idx,) = shard_of({"Hostname": h}, specs)
            sizes[idx] += 1
        assert max(sizes) - min(sizes) <= 1
    specs = make_shards("Hostname", HOSTS2000, 4)
    assert shard_of({}, specs) == [0]  # "" sorts first
    assert shard_of({"Hostname": "gpu-node-0499x"}, specs) == [0]
    assert shard_of({"Hostname": "gpu-node-05"}, specs) == [1]
    assert shard_of({"Hostname": "zzz"}, specs) == [3]


def test_reduces_or_refuses() -> None:
    assert make_shards("H", HOSTS10, 1) == []
    assert make_shards("H", [], 4) == []
    assert make_shards("H", ["", "only"], 4) == []
    assert len(make_shards("H", ["a", "b", "c"], 8)) == 3  # at most one shard per value
    # A bound no matcher can meet: no sharding rather than an oversized matcher.
    assert make_shards("H", HOSTS10, 4, max_matcher_bytes=3) == []


def test_deterministic() -> None:
    vals = list(HARD)
    random.Random(1).shuffle(vals)
    assert make_shards("H", vals, 5) == make_shards("H", sorted(set(HARD)), 5)


# --- properties ---------------------------------------------------------------------------

label_values = st.text(
    st.one_of(
        st.sampled_from(list("\\.+*?()|[]{}^$-~ a0\n\x00é日")),
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(label_values, st.sampled_from(HARD)), max_size=40),
    st.integers(2, 12),
    st.sampled_from([MAX_MATCHER_BYTES, 200, 60]),
    st.sampled_from(["auto", "listing", "ranges"]),
    st.lists(st.one_of(label_values, st.sampled_from(HARD)), max_size=20),
)
def test_every_series_is_in_exactly_one_shard(
    values: list[str], n: int, max_bytes: int, scheme: str, probes: list[str]
) -> None:
    specs = make_shards(
        "Hostname",
        values,
        n,
        max_matcher_bytes=max_bytes,
        scheme=scheme,  # type: ignore[arg-type]
    )
    if not specs:
        assert n < 2 or len({v for v in values if v}) < 2 or max_bytes < MAX_MATCHER_BYTES
        return
    assert [s.index for s in specs] == list(range(len(specs)))
    assert all(s.count == len(specs) for s in specs)
    assert all(len(s.matcher_value.encode()) <= max_bytes for s in specs)
    assert [s.matcher_op for s in specs] == ["=~"] * (len(specs) - 1) + ["!~"]
    for v in [*values, *probes, ""]:
        assert len(shard_of({"Hostname": v}, specs)) == 1, v
    assert len(shard_of({"other": "x"}, specs)) == 1
    # Every shard holds at least one known value (balanced chunks of the sorted values).
    known = sorted({v for v in values if v})
    counts = [sum(series_in_shard({"Hostname": v}, s) for v in known) for s in specs]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 1


# --- the real engine agrees (RE2 in Prometheus 2.42, via promtool's rule unit tests) ------------


def _promtool_group(specs: list[ShardSpec], values: list[str | None]) -> dict[str, object]:
    """One promtool test group. Series i carries value 2**i (exact in float64 for i < 53);
    sum(x{<shard matcher>}) then tells exactly which series the engine put in the shard."""
    assert len(values) <= 50
    series = []
    expected: list[list[int]] = [[] for _ in specs]
    for i, v in enumerate(values):
        labels = f"i={quote_string(str(i))}"
        if v is not None:
            labels += f", Hostname={quote_string(v)}"
        series.append({"series": f"x{{{labels}}}", "values": str(2**i)})
        lbls = {} if v is None else {"Hostname": v}
        owners = [s.index for s in specs if series_in_shard(lbls, s)]
        assert len(owners) == 1, v
        expected[owners[0]].append(i)
    tests = []
    for s in specs:
        expr = f"sum(x{{{s.label}{s.matcher_op}{quote_string(s.matcher_value)}}})"
        total = sum(2**i for i in expected[s.index])
        samples = [{"labels": "{}", "value": total}] if expected[s.index] else []
        tests.append({"expr": expr, "eval_time": "0m", "exp_samples": samples})
    return {"interval": "1m", "input_series": series, "promql_expr_test": tests}


def run_promtool(groups: list[dict[str, object]], tmp_path: Path) -> None:
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": groups}
    path = tmp_path / "promtool_test.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


def test_prometheus_agrees_with_the_partition(tmp_path: Path) -> None:
    require("promtool")
    hard = [v for v in HARD if v not in ("\x00", "\ufffd")]
    probes: list[str | None] = [None, "", "gpu-node-7777", "a.c", "zzzz", "A", "a\\", "\n\n"]
    hosts = [f"gpu-node-{i:04d}" for i in range(0, 2000, 97)]
    groups = []
    # Listing scheme over hard values.
    listing = make_shards("Hostname", hard, 5)
    assert "(?s:.*)" not in "".join(s.matcher_value for s in listing)
    groups.append(_promtool_group(listing, [*hard, *probes]))
    # Range scheme over hard values plus host names.
    known = hard + hosts[:8]
    ranged = make_shards("Hostname", known, 6, scheme="ranges")
    assert len(ranged) == 6 and "(?s:.*)" in "".join(s.matcher_value for s in ranged)
    groups.append(_promtool_group(ranged, [*known, *probes]))
    # Range scheme at the real bound: 2,000 hosts, 8 shards; probe known and unseen values.
    big = make_shards("Hostname", HOSTS2000, 8)
    samples: list[str | None] = [*hosts, "gpu-node-2000", "gpu-node-0500x", "gpu-node-05"]
    groups.append(_promtool_group(big, [*samples, *probes]))
    run_promtool(groups, tmp_path)
