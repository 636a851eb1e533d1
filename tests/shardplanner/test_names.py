"""Selectors without a fixed metric name resolved against the names the stores have
(shardplanner/names.py)."""

from __future__ import annotations

import pytest

from shardplanner.ast import Selector
from shardplanner.names import (
    NO_METRIC,
    PER_SERIES_CALLS,
    fixed_names,
    missing_names,
    name_matchers,
    needs_names,
    per_series_selector,
    resolve_names,
    with_names,
)
from shardplanner.promql import parse
from shardplanner.read_windows import listed_names
from shardplanner.serialize import to_promql

KNOWN = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "node_load1"}


@pytest.mark.parametrize(("query", "want"), [
    ('{__name__=~"DCGM_FI_DEV_(GPU|MEM_COPY)_UTIL", namespace=~"llm-.*"}',
     '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL",namespace=~"llm-.*"}'),
    ('sum(rate({__name__=~"node_.*"}[5m]))', "sum(rate(node_load1[5m]))"),
    ('{__name__=~"DCGM.*", __name__!="DCGM_FI_DEV_FB_USED"}',
     '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL"}'),
    ('{__name__=~"nothing.*", job="x"}', NO_METRIC + '{job="x"}'),
    ("node_load1 + other", "node_load1 + other"),  # fixed names are left alone
])
def test_resolve_names(query: str, want: str) -> None:
    assert to_promql(resolve_names(parse(query), KNOWN)) == to_promql(parse(want))


def test_resolve_names_leaves_a_selector_matching_too_many_names() -> None:
    expr = parse('{job="x"}')  # every name
    assert resolve_names(expr, KNOWN, max_names=3) == expr


def test_per_series_selector_and_with_names() -> None:
    expr = parse('abs(rate({__name__=~"a|b"}[5m]) * 2)')
    sel = per_series_selector(expr)
    assert sel is not None and listed_names(sel) == ("a", "b")
    assert to_promql(with_names(expr, sel, ("a",))) == "abs(rate(a[5m]) * 2)"
    for text in ('sum({__name__=~"a|b"})', '{__name__=~"a|b"} * on() c', 'sort({__name__=~"a|b"})',
                 'absent({__name__=~"a|b"})'):
        assert per_series_selector(parse(text)) is None, text


def _sel(text: str) -> Selector:
    node = parse(text)
    assert isinstance(node, Selector)
    return node


def test_name_matchers_only_for_nameless_plain_selectors() -> None:
    assert name_matchers(_sel('{__name__=~"a.*", job="x"}')) == _sel('{__name__=~"a.*"}').matchers
    assert name_matchers(_sel('{job="x"}')) == ()  # nameless, no name matcher: every name
    assert name_matchers(_sel('up{job="x"}')) is None  # a fixed name
    assert name_matchers(_sel('{__name__="up"}')) is None  # `__name__="up"` is a fixed name too


def test_needs_fixed_and_missing_names() -> None:
    expr = parse('rate(up[5m]) / on() group_left {__name__=~"node_.*"} + absent(gone)')
    assert needs_names(expr) and not needs_names(parse("sum(up) + node_load1"))
    assert fixed_names(expr) == {"up", "gone"}
    assert missing_names(expr, {"up", "node_load1"}) == {"gone"}
    # NO_METRIC is what resolve_names writes for "matches nothing": never reported missing.
    assert missing_names(parse(NO_METRIC), set()) == set()


def test_a_name_matcher_with_a_bad_regex_matches_nothing() -> None:
    # A regex the planner's RE2 engine cannot compile selects no name, so the selector reads
    # nothing rather than everything.
    sel = _sel('{__name__=~"a.*"}')
    bad = Selector(None, (type(sel.matchers[0])("__name__", "=~", "(?P<"),))
    assert resolve_names(bad, {"a", "b"}) == Selector(NO_METRIC, ())


def test_with_names_keeps_the_other_matchers() -> None:
    expr = parse('max_over_time({__name__=~"a.*", job="x"}[5m])')
    sel = per_series_selector(expr)
    assert sel is not None
    assert with_names(expr, sel, ("ab", "ac")) == parse('max_over_time({__name__=~"ab|ac", job="x"}[5m])')
    assert with_names(expr, sel, ("ab",)) == parse('max_over_time(ab{job="x"}[5m])')


def test_per_series_calls_are_from_the_function_table() -> None:
    # One series in, at most one out (Prometheus 2.42 functions.go: funcAbs, funcRate's
    # extrapolatedRate, funcLabelReplace...): a union of per-name answers is the same query.
    assert {"abs", "rate", "label_replace", "round", "clamp"} <= PER_SERIES_CALLS
    # sort orders, histogram_quantile folds buckets, absent and vector are not per series.
    assert not {"sort", "sort_desc", "histogram_quantile", "absent", "vector", "scalar"} & PER_SERIES_CALLS
