"""PromQL range functions evaluated here, over raw samples, exactly as Prometheus 2.42 does.

    RANGE_FUNCTIONS                       the functions eval_range_function knows
    eval_range_function(func, params, raw, eval_ms, range_ms, offset_ms=0) -> QueryResult
    subquery_times(eval_ms, range_ms, step_ms, offset_ms=0) -> int64 array

Hybrid fleets hold one series in several stores (AMP until two hours ago, a local Prometheus
for the last three); `increase(x[6h])` then reads a window that no single store holds. The
caller fetches each store's raw samples (the matrix selector `x[W]` asked as an instant
query), merges them per series, and evaluates the function here. For a subquery
`f(expr[R:S] offset o)`, `raw` is `expr` evaluated at `subquery_times(...)` (a range query
over that grid), and the same kernel applies: Prometheus turns a subquery's result into
series and reads them with the same window walk as stored samples.

Semantics (Prometheus v2.42.0, promql/engine.go and promql/functions.go):
- the window of eval time t is [t - offset - range, t - offset], closed on both ends; a
  function is called only when the window holds a sample; rate/increase/delta, irate/idelta,
  deriv, predict_linear and holt_winters give no point for fewer than two samples;
- every function but last_over_time drops `__name__`; two output series with one label set
  are Prometheus's execution error "vector cannot contain metrics with the same labelset";
- holt_winters refuses a smoothing or trend factor outside (0, 1) with Prometheus's text, at
  the first call (series order, then time); a NaN factor passes, as in Go;
- quantile_over_time: q < 0 gives -Inf, q > 1 +Inf, NaN gives NaN;
- the answer is a matrix sorted by label set (labels.Compare), timestamps the eval times.
The arithmetic is Go's, operation for operation (window_kernels.py): Kahan-compensated
sum/avg/stddev/stdvar/linear regression, rate's extrapolation with the counter zero point.
Stale markers are never in `raw` (a matrix selector's answer leaves them out) and the
range functions skip them anyway. Native histograms are not handled (float samples only).

`params` are the function's scalar arguments other than the range vector, in call order:
quantile_over_time: [q]; predict_linear: [t]; holt_winters: [sf, tf]; others: []. Each is
a number or an array with one value per eval time (a scalar expression evaluated per step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import DuplicateLabelset, EvalError
from proxy.engine.window_codes import CODES, QUANTILE_OVER_TIME, SERIAL
from proxy.engine.work import WorkBudget
from proxy.result.query_result import QueryResult
from shardplanner.functions import FUNCTIONS

__all__ = ["PARAMS", "RANGE_FUNCTIONS", "eval_range_function", "go_duration_seconds", "subquery_times"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

# The range functions with a window kernel, and how many scalar parameters each takes
# besides its range vector: from their rows' argument types (shardplanner/functions.py).
PARAMS: dict[str, int] = {name: FUNCTIONS[name].args.count("scalar") for name in CODES}
RANGE_FUNCTIONS: frozenset[str] = frozenset(PARAMS)



def go_duration_seconds(ms: int) -> float:
    """time.Duration.Seconds() of a whole number of milliseconds: whole seconds plus the
    nanoseconds / 1e9 (not ms / 1000, which can differ in the last bit)."""
    sec, rest = divmod(ms, 1000) if ms >= 0 else (-((-ms) // 1000), -((-ms) % 1000))
    return float(sec) + float(rest * 1_000_000) / 1e9


def subquery_times(eval_ms: I64 | Sequence[int] | int, range_ms: int, step_ms: int, offset_ms: int = 0) -> I64:
    """The inner evaluation times of `expr[range:step] offset o` for a query evaluated at
    `eval_ms` (one instant, or the ascending times of a range query): Prometheus 2.42 runs
    the inner expression once, over the multiples of the step from the first one at or after
    start - offset - range to end - offset. A subquery without a step uses the global
    evaluation interval: pass that as `step_ms`."""
    times = np.atleast_1d(np.asarray(eval_ms, dtype=np.int64))
    if step_ms <= 0:
        raise ValueError("a subquery step must be positive")
    if len(times) == 0:
        return np.zeros(0, dtype=np.int64)
    lowest = int(times[0]) - offset_ms - range_ms
    first = -(-lowest // step_ms) * step_ms  # Go: step * (x / step), plus a step if below x
    last = int(times[-1]) - offset_ms
    if first > last:
        return np.zeros(0, dtype=np.int64)
    return np.arange(first, last + 1, step_ms, dtype=np.int64)


def eval_range_function(
    func: str,
    params: Sequence[float | F64],
    raw: QueryResult,
    eval_ms: I64 | Sequence[int],
    range_ms: int,
    *,
    offset_ms: int = 0,
    budget: WorkBudget | None = None,
) -> QueryResult:
    """`func(sel[range_ms] offset offset_ms)` at each of `eval_ms`, from `raw`: the samples
    of every series of `sel` (a "matrix" answer) covering [eval_ms[0] - offset - range,
    eval_ms[-1] - offset]. Samples outside that span are ignored. Raises PromError
    ("execution") where Prometheus answers an error, ValueError for a misuse.

    `budget`: the work is estimated (`window_work`) and charged before any kernel runs (a 422
    over `limits.max_eval_work`), and the series are evaluated a chunk at a time with
    `budget.check()` between chunks (the deadline, a cancellation)."""
    from proxy.engine import window_kernels, window_lanes
    from proxy.engine.quantile import run_quantile_over_time

    if func not in PARAMS:
        raise ValueError(f"{func!r} is not a range function evaluated here")
    if raw.result_type != "matrix":
        raise ValueError(f"range functions read a matrix, not a {raw.result_type}")
    times = np.ascontiguousarray(eval_ms, dtype=np.int64)
    if times.ndim != 1 or (len(times) > 1 and not (np.diff(times) > 0).all()):
        raise ValueError("eval_ms must be strictly ascending times")
    if range_ms <= 0:
        raise ValueError("the range must be positive")
    if len(params) != PARAMS[func]:
        raise ValueError(f"{func} takes {PARAMS[func]} scalar parameter(s), got {len(params)}")
    n_steps = len(times)
    p = [np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype=np.float64), (n_steps,))) for x in params]
    while len(p) < 2:
        p.append(np.zeros(n_steps, dtype=np.float64))
    code = CODES[func]
    offsets = np.ascontiguousarray(raw.offsets, dtype=np.int64)
    t_ms, value = np.ascontiguousarray(raw.t_ms), np.ascontiguousarray(raw.value)
    per_series = window_work(offsets, times, range_ms)
    if budget is not None:
        budget.charge(int(per_series.sum()), f"{func} over a window of {range_ms // 1000}s")
    # The kernels that read window_bounds's windows hold 16 bytes a cell of them per chunk.
    bounded = code in SERIAL or code == QUANTILE_OVER_TIME
    states, outs = [], []
    for a, b in _chunks(per_series, n_steps if bounded else 0):
        if budget is not None:
            budget.check()
        first, end = int(offsets[a]), int(offsets[b])
        chunk, t, v = offsets[a : b + 1] - first, t_ms[first:end], value[first:end]
        if bounded:  # their kernels read the windows of the one window walk (window_kernels.py)
            win_lo, win_hi = window_kernels.window_bounds(chunk, t, times, int(range_ms), int(offset_ms))
            if code in SERIAL:
                st, o = window_lanes.run_serial(code, chunk, t, v, win_lo, win_hi, times, p[0], p[1])
            else:
                st, o = run_quantile_over_time(chunk, v, win_lo, win_hi, times, p[0])
        else:
            st, o = window_kernels.run(code, chunk, t, v, times, int(range_ms), int(offset_ms),
                                       go_duration_seconds(range_ms), p[0], p[1])
        states.append(st)
        outs.append(o)
    if len(states) == 1:
        state, out = states[0], outs[0]
    elif states:
        state, out = np.concatenate(states), np.concatenate(outs)
    else:
        state, out = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.float64)
    state = state.reshape(raw.n_series, n_steps)
    if func == "holt_winters":
        _check_factors(state, p[0], p[1])
    return _assemble(func, raw, times, state, out)


# Work per chunk of series between two budget checks: ~50-120 ms of a kernel on one core.
CHUNK_WORK = 50_000_000
# Cells (series x steps) per chunk whose windows are held as bounds (window_bounds, 16 bytes
# a cell): at most ~130 MB of them beside the kernel's answer, for many sparse series.
CHUNK_CELLS = 1 << 23


def window_work(offsets: I64, eval_ms: I64, range_ms: int) -> I64:
    """An upper estimate of each series' work (samples visited) for a range function at
    `eval_ms`: steps x samples in one window, the samples taken as spread evenly over the span
    the steps' windows cover, plus one per step (the walk itself)."""
    counts = np.diff(offsets)
    n_steps = len(eval_ms)
    if n_steps == 0 or len(counts) == 0:
        return np.zeros(len(counts), dtype=np.int64)
    span = int(eval_ms[-1]) - int(eval_ms[0]) + range_ms
    frac = min(1.0, range_ms / span) if span > 0 else 1.0
    per_window = np.minimum(counts, np.ceil(counts * frac).astype(np.int64) + 1)
    return (per_window + 1) * n_steps


