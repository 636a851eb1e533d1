"""What data a piece reads: its metric names and the time range of the samples it touches.

The cache needs both: invalidation drops the entries that read a metric over a time range
(`PieceMeta`), freshness asks whether any sample a piece reads is recent (a piece far in the
past can still read recent data through `offset -1h` or a pinned `@`), and revalidation
re-reads a cheap digest of exactly those samples.

    fp = footprint('rate(x{a="b"}[5m] offset 1m)', 1_000_000, 2_000_000, lookback_ms=300_000)
    fp.metrics   -> ("x",)
    fp.start_ms  -> 1_000_000 - 60_000 - 300_000      (first eval - offset - range)
    fp.end_ms    -> 2_000_000 - 60_000                (last eval - offset)

Rules, for a node evaluated at times [lo, hi]:
- `sel offset o @ a`: reads (t - o - lookback, t - o] for t in [lo, hi], or t = a when pinned;
- `sel[r] offset o @ a`: [t - o - r, t - o];
- `expr[r:s] offset o @ a`: `expr` is evaluated at times in [t - o - r, t - o];
- everything else passes [lo, hi] to its children.
The windows are supersets (a subquery's inner grid lies inside them), which is what both
invalidation and freshness need. An unpinned `@ start()`/`@ end()` (the planner pins them)
or a query the planner cannot parse has no known footprint: such pieces are not cached.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from shardplanner.ast import Expr, MatrixSel, Selector, Subquery, children
from shardplanner.promql import CannotParse, parse
from shardplanner.serialize import to_promql

__all__ = ["Footprint", "digest_query", "footprint"]


@dataclass(frozen=True)
class Footprint:
    """metrics: the metric names read, () when some selector has no plain metric name
    (then every invalidation must match). selectors: each distinct series selector as
    PromQL, without offset/@ (for digests)."""

    metrics: tuple[str, ...]
    start_ms: int
    end_ms: int
    selectors: tuple[str, ...]


class _Unknown(Exception):
    pass


def _parsed(query: str) -> Expr | None:
    try:
        return parse(query)  # cached by text
    except CannotParse:
        return None


# A bound of a window the query reads: (relative, c) is `lo + c` (or `hi + c`) when
# relative, else the absolute time c (under a pinned `@`).
_Bound = tuple[bool, int]
_Shape = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[_Bound, _Bound], ...]]


def footprint(query: str, lo_ms: int, hi_ms: int, *, lookback_ms: int) -> Footprint | None:
    """The footprint of `query` evaluated at times in [lo_ms, hi_ms]; None if unknown."""
    shape = _shape(query, lookback_ms)
    if shape is None:
        return None
    metrics, texts, windows = shape
    if not windows:
        # No selector at all (`vector(1)`, `time()`): reads nothing, depends on nothing.
        return Footprint((), lo_ms, hi_ms, ())
    return Footprint(
        metrics,
        min(lo_ms + a if rel else a for (rel, a), _ in windows),
        max(hi_ms + b if rel else b for _, (rel, b) in windows),
        texts,
    )


@functools.lru_cache(maxsize=4096)
def _shape(query: str, lookback_ms: int) -> _Shape | None:
    """What `footprint` needs of a query, apart from its times: its metric names, selectors
    and the windows it reads relative to [lo, hi] (or absolute, pinned). Kept per query text:
    every warm request of a panel asks the footprint of each of its cache units (issue 28:
    the tiny panel's per-request cost)."""
    expr = _parsed(query)
    if expr is None:
        return None
    windows: list[tuple[_Bound, _Bound]] = []
    sels: list[Selector] = []
    try:
        _visit(expr, (True, 0), (True, 0), lookback_ms, windows, sels)
    except _Unknown:
        return None
    if not windows:
        return (), (), ()
    names: list[str] = []
    unknown = False
    for s in sels:
        name = s.metric_name
        if name is None:
            unknown = True
        elif name not in names:
            names.append(name)
    texts = tuple(dict.fromkeys(to_promql(replace(s, offset_ms=0, at=None)) for s in sels))
    return () if unknown else tuple(sorted(names)), texts, tuple(windows)


def _times(at: object, lo: _Bound, hi: _Bound) -> tuple[_Bound, _Bound]:
    if at is None:
        return lo, hi
    if isinstance(at, int) and not isinstance(at, bool):
        return (False, at), (False, at)
    raise _Unknown()  # "start"/"end" not pinned


def _minus(t: _Bound, ms: int) -> _Bound:
    return t[0], t[1] - ms


def _visit(node: Expr, lo: _Bound, hi: _Bound, lookback: int, out: list[tuple[_Bound, _Bound]],
           sels: list[Selector]) -> None:
    if isinstance(node, Selector):
        a, b = _times(node.at, lo, hi)
        out.append((_minus(a, node.offset_ms + lookback), _minus(b, node.offset_ms)))
        sels.append(node)
        return
    if isinstance(node, MatrixSel):
        s = node.selector
        a, b = _times(s.at, lo, hi)
        out.append((_minus(a, s.offset_ms + node.range_ms), _minus(b, s.offset_ms)))
        sels.append(s)
        return
    if isinstance(node, Subquery):
        a, b = _times(node.at, lo, hi)
        _visit(node.expr, _minus(a, node.offset_ms + node.range_ms), _minus(b, node.offset_ms), lookback, out, sels)
        return
    for c in children(node):
        _visit(c, lo, hi, lookback, out, sels)


def digest_query(fp: Footprint) -> str | None:
    """One instant query, evaluated at `fp.end_ms`, whose answer changes whenever a sample
    the piece reads is added, removed or changed: per selector, the number of samples and
    their sum over the whole footprint window. None when the piece reads no series."""
    if not fp.selectors:
        return None
    window_ms = max(fp.end_ms - fp.start_ms, 1)
    terms = []
    for i, sel in enumerate(fp.selectors):
        for fn, tag in (("count_over_time", "c"), ("sum_over_time", "s")):
            terms.append(
                f'label_replace(sum({fn}({sel}[{window_ms}ms])), "promaccel_digest", "{tag}{i}", "", "")'
            )
    return " or ".join(terms)
