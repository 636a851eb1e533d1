"""The one door to promql-parser (shardplanner/promql.py): what it reads as Prometheus 2.42
does, what it refuses to plan (CannotParse: the backend's own answer then stands), its
bounds, and its cache."""

from __future__ import annotations

import pytest

from shardplanner.ast import Binary, Call, Matcher, MatrixSel, Number, Selector, Unary, unparen
from shardplanner.promql import MAX_NESTING, MAX_OPERATORS, MAX_QUERY_BYTES, CannotParse, TooComplex, parse


def test_a_raw_string_is_taken_verbatim() -> None:
    # Prometheus's lexer (promql/parser/lex.go, lexRawString) keeps backslashes in backtick
    # strings as they are: `raw\d` is the four characters r, a, w, \, d.
    assert parse(r"up{a=`raw\d`}") == Selector("up", (Matcher("a", "=", "raw\\d"),))
    assert parse(r'up{a="raw\\d"}') == parse(r"up{a=`raw\d`}")


def test_holt_winters_is_a_2_42_function() -> None:
    # 2.42 promql/parser/functions.go lists holt_winters (Prometheus 3 renamed it).
    node = parse("holt_winters(x[10m], 0.5, 0.5)")
    assert isinstance(node, Call) and node.func == "holt_winters"
    assert node.args[0] == MatrixSel(Selector("x"), 600_000)


@pytest.mark.parametrize(("query", "at_ms"), [
    ("x @ 1700000000", 1_700_000_000_000),
    ("x @ 1700000000.25", 1_700_000_000_250),
    ("x @ 0.0015", 2),  # math.Round(1.5) = 2: half away from zero
])
def test_at_becomes_milliseconds_rounded_as_prometheus(query: str, at_ms: int) -> None:
    # 2.42 parser.go (newAtModifier... timestamp.FromFloatSeconds): int64(math.Round(ts*1000)).
    node = parse(query)
    assert isinstance(node, Selector) and node.at == at_ms


def test_unary_plus_is_dropped_and_minus_kept() -> None:
    # Prometheus's parser (generated_parser.y, unary_expr) drops a unary plus.
    assert parse("+x") == Selector("x")
    assert parse("-x") == Unary(Selector("x"))
    assert parse("-1") == Number(-1.0)


@pytest.mark.parametrize("query", [
    'up{a="\\x80"}',  # Prometheus: raw byte 0x80; promql-parser: U+0080
    'up{a="\\377"}',
    "up{a=\"\ufffd\"}",  # a raw U+FFFD: 2.42's lexer rejects it in strings
    '{"a"="b"}',  # quoted label names are Prometheus 3 syntax
    'up{a=~"(?<n>x)"}',  # Go 1.19's regexp (2.42) has no (?<name>...)
    "x @ -100",  # promql-parser 0.12 panics reading it back
    "1e400",  # beyond float64: 2.42 rejects it, promql-parser reads +Inf
    "sum(rate(",  # plain syntax error
    "a * group_left b",
])
def test_what_is_not_read_as_2_42_reads_it_is_not_planned(query: str) -> None:
    with pytest.raises(CannotParse):
        parse(query)


def test_a_named_group_in_go_spelling_is_fine() -> None:
    # (?P<name>...) is Go's own spelling, and a `(?<` inside a character class is text.
    assert parse('up{a=~"(?P<n>x)"}') == Selector("up", (Matcher("a", "=~", "(?P<n>x)"),))
    assert parse('up{a=~"[(?<]x"}') == Selector("up", (Matcher("a", "=~", "[(?<]x"),))


def test_bounds_make_a_query_too_complex() -> None:
    chain = " + ".join(["1"] * (MAX_OPERATORS + 2))
    nested = "(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1)
    long = "x" + " " * MAX_QUERY_BYTES
    for query in (chain, nested, long):
        with pytest.raises(TooComplex):
            parse(query)
    # Just inside the bounds: parsed.
    assert isinstance(parse(" + ".join(["1"] * (MAX_OPERATORS // 2))), Binary)
    assert unparen(parse("(" * (MAX_NESTING - 1) + "1" + ")" * (MAX_NESTING - 1))) == Number(1.0)


def test_operators_inside_strings_do_not_count() -> None:
    text = "+" * (MAX_OPERATORS * 2)
    assert parse(f'up{{a="{text}"}}') == Selector("up", (Matcher("a", "=", text),))


def test_results_and_failures_are_cached_by_text() -> None:
    q = 'sum by (h) (rate(cache_test_metric{a="1"}[5m]))'
    assert parse(q) is parse(q)  # one immutable tree, shared
    bad = " * ".join(["1"] * (MAX_OPERATORS + 5))
    for _ in range(2):  # the cached failure keeps its type
        with pytest.raises(TooComplex):
            parse(bad)
