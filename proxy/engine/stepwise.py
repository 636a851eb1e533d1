"""Shared plumbing of functions.py and aggregate.py: an answer as samples on the query's step
grid, scalar arguments per step, and the output built the way Prometheus's rangeEval builds
it.

    Samples.of(result, grid)        every sample's series index, step index and value
    scalar_steps(arg, grid)         a scalar-typed argument's value at every step
    Interner                        output label sets -> ids
    build(rtype, ...)               instant: samples in evaluation order; range: series
                                    sorted by labels.Compare, samples by time
    check_unique(sid, step, n)      rangeEval's "vector cannot contain metrics with the same
                                    labelset", raised as Prometheus raises it

Conventions (the executor's, as proxy/engine/binop.py): a vector-typed value is a "vector"
QueryResult for an instant query and a "matrix" whose samples sit on the step grid for a range
query; a scalar-typed value is a float (a number literal), a "scalar" QueryResult (instant) or
a one-series "matrix" (range).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import DuplicateLabelset
from proxy.result.query_result import QueryResult

__all__ = ["Interner", "Samples", "build", "check_unique", "notes", "scalar_steps"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Labels = dict[str, str]
Key = tuple[tuple[str, str], ...]

def as_grid(grid: Sequence[int] | npt.NDArray[np.int64]) -> I64:
    g = np.asarray(grid, dtype=np.int64).reshape(-1)
    if len(g) == 0:
        raise ValueError("the step grid is empty")
    if len(g) > 1 and np.any(np.diff(g) <= 0):
        raise ValueError("the step grid must be strictly increasing")
    return g


def step_index(grid: I64, t: I64) -> I64:
    """Step of each timestamp; every timestamp must be on the grid."""
    idx = np.searchsorted(grid, t).astype(np.int64)
    if len(t) and (np.any(idx >= len(grid)) or np.any(grid[np.minimum(idx, len(grid) - 1)] != t)):
        raise ValueError("a sample is not on the query's step grid")
    return idx


@dataclass
class Samples:
    """A vector-typed answer as flat samples: series index, step index, value (series-major,
    so within one step the samples come in series order: the evaluation order)."""

    result: QueryResult
    ser: I64
    step: I64
    value: F64

    @classmethod
    def of(cls, r: QueryResult, grid: I64, is_range: bool) -> Samples:
        if not isinstance(r, QueryResult):
            raise TypeError(f"a vector argument must be a QueryResult, not {type(r).__name__}")
        want = "matrix" if is_range else "vector"
        if r.result_type != want:
            raise ValueError(f"a vector argument of a {'range' if is_range else 'instant'} query must be "
                             f"a {want!r} QueryResult, not {r.result_type!r}")
        ser = np.repeat(np.arange(r.n_series, dtype=np.int64), r.counts)
        return cls(r, ser, step_index(grid, r.t_ms), r.value)


def scalar_steps(arg: QueryResult | float, grid: I64) -> F64:
    """A scalar-typed argument at every step (a step the answer lacks is NaN: Prometheus's
    scalars have a value at every step)."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return np.full(len(grid), float(arg))
    if not isinstance(arg, QueryResult):
        raise TypeError(f"a scalar argument must be a float or a QueryResult, not {type(arg).__name__}")
    if arg.result_type == "scalar":
        return np.full(len(grid), float(arg.value[0]) if arg.n_samples else np.nan)
    if arg.result_type != "matrix" or arg.n_series > 1:
        raise ValueError("a scalar argument is a float, a 'scalar' or a one-series 'matrix' QueryResult")
    out = np.full(len(grid), np.nan)
    out[step_index(grid, arg.t_ms)] = arg.value
    return out


def notes(args: Sequence[object]) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    infos: list[str] = []
    for a in args:
        if isinstance(a, QueryResult):
            warnings += [w for w in a.warnings if w not in warnings]
            infos += [i for i in a.infos if i not in infos]
    return warnings, infos


class Interner:
    """Output label sets -> dense ids (by label set, so equal sets share an id)."""

    def __init__(self) -> None:
        self.ids: dict[Key, int] = {}
        self.labels: list[Labels] = []
        self.keys: list[Key] = []

    def add(self, labels: Labels) -> int:
        k = tuple(sorted(labels.items()))
        i = self.ids.get(k)
        if i is None:
            i = self.ids[k] = len(self.labels)
            self.labels.append(labels)
            self.keys.append(k)
        return i


def without_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != "__name__"} if "__name__" in labels else labels


def check_unique(sid: I64, step: I64, n_steps: int) -> None:
    """Raise Prometheus's error when one output label set occurs twice at one step."""
    if len(sid) < 2:
        return
    key = sid * max(n_steps, 1) + step
    s = np.sort(key)
    if np.any(s[1:] == s[:-1]):
        raise DuplicateLabelset()


def build(rtype: Literal["vector", "matrix"], grid: I64, interner: Interner, sid: I64, step: I64,
          value: F64, warnings: list[str], infos: list[str]) -> QueryResult:
    """Output samples -> an answer. "vector": one sample per series, in the given (evaluation)
    order; "matrix": series sorted by labels.Compare, each series' samples by time."""
    n = len(sid)
    if n == 0:
        return QueryResult.empty(rtype, warnings=warnings, infos=infos)
    if rtype == "vector":
        labels = [interner.labels[i] for i in sid.tolist()]
        return QueryResult("vector", labels, np.arange(n + 1, dtype=np.int64), grid[step].astype(np.int64),
                           np.asarray(value, dtype=np.float64), warnings, infos)
    present = np.unique(sid)
    order = sorted(present.tolist(), key=lambda i: interner.keys[i])
    rank = np.full(len(interner.labels), -1, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    r = rank[sid]
    idx = np.lexsort((step, r))
    counts = np.bincount(r, minlength=len(order))
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return QueryResult("matrix", [interner.labels[i] for i in order], offsets, grid[step[idx]].astype(np.int64),
                       np.asarray(value, dtype=np.float64)[idx], warnings, infos)


def per_step_answer(rtype_scalar: bool, is_range: bool, grid: I64, values: F64, warnings: list[str],
                    infos: list[str]) -> QueryResult:
    """A value at every step with no labels: a scalar (pi(), time(), scalar(v)) or a vector
    of one series `{}` (vector(s), hour())."""
    if not is_range:
        if rtype_scalar:
            return QueryResult.scalar(int(grid[0]), float(values[0]), warnings=warnings, infos=infos)
        return QueryResult("vector", [{}], np.array([0, 1], dtype=np.int64), grid[:1].copy(),
                           np.asarray(values[:1], dtype=np.float64), warnings, infos)
    return QueryResult("matrix", [{}], np.array([0, len(grid)], dtype=np.int64), grid.copy(),
                       np.asarray(values, dtype=np.float64), warnings, infos)
