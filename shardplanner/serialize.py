"""Print a `shardplanner.ast` tree as PromQL that Prometheus 2.42 reads back to the same query.

Rule: a rewritten query is printed with `to_promql`, never with promql-parser's `str()`,
which does not re-escape strings (`up{a="x\\"y"}` prints as `up{a="x"y"}`) and prints
`x[5m:]` as `x{}[5m]`. A query that was not rewritten is forwarded byte for byte instead.

    to_promql(parse('up{instance=~"10\\\\.42\\\\..+"} offset 5m @ end()'))
        -> 'up{instance=~"10\\\\.42\\\\..+"} @ end() offset 5m'

Choices, each for a Prometheus reason:
- strings: Go-style double quoting (`\\\\`, `\\"`, `\\n`, `\\t`, ..., `\\xNN` / `\\uNNNN`
  for other non-printable characters); printable unicode is emitted raw, except U+FFFD,
  which Prometheus's lexer rejects raw ("invalid UTF-8 rune") but accepts as `\\ufffd`;
- numbers: shortest round-trip form (`repr`, without a trailing `.0`), `NaN`, `Inf`, `-Inf`
  (`Inf`, not `+Inf`, so `Inf ^ 2` is not read as the unary `+(Inf ^ 2)`);
- durations: Prometheus's own format, largest units first (`1h30m`, `1d`, `1w`, `100ms`);
- `@` before `offset` (Prometheus's order; it reads both), `@` as seconds with 3 decimals;
- parentheses: every Paren node, plus whatever a hand-built tree needs to keep its shape
  under PromQL precedence: `a - (b - c)`, `(a + b) * c`, `(2 ^ 3) ^ 2`, `(-1) ^ 2` (while
  `-1 ^ 2` is `-(1 ^ 2)`), `(a + 1)[5m:]`;
- `group_left()` always with its parentheses, so a parenthesised right operand is not read
  as the include list.
"""

from __future__ import annotations

import math
import re

from shardplanner.ast import (
    PRECEDENCE,
    RIGHT_ASSOCIATIVE,
    Agg,
    At,
    Binary,
    Call,
    Expr,
    Matcher,
    MatrixSel,
    Number,
    Paren,
    Selector,
    String,
    Subquery,
    Unary,
)

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# Words Prometheus never reads as a metric name; such a metric is printed as
# {__name__="..."} (the parser never produces one; a hand-built tree might).
_NOT_METRIC_NAMES = frozenset(
    {"inf", "nan", "bool", "on", "ignoring", "group_left", "group_right", "atan2"}
)
_NAMED_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}
_DURATION_UNITS = (
    # (unit, milliseconds, only when it divides the rest exactly), as model.Duration.String.
    ("y", 365 * 24 * 3_600_000, True),
    ("w", 7 * 24 * 3_600_000, True),
    ("d", 24 * 3_600_000, False),
    ("h", 3_600_000, False),
    ("m", 60_000, False),
    ("s", 1_000, False),
    ("ms", 1, False),
)


def to_promql(node: Expr) -> str:
    """PromQL text for `node`. Raises ValueError for a tree PromQL cannot express
    (bad label name, non-positive range, selector without matchers, ...)."""
    match node:
        case Selector():
            return _selector(node) + _modifiers(node.at, node.offset_ms)
        case MatrixSel():
            sel = node.selector
            return (
                f"{_selector(sel)}[{format_duration(_positive(node.range_ms, 'range'))}]"
                + _modifiers(sel.at, sel.offset_ms)
            )
        case Subquery():
            inner = to_promql(node.expr)
            if _is_operator_like(node.expr):
                inner = f"({inner})"
            step = "" if node.step_ms is None else format_duration(_positive(node.step_ms, "step"))
            rng = format_duration(_positive(node.range_ms, "range"))
            return f"{inner}[{rng}:{step}]" + _modifiers(node.at, node.offset_ms)
        case Agg():
            clause = ""
            if node.grouping is not None:
                kind = "without" if node.without else "by"
                clause = f" {kind} ({_labels(node.grouping)}) "
            args = to_promql(node.expr)
            if node.param is not None:
                args = f"{to_promql(node.param)}, {args}"
            return f"{_identifier(node.op)}{clause}({args})"
        case Binary():
            return _binary(node)
        case Unary():
            inner = to_promql(node.expr)
            if isinstance(node.expr, Binary) and node.expr.op != "^":
                inner = f"({inner})"
            elif inner.startswith(("-", "+")):
                inner = " " + inner  # `- -x`: no `--` token in PromQL, but keep it readable
            return "-" + inner
        case Paren():
            return f"({to_promql(node.expr)})"
        case Call():
            return f"{_identifier(node.func)}({', '.join(to_promql(a) for a in node.args)})"
        case Number():
            return format_number(node.value)
        case String():
            return quote_string(node.value)
    raise TypeError(f"not a PromQL node: {node!r}")


# Printable ASCII: only `"` and `\` need escaping (a shard regex of escaped host names is all
# of it; the loop below took ~110 us for one, on every warm lookup's footprint).
_PRINTABLE_ASCII = re.compile(r"[ -~]*\Z")


