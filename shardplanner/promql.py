"""The one door to promql-parser: `parse(query)` returns a `shardplanner.ast` tree.

No other module in the project imports `promql_parser`. The planner works on the frozen
dataclasses of `shardplanner.ast` (rewrite with `dataclasses.replace`, `transform`,
`inject_matcher`) and prints with `shardplanner.serialize.to_promql`.

    parse('sum by (Hostname) (rate(x{a=`raw\\d`}[5m]))')
      -> Agg(op='sum', grouping=('Hostname',),
             expr=Call('rate', (MatrixSel(Selector('x', (Matcher('a', '=', 'raw\\\\d'),)),
                                          300000),)))

`CannotParse` means "cannot plan", not "invalid": the proxy forwards such a query unplanned
and lets the backend's answer (or error) stand. It is raised when promql-parser rejects the
query and also when promql-parser would read it differently from Prometheus 2.42:
- `\\x80`..`\\xff` and `\\200`..`\\377` escapes: Prometheus makes raw bytes of them,
  promql-parser the code points U+0080..U+00FF;
- a raw U+FFFD anywhere: Prometheus rejects it in strings, promql-parser accepts it;
- quoted label or metric names (`{"a"="b"}`, Prometheus 3 syntax): promql-parser accepts them,
  2.42 does not, and printing them back unquoted would make a rejected query valid;
- `fill()` / `fill_left()` / `fill_right()` binary modifiers (newer than 2.42);
- a negative `@` time, which makes promql-parser 0.12 panic when it is read back;
- a decimal literal beyond float64 (`1e400`): Prometheus rejects it, promql-parser reads +Inf;
- a regex the backend's Go regexp rejects although RE2 accepts it: the named group
  `(?<name>...)` before Go 1.22 (`Dialect`, below);
- anything else the conversion does not recognise.

The regex dialect is data passed in: `parse(query, dialect)`, where `Dialect` is the Go
version of the backend that would evaluate the query (the proxy reads the primary's from
`/api/v1/status/buildinfo`). Without one, `GO_1_19` (Prometheus 2.42's Go): the
conservative reading, which plans less and never plans what the backend would reject.

promql-parser 0.12 quirks worked around here:
- a backtick raw string holding a backslash (`` up{a=`raw\\d`} ``) fails to parse ("unknown
  escape sequence"), although Prometheus takes raw strings verbatim: when the query holds a
  backtick, `parse` first rewrites each raw string into the equivalent double-quoted string;
- `holt_winters` (a 2.42 function, renamed in Prometheus 3) is unknown to it: it is registered
  as an extra function;
- `@ <time>` comes back as a datetime: it becomes integer milliseconds, rounded as Prometheus
  rounds `@` (math.Round of seconds * 1000).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import promql_parser as _pp

from shardplanner.ast import (
    Agg,
    At,
    Binary,
    Call,
    Expr,
    Matcher,
    MatchOp,
    MatrixSel,
    Number,
    Paren,
    Selector,
    String,
    Subquery,
    Unary,
    VectorMatching,
    walk,
)
from shardplanner.serialize import quote_string


@dataclass(frozen=True, order=True)
class Dialect:
    """The regexp dialect of the backend that evaluates a query: the Go version it is built
    with (Prometheus compiles every `=~` / `!~` value and label_replace's regex with Go's
    `regexp`, whose syntax grows with Go releases). Pure data, compared by version."""

    go: tuple[int, int] = (1, 19)

    @classmethod
    def of_go_version(cls, text: str) -> Dialect | None:
        """The dialect of a Go version as buildinfo's `goVersion` prints it (`go1.22.0`,
        `go1.21rc2`, `devel go1.23-abc`); None when the text names no Go version."""
        m = _GO_VERSION.search(text[:64])
        if m is None:
            return None
        return cls((int(m.group(1)), int(m.group(2))))

    def __str__(self) -> str:
        return f"go{self.go[0]}.{self.go[1]}"


# Prometheus 2.42's Go: a backend that does not say (AMP has no buildinfo) is read this way.
GO_1_19 = Dialect((1, 19))
# Go 1.22's regexp/syntax added `(?<name>...)` beside `(?P<name>...)`.
NAMED_GROUP_SINCE = (1, 22)
_GO_VERSION = re.compile(r"go([0-9]{1,3})\.([0-9]{1,4})")


class CannotParse(Exception):
    """promql-parser cannot read this query the way Prometheus does: do not plan it."""


class TooComplex(CannotParse):
    """The query is beyond the planner's bounds (MAX_QUERY_BYTES, MAX_OPERATORS, MAX_NESTING):
    it is not parsed at all."""


# Prometheus 2.42 functions promql-parser 0.12 no longer knows (Prometheus 3 renamed
# holt_winters to double_exponential_smoothing). Registration is process-global; this module
# is the only one that talks to promql-parser, so it owns it.
_EXTRA_FUNCTIONS = [
    _pp.Function(
        "holt_winters",
        [_pp.ValueType.Matrix, _pp.ValueType.Scalar, _pp.ValueType.Scalar],
        _pp.ValueType.Vector,
    ),
]
_pp.register_extra_functions(_EXTRA_FUNCTIONS)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_US = timedelta(microseconds=1)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# promql-parser's enums are not hashable: a list of pairs, not a dict.
_MATCH_OPS: list[tuple[Any, MatchOp]] = [
    (_pp.MatchOp.Equal, "="),
    (_pp.MatchOp.NotEqual, "!="),
    (_pp.MatchOp.Re, "=~"),
    (_pp.MatchOp.NotRe, "!~"),
]
_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OCTAL = frozenset("01234567")
_OPERATOR_CHARS = frozenset("+-*/%^=!<>~")
_OPERATOR_PAIR_FIRST = frozenset("=!<>")  # `==`, `!=`, `<=`, `>=`, `=~`, `!~`: one token
_KEYWORD_OPERATORS = frozenset({"and", "or", "unless", "atan2"})
_HEX = frozenset("0123456789abcdefABCDEF")


# --- bounds: what the planner agrees to parse --------------------------------------------
# promql-parser's cost grows with the square of the expression's depth, and it holds the GIL
# throughout (a thread would not keep the event loop free): `1+1+...` with 3,000 terms took
# 5 s and 1.4 GB. Measured on 2 cores: a chain of 256 binary operators parses in ~9 ms, 512 in
# ~28 ms; 64 nested calls in 0.2 ms. Beyond these bounds a query is not planned (CannotParse):
# it is forwarded as it is and the backend decides. Real dashboard queries stay far below.
MAX_QUERY_BYTES = 128 * 1024  # piece queries carry shard regexes of tens of KB
MAX_OPERATORS = 256  # operator tokens (binary, comparison, matchers), outside strings
MAX_NESTING = 64  # open (, {, [ at once
# Parse results by query text, failures included: a dashboard repeats its queries, and each
# request reads its query (and its pieces' queries) several times. Bounded by total text size.
_CACHE_BYTES = 32 * 1024 * 1024
# Each entry holds the dialect-free reading and the Go version its regexes need (a query
# reads the same in every dialect but for which regexes are valid): one entry per text,
# whatever dialect asks, and a dialect too old is refused at lookup.
_cache: OrderedDict[str, tuple[Expr | CannotParse, tuple[int, int]]] = OrderedDict()
_cache_bytes = 0
_cache_lock = threading.Lock()


def parse(query: str, dialect: Dialect = GO_1_19) -> Expr:
    """Parse `query` into a `shardplanner.ast` tree, or raise CannotParse -- also when one of
    its regexes is invalid in `dialect` (the backend's Go regexp). Results (and failures) are
    cached by text, with the Go version they need, so the cache answers every dialect; the
    tree is immutable, so it is shared."""
    global _cache_bytes
    with _cache_lock:
        hit = _cache.get(query)
        if hit is not None:
            _cache.move_to_end(query)
    if hit is None:
        needs = GO_1_19.go
        try:
            tree = _parse(query)
            needs = _regexes_need(tree)
            got: Expr | CannotParse = tree
        except CannotParse as exc:
            got = exc.with_traceback(None)
            got.__cause__ = got.__context__ = None  # keep no parser objects alive
        hit = (got, needs)
        with _cache_lock:
            if query not in _cache:
                _cache[query] = hit
                _cache_bytes += len(query) + 64
                while _cache_bytes > _CACHE_BYTES and _cache:
                    old, _ = _cache.popitem(last=False)
                    _cache_bytes -= len(old) + 64
    expr, needs_go = hit
    if isinstance(expr, CannotParse):
        raise type(expr)(*expr.args)
    if dialect.go < needs_go:
        raise CannotParse(f"named group (?<name>...): the backend's regexp ({dialect}) rejects it "
                          f"(Go {needs_go[0]}.{needs_go[1]} added it)")
    return expr


def dialect_matters(query: str) -> bool:
    """Could `query` read differently in another dialect? Only a regex holding `(?<` can, and
    a PromQL string holds one only as that text or through an escape (`\\x28?<`, `\\050?<`):
    a query with neither parses the same in every dialect, so its caller need not learn the
    backend's."""
    return "(?<" in query or "\\" in query


def _parse(query: str) -> Expr:
    """The dialect-free reading of `query`."""
    if len(query) > MAX_QUERY_BYTES:
        raise TooComplex(f"{len(query)} characters, more than {MAX_QUERY_BYTES}")
    text = _prelex(query)
    try:
        return _convert(_pp.parse(text))
    except CannotParse:
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError):
        raise
    except BaseException as exc:
        # ValueError for a rejected query; pyo3's PanicException (a BaseException) when the
        # Rust side panics, e.g. reading back `@ -100`.
        raise CannotParse(f"{type(exc).__name__}: {exc}") from exc


