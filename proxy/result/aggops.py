"""The one table of aggregation op codes the compiled kernels share.

`aggregate.py` evaluates an aggregation as engine.go does (per step, in input order);
`merge.py` re-aggregates the partial answers of shard pieces (sum of sums, sum of counts,
avg as sum / count). Both kernels are compiled with numba and take the op as an integer: these
are those integers, the same in both (a kernel reads the module-level constants, which numba
freezes at compile time).
"""

from __future__ import annotations

SUM = 0
AVG = 1
MIN = 2
MAX = 3
COUNT = 4
GROUP = 5
STDDEV = 6
STDVAR = 7

CODES: dict[str, int] = {
    "sum": SUM, "avg": AVG, "min": MIN, "max": MAX, "count": COUNT, "group": GROUP, "stddev": STDDEV,
    "stdvar": STDVAR,
}

__all__ = ["AVG", "CODES", "COUNT", "GROUP", "MAX", "MIN", "STDDEV", "STDVAR", "SUM"]
