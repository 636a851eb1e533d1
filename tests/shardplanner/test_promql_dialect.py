"""Regexes read in the backend's dialect (issue 27 item 4): Go 1.22's regexp added the named
group `(?<name>...)`; Go 1.19's (Prometheus 2.42) rejects it. `parse(query, dialect)` plans
such a query only for a dialect that reads it; `(?P<name>...)` is every Go's."""

from __future__ import annotations

import pytest

from shardplanner.ast import Call, Matcher, Selector, String
from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.planner import plan
from shardplanner.promql import GO_1_19, CannotParse, Dialect, dialect_matters, parse

GO_1_22 = Dialect((1, 22))
ANGLE = [
    'up{a=~"(?<n>x)"}',
    'x{a!~"x(?<n>y)"}',
    '{__name__=~"(?<n>a)|b"}',
    'label_replace(x, "a", "$n", "b", "(?<n>.+)")',
    'x{a=~"\\x28?<n>y)"}',  # the `(` written as an escape: the regex is still `(?<n>y)`
    "sum(rate(x{a=~`(?<n>y)`}[5m]))",
]


@pytest.mark.parametrize("query", ANGLE)
def test_a_named_group_is_refused_by_go_1_19_and_read_by_go_1_22(query: str) -> None:
    with pytest.raises(CannotParse, match=r"named group .*go1\.19"):
        parse(query, GO_1_19)
    with pytest.raises(CannotParse, match="named group"):
        parse(query)  # the default is the conservative dialect
    assert parse(query, GO_1_22) == parse(query, Dialect((1, 23)))
    # The cache holds one reading per text, whichever dialect asked first.
    with pytest.raises(CannotParse):
        parse(query, Dialect((1, 21)))


def test_the_go_1_22_reading_keeps_the_regex_as_written() -> None:
    assert parse('up{a=~"(?<n>x)"}', GO_1_22) == Selector("up", (Matcher("a", "=~", "(?<n>x)"),))
    lr = parse('label_replace(x, "a", "${n}-$1", "b", "(?<n>.+)")', GO_1_22)
    assert isinstance(lr, Call) and lr.args[2] == String("${n}-$1") and lr.args[4] == String("(?<n>.+)")


@pytest.mark.parametrize("query", [
    'x{a=~"(?P<n>a)"}',  # Go's own spelling, in every version
    'label_replace(x, "a", "$n", "b", "(?P<n>.+)")',
    'x{a=~"\\\\(?<n>"}',  # an escaped parenthesis
    'x{a=~"[(?<]"}',  # inside a character class
    'x{a="(?<n>)"}',  # not a regex
    'label_join(x, "a", "(?<n>", "b")',  # a separator, not a regex
])
def test_other_groups_parse_in_both_dialects(query: str) -> None:
    assert parse(query, GO_1_19) == parse(query, GO_1_22)


def test_a_look_behind_is_not_a_named_group_and_no_go_reads_it() -> None:
    # `(?<=` / `(?<!`: no Go version reads them; promql-parser refuses the regex itself, in
    # every dialect, and not as a named group.
    for dialect in (GO_1_19, GO_1_22):
        with pytest.raises(CannotParse) as info:
            parse('x{a=~"(?<=a)b"}', dialect)
        assert "named group" not in str(info.value)


@pytest.mark.parametrize(("text", "go"), [
    ("go1.19.5", (1, 19)), ("go1.22.0", (1, 22)), ("go1.21rc2", (1, 21)), ("devel go1.23-abc", (1, 23)),
    ("go1.22", (1, 22)),
])
def test_a_dialect_from_buildinfo_go_version(text: str, go: tuple[int, int]) -> None:
    dialect = Dialect.of_go_version(text)
    assert dialect is not None and dialect.go == go and str(dialect) == f"go{go[0]}.{go[1]}"


@pytest.mark.parametrize("text", ["", "1.22", "gccgo", "go", "x" * 100 + "go1.22.0"])
def test_no_dialect_from_a_text_naming_no_go_version(text: str) -> None:
    assert Dialect.of_go_version(text) is None


def test_dialects_order_by_version() -> None:
    assert GO_1_19 < GO_1_22 < Dialect((1, 100)) and Dialect((2, 0)) > Dialect((1, 99))


@pytest.mark.parametrize(("query", "matters"), [
    ("sum(rate(x[5m]))", False), ('x{a=~"a.*"}', False), ('x{a=~"(?<n>a)"}', True), ('x{a=~"\\\\d"}', True),
])
def test_whether_the_dialect_matters_to_a_query_text(query: str, matters: bool) -> None:
    assert dialect_matters(query) is matters


def test_every_text_the_dialect_does_not_matter_to_parses_alike() -> None:
    for query in ['x{a=~"(?P<n>a)"}', 'up{a=~"[(]?<n>"}', "sum(x) / 2"]:
        assert not dialect_matters(query)
        assert parse(query, GO_1_19) == parse(query, GO_1_22)


def test_the_planner_plans_in_its_settings_dialect() -> None:
    req = QueryRequest.range('sum by (Hostname) (label_replace(DCGM_FI_DEV_GPU_UTIL, "h", "$n", "Hostname", '
                             '"(?<n>.+)"))', 0, 3_600_000, 60_000)
    old = plan(req, PlannerSettings(shards=4), {"Hostname": ("a", "b", "c", "d")})
    new = plan(req, PlannerSettings(shards=4, dialect=GO_1_22), {"Hostname": ("a", "b", "c", "d")})
    assert old.expr is None and old.notes == ("unparsable by planner",) and len(old.pieces) == 1
    assert old.pieces[0].query == req.query  # forwarded as it is: the backend's answer stands
    assert new.expr is not None and new.sharded and len(new.pieces) == 4
    assert all("(?<n>.+)" in p.query for p in new.pieces)