def quote_string(value: str) -> str:
    """Go-style double-quoted PromQL string literal that Prometheus unquotes to `value`."""
    if _PRINTABLE_ASCII.match(value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    out = ['"']
    for ch in value:
        esc = _NAMED_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
            continue
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF:
            raise ValueError(f"lone surrogate U+{cp:04X} cannot be a PromQL string")
        if ch.isprintable() and ch != "\ufffd":
            out.append(ch)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def format_number(value: float) -> str:
    """A float64 literal Prometheus parses to exactly `value`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # Shortest round trip; Go's ParseFloat reads it back exactly. An integral repr below 1e16
    # ("31.0") loses its ".0" and goes through ParseInt, which is exact in that range.
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def format_duration(ms: int) -> str:
    """Prometheus's duration format: 5400000 -> '1h30m', 86400000 -> '1d', 0 -> '0s'."""
    if ms < 0:
        return "-" + format_duration(-ms)
    if ms == 0:
        return "0s"
    out = []
    for unit, size, exact in _DURATION_UNITS:
        if exact and ms % size:
            continue
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)


def format_at(at: At) -> str:
    """The argument of `@`: 'start()', 'end()' or seconds with millisecond decimals."""
    if at == "start" or at == "end":
        return f"{at}()"
    if not isinstance(at, int) or isinstance(at, bool):
        raise ValueError(f"bad @ value {at!r}")
    sign = "-" if at < 0 else ""
    return f"{sign}{abs(at) // 1000}.{abs(at) % 1000:03d}"


def _modifiers(at: At, offset_ms: int) -> str:
    out = ""
    if at is not None:
        out += f" @ {format_at(at)}"
    if offset_ms:
        out += f" offset {format_duration(offset_ms)}"
    return out


def _selector(sel: Selector) -> str:
    name = sel.name
    matchers: tuple[Matcher, ...] = sel.matchers
    groups = sel.or_matchers
    if name is not None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"metric name {name!r} is not a PromQL identifier")
        if name.lower() in _NOT_METRIC_NAMES:
            matchers = (Matcher("__name__", "=", name),) + matchers
            groups = tuple((Matcher("__name__", "=", name),) + g for g in groups)
            name = None
    if groups:
        if matchers:
            raise ValueError("a selector has either matchers or or_matchers, not both")
        body = " or ".join(", ".join(_matcher(m) for m in g) for g in groups)
    else:
        body = ", ".join(_matcher(m) for m in matchers)
    if name is None:
        if not body:
            raise ValueError("a selector needs a metric name or a matcher")
        return "{" + body + "}"
    return name + ("{" + body + "}" if body else "")


def _matcher(m: Matcher) -> str:
    return f"{_label(m.name)}{m.op}{quote_string(m.value)}"


def _label(name: str) -> str:
    if not _LABEL_NAME.match(name):
        raise ValueError(f"label name {name!r} is not a PromQL identifier")
    return name


def _labels(names: tuple[str, ...]) -> str:
    return ", ".join(_label(n) for n in names)


def _identifier(name: str) -> str:
    if not _LABEL_NAME.match(name):
        raise ValueError(f"{name!r} is not a PromQL function or operator name")
    return name


def _positive(ms: int, what: str) -> int:
    if ms <= 0:
        raise ValueError(f"{what} must be positive, got {ms} ms")
    return ms


def _is_negative_number(node: Expr) -> bool:
    return isinstance(node, Number) and math.copysign(1.0, node.value) < 0 and not math.isnan(
        node.value
    )


def _is_operator_like(node: Expr) -> bool:
    """Printed with a leading or infix operator, so `[...]` would bind to a part of it."""
    return isinstance(node, (Binary, Unary)) or _is_negative_number(node)


def _binary(node: Binary) -> str:
    prec = PRECEDENCE[node.op]
    lhs, rhs = to_promql(node.lhs), to_promql(node.rhs)
    if _needs_parens(node.lhs, prec, node.op, left=True):
        lhs = f"({lhs})"
    if _needs_parens(node.rhs, prec, node.op, left=False):
        rhs = f"({rhs})"
    mods = ""
    if node.return_bool:
        mods += " bool"
    m = node.matching
    if m is not None:
        mods += f" {'on' if m.on else 'ignoring'}({_labels(m.labels)})"
        if m.group is not None:
            mods += f" group_{m.group}({_labels(m.include)})"
    return f"{lhs} {node.op}{mods} {rhs}"


def _needs_parens(child: Expr, prec: int, op: str, *, left: bool) -> bool:
    if isinstance(child, Binary):
        child_prec = PRECEDENCE[child.op]
        if child_prec != prec:
            return child_prec < prec
        # Same level: only the side the operator associates to may go without parentheses.
        return left == (op in RIGHT_ASSOCIATIVE)
    # Unary minus binds looser than `^` only: `-a ^ b` is `-(a ^ b)`.
    if isinstance(child, Unary) or _is_negative_number(child):
        return left and op == "^"
    return False


__all__ = ["format_at", "format_duration", "format_number", "quote_string", "to_promql"]