def _prelex(query: str) -> str:
    """Rewrite backtick raw strings as double-quoted strings; raise CannotParse for input that
    promql-parser and Prometheus read differently (see the module docstring), or that is
    beyond the planner's bounds (MAX_OPERATORS, MAX_NESTING). Linear in the query's length."""
    if "\ufffd" in query:
        raise CannotParse("raw U+FFFD in the query")
    out: list[str] = []
    n = len(query)
    i = 0
    brace_depth = 0
    depth = 0  # open (, {, [
    operators = 0
    last = ""  # last significant character outside strings and comments
    unary = 0  # unary +/- in a row: each one is a level of the parser's recursion
    while i < n:
        c = query[i]
        if c in _OPERATOR_CHARS:
            # Every operator character is a token of its own, whitespace or not (`- - -x` and
            # `---x` are three), except the second character of `==`, `!=`, `>=`, `<=`, `=~`
            # and `!~`. Counting a run as one let 10,000 spaced unary minus signs through, and
            # promql-parser overflowed its stack (SIGSEGV).
            if not (c in "=~" and i and query[i - 1] in _OPERATOR_PAIR_FIRST):
                operators += 1
                if operators > MAX_OPERATORS:
                    raise TooComplex(f"more than {MAX_OPERATORS} operators")
            if c in "+-" and (not last or last in _OPERATOR_CHARS or last in "([{,"):
                unary += 1
                if depth + unary > MAX_NESTING:
                    raise TooComplex(f"nested more than {MAX_NESTING} deep (unary operators count as nesting)")
        elif c in "({[":
            depth += 1
            if depth + unary > MAX_NESTING:
                raise TooComplex(f"nested more than {MAX_NESTING} deep")
        elif c in ")}]":
            depth = max(0, depth - 1)
        elif c.isalpha() and (not i or not _is_word_char(query[i - 1])):
            j = i + 1
            while j < n and _is_word_char(query[j]):
                j += 1
            unary = 0
            if query[i:j].lower() in _KEYWORD_OPERATORS:
                operators += 1
                if operators > MAX_OPERATORS:
                    raise TooComplex(f"more than {MAX_OPERATORS} operators")
            out.append(query[i:j])
            last = query[j - 1]
            i = j
            continue
        if not c.isspace() and c not in "+-(":
            unary = 0
        if c == "#":
            j = query.find("\n", i)
            j = n if j < 0 else j
            out.append(query[i:j])
            i = j
            continue
        if c in "\"'`":
            unary = 0
            if brace_depth and last not in ("=", "~"):
                raise CannotParse("quoted label or metric name (Prometheus 3 syntax)")
            if c == "`":
                j = query.find("`", i + 1)
                if j < 0:  # unterminated: leave it to the parser to reject
                    out.append(query[i:])
                    break
                out.append(quote_string(query[i + 1 : j]))
            else:
                j = _scan_quoted(query, i)
                out.append(query[i : j + 1])
            i = j + 1
            last = c
            continue
        if (c.isdigit() or c == ".") and not (i and _is_word_char(query[i - 1])):
            m = _DECIMAL.match(query, i)
            if m and math.isinf(float(m.group())):
                raise CannotParse(f"number {m.group()} overflows float64")
        if c == "@" and query[i + 1 :].lstrip().startswith("-"):
            raise CannotParse("negative @ time (promql-parser 0.12 panics on it)")
        if c == "{":
            brace_depth += 1
        elif c == "}":
            brace_depth = max(0, brace_depth - 1)
        if not c.isspace():
            last = c
        out.append(c)
        i += 1
    return "".join(out) if "`" in query else query


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c in "_:."


