"""The integer code of each range function's compiled window kernel, in one place.

The numba kernels (window_kernels.py, window_lanes.py) take the function as an integer and
compare it with these names; numba freezes them into the compiled code. A code is never
renumbered: its kernel files' on-disk numba cache is keyed on their own source only, so a new
range function takes the next free code (and its kernel a branch in one of those files,
which refreshes their cache).

    CODES["rate"] -> 0        WINDOW_FUNCTIONS: the names, in code order
"""

from __future__ import annotations

__all__ = [
    "AVG_OVER_TIME", "CHANGES", "CODES", "COUNT_OVER_TIME", "DELTA", "DERIV", "HOLT_WINTERS", "IDELTA", "INCREASE",
    "IRATE", "LAST_OVER_TIME", "MAX_OVER_TIME", "MIN_OVER_TIME", "PREDICT_LINEAR", "PRESENT_OVER_TIME",
    "QUANTILE_OVER_TIME", "RATE", "RESETS", "SERIAL", "STDDEV_OVER_TIME", "STDVAR_OVER_TIME", "SUM_OVER_TIME",
    "WINDOW_FUNCTIONS",
]

# The order matters to the kernels: rate..delta (<= DELTA) extrapolate, irate/idelta
# (<= IDELTA) read the last two samples, deriv/predict_linear/holt_winters (>= DERIV) need two.
WINDOW_FUNCTIONS: tuple[str, ...] = (
    "rate", "increase", "delta", "irate", "idelta",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
    "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time",
    "changes", "resets", "deriv", "predict_linear", "holt_winters",
)
CODES: dict[str, int] = {name: i for i, name in enumerate(WINDOW_FUNCTIONS)}

# Named for the kernels' comparisons (`code == QUANTILE_OVER_TIME`, `code <= DELTA`).
RATE = CODES["rate"]
INCREASE = CODES["increase"]
DELTA = CODES["delta"]
IRATE = CODES["irate"]
IDELTA = CODES["idelta"]
AVG_OVER_TIME = CODES["avg_over_time"]
MIN_OVER_TIME = CODES["min_over_time"]
MAX_OVER_TIME = CODES["max_over_time"]
SUM_OVER_TIME = CODES["sum_over_time"]
COUNT_OVER_TIME = CODES["count_over_time"]
QUANTILE_OVER_TIME = CODES["quantile_over_time"]
STDDEV_OVER_TIME = CODES["stddev_over_time"]
STDVAR_OVER_TIME = CODES["stdvar_over_time"]
LAST_OVER_TIME = CODES["last_over_time"]
PRESENT_OVER_TIME = CODES["present_over_time"]
CHANGES = CODES["changes"]
RESETS = CODES["resets"]
DERIV = CODES["deriv"]
PREDICT_LINEAR = CODES["predict_linear"]
HOLT_WINTERS = CODES["holt_winters"]

# The functions whose every step depends on the one before: window_lanes.run_serial runs
# them four windows at a time; the rest are window_kernels.run.
SERIAL: frozenset[int] = frozenset({AVG_OVER_TIME, SUM_OVER_TIME, STDDEV_OVER_TIME, STDVAR_OVER_TIME, DERIV,
                                    PREDICT_LINEAR, HOLT_WINTERS})
