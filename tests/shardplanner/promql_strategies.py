"""Hypothesis strategies of PromQL for the printer's round-trip tests
(tests/shardplanner/test_serialize.py): random PromQL text from a small typed grammar (also
over the data the test Prometheus holds), and random hand-built trees without Paren nodes, so
the printer has to add the parentheses precedence needs."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from shardplanner.ast import (
    Agg,
    Binary,
    Call,
    Expr,
    Matcher,
    MatrixSel,
    Number,
    Paren,
    Selector,
    Subquery,
    Unary,
    VectorMatching,
    transform,
)
from shardplanner.serialize import quote_string

# --- hypothesis: random PromQL text ------------------------------------------------------
HARD_CHARS = [
    "\\", '"', "'", "\n", "\t", "\r", "é", "😀", "日", "\u2028", "\x01", "\x7f", "\ufffd",
    ".", "*", "+", "?", "|", "(", ")", "[", "]", "{", "}", "^", "$", "#", "`", "@", " ",
    "a", "Z", "0", ",", "=", "~",
]
_REGEX_META = set("\\.+*?()|[]{}^$")
METRICS = ["up", "node_cpu_seconds_total", "DCGM_FI_DEV_GPU_UTIL", "x:y:z", "sum", "offset", "by"]
LABELS = ["a", "job", "Hostname", "le", "on", "bool", "offset", "by", "_x1"]

values = st.text(alphabet=st.sampled_from(HARD_CHARS), max_size=6)


@st.composite
def string_literal(draw: st.DrawFn, value: str | None = None) -> str:
    """`value` as a PromQL string literal in one of several legal spellings."""
    if value is None:
        value = draw(values)
    styles = ["go", "single", "escape_all"]
    if "`" not in value and "\ufffd" not in value:
        styles.append("raw")
    style = draw(st.sampled_from(styles))
    if style == "go":
        return quote_string(value)
    if style == "raw":
        return f"`{value}`"
    if style == "single":
        return "'" + quote_string(value)[1:-1].replace('\\"', '"').replace("'", "\\'") + "'"
    # Every character escaped, in the escape forms Prometheus accepts.
    out = []
    for ch in value:
        cp = ord(ch)
        if cp < 0x80:
            out.append(draw(st.sampled_from([f"\\x{cp:02x}", f"\\{cp:03o}", f"\\u{cp:04x}"])))
        elif cp <= 0xFFFF:
            out.append(draw(st.sampled_from([f"\\u{cp:04x}", f"\\U{cp:08x}"])))
        else:
            out.append(f"\\U{cp:08x}")
    return '"' + "".join(out) + '"'


def _regex_quote(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


@st.composite
def regex_value(draw: st.DrawFn) -> str:
    parts = draw(st.lists(values.map(_regex_quote), min_size=1, max_size=3))
    return "|".join(parts) + draw(st.sampled_from(["", ".*", ".+", "[a-z]?", "\\d+"]))


@st.composite
def matcher(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(LABELS))
    op = draw(st.sampled_from(["=", "!=", "=~", "!~"]))
    value = draw(regex_value() if op.endswith("~") else values)
    return f"{name}{op}{draw(string_literal(value))}"


@st.composite
def duration(draw: st.DrawFn) -> str:
    return draw(
        st.sampled_from(["5m", "1h30m", "90s", "1d", "1w", "1y", "250ms", "1m30s500ms", "2h", "10s"])
    )


@st.composite
def modifiers(draw: st.DrawFn) -> str:
    parts = []
    if draw(st.booleans()):
        parts.append(" offset " + draw(st.sampled_from(["", "-"])) + draw(duration()))
    if draw(st.booleans()):
        at = draw(st.sampled_from(["start()", "end()", "1700000000", "1700000000.123", "0", "1.5e9"]))
        parts.append(f" @ {at}")
    if draw(st.booleans()):
        parts.reverse()
    return "".join(parts)


@st.composite
def selector(draw: st.DrawFn, names: list[str] = METRICS, matchers: st.SearchStrategy[list[str]] | None = None,
             any_name: str = '__name__=~"up|x.+"') -> str:
    name = draw(st.sampled_from(names + [""]))
    ms = draw(matchers if matchers is not None else st.lists(matcher(), max_size=3))
    if not name:
        ms.insert(0, any_name)
    body = "{" + ", ".join(ms) + "}" if ms or draw(st.booleans()) else ""
    return name + body


@st.composite
def number(draw: st.DrawFn) -> str:
    choice = draw(st.sampled_from(["int", "float", "form"]))
    if choice == "int":
        return str(draw(st.integers(0, 10**20)))
    if choice == "float":
        return repr(draw(st.floats(allow_nan=True, allow_infinity=True)))
    return draw(
        st.sampled_from(["0x1f", "0XfF", "1e3", "1.5E-7", ".5", "5.", "NaN", "Inf", "+Inf", "-Inf", "nan", "0755"])
    )


# Selectors that match the self-scraping Prometheus of the `prom` fixture below (its own
# metrics, labels that exist, offsets into the past, ranges over a few scrapes): the property
# test against Prometheus draws mostly from these, so that most examples compare data.
DATA_METRICS = ["up", "prometheus_build_info", "prometheus_http_requests_total", "prometheus_tsdb_head_series",
                "scrape_duration_seconds"]
DATA_MATCHERS = ['job="prometheus"', 'instance=~"127\\\\.0\\\\.0\\\\.1:.+"', 'job!="x\\"y"',
                 'code!~"5.."', "job=~`prom.*`"]  # each matches every series of DATA_METRICS


def data_selector() -> st.SearchStrategy[str]:
    return selector(DATA_METRICS, st.lists(st.sampled_from(DATA_MATCHERS), max_size=2, unique=True),
                    '__name__=~"up|prometheus_h.+"')


@st.composite
def data_modifiers(draw: st.DrawFn) -> str:
    parts = []
    if draw(st.booleans()):
        # the fixture answers at 2 s before now, once 5 one-second scrapes are in
        parts.append(" offset " + draw(st.sampled_from(["500ms", "1s", "1s500ms"])))
    if draw(st.booleans()):
        parts.append(" @ " + draw(st.sampled_from(["start()", "end()"])))
    if draw(st.booleans()):
        parts.reverse()
    return "".join(parts)


def data_duration() -> st.SearchStrategy[str]:
    return st.sampled_from(["3s", "5s", "10s", "1m"])


def _vector_and_scalar(
    selector_s: Callable[[], st.SearchStrategy[str]] = lambda: selector(),
    modifiers_s: Callable[[], st.SearchStrategy[str]] = lambda: modifiers(),
    duration_s: Callable[[], st.SearchStrategy[str]] = lambda: duration(),
) -> tuple[st.SearchStrategy[str], st.SearchStrategy[str]]:
    selector, modifiers, duration = selector_s, modifiers_s, duration_s  # noqa: F811 -- the leaves in use
    scalar_leaf = st.one_of(number(), st.just("time()"))
    vector_leaf = st.one_of(selector().flatmap(lambda s: modifiers().map(lambda m: s + m)))

    def extend(vec: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        atom = st.one_of(vector_leaf, vec.map(lambda v: f"({v})"))
        matrix = st.one_of(
            st.tuples(selector(), duration(), modifiers()).map(lambda t: f"{t[0]}[{t[1]}]{t[2]}"),
            st.tuples(atom, duration(), st.one_of(st.just(""), duration()), modifiers()).map(
                lambda t: f"{t[0]}[{t[1]}:{t[2]}]{t[3]}"
            ),
        )
        grouping = st.one_of(
            st.just(""),
            st.tuples(st.sampled_from(["by", "without"]), st.lists(st.sampled_from(LABELS), max_size=2)).map(
                lambda t: f" {t[0]} ({', '.join(t[1])}) "
            ),
        )
        agg = st.one_of(
            st.tuples(st.sampled_from(["sum", "avg", "min", "max", "count", "group", "stddev"]), grouping, vec).map(
                lambda t: f"{t[0]}{t[1]}({t[2]})"
            ),
            st.tuples(st.sampled_from(["topk", "bottomk"]), grouping, scalar_leaf, vec).map(
                lambda t: f"{t[0]}{t[1]}({t[2]}, {t[3]})"
            ),
            st.tuples(grouping, vec).map(lambda t: f"quantile{t[0]}(0.9, {t[1]})"),
            st.tuples(string_literal(), vec).map(lambda t: f"count_values({t[0]}, {t[1]})"),
            st.tuples(vec, st.sampled_from(LABELS)).map(lambda t: f"sum({t[0]}) by ({t[1]})"),
        )
        calls = st.one_of(
            st.tuples(st.sampled_from(["abs", "ceil", "sort_desc", "timestamp"]), vec).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(
                st.sampled_from(["rate", "increase", "avg_over_time", "max_over_time", "count_over_time"]), matrix
            ).map(lambda t: f"{t[0]}({t[1]})"),
            matrix.map(lambda m: f"quantile_over_time(0.5, {m})"),
            st.tuples(vec, string_literal(), string_literal(), st.sampled_from(LABELS), regex_value()).map(
                lambda t: f'label_replace({t[0]}, "dst", {t[1]}, "{t[3]}", {quote_string(t[4])})'
            ),
            scalar_leaf.map(lambda s: f"vector({s})"),
        )
        arith = st.sampled_from(["+", "-", "*", "/", "%", "^", "atan2"])
        compare = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
        labels = st.lists(st.sampled_from(LABELS), max_size=2, unique=True)
        matching = st.one_of(
            st.just(""),
            st.tuples(st.sampled_from(["on", "ignoring"]), labels).map(lambda t: f" {t[0]}({', '.join(t[1])})"),
            st.tuples(st.sampled_from(["left", "right"]), st.sampled_from(["", "()", "(extra)", "(e1, e2)"])).map(
                lambda t: f" on(a) group_{t[0]}{t[1]}"
            ),
        )
        binary = st.one_of(
            st.tuples(vec, arith, matching, vec).map(lambda t: f"{t[0]} {t[1]}{t[2]} {t[3]}"),
            st.tuples(vec, compare, st.sampled_from(["", " bool"]), matching, vec).map(
                lambda t: f"{t[0]} {t[1]}{t[2]}{t[3]} {t[4]}"
            ),
            st.tuples(vec, st.sampled_from(["and", "or", "unless"]), st.sampled_from(["", " on()", " ignoring(a)"]), vec).map(
                lambda t: f"{t[0]} {t[1]}{t[2]} {t[3]}"
            ),
            st.tuples(vec, st.one_of(arith, compare.map(lambda c: c + " bool")), scalar_leaf).map(
                lambda t: f"{t[0]} {t[1]} {t[2]}"
            ),
            st.tuples(scalar_leaf, arith, vec).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        )
        unary = st.tuples(st.sampled_from(["-", "+", "- -"]), atom).map(lambda t: t[0] + t[1])
        return st.one_of(atom, agg, calls, binary, unary)

    vector = st.recursive(vector_leaf, extend, max_leaves=6)
    scalar = st.recursive(
        scalar_leaf,
        lambda s: st.one_of(
            s.map(lambda x: f"({x})"),
            st.tuples(s, st.sampled_from(["+", "-", "*", "/", "^", "%"]), s).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            st.tuples(s, st.sampled_from(["==", ">", "<="]), s).map(lambda t: f"{t[0]} {t[1]} bool {t[2]}"),
            s.map(lambda x: f"-{x}"),
        ),
        max_leaves=4,
    )
    return vector, scalar


_VECTOR, _SCALAR = _vector_and_scalar()
queries = st.one_of(_VECTOR, _SCALAR, string_literal())
DATA_VECTOR, _ = _vector_and_scalar(data_selector, data_modifiers, data_duration)


# --- hypothesis: hand-built trees ---------------------------------------------------------
def normalise(tree: Expr) -> Expr:
    """Drop Paren nodes and fold `-<number>`: what differs between a hand-built tree and its
    printed-and-parsed form without changing the query's meaning."""

    def fold(node: Expr) -> Expr:
        if isinstance(node, Paren):
            return node.expr
        if isinstance(node, Unary) and isinstance(node.expr, Number):
            return Number(-node.expr.value)
        return node

    return transform(tree, fold)


