"""The function table (shardplanner/functions.py) against everything the parser, the planner
and the evaluators know.

The planner's per-function lists are derived from the table; `functions_before_table` holds
those lists as they were hand-kept before (commit c14e7d2), and every derivation is checked
equal to them here."""

from __future__ import annotations

import ast as pyast
import glob
import re
from functools import cache
from pathlib import Path

import promql_parser
import pytest

from shardplanner import analysis, answer_size, names, rules
from shardplanner.ast import AGGREGATION_OPS
from shardplanner.functions import (
    AGGREGATIONS,
    ALL_AGGREGATIONS,
    ALL_FUNCTIONS,
    AT_UNSAFE,
    FUNCTIONS,
    PROMETHEUS,
    Function,
    unknown_names,
)
from shardplanner.promql import CannotParse, parse

from . import functions_before_table as before

_ARG = {"vector": '{job="a"}', "matrix": '{job="a"}[5m]', "scalar": "1", "string": '"a"'}


def call_of(f: Function) -> str:
    """A call of `f` with one argument of each declared type."""
    return f"{f.name}({', '.join(_ARG[a] for a in f.args)})"


@cache
def names_the_parser_knows() -> frozenset[str]:
    """Every function and aggregation name promql-parser accepts, found without a list of
    guesses: the compiled parser's string data packs its name table, so every identifier-like
    substring of it (up to 36 characters) is tried as `name()`. A known name fails with an
    argument-count error naming it, an unknown one with "unknown function"."""
    so = glob.glob(str(Path(promql_parser.__file__).parent / "*.so"))
    assert len(so) == 1, so
    runs = set(re.findall(rb"[a-z][a-z0-9_]+", Path(so[0]).read_bytes()))
    candidates: set[str] = set(ALL_FUNCTIONS)  # holt_winters is registered by shardplanner.promql
    for raw in runs:
        run = raw.decode()
        for i, c in enumerate(run):
            if c.isalpha():
                candidates.update(run[i:j] for j in range(i + 2, min(len(run), i + 36) + 1))
    known = set()
    for name in candidates:
        try:  # the parser itself (shardplanner.promql's checks around it cost twice the time)
            promql_parser.parse(name + "()")
            known.add(name)
        except ValueError as exc:
            if f"call to '{name}'" in str(exc) or f"expression '{name}'" in str(exc):
                known.add(name)
    return frozenset(known)


def test_every_name_the_parser_knows_is_a_row() -> None:
    known = names_the_parser_knows()
    assert len(known) > 90  # the scan works: 2.42 alone has 70 functions and 12 aggregations
    assert {n for n in known if n not in ALL_AGGREGATIONS} == set(ALL_FUNCTIONS)
    assert {n for n in known if n in ALL_AGGREGATIONS} == set(ALL_AGGREGATIONS) == AGGREGATION_OPS


def test_every_row_not_in_242_is_reported_by_unknown_names() -> None:
    newer = [f for f in ALL_FUNCTIONS.values() if f.name not in FUNCTIONS]
    # Prometheus 2.47+/3 and promql-parser extensions: a query using one gets the backend's error.
    assert {"sort_by_label", "double_exponential_smoothing", "mad_over_time", "ts_of_max_over_time",
            "first_over_time", "info", "integral"} <= {f.name for f in newer}
    for f in newer:
        assert f.since != PROMETHEUS
        assert unknown_names(parse(call_of(f))) == [f.name]
    for f in FUNCTIONS.values():
        assert unknown_names(parse(call_of(f))) == [], f.name
    for a in ALL_AGGREGATIONS.values():
        param = {"scalar": "1, ", "string": '"v", ', None: ""}[a.param]
        got = unknown_names(parse(f"{a.name}({param}x)"))
        assert got == ([] if a.name in AGGREGATIONS else [a.name]), a.name
    assert AGGREGATIONS == {a for a in ALL_AGGREGATIONS if ALL_AGGREGATIONS[a].since == PROMETHEUS}