def _chunks(work: I64, cells_per_series: int = 0) -> list[tuple[int, int]]:
    """Consecutive series ranges [a, b) of about CHUNK_WORK each (at least one series), and
    of at most CHUNK_CELLS cells (or one series) when each series has `cells_per_series`."""
    n = len(work)
    if n == 0:
        return []
    total = int(work.sum())
    spans = [(0, n)]
    if total > CHUNK_WORK:
        bounds = np.searchsorted(np.cumsum(work), np.arange(CHUNK_WORK, total, CHUNK_WORK), side="left")
        cuts = sorted({0, n, *(min(n, int(x) + 1) for x in bounds)})
        spans = [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
    if cells_per_series <= 0:
        return spans
    most = max(1, CHUNK_CELLS // cells_per_series)
    return [(x, min(x + most, b)) for a, b in spans for x in range(a, b, most)]


def _go_f(x: float) -> str:
    """fmt's %f."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return f"{x:f}"


def _check_factors(state: npt.NDArray[np.int8], sf: F64, tf: F64) -> None:
    """funcHoltWinters panics at its first call with a bad factor (the smoothing factor
    checked first); it is called per series, step by step, where the window holds a sample."""
    bad = ((sf <= 0) | (sf >= 1)) | ((tf <= 0) | (tf >= 1))
    if not bad.any():
        return
    calls = (state > 0) & bad[None, :]
    if not calls.any():
        return
    s, k = np.unravel_index(int(np.argmax(calls.ravel())), calls.shape)
    f_s, f_t = float(sf[k]), float(tf[k])
    if f_s <= 0 or f_s >= 1:
        raise EvalError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {_go_f(f_s)}")
    raise EvalError(f"invalid trend factor. Expected: 0 < tf < 1, got: {_go_f(f_t)}")


def _assemble(func: str, raw: QueryResult, times: I64, state: npt.NDArray[np.int8], out: F64) -> QueryResult:
    from proxy.result.merge import concat

    has = state == 2
    counts = has.sum(axis=1)
    keep = np.flatnonzero(counts > 0)
    if len(keep) == 0:
        return QueryResult.empty("matrix", warnings=list(raw.warnings), infos=list(raw.infos))
    keep_name = func == "last_over_time"
    labels = []
    for s in keep.tolist():
        d = raw.labels[s]
        labels.append(d if keep_name or "__name__" not in d else {k: v for k, v in d.items() if k != "__name__"})
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    mask = has[keep]
    t = np.broadcast_to(times, mask.shape)[mask]
    v = out.reshape(state.shape)[keep][mask]
    result = QueryResult("matrix", labels, offsets, t, v, list(raw.warnings), list(raw.infos))
    keys = result.canonical_keys()
    if len(set(keys)) != len(keys):
        raise DuplicateLabelset()
    return concat([result])