simple_selectors = st.builds(
    Selector,
    st.sampled_from(["a", "b", "up"]),
    st.lists(st.builds(Matcher, st.sampled_from(LABELS), st.just("="), values), max_size=2).map(tuple),
    st.sampled_from([0, 60_000, -30_000]),
    st.sampled_from([None, "start", "end", 1_700_000_000_123]),
)
tree_numbers = st.builds(Number, st.floats(allow_nan=True, allow_infinity=True))


def typed_trees() -> st.SearchStrategy[tuple[Expr, bool]]:
    """(tree, is_vector) pairs; only type-correct trees, since promql-parser type-checks."""
    leaves = st.one_of(simple_selectors.map(lambda s: (s, True)), tree_numbers.map(lambda n: (n, False)))

    def extend(sub: st.SearchStrategy[tuple[Expr, bool]]) -> st.SearchStrategy[tuple[Expr, bool]]:
        vectors = sub.filter(lambda t: t[1]).map(lambda t: t[0])

        @st.composite
        def binary(draw: st.DrawFn) -> tuple[Expr, bool]:
            (lhs, lv), (rhs, rv) = draw(sub), draw(sub)
            ops = sorted(["+", "-", "*", "/", "%", "^", "atan2", "==", "!=", "<", ">"])
            if lv and rv:
                ops += ["and", "or", "unless"]
            op = draw(st.sampled_from(ops))
            is_cmp = op in ("==", "!=", "<", ">")
            return_bool = is_cmp and (not (lv or rv) or draw(st.booleans()))
            matching = None
            if lv and rv and draw(st.booleans()):
                group = None if op in ("and", "or", "unless") else draw(st.sampled_from([None, "left", "right"]))
                matching = VectorMatching(draw(st.booleans()), ("x",), group, ("y",) if group else ())
            return Binary(op, lhs, rhs, return_bool, matching), lv or rv

        return st.one_of(
            binary(),
            sub.map(lambda t: (Unary(t[0]), t[1])),
            vectors.map(lambda v: (Agg("sum", v, grouping=("x",)), True)),
            st.tuples(vectors, st.sampled_from([None, 60_000])).map(
                lambda t: (Call("max_over_time", (Subquery(t[0], 300_000, t[1]),)), True)
            ),
            simple_selectors.map(lambda s: (Call("rate", (MatrixSel(s, 300_000),)), True)),
        )

    return st.recursive(leaves, extend, max_leaves=8)
