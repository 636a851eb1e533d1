"""What a query reads: each selector's metric and the closed sample-time window it may touch
when the query is evaluated over a range. Pure; the input of routing (`shardplanner.routing`),
which sends a timestamp only to backends that hold every read of it.

    reads("rate(x[5m]) offset 1h", 10:00, 11:00)  ->  [("x", 08:55, 10:00)]

Windows are closed and in integer ms; a sample exactly at `eval - lookback` is counted as
read (Prometheus 2 includes it, Prometheus 3 does not): conservative either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from shardplanner.ast import At, Expr, MatrixSel, Selector, Subquery, children
from shardplanner.promql import parse
from shardplanner.serialize import to_promql

__all__ = ["DEFAULT_LOOKBACK_MS", "UNPARSED", "Read", "Shape", "listed_names", "read_shapes", "reads"]

DEFAULT_LOOKBACK_MS = 300_000


class Read(NamedTuple):
    """One selector's samples: metric name (None: picked by regex or not at all) and the
    closed sample-time window `[from_ms, to_ms]` it may touch."""

    metric: str | None
    from_ms: int
    to_ms: int


@dataclass(frozen=True)
class Shape:
    """A selector's read window as a function of the evaluation range [a, b]:
    `[a + lo_ms, b + hi_ms]`, or the fixed `pinned` window when `@` fixes its times.
    `name`: one of the names of a selector that names its metrics as a literal alternation
    (`{__name__=~"a|b"}` reads a and b: one shape each)."""

    selector: Selector
    lo_ms: int
    hi_ms: int
    pinned: tuple[int, int] | None
    name: str | None = None

    @property
    def metric(self) -> str | None:
        return self.name if self.name is not None else self.selector.metric_name

    @property
    def text(self) -> str:
        if self.selector == UNPARSED:
            return "the query (not parsed: it may read any metric)"
        return to_promql(self.selector)

    def window(self, a: int, b: int) -> tuple[int, int]:
        return self.pinned if self.pinned is not None else (a + self.lo_ms, b + self.hi_ms)


# Stands in for every selector of a query the planner cannot parse.
UNPARSED = Selector(None)


def read_shapes(expr: Expr, start_ms: int, end_ms: int, lookback_ms: int) -> list[Shape]:
    """Every selector's read shape, in print order. `@ start()` / `@ end()` resolve to
    `start_ms` / `end_ms` (the planner pins them to the whole query's before splitting)."""

    def at_ms(at: At) -> int | None:
        if at == "start":
            return start_ms
        if at == "end":
            return end_ms
        return at

    out: list[Shape] = []

    # Evaluation times of `node`: [a + lo, b + hi] for the range [a, b], or `pin` when fixed.
    def rec(node: Expr, lo: int, hi: int, pin: tuple[int, int] | None) -> None:
        match node:
            case Selector():
                _read(node, lookback_ms, lo, hi, pin)
            case MatrixSel():
                _read(node.selector, node.range_ms, lo, hi, pin)
            case Subquery():
                # Inner steps lie in [t - offset - range, t - offset] (aligned to the
                # subquery step inside it; the bound is what matters here).
                o, r = node.offset_ms, node.range_ms
                at = at_ms(node.at)
                if at is not None:
                    pin = (at - o - r, at - o)
                elif pin is not None:
                    pin = (pin[0] - o - r, pin[1] - o)
                rec(node.expr, lo - o - r, hi - o, pin)
            case _:
                for child in children(node):
                    rec(child, lo, hi, pin)

    def _read(sel: Selector, span: int, lo: int, hi: int, pin: tuple[int, int] | None) -> None:
        o = sel.offset_ms
        at = at_ms(sel.at)
        if at is not None:
            pin = (at - o - span, at - o)
        elif pin is not None:
            pin = (pin[0] - o - span, pin[1] - o)
        names = listed_names(sel)
        for name in names or (None,):
            out.append(Shape(sel, lo - o - span, hi - o, pin, name))

    rec(expr, 0, 0, None)
    return out


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def listed_names(sel: Selector) -> tuple[str, ...]:
    """The metrics a nameless selector reads when its `__name__` matcher is a literal list,
    `{__name__=~"a|b|c"}` (PromQL regexes are anchored: exactly a, b and c); `()` otherwise."""
    if sel.metric_name is not None or sel.or_matchers:
        return ()
    regexes = [m for m in sel.matchers if m.name == "__name__"]
    if len(regexes) != 1 or regexes[0].op != "=~":
        return ()
    names = regexes[0].value.split("|")
    if not all(_METRIC_NAME.fullmatch(n) for n in names):
        return ()
    return tuple(dict.fromkeys(names))


def reads(
    expr: Expr | str,
    eval_start_ms: int,
    eval_end_ms: int,
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
) -> list[Read]:
    """The samples each selector of `expr` may read when it is evaluated at every time in
    `[eval_start_ms, eval_end_ms]` (an instant query: both the same). One `Read` per selector,
    in print order (a metric read twice appears twice).

        x                         [s, e] -> ("x", s - lookback, e)
        rate(x[1h] offset 1d)     [s, e] -> ("x", s - 1d - 1h, e - 1d)
        max_over_time(x[10m:1m])  [s, e] -> ("x", s - 10m - lookback, e)
        x @ 1000 offset 5m        [s, e] -> ("x", 1000 - 5m - lookback, 1000 - 5m)  (any s, e)
        {__name__=~"DCGM_.*"}     [s, e] -> (None, s - lookback, e)

    Raises `CannotParse` for a query string the planner cannot read.
    """
    if eval_end_ms < eval_start_ms:
        raise ValueError(f"eval_end_ms {eval_end_ms} is before eval_start_ms {eval_start_ms}")
    node = parse(expr) if isinstance(expr, str) else expr
    return [
        Read(s.metric, *s.window(eval_start_ms, eval_end_ms))
        for s in read_shapes(node, eval_start_ms, eval_end_ms, lookback_ms)
    ]