def _scan_quoted(query: str, start: int) -> int:
    """Index of the closing quote of the string opening at `start` (or the last index if it is
    unterminated); raises CannotParse for byte escapes >= 0x80."""
    quote = query[start]
    n = len(query)
    i = start + 1
    while i < n:
        c = query[i]
        if c == quote:
            return i
        if c == "\\" and i + 1 < n:
            e = query[i + 1]
            digits = ""
            if e == "x":
                digits = query[i + 2 : i + 4]
                if len(digits) == 2 and set(digits) <= _HEX and int(digits, 16) >= 0x80:
                    raise CannotParse(f"byte escape \\x{digits}")
            elif e in _OCTAL:
                digits = query[i + 1 : i + 4]
                if len(digits) == 3 and set(digits) <= _OCTAL and int(digits, 8) >= 0o200:
                    raise CannotParse(f"byte escape \\{digits}")
            i += 2
            continue
        i += 1
    return n - 1


def _convert(node: Any) -> Expr:
    if isinstance(node, _pp.VectorSelector):
        return _selector(node)
    if isinstance(node, _pp.MatrixSelector):
        return MatrixSel(_selector(node.vector_selector), _duration_ms(node.range))
    if isinstance(node, _pp.SubqueryExpr):
        if node.range is None:  # the parser always sets it; its stubs allow None
            raise CannotParse("subquery without a range")
        return Subquery(
            expr=_convert(node.expr),
            range_ms=_duration_ms(node.range),
            step_ms=None if node.step is None else _duration_ms(node.step),
            offset_ms=_offset_ms(node.offset),
            at=_at(node.at),
        )
    if isinstance(node, _pp.AggregateExpr):
        mod = node.modifier
        grouping = None if mod is None else tuple(_label(x) for x in mod.labels)
        without = mod is not None and mod.type == _pp.AggModifierType.Without
        return Agg(
            op=str(node.op),
            expr=_convert(node.expr),
            param=None if node.param is None else _convert(node.param),
            grouping=grouping,
            without=without,
        )
    if isinstance(node, _pp.BinaryExpr):
        return _binary(node)
    if isinstance(node, _pp.UnaryExpr):
        return Unary(_convert(node.expr))
    if isinstance(node, _pp.ParenExpr):
        return Paren(_convert(node.expr))
    if isinstance(node, _pp.Call):
        return Call(node.func.name, tuple(_convert(a) for a in node.args))
    if isinstance(node, _pp.NumberLiteral):
        return Number(float(node.val))
    if isinstance(node, _pp.StringLiteral):
        return String(node.val)
    raise CannotParse(f"unsupported node {type(node).__name__}")


