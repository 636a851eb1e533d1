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
from shardplanner.promql import GO_1_19, Dialect

MergeKind = Literal["passthrough", "concat", "aggregate"]
AggOp = Literal["sum", "min", "max", "count", "group", "avg", "topk", "bottomk"]


@dataclass(frozen=True)
class Span:
    """When a query is evaluated: at start, start + step, ... up to end (a range), or once
    (an instant: start == end, no step). The one time shape of requests, pieces, cache units,
    fetches and cache keys.

        Span.range(0, 3_600_000, 60_000).points  -> 61
        Span.instant(5_000).time_ms              -> 5_000
    """

    start_ms: int
    end_ms: int
    step_ms: int | None = None

    def __post_init__(self) -> None:
        if self.step_ms is None and self.start_ms != self.end_ms:
            raise ValueError("an instant span has start_ms == end_ms")
        if self.step_ms is not None and (self.step_ms <= 0 or self.end_ms < self.start_ms):
            raise ValueError(f"bad range span {self.start_ms}..{self.end_ms} step {self.step_ms}")

    @classmethod
    def range(cls, start_ms: int, end_ms: int, step_ms: int) -> Span:
        return cls(start_ms, end_ms, step_ms)

    @classmethod
    def instant(cls, time_ms: int) -> Span:
        return cls(time_ms, time_ms, None)

    @property
    def is_range(self) -> bool:
        return self.step_ms is not None

    @property
    def time_ms(self) -> int:
        """The evaluation time of an instant (the first one of a range)."""
        return self.start_ms

    @property
    def step(self) -> int:
        """The step of a range span (ValueError for an instant)."""
        if self.step_ms is None:
            raise ValueError("an instant span has no step")
        return self.step_ms

    @property
    def points(self) -> int:
        return 1 if self.step_ms is None else (self.end_ms - self.start_ms) // self.step_ms + 1

    def with_bounds(self, start_ms: int, end_ms: int) -> Span:
        """The same grid (step) over [start_ms, end_ms]; an instant at start_ms."""
        return Span(start_ms, end_ms, self.step_ms) if self.step_ms is not None else Span.instant(start_ms)


class Timed:
    """The optional views of a `span` that older code reads (None where they do not apply)."""

    span: Span

    @property
    def is_range(self) -> bool:
        return self.span.step_ms is not None

    @property
    def start_ms(self) -> int | None:
        return self.span.start_ms if self.span.step_ms is not None else None

    @property
    def end_ms(self) -> int | None:
        return self.span.end_ms if self.span.step_ms is not None else None

    @property
    def step_ms(self) -> int | None:
        return self.span.step_ms

    @property
    def time_ms(self) -> int | None:
        return None if self.span.step_ms is not None else self.span.start_ms


@dataclass(frozen=True)
class QueryRequest(Timed):
    """A validated query: its PromQL, when it is evaluated, and its lookback delta."""

    query: str
    span: Span
    lookback_ms: int = 300_000

    @classmethod
    def range(cls, query: str, start_ms: int, end_ms: int, step_ms: int, lookback_ms: int = 300_000) -> QueryRequest:
        return cls(query, Span.range(start_ms, end_ms, step_ms), lookback_ms)

    @classmethod
    def instant(cls, query: str, time_ms: int, lookback_ms: int = 300_000) -> QueryRequest:
        return cls(query, Span.instant(time_ms), lookback_ms)


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
    # the shard label) for one metric -- the fallback for a metric whose series count is not
    # known --, and the scrape interval (samples per range window).
    series_per_node: int = 8
    scrape_interval_ms: int = 30_000
    # Known series counts, (metric name, series) pairs sorted by name: counted by the caller
    # (the proxy asks the backend, `proxy/pipeline/series_counts.py`) and passed in as data.
    # A listed metric's selectors are estimated from its real count instead of
    # nodes x series_per_node.
    series_counts: tuple[tuple[str, int], ...] = ()
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
    # The most grid points one backend call may ask for (Prometheus: 11,000); a day cell
    # (`plan(day_cells_until_ms=...)`) is only made when a day's grid points fit one call.
    max_points: int = 11_000
    # The regexp dialect of the backend the query goes to (the Go version the proxy read from
    # the primary's buildinfo): a regex it rejects makes the query unplannable, so its own
    # error stands. Go 1.19 (Prometheus 2.42) when unknown: the conservative reading.
    dialect: Dialect = GO_1_19


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
class Piece(Timed):
    """One planned query: the PromQL to send and when it is evaluated."""

    query: str
    span: Span
    shard: ShardSpec | None = None
    # For avg: which partial this piece computes ("sum" or "count"); None otherwise.
    role: str | None = None


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
    # Day cells (`timesplit.split_range_days`): the time pieces of days that end by this
    # instant were cut by day (a whole day in the query is one piece); None: not applied.
    day_cells_until_ms: int | None = None
