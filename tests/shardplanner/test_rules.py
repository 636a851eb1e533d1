"""The shardability table covers every PromQL function and aggregation, and reads right."""

from __future__ import annotations

from typing import get_args

import pytest

from shardplanner.ast import AGGREGATION_OPS
from shardplanner.plan import AggOp
from shardplanner.promql import CannotParse, parse
from shardplanner.rules import (
    MERGEABLE_AGGREGATIONS,
    RULES,
    is_constant,
    is_shard_local,
    rule_for,
    time_splittable,
    unshardable_reasons,
)

# Prometheus 2.42's promql/parser/functions.go, in full.
PROMETHEUS_2_42_FUNCTIONS = """
abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
clamp_max clamp_min cos cosh count_over_time days_in_month day_of_month day_of_week day_of_year
deg delta deriv exp floor histogram_count histogram_fraction histogram_quantile histogram_sum
holt_winters hour idelta increase irate label_replace label_join last_over_time ln log10 log2
max_over_time min_over_time minute month pi predict_linear present_over_time quantile_over_time
rad rate resets round scalar sgn sin sinh sort sort_desc sqrt stddev_over_time stdvar_over_time
sum_over_time tan tanh time timestamp vector year
""".split()
PROMETHEUS_2_42_AGGREGATIONS = """
sum avg count min max group stddev stdvar topk bottomk count_values quantile
""".split()
# Names promql-parser 0.12 accepts beyond 2.42 (Prometheus 3 and its own extensions), plus
# names of newer Prometheus releases: whichever the parser knows must be classified too.
NEWER_FUNCTIONS = """
double_exponential_smoothing histogram_avg histogram_stddev histogram_stdvar histogram_quantiles
sort_by_label sort_by_label_desc info mad_over_time first_over_time ts_of_max_over_time
ts_of_min_over_time ts_of_last_over_time ts_of_first_over_time start end range step
start_timestamp max_of min_of integral
""".split()

# Argument shapes to find out whether the parser knows a function name at all.
_SHAPES = [
    "()",
    "(x)",
    "(x[5m])",
    "(1, x)",
    "(x, 1)",
    "(x, 1, 2)",
    "(1, 2, x)",
    "(0.5, x[5m])",
    "(x[5m], 1)",
    "(x[5m], 0.5, 0.5)",
    '(x, "a")',
    '(x, "a", "b", "c")',
    '(x, "a", "b", "c", "d")',
    '(x, "q", 0.5, 0.9)',
    "(1, 2)",
    "(x, y)",
]


def parser_knows(name: str) -> bool:
    for shape in _SHAPES:
        try:
            parse(name + shape)
            return True
        except CannotParse:
            continue
    return False


def test_every_2_42_function_and_aggregation_is_classified() -> None:
    missing = [n for n in PROMETHEUS_2_42_FUNCTIONS if n not in RULES]
    assert not missing
    assert all(RULES[n].node == "function" for n in PROMETHEUS_2_42_FUNCTIONS)
    assert all(RULES[n].node == "aggregation" for n in PROMETHEUS_2_42_AGGREGATIONS)


def test_every_function_the_parser_knows_is_classified() -> None:
    known = [n for n in PROMETHEUS_2_42_FUNCTIONS + NEWER_FUNCTIONS if parser_knows(n)]
    assert len(known) > 80  # the probe works (holt_winters is renamed in promql-parser 0.12)
    assert [n for n in known if n not in RULES] == []


def test_every_aggregation_the_ast_knows_is_classified() -> None:
    assert AGGREGATION_OPS <= {n for n, r in RULES.items() if r.node == "aggregation"}
    for op in AGGREGATION_OPS:
        q = (
            f"{op}(x)"
            if op not in ("topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio")
            else (f'{op}("v", x)' if op == "count_values" else f"{op}(1, x)")
        )
        assert parse(q)


def test_no_stale_entries() -> None:
    for name, rule in RULES.items():
        if rule.node == "function":
            assert name in PROMETHEUS_2_42_FUNCTIONS or name in NEWER_FUNCTIONS, name


def test_mergeable_ops_are_merge_recipe_ops() -> None:
    assert MERGEABLE_AGGREGATIONS <= set(get_args(AggOp))


def test_unknown_names_are_unshardable() -> None:
    assert rule_for("no_such_function").kind == "unshardable"


def test_rule_kinds() -> None:
    assert MERGEABLE_AGGREGATIONS == {
        "sum",
        "min",
        "max",
        "count",
        "group",
        "avg",
        "topk",
        "bottomk",
    }
    for name in ("quantile", "stddev", "stdvar", "count_values"):
        assert RULES[name].kind == "group_local"
    for name in (
        "absent",
        "absent_over_time",
        "scalar",
        "vector",
        "sort",
        "sort_desc",
        "sort_by_label",
        "sort_by_label_desc",
        "limitk",
        "limit_ratio",
        "info",
    ):
        assert RULES[name].kind == "unshardable", name
    assert RULES["time"].kind == "constant"
    assert RULES["label_replace"].kind == RULES["label_join"].kind == "label_write"
    assert all(r.reason for r in RULES.values())


