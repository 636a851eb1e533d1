"""The engine's one table of functions: each PromQL function's row (shardplanner/functions.py:
argument and return types, keeps `__name__`, safe under `@`, ...) joined by NAME with the
kernel that evaluates it here, as Prometheus joins parser.Functions with FunctionCalls.

    TABLE["rate"]    -> Entry(row=FUNCTIONS["rate"], instant=None, window=CODES["rate"])
    TABLE["abs"]     -> Entry(row=FUNCTIONS["abs"], instant=<kernel>, window=None)
    ELSEWHERE        -> the 2.42 functions with no kernel here, each with the reason

Two kinds of kernel:
- an instant-vector function: a Python function over the call's evaluated arguments
  (`functions.kernel("name")` registers it; functions.py);
- a range function: a compiled window kernel, by its integer code (window_codes.py); its
  scalar parameters (windows.PARAMS) are counted from the row's argument types.

Adding a function is one row in shardplanner/functions.py and one kernel registered here;
tests/engine/test_kernel_table.py fails for a 2.42 row without a kernel (unless listed in
ELSEWHERE) and for a kernel without a row.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.engine.functions import KERNELS, InstantKernel
from proxy.engine.window_codes import CODES
from shardplanner.functions import FUNCTIONS, Function

__all__ = ["ELSEWHERE", "TABLE", "Entry"]


@dataclass(frozen=True)
class Entry:
    row: Function
    instant: InstantKernel | None = None  # functions.py
    window: int | None = None  # window_codes.CODES: a range function's compiled kernel

    @property
    def name(self) -> str:
        return self.row.name


# 2.42 functions the evaluator answers without a kernel of their own, and why.
ELSEWHERE: dict[str, str] = {
    "absent": "AbsentNode: 1 where its merged argument has no series, labels from the selector's "
              "equality matchers (local_ops.absent_or_scalar); it reads the argument's AST, not only its value",
    "absent_over_time": "AbsentNode over count_over_time of its range vector (the window kernel), then "
                        "absent's rule (local_ops.absent_or_scalar)",
}


def _table() -> dict[str, Entry]:
    table: dict[str, Entry] = {}
    for name, fn in KERNELS.items():
        table[name] = Entry(FUNCTIONS[name], instant=fn)
    for name, code in CODES.items():
        table[name] = Entry(FUNCTIONS[name], window=code)
    return table


TABLE: dict[str, Entry] = _table()