def _selector(node: Any) -> Selector:
    name = node.name
    if name is not None and not _METRIC_NAME.match(name):
        raise CannotParse(f"metric name {name!r} is not a Prometheus 2 identifier")
    matchers = tuple(_matcher(m) for m in node.matchers.matchers)
    or_matchers = tuple(tuple(_matcher(m) for m in g) for g in node.matchers.or_matchers)
    if matchers and or_matchers:
        raise CannotParse("selector with both plain and `or` matchers")
    return Selector(
        name=name,
        matchers=matchers,
        offset_ms=_offset_ms(node.offset),
        at=_at(node.at),
        or_matchers=or_matchers,
    )


def _matcher(m: Any) -> Matcher:
    for native, op in _MATCH_OPS:
        if m.op == native:
            return Matcher(_label(m.name), op, m.value)
    raise CannotParse(f"unknown match operator {m.op!r}")


def _regexes_need(expr: Expr) -> tuple[int, int]:
    """The Go version whose regexp reads every regex of `expr`: the `=~` / `!~` matchers and
    label_replace's regex (a literal string; Prometheus compiles it when it evaluates the
    call, engine.go funcLabelReplace: a 422 "invalid regular expression")."""
    needs = GO_1_19.go
    for node in walk(expr):
        regexes: list[str] = []
        if isinstance(node, Selector):
            for m in (*node.matchers, *(m for group in node.or_matchers for m in group)):
                if m.op in ("=~", "!~"):
                    regexes.append(m.value)
        elif isinstance(node, Call) and node.func == "label_replace" and len(node.args) == 5 \
                and isinstance(node.args[4], String):
            regexes.append(node.args[4].value)
        for regex in regexes:
            if _has_angle_named_group(regex):
                needs = max(needs, NAMED_GROUP_SINCE)
    return needs


