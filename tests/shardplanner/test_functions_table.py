"""The Prometheus 2.42 function table (shardplanner/functions.py) against everything the
parser and the evaluators know."""

from __future__ import annotations

import pytest

from shardplanner.functions import AGGREGATIONS, AT_UNSAFE, FUNCTIONS, unknown_names
from shardplanner.promql import CannotParse, parse
from shardplanner.rules import RULES


def test_every_function_the_parser_knows_is_in_the_table_or_unknown_to_242() -> None:
    # RULES classifies every function and aggregation promql-parser 0.12 knows.
    newer = sorted(n for n in RULES if n not in FUNCTIONS and n not in AGGREGATIONS)
    # Prometheus 3 (or promql-parser extensions): a query using one gets the backend's error.
    assert {"sort_by_label", "limitk", "double_exponential_smoothing"} <= set(newer)
    assert not set(FUNCTIONS) - set(RULES) and not AGGREGATIONS - set(RULES)


def test_the_evaluators_know_exactly_the_242_functions() -> None:
    from proxy.result.functions import INSTANT_FUNCTIONS
    from proxy.result.windows import RANGE_FUNCTIONS
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
