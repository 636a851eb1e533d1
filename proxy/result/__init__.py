"""Query answers as columns (`QueryResult`) and the kernels that combine and cut them.

    query_result.py  the QueryResult type (imports neither numba nor pyarrow)
    labels.py        label sets as Prometheus writes them (canonical keys)
    merge.py         concat / re-aggregate pieces (sum of sums, avg as sum/count, topk)
    overlap.py       merge the answers of backends whose data overlap in time
    binop.py         PromQL binary operators on two answers (golang.py: Go's math, quoting)
    functions.py     PromQL's instant-vector functions (histogram.py: histogram_quantile)
    aggregate.py     PromQL's aggregation operators
    stepwise.py      their shared plumbing: samples on the step grid, rangeEval's output
    gosort.py        Go's sort.Sort (pdqsort), container/heap, sort.Search
    gomath.py        Go's Sin/Cos/Tan/Log, bit for bit
    pieces.py        cut an answer into time pieces, subsample to a coarser step
    ties.py          is a sharded topk exact? (ties at the k-th place)
    windows.py       range functions (rate, *_over_time, ...) over raw samples, as Prometheus
                     2.42 (window_kernels.py, window_lanes.py: the compiled loops); subquery grids
"""

from .query_result import QueryResult, ResultType

__all__ = ["QueryResult", "ResultType"]