def _has_angle_named_group(regex: str) -> bool:
    """Does `regex` open a named group spelt `(?<name>` (outside a character class, not
    escaped, not the look-behind `(?<=` / `(?<!` that no Go version accepts)? Go's regexp
    before 1.22 rejects it ("invalid or unsupported Perl syntax"); RE2 here accepts it, so a
    query holding one is planned only for a backend whose Go reads it -- otherwise the
    backend's own answer stands: its parse error (400), or label_replace's "invalid regular
    expression" (422)."""
    if "(?<" not in regex:
        return False
    i, n = 0, len(regex)
    in_class = False
    while i < n:
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if regex.startswith("]", i + 1) or regex.startswith("^]", i + 1):
                i += 2 if regex[i + 1] == "]" else 3
                continue
        elif regex.startswith("(?<", i) and not regex.startswith(("(?<=", "(?<!"), i):
            return True
        i += 1
    return False


def _label(name: str) -> str:
    if not _LABEL_NAME.match(name):
        raise CannotParse(f"label name {name!r} is not a Prometheus 2 identifier")
    return name


def _binary(node: Any) -> Binary:
    op = str(node.op)
    mod = node.modifier
    return_bool = False
    matching = None
    if mod is not None:
        fill = mod.fill_values
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            raise CannotParse("fill() modifiers are not PromQL 2.42")
        return_bool = bool(mod.return_bool)
        card = mod.card
        group: Literal["left", "right"] | None = None
        if card == _pp.VectorMatchCardinality.ManyToOne:
            group = "left"
        elif card == _pp.VectorMatchCardinality.OneToMany:
            group = "right"
        if mod.matching is not None:
            matching = VectorMatching(
                on=mod.matching.type == _pp.LabelModifierType.Include,
                labels=tuple(_label(x) for x in mod.matching.labels),
                group=group,
                include=tuple(_label(x) for x in (mod.group_labels or ())) if group else (),
            )
        elif group is not None:
            raise CannotParse("group_left/group_right without on/ignoring")
    try:
        return Binary(op, _convert(node.lhs), _convert(node.rhs), return_bool, matching)
    except ValueError as exc:  # an operator shardplanner.ast does not know
        raise CannotParse(str(exc)) from exc


def _duration_ms(td: timedelta) -> int:
    ms, rest = divmod(td, _MS)
    if rest:
        raise CannotParse(f"duration {td} is not a whole number of milliseconds")
    return int(ms)


def _offset_ms(td: timedelta | None) -> int:
    return 0 if td is None else _duration_ms(td)


def _at(at: Any) -> At:
    if at is None:
        return None
    kind = at.type
    if kind == _pp.AtModifierType.Start:
        return "start"
    if kind == _pp.AtModifierType.End:
        return "end"
    # Prometheus: int64(math.Round(seconds * 1000)). promql-parser already rounds that way
    # (checked against 2.42 at half-millisecond times); this keeps it exact if it stops.
    seconds = ((at.at - _EPOCH) // _US) / 1e6
    return int(math.copysign(math.floor(abs(seconds * 1000) + 0.5), seconds))


__all__ = ["GO_1_19", "NAMED_GROUP_SINCE", "CannotParse", "Dialect", "TooComplex", "dialect_matters", "parse"]