def _parses(name: str, types: tuple[str, ...]) -> bool:
    try:
        parse(f"{name}({', '.join(_ARG[a] for a in types)})")
        return True
    except CannotParse:
        return False


@pytest.mark.parametrize("f", ALL_FUNCTIONS.values(), ids=lambda f: f.name)
def test_arity_is_the_parsers(f: Function) -> None:
    # Variadic as parser.Functions means it: the last argument may be left out, and repeated
    # up to `optional` arguments in all (without bound for -1).
    assert _parses(f.name, f.args[:f.min_args])
    if f.min_args:
        assert not _parses(f.name, f.args[:f.min_args - 1])
    most = len(f.args) - 1 + f.optional if f.optional > 0 else len(f.args) if f.optional == 0 else len(f.args) + 3
    assert _parses(f.name, f.args + f.args[-1:] * (most - len(f.args)))
    if f.optional >= 0:
        assert not _parses(f.name, f.args + (f.args[-1:] or ("scalar",)) * (most - len(f.args) + 1))


def test_since_is_a_release_or_empty() -> None:
    for f in ALL_FUNCTIONS.values():
        assert f.since == "" or re.fullmatch(r"[23]\.\d+", f.since), f
        assert f.since == "" or tuple(map(int, f.since.split("."))) >= (2, 42), f


def test_the_242_rows_are_what_the_table_held_before() -> None:
    assert {n: (f.args, f.returns, f.optional) for n, f in FUNCTIONS.items()} == before.FUNCTIONS
    assert AGGREGATIONS == before.AGGREGATIONS
    assert AT_UNSAFE == before.AT_UNSAFE


def test_rules_derived_from_the_table_are_the_rules_before() -> None:
    got = {n: (r.node, r.kind, r.reason, r.time_splittable) for n, r in rules.RULES.items()}
    assert got == before.RULES


@pytest.mark.parametrize(("derived", "hand_kept"), [
    (names.PER_SERIES_CALLS, before.PER_SERIES_CALLS),
    (analysis.ABSENT_LIKE, before.ABSENT_LIKE),
    (analysis.NOT_PER_SERIES, before.NOT_PER_SERIES),
    (analysis.SCALAR_FUNCS, before.SCALAR_FUNCS),
    (analysis.CLOCK_FUNCS, before.CLOCK_FUNCS),
    (analysis.SORTING_FUNCS, before.ORDERED),
    (answer_size.ONE_SERIES, before.ONE_SERIES),
    (answer_size.BY_K, frozenset({"topk", "bottomk", "limitk", "limit_ratio"})),
    (answer_size.AS_WIDE_AS_INPUT, frozenset({"count_values"})),
], ids=["names.PER_SERIES_CALLS", "ABSENT_LIKE", "NOT_PER_SERIES", "SCALAR_FUNCS", "CLOCK_FUNCS",
        "SORTING_FUNCS", "answer_size.ONE_SERIES", "answer_size.BY_K", "answer_size.AS_WIDE_AS_INPUT"])
def test_derived_lists_are_the_hand_kept_ones(derived: frozenset[str], hand_kept: frozenset[str]) -> None:
    assert derived == hand_kept
    assert derived <= set(ALL_FUNCTIONS) | set(ALL_AGGREGATIONS)  # no name outside the table


def test_derived_lists_name_only_rows() -> None:
    table = set(ALL_FUNCTIONS) | set(ALL_AGGREGATIONS)
    assert set(rules.RULES) == table
    assert rules.MERGEABLE_AGGREGATIONS <= set(ALL_AGGREGATIONS)
    assert AT_UNSAFE <= set(FUNCTIONS)


# Modules that still hold literal lists of function names: planner.py's instant-window splits
# (_WINDOW_FUNCS: which *_over_time recombine, and how); plan.py's AggOp (the merge recipes'
# operator type, a Literal: test_rules checks MERGEABLE_AGGREGATIONS against it); ast.py's
# AGGREGATION_OPS (the parser's vocabulary, checked equal to the table above).
_NOT_DERIVED = {"functions.py", "planner.py", "plan.py", "ast.py"}


