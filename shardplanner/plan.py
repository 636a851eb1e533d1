"""The planner's data types: a request in, a plan (pieces + merge recipe) out.

Everything here is frozen and pure. Times are integer milliseconds (`_ms`); seconds exist
only at the HTTP edge in `proxy/`.

The contract with `proxy/`:
- `proxy` builds a `QueryRequest` from validated HTTP parameters, asks the planner for a
  `Plan`, runs every `Piece` against a backend, and merges the piece answers following
  `Plan.merge` (a `MergeRecipe`).
- A `Piece.query` is exactly the PromQL string to send. When nothing was rewritten it is the
  client's original query string, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shardplanner.ast import Expr

MergeKind = Literal["passthrough", "concat", "aggregate"]
AggOp = Literal["sum", "min", "max", "count", "group", "avg", "topk", "bottomk"]


@dataclass(frozen=True)
class QueryRequest:
    """A validated query. Range query: start/end/step set. Instant query: time_ms set."""

    query: str
    start_ms: int | None = None
    end_ms: int | None = None
    step_ms: int | None = None
    time_ms: int | None = None
    lookback_ms: int = 300_000

    @property
    def is_range(self) -> bool:
        return self.step_ms is not None


@dataclass(frozen=True)
class PlannerSettings:
    """Knobs from config / CLI (`planner.*`)."""

    split_interval_ms: int | None = None  # None: never split by time
    # 1: never shard by node. With auto_shards: the most shards a query may get.
    shards: int = 1
    # Choose the shard count per query (`planner.shards: auto`, formula in `planner`): as
    # many shards as keep every piece under max_samples_per_piece estimated samples.
    auto_shards: bool = False
    max_samples_per_piece: int = 10_000_000
    # Samples-touched estimate (see `planner.estimate_samples`): series per node (value of
    # the shard label) for one metric, and the scrape interval (samples per range window).
    series_per_node: int = 8
    scrape_interval_ms: int = 30_000
    # (metric-name regex, shard label); first match wins.
    shard_labels: tuple[tuple[str, str], ...] = (
        ("DCGM_.*", "Hostname"),
        ("node_.*", "instance"),
    )
    min_range_to_split_ms: int = 0
    max_pieces: int = 10_000
    # Instant `max_over_time(x[7d])`, `min_over_time`, `sum_over_time`, `count_over_time`
    # (optionally under the aggregation that recombines them exactly, e.g. `sum by (g)`):
    # cut the range window at multiples of split_interval_ms into instant pieces evaluated at
    # different times, recombined with MergeRecipe.combine_time.
    split_instant_windows: bool = False
    # The backend's range windows: True for Prometheus 2 (closed `[t-r, t]`: sub-windows for
    # sum/count are made disjoint by starting 1 ms after their neighbour), False for
    # Prometheus 3 / left-open `(t-r, t]` (adjacent sub-windows are disjoint as they are).
    closed_range_windows: bool = True


@dataclass(frozen=True)
class ShardSpec:
    """Shard `index` of `count` over `label`; `matcher_op`/`matcher_value` is the injected
    matcher, e.g. Hostname=~"node-0|node-1" or, for the final complement shard,
    Hostname!~"node-0|...|node-9"."""

    label: str
    index: int
    count: int
    matcher_op: Literal["=~", "!~"]
    matcher_value: str


@dataclass(frozen=True)
class Piece:
    """One backend call. Range piece: start/end/step; instant piece: time_ms."""

    query: str
    start_ms: int | None = None
    end_ms: int | None = None
    step_ms: int | None = None
    time_ms: int | None = None
    shard: ShardSpec | None = None
    # For avg: which partial this piece computes ("sum" or "count"); None otherwise.
    role: str | None = None

    @property
    def is_range(self) -> bool:
        return self.step_ms is not None


@dataclass(frozen=True)
class MergeRecipe:
    """How piece answers become one answer.

    - passthrough: exactly one piece; relay its answer untouched.
    - concat: pieces partition time and/or series; union the series, concatenating their
      samples in time order (a series present in several pieces is the same series).
    - aggregate: per timestamp, group the piece series by the output labels and apply `op`:
      sum -> sum of sums; count -> sum of counts; min/max -> min/max; group -> 1;
      avg -> sum of "sum" pieces / sum of "count" pieces; topk/bottomk(param) -> global
      topk/bottomk over the union of per-shard winners.
      `grouping` / `without` describe the output labels exactly as the PromQL `by`/`without`.
    - combine_time (with aggregate, instant queries only): the pieces are instant queries
      evaluated at *different* times (`Piece.time_ms`), each over one sub-window of a range
      selector; treat all their samples as if at the request's `time_ms`, combine them with
      `op` (max, min, or sum: sum of sums for sum_over_time, sum of counts for
      count_over_time) and stamp the answer with the request's `time_ms`.
    """

    kind: MergeKind
    op: AggOp | None = None
    grouping: tuple[str, ...] = ()
    without: bool = False
    param: float | None = None
    combine_time: bool = False


@dataclass(frozen=True)
class Plan:
    request: QueryRequest
    pieces: tuple[Piece, ...]
    merge: MergeRecipe
    sharded: bool = False
    time_split: bool = False
    # Why the query was not sharded / not split (for metrics and /api/v1/explain).
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Samples the whole query touches, estimated (`planner.estimate_samples`); None when the
    # planner cannot estimate it (a metric without a shard label, no known label values).
    estimated_samples: int | None = None
    estimated_series: int | None = None
    # The query's tree with `@ start()`/`@ end()` pinned to absolute times; None when the
    # planner could not parse it. One parse per request: routing and analysis read this.
    expr: Expr | None = field(default=None, compare=False)
