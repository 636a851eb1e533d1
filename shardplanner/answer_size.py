"""How big a query's answer may be, estimated before anything runs (pure, no I/O).

The executor reserves this many bytes from its process-wide budget of answers being
materialised (`limits.max_inflight_answer_bytes`) before it fetches anything, and corrects the
reservation once the real answer is known. An estimate is a guess: where it cannot stand on
anything (no shard-label values known for a selector) it is None and the executor uses its
fallback; a wrong guess only changes how many queries run at once, never an answer.

    answer samples = series of the answer x samples per series
    series:  a selector: nodes selected (known shard-label values) x series_per_node, as
             `planner.estimate_samples` counts them;
             `agg by (shard label)`: the nodes; `agg by (other labels)`: the input series
             over series_per_node (labels coarser than a node's); `agg` without grouping: 1;
             `agg without (...)`, count_values: the input series; topk/bottomk/limitk(k):
             k per group (at each step: over a range the picked series change, but the
             samples stay k per group per step);
             functions and binary operators: their widest vector argument;
             numbers, strings, time(), vector(), scalar(), absent*(): 1.
    samples per series: the query's steps (1 for an instant query); an instant query that
             answers a range (`x[5m]`, a subquery) the range over the scrape interval (or
             the subquery's step).
    bytes: 16 per sample (an int64 timestamp and a float64 value) + LABEL_BYTES per series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .ast import Agg, Binary, Call, Expr, MatrixSel, Number, Paren, Selector, String, Subquery, Unary
from .functions import ALL_AGGREGATIONS, FUNCTIONS
from .plan import PlannerSettings, QueryRequest
from .planner import nodes_selected, shard_label_for

SAMPLE_BYTES = 16
LABEL_BYTES = 256  # a DCGM series' label set as Prometheus writes it is ~200-300 bytes
_DEFAULT_SUBQUERY_STEP_MS = 60_000
# From the function table (shardplanner/functions.py): functions whose answer is one series
# whatever their argument (answer "one": time, vector, scalar, absent, ...); aggregations that
# keep up to k series per group (topk, bottomk, limitk), and those as wide as their input
# (count_values: one series per distinct value).
ONE_SERIES = frozenset(n for n, f in FUNCTIONS.items() if f.answer == "one")
BY_K = frozenset(n for n, a in ALL_AGGREGATIONS.items() if a.answer == "k")
AS_WIDE_AS_INPUT = frozenset(n for n, a in ALL_AGGREGATIONS.items() if a.answer == "series")


def answer_series(expr: Expr, settings: PlannerSettings, shard_values: Mapping[str, Sequence[str]]) -> int | None:
    """Series in `expr`'s answer, estimated; None when a selector's nodes are not known."""
    match expr:
        case Number() | String():
            return 1
        case Selector():
            nodes = nodes_selected(expr, settings, shard_values)
            return None if nodes is None else nodes * settings.series_per_node
        case MatrixSel():
            return answer_series(expr.selector, settings, shard_values)
        case Subquery() | Paren() | Unary():
            return answer_series(expr.expr, settings, shard_values)
        case Call():
            if expr.func in ONE_SERIES or not expr.args:
                return 1
            widths = [answer_series(a, settings, shard_values) for a in expr.args]
            return None if any(w is None for w in widths) else max(w for w in widths if w is not None)
        case Binary():
            lhs = answer_series(expr.lhs, settings, shard_values)
            rhs = answer_series(expr.rhs, settings, shard_values)
            if lhs is None or rhs is None:
                return None
            return lhs + rhs if expr.op == "or" else max(lhs, rhs)
        case Agg():
            inner = answer_series(expr.expr, settings, shard_values)
            if inner is None:
                return None
            groups = _groups(expr, inner, settings, shard_values)
            if expr.op in AS_WIDE_AS_INPUT:
                return inner
            if expr.op in BY_K:
                k = expr.param.value if isinstance(expr.param, Number) else inner
                return max(1, min(inner, int(k) * groups if k == k and k >= 1 else inner))
            return groups
    return None


def _groups(agg: Agg, inner: int, settings: PlannerSettings, shard_values: Mapping[str, Sequence[str]]) -> int:
    if agg.without:
        return inner
    if not agg.grouping:
        return 1
    label, _ = shard_label_for(agg.expr, settings.shard_labels)
    if label is not None and label in agg.grouping:
        nodes = len([v for v in shard_values.get(label, ()) if v])
        if nodes:
            return min(inner, nodes)
    return max(1, inner // max(settings.series_per_node, 1))


def _samples_per_series(expr: Expr, req: QueryRequest, settings: PlannerSettings) -> int:
    if req.is_range:
        return req.span.points
    while isinstance(expr, Paren):
        expr = expr.expr
    if isinstance(expr, MatrixSel):
        return max(1, expr.range_ms // max(settings.scrape_interval_ms, 1))
    if isinstance(expr, Subquery):
        return max(1, expr.range_ms // (expr.step_ms or _DEFAULT_SUBQUERY_STEP_MS))
    return 1


def answer_bytes(expr: Expr | None, req: QueryRequest, settings: PlannerSettings,
                 shard_values: Mapping[str, Sequence[str]]) -> int | None:
    """Bytes of `req`'s answer decoded (16 a sample, LABEL_BYTES a series), estimated; None
    when it cannot be (no parsed expression, a selector's nodes unknown)."""
    if expr is None:
        return None
    series = answer_series(expr, settings, shard_values)
    if series is None:
        return None
    return series * (_samples_per_series(expr, req, settings) * SAMPLE_BYTES + LABEL_BYTES)
