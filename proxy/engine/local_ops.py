"""Small pieces of what the engine evaluates, on decoded answers: an `@`-pinned answer
restamped at every step, absent()/scalar() of merged series, a range function's answer as an
instant answer, and answers of step stretches (or of a union of stores) put back together.
Functions, aggregations and range functions are in this package (functions.py,
aggregate.py, windows.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import DuplicateLabelset
from proxy.result import QueryResult, ResultType
from proxy.result.merge import concat
from shardplanner.plan import QueryRequest

if TYPE_CHECKING:
    from shardplanner.ast import Matcher


def restamp(value: QueryResult, req: QueryRequest) -> QueryResult:
    """An instant answer (evaluated at a pinned time) as the answer at every step of `req`."""
    grid = grid_of(req)
    n = value.n_series
    if value.result_type == "scalar":
        v = float(value.value[0]) if len(value.value) else float("nan")
        if not req.is_range:
            return QueryResult.scalar(int(grid[0]), v)
        return QueryResult("matrix", [{}], np.array([0, len(grid)], dtype=np.int64), grid, np.full(len(grid), v))
    values = value.value[value.offsets[:-1]] if n else np.zeros(0)
    rtype: ResultType = "matrix" if req.is_range else "vector"
    offsets = np.arange(n + 1, dtype=np.int64) * len(grid)
    out = QueryResult(rtype, list(value.labels), offsets, np.tile(grid, n), np.repeat(values, len(grid)),
                      list(value.warnings), list(value.infos))
    if rtype == "matrix" and n > 1:
        out = concat([out])  # Prometheus sorts range answers by labels
    return out


def grid_of(req: QueryRequest) -> npt.NDArray[np.int64]:
    span = req.span
    return np.arange(span.start_ms, span.end_ms + 1, span.step_ms or 1, dtype=np.int64)


def absent_or_scalar(node: Any, inner: QueryResult, req: QueryRequest) -> QueryResult:
    """absent(v) / absent_over_time(m) (with `inner` = count_over_time(m)) / scalar(v) of a
    merged answer, as Prometheus computes them."""
    from shardplanner.ast import MatrixSel, Selector

    grid = grid_of(req)
    if node.func == "scalar":
        counts = np.zeros(len(grid), dtype=np.int64)
        values = np.full(len(grid), np.nan)
        pos = np.searchsorted(grid, inner.t_ms)
        np.add.at(counts, pos, 1)
        values[pos] = inner.value  # kept only where exactly one series has a sample
        values[counts != 1] = np.nan
        if not req.is_range:
            return QueryResult.scalar(int(grid[0]), float(values[0]))
        return QueryResult("matrix", [{}], np.array([0, len(grid)], dtype=np.int64), grid, values)
    # absent: 1 at the steps where the argument has no series, labelled from its selector.
    sel = node.args[0]
    if isinstance(sel, MatrixSel):
        sel = sel.selector
    labels = absent_labels(sel.matchers) if isinstance(sel, Selector) and not sel.or_matchers else {}
    t = grid[~np.isin(grid, inner.t_ms)]
    rtype: ResultType = "matrix" if req.is_range else "vector"
    if len(t) == 0:
        return QueryResult.empty(rtype)
    return QueryResult(rtype, [labels], np.array([0, len(t)], dtype=np.int64), t, np.ones(len(t)))


def absent_labels(matchers: Sequence[Matcher]) -> dict[str, str]:
    """The labels of absent()'s answer, ported from Prometheus v2.42 promql/functions.go
    `createLabelsForAbsentFunction`: the matchers in their order, the metric name skipped; the
    first equality matcher of a name sets its label, any other matcher of that name (a second
    equality one too: Go's historic `has` rule) deletes it. A regex before the equality does
    not stop it: `{job=~"a.*", job="a"}` gives `{job="a"}`. An empty value is no label
    (labels.Builder.Set deletes on "")."""
    labels: dict[str, str] = {}
    has: set[str] = set()
    for m in matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in has:
            if m.value:
                labels[m.name] = m.value
            else:
                labels.pop(m.name, None)
            has.add(m.name)
        else:
            labels.pop(m.name, None)
    return labels


def as_answer(result: QueryResult, req: QueryRequest) -> QueryResult:
    """A range-function answer (a matrix at the evaluation times) as `req` wants it: the
    matrix for a range query, the vector at its one time for an instant query."""
    if req.is_range or result.result_type != "matrix":
        return result
    return QueryResult("vector", result.labels, result.offsets, result.t_ms, result.value,
                       result.warnings, result.infos)


def joined(parts: list[QueryResult], req: QueryRequest) -> QueryResult:
    """Answers of consecutive step stretches of one range query as one answer."""
    nonempty = [p for p in parts if p.n_series]
    if not nonempty:
        return QueryResult.empty("matrix" if req.is_range else "vector")
    return concat(nonempty)


def check_distinct(parts: list[QueryResult]) -> None:
    """Answers of a union (metrics held by different stores) must not share a label set:
    once a function has dropped the metric name, Prometheus refuses such a vector."""
    seen: set[bytes] = set()
    for p in parts:
        keys = p.canonical_keys()
        if seen.intersection(keys):
            raise DuplicateLabelset()
        seen.update(keys)
