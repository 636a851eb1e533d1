"""The one door to promql-parser (shardplanner/promql.py): what it reads as Prometheus 2.42
does, what it refuses to plan (CannotParse: the backend's own answer then stands), its
bounds, and its cache."""

from __future__ import annotations

import pytest

from shardplanner.ast import (
    Agg,
    Binary,
    Call,
    Matcher,
    MatrixSel,
    Number,
    Selector,
    Subquery,
    Unary,
    VectorMatching,
    unparen,
)
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


# promql-parser rejects these, or would read them differently from Prometheus 2.42.
CANNOT_PARSE: dict[str, str] = {
    "syntax_error": "sum(",
    "unterminated_raw": "up{a=`x}",
    "negative_at": "up @ -100",
    "byte_escape_hex": 'up{a="\\x80"}',
    "byte_escape_octal": 'up{a="\\377"}',
    "raw_replacement_char": 'up{a="\ufffd"}',
    "quoted_label_name": 'up{"a"="b"}',
    "quoted_metric_name": '{"up"}',
    "fill_modifier": "a + fill(0) b",
    "offset_zero": "up offset 0s",
    "float_overflow": "vector(1) * 1e400",
    "float_overflow_digits": "1" + "0" * 400,
    "named_group": 'up{a=~"(?<n>x)"}',  # Go 1.19's regexp (2.42's) has no (?<name>...)
    "group_left_without_on": "a * group_left b",
}


@pytest.mark.parametrize("query", CANNOT_PARSE.values(), ids=CANNOT_PARSE.keys())
def test_cannot_parse(query: str) -> None:
    with pytest.raises(CannotParse):
        parse(query)


def test_parsed_shapes() -> None:
    """promql-parser's shapes, as converted: the facts the planner relies on."""
    assert parse("x[5m:]") == Subquery(Selector("x"), 300_000, None)
    assert parse("x[5m] offset -1m @ end()") == MatrixSel(Selector("x", offset_ms=-60_000, at="end"), 300_000)
    assert parse("x @ 1.5") == Selector("x", at=1_500)
    assert parse("-1") == Number(-1.0)
    assert parse("-1 ^ 2") == Unary(Binary("^", Number(1), Number(2)))
    assert parse("+x") == Selector("x")
    assert parse('{__name__="up"}').metric_name == "up"  # type: ignore[union-attr]
    assert parse('{a="b" or c="d"}') == Selector(
        None, (), or_matchers=((Matcher("a", "=", "b"),), (Matcher("c", "=", "d"),))
    )
    assert parse("a and b") == Binary("and", Selector("a"), Selector("b"))
    assert parse("a + on(x) group_right b") == Binary(
        "+", Selector("a"), Selector("b"), matching=VectorMatching(True, ("x",), "right", ())
    )
    assert parse("sum by () (x)") == Agg("sum", Selector("x"), grouping=())


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