def test_docstring_table_names_every_kind() -> None:
    import shardplanner.rules as mod

    assert mod.__doc__ is not None
    for kind in {r.kind for r in RULES.values()}:
        assert kind in mod.__doc__


# --- is_shard_local: (query, local for Hostname) ------------------------------------------------

LOCAL = [
    ("x", True),
    ("x[5m]", True),
    ('x{Hostname=~"a|b"} offset 5m', True),
    ("rate(x[5m])", True),
    ("-x", True),
    ("(x)", True),
    ("x > 0", True),
    ("0 < x", True),
    ("x > bool 50", True),
    ("x / 1024", True),
    ("x - time()", True),
    ("x * (2 + pi())", True),
    ("avg_over_time(x[5m])", True),
    ("quantile_over_time(0.9, x[5m])", True),
    ("clamp(x, 0, 100)", True),
    ("round(x, 0.1)", True),
    ("hour(x)", True),
    ("hour()", False),
    ("histogram_quantile(0.9, rate(x_bucket[5m]))", True),
    ("histogram_quantile(0.9, sum by (le, Hostname) (rate(x_bucket[5m])))", True),
    ("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))", False),
    ('label_replace(x, "node", "$1", "Hostname", "(.*)")', True),
    ('label_replace(x, "Hostname", "$1", "node", "(.*)")', False),
    ('label_join(x, "Hostname", ",", "a", "b")', False),
    ('label_join(x, "foo", ",", "Hostname")', True),
    ("max_over_time(rate(x[5m])[1h:5m])", True),
    ("max_over_time(sum(x)[1h:5m])", False),
    ("max_over_time(sum by (Hostname) (x)[1h:])", True),
    ("sum by (Hostname) (x)", True),
    ("avg by (Hostname, gpu) (x)", True),
    ("sum without (gpu) (x)", True),
    ("sum without (Hostname) (x)", False),
    ("sum(x)", False),
    ("sum by () (x)", False),
    ("topk by (Hostname) (3, x)", True),
    ("topk(3, x)", False),
    ("topk by (Hostname) (scalar(y), x)", False),
    ("quantile by (Hostname) (0.9, x)", True),
    ("quantile(0.9, x)", False),
    ('count_values by (Hostname) ("v", x)', True),
    ('count_values without () ("Hostname", x)', False),
    ("stddev by (Hostname) (x)", True),
    ("limitk by (Hostname) (1, x)", False),
    ("x / y", True),
    ("x / on(Hostname, gpu) y", True),
    ("x / on(gpu) y", False),
    ("x / ignoring(gpu) y", True),
    ("x / ignoring(Hostname) y", False),
    ("x * on(Hostname) group_left(model) y", True),
    ("x and y", True),
    ("x unless on(Hostname) y", True),
    ("x and on() y", False),
    ("x or y", True),
    ("x or vector(0)", False),
    ("sum(x) or vector(0)", False),
    ("x > scalar(y)", False),
    ("absent(x)", False),
    ("absent_over_time(x[5m])", False),
    ("sort(x)", False),
    ("vector(1)", False),
    ("scalar(x)", False),
    ("time()", False),
    ("1 + 1", False),
    ('"s"', False),
    ("info(x)", False),
]


@pytest.mark.parametrize(("query", "local"), LOCAL)
def test_is_shard_local(query: str, local: bool) -> None:
    assert is_shard_local(parse(query), "Hostname") is local


def test_histogram_quantile_cannot_shard_by_le() -> None:
    assert not is_shard_local(parse("histogram_quantile(0.9, x)"), "le")


@pytest.mark.parametrize(
    ("query", "const"),
    [
        ("1", True),
        ("-(2 * 3)", True),
        ("time()", True),
        ("pi() + 1", True),
        ('"a"', True),
        ("scalar(x)", False),
        ("x", False),
        ("vector(1)", False),
        ("max_of(1, 2)", True),
        ("max_of(scalar(x), 2)", False),
        ("start()", False),
    ],
)
def test_is_constant(query: str, const: bool) -> None:
    assert is_constant(parse(query)) is const


@pytest.mark.parametrize(
    ("query", "ok"),
    [
        ("rate(x[5m])", True),
        ("x - time()", True),
        ("x @ start()", True),
        ("x - start()", False),
        ("x * step()", False),
        ("range() + x", False),
    ],
)
def test_time_splittable(query: str, ok: bool) -> None:
    assert time_splittable(parse(query)) is ok


def test_unshardable_reasons() -> None:
    assert list(unshardable_reasons(parse("sum(x) or vector(0)"))) == [
        "vector: creates a series from nothing in every shard"
    ]
    assert list(unshardable_reasons(parse('label_replace(x, "H", "a", "b", "c")'), "H")) == [
        "label_replace: writes the shard label H"
    ]
    assert list(unshardable_reasons(parse("sum(rate(x[5m]))"))) == []
