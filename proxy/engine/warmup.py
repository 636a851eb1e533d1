"""Compile the cross-store kernels (range functions over raw samples, functions and
aggregations above the stores) before a hybrid fleet's first query needs them.

They are numba-compiled on first use and cached on disk; a cold compile of all of them takes
tens of seconds on a busy 2-core machine, which a dashboard's first straddling panel should
not pay. `promaccel serve` runs this for a hybrid configuration (several backends or `holds`),
`make test` once before the suite.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from proxy.engine.aggregate import AGGREGATIONS, evaluate_aggregation
from proxy.engine.functions import evaluate_call
from proxy.engine.windows import PARAMS, eval_range_function
from proxy.result.query_result import QueryResult
from shardplanner.ast import Number, String
from shardplanner.promql import parse

_T0 = 1_700_000_000_000


def _raw() -> QueryResult:
    t = [_T0 + i * 15_000 for i in range(12)]
    return QueryResult.from_series("matrix", [
        ({"__name__": "x", "le": "1", "a": "1"}, t, [float(i % 5) for i in range(12)]),
        ({"__name__": "x", "le": "+Inf", "a": "1"}, t, [float(i) for i in range(12)]),
    ])


def warm_up() -> float:
    """Exercise every cross-store kernel once; returns the seconds it took."""
    start = time.perf_counter()
    raw = _raw()
    grid = np.array([_T0 + 60_000, _T0 + 120_000, _T0 + 165_000], dtype=np.int64)
    params = {0: [], 1: [0.5], 2: [0.5, 0.5]}
    for func, n in PARAMS.items():
        eval_range_function(func, params[n], raw, grid, 60_000)
    stepped = eval_range_function("last_over_time", [], raw, grid, 60_000)
    param: dict[str, float | str] = {"topk": 1.0, "bottomk": 1.0, "quantile": 0.5, "count_values": "v"}
    for op in sorted(AGGREGATIONS):
        p = param.get(op)
        text = f"{op} by (a) (x)" if p is None else f"{op} by (a) ({p if op != 'count_values' else repr(p)}, x)"
        agg: Any = parse(text)
        evaluate_aggregation(agg, stepped, p, grid, True)
    for text in ("abs(x)", "sort_desc(x)", "histogram_quantile(0.9, x)", 'label_replace(x, "b", "$1", "a", "(.*)")',
                 "round(x, 0.5)", "clamp(x, 0, 1)", "exp(x)", "hour(x)", "timestamp(-x)"):
        call: Any = parse(text)
        args = [a.value if isinstance(a, (Number, String)) else stepped for a in call.args]
        evaluate_call(call, args, grid, True)
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"promaccel cross-store kernels compiled in {warm_up():.1f}s")