def test_no_other_planner_module_keeps_a_list_of_function_names() -> None:
    table = set(ALL_FUNCTIONS) | set(ALL_AGGREGATIONS)
    found = []
    for path in sorted(Path(rules.__file__).parent.glob("*.py")):
        if path.name in _NOT_DERIVED:
            continue
        for node in pyast.walk(pyast.parse(path.read_text())):
            items = node.elts if isinstance(node, (pyast.Set, pyast.List, pyast.Tuple)) else (
                [k for k in node.keys if k is not None] if isinstance(node, pyast.Dict) else [])
            hits = [e.value for e in items if isinstance(e, pyast.Constant) and e.value in table]
            if len(hits) >= 2:
                found.append(f"{path.name}:{node.lineno}: {hits}")
    assert found == []


def test_columns_read_from_242_source() -> None:
    # engine.go rangeEval keeps __name__ for last_over_time only; funcSort/funcSortDesc return
    # their input; funcLabelReplace/funcLabelJoin rebuild from the input's labels. Every other
    # 2.42 function drops it (enh.DropMetricName) or builds its labels anew (absent, vector).
    assert {n for n, f in FUNCTIONS.items() if f.keeps_name} == {
        "last_over_time", "sort", "sort_desc", "label_replace", "label_join"}
    # functions.go AtModifierUnsafeFunctions, v2.42.0
    assert AT_UNSAFE == {"days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month",
                         "year", "predict_linear", "time", "timestamp"}
    assert {n for n, f in FUNCTIONS.items() if f.native_only} == {"histogram_count", "histogram_sum",
                                                                  "histogram_fraction"}
    for f in ALL_FUNCTIONS.values():
        assert f.why, f.name
        assert f.is_range == ("matrix" in f.args)
        assert f.answer != "one" or f.shard in ("constant", "unshardable"), f.name
        assert f.returns != "scalar" or f.answer == "one", f.name
        assert f.min_args <= len(f.args)


def test_the_evaluators_know_exactly_the_242_functions() -> None:
    from proxy.engine.functions import INSTANT_FUNCTIONS
    from proxy.engine.windows import RANGE_FUNCTIONS
    from shardplanner.analysis import ABSENT_LIKE

    assert set(INSTANT_FUNCTIONS) | set(RANGE_FUNCTIONS) | set(ABSENT_LIKE) == set(FUNCTIONS)
    assert set(RANGE_FUNCTIONS) | {"absent_over_time"} == {n for n, f in FUNCTIONS.items() if f.is_range}
    assert AT_UNSAFE <= set(FUNCTIONS)


def test_unknown_names() -> None:
    assert unknown_names(parse('sort_by_label(sum(rate(x[5m])), "a")')) == ["sort_by_label"]
    assert unknown_names(parse("limitk(2, x)")) == ["limitk"]
    assert unknown_names(parse("topk(3, holt_winters(x[1h], 0.1, 0.2))")) == []


@pytest.mark.parametrize("query", [
    '{__name__=~"(?<n>a)|b"}',
    'x{a!~"x(?<n>y)"}',
    'label_replace(x, "a", "$1", "b", "(?<n>.+)")',
])
def test_go_119_named_groups_are_not_planned(query: str) -> None:
    with pytest.raises(CannotParse, match="named group"):
        parse(query)


@pytest.mark.parametrize("query", [
    'x{a=~"(?P<n>a)"}',  # Go's own syntax
    'x{a=~"\\\\(?<n>"}',  # an escaped parenthesis
    'x{a=~"[(?<]"}',  # inside a character class
    'x{a=~"(?i)a"}',
    'x{a="(?<n>)"}',  # not a regex
])
def test_other_groups_parse(query: str) -> None:
    parse(query)
