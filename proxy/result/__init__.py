"""Query answers as columns (`QueryResult`) and the kernels that combine and cut them.

    query_result.py  the QueryResult type (imports neither numba nor pyarrow)
    labels.py        label sets as Prometheus writes them (canonical keys)
    label_sets.py    the process-wide table of label sets (each label JSON kept once)
    merge.py         concat / re-aggregate pieces (sum of sums, avg as sum/count, topk)
    overlap.py       merge the answers of backends whose data overlap in time
    aggops.py        the aggregation op codes merge.py and proxy/engine/aggregate.py share
    golang.py        Go's math, quoting and number formatting (also proxy/engine's)
    gosort.py        Go's sort.Sort (pdqsort), container/heap, sort.Search
    gomath.py        Go's Sin/Cos/Tan/Log, bit for bit
    pieces.py        cut an answer into time pieces, subsample to a coarser step
    ties.py          is a sharded topk exact? (ties at the k-th place)

PromQL's evaluation itself (operators, functions, aggregations, range functions) is in
proxy/engine/.
"""

from .query_result import QueryResult, ResultType

__all__ = ["QueryResult", "ResultType"]
