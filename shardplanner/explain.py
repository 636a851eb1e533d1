"""A plan as JSON-ready data (`GET /api/v1/explain`) and as text for humans and logs.

explain(plan) -> {
  "query": "avg(DCGM_FI_DEV_GPU_UTIL)", "type": "range",
  "start_ms": ..., "end_ms": ..., "step_ms": ..., "time_ms": null,
  "sharded": true, "time_split": true, "notes": [],
  "merge": {"kind": "aggregate", "op": "avg", "by": [], "without": false, ...},
  "shards": [{"index": 0, "count": 4, "label": "Hostname", "matcher": "Hostname=~\"...\""}],
  "time_pieces": [[start_ms, end_ms], ...],            # or instant evaluation times
  "piece_count": 16,
  "estimated_samples": 2949120, "estimated_series": 2048,   # or null (Plan.estimated_*)
  "pieces": [{"query": ..., "start_ms": ..., "shard": 0, "role": "sum"}, ...]
}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardplanner.ast import Expr
from shardplanner.coverage import partition_window
from shardplanner.holdings import BackendHolding, fmt_time
from shardplanner.plan import Piece, Plan, ShardSpec
from shardplanner.read_windows import DEFAULT_LOOKBACK_MS, reads
from shardplanner.routing import Route
from shardplanner.serialize import quote_string

__all__ = ["REASON_CODES", "explain", "explain_text", "reason_code", "unheld_reads"]

# Why a query was planned as it was, as a short code from this fixed list: the `reason` label
# of promaccel_queries_planned_total. A note's text can hold a client's metric names or
# numbers, so it never becomes a label value (unbounded cardinality in /metrics).
_NOTE_CODES: tuple[tuple[str, str], ...] = (
    ("unparsable by planner", "unparsable"),
    ("too complex to plan", "too_complex"),
    ("not a range-query expression", "not_range_expression"),
    ("not sharded: auto:", "auto_small"),
    ("not sharded: max_pieces", "max_pieces"),
    ("not sharded: no known values", "no_shard_values"),
    ("not sharded: fewer than two known values", "no_shard_values"),
    ("not sharded: a selector has no plain metric name", "no_metric_name"),
    ("not sharded: no shard label configured", "no_shard_label"),
    ("not sharded: selectors resolve to different shard labels", "mixed_shard_labels"),
    ("not sharded: no series selectors", "no_selectors"),
    ("not sharded:", "not_shardable"),
    ("not split in time:", "not_split"),
    ("time split coarsened", "coarsened"),
    ("shards reduced", "shards_reduced"),
    ("auto:", "auto"),
    ("@ start()/end() pinned", "pinned"),
)
# "topk_tie": the proxy's rerun of a sharded topk/bottomk tied at the k-th place.
REASON_CODES = frozenset({"", "other", "topk_tie", *(code for _, code in _NOTE_CODES)})


def reason_code(notes: tuple[str, ...] | list[str]) -> str:
    """The fixed code of a plan's first note ("" without notes, "other" if unknown)."""
    if not notes:
        return ""
    head = notes[0]
    return next((code for prefix, code in _NOTE_CODES if head.startswith(prefix)), "other")


def _matcher(spec: ShardSpec) -> str:
    return f"{spec.label}{spec.matcher_op}{quote_string(spec.matcher_value)}"


def _piece(p: Piece) -> dict[str, Any]:
    out: dict[str, Any] = {"query": p.query}
    if p.is_range:
        out.update(start_ms=p.start_ms, end_ms=p.end_ms, step_ms=p.step_ms)
    else:
        out["time_ms"] = p.time_ms
    out["shard"] = None if p.shard is None else p.shard.index
    out["role"] = p.role
    return out


def explain(plan: Plan) -> dict[str, Any]:
    """JSON-ready description of ``plan`` (only str/int/float/bool/None/list/dict)."""
    req = plan.request
    shards: dict[int, ShardSpec] = {}
    times: list[Any] = []
    for p in plan.pieces:
        if p.shard is not None:
            shards.setdefault(p.shard.index, p.shard)
        t: Any = [p.start_ms, p.end_ms] if p.is_range else p.time_ms
        if t not in times:
            times.append(t)
    m = plan.merge
    return {
        "query": req.query,
        "type": "range" if req.is_range else "instant",
        "start_ms": req.start_ms,
        "end_ms": req.end_ms,
        "step_ms": req.step_ms,
        "time_ms": req.time_ms,
        "sharded": plan.sharded,
        "time_split": plan.time_split,
        "notes": list(plan.notes),
        "merge": {
            "kind": m.kind,
            "op": m.op,
            "by": list(m.grouping),
            "without": m.without,
            "param": m.param,
            "combine_time": m.combine_time,
        },
        "shards": [
            {"index": s.index, "count": s.count, "label": s.label, "matcher": _matcher(s)}
            for _, s in sorted(shards.items())
        ],
        "time_pieces": times,
        "piece_count": len(plan.pieces),
        "estimated_samples": plan.estimated_samples,
        "estimated_series": plan.estimated_series,
        "pieces": [_piece(p) for p in plan.pieces],
    }


def explain_text(plan: Plan, max_pieces: int = 20) -> str:
    """Readable multi-line rendering; lists at most ``max_pieces`` pieces."""
    d = explain(plan)
    m = d["merge"]
    lines = [f"query: {d['query']}"]
    if d["type"] == "range":
        lines.append(f"range: {d['start_ms']}..{d['end_ms']} ms, step {d['step_ms']} ms")
    else:
        lines.append(f"instant: {d['time_ms']} ms")
    merge = m["kind"]
    if m["op"]:
        clause = "without" if m["without"] else "by"
        merge += f" {m['op']} {clause} ({', '.join(m['by'])})"
        if m["param"] is not None:
            merge += f" param={m['param']:g}"
        if m["combine_time"]:
            merge += " across time"
    lines.append(f"merge: {merge}")
    lines.append(
        f"pieces: {d['piece_count']} = {len(d['time_pieces'])} time x "
        f"{max(len(d['shards']), 1)} shard(s)"
        + (" x 2 roles (sum, count)" if m["op"] == "avg" and d["sharded"] else "")
    )
    for s in d["shards"]:
        lines.append(f"  shard {s['index']}/{s['count']}: {s['matcher']}")
    if d["estimated_samples"] is not None:
        lines.append(
            f"estimate: {d['estimated_samples']:,} samples over {d['estimated_series']:,} series"
        )
    for note in d["notes"]:
        lines.append(f"note: {note}")
    for p in d["pieces"][:max_pieces]:
        when = f"{p['start_ms']}..{p['end_ms']}" if "start_ms" in p else f"@{p['time_ms']}"
        tags = "".join(f" [{k} {p[k]}]" for k in ("shard", "role") if p[k] is not None)
        lines.append(f"  {when}{tags}: {p['query']}")
    if len(d["pieces"]) > max_pieces:
        lines.append(f"  ... {len(d['pieces']) - max_pieces} more")
    return "\n".join(lines)


# --- routes: what a chosen store does not hold ---------------------------------------------


def unheld_reads(
    expr: Expr,
    route: Route,
    holdings: Sequence[BackendHolding],
    start_ms: int,
    end_ms: int,
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
) -> list[dict[str, Any]]:
    """The reads a routed store holds nothing of, for explain: each `{"backend", "metric",
    "from_ms", "to_ms", "held_by", "note"}` (the closed sample window of one selector, evaluated
    over `[start_ms, end_ms]` or the route's part of it; `held_by`: the stores that hold any
    of it). A store is sent a read that it holds nothing of when nobody holds that time:
    routing then picks the preferred store whose patterns name the metric (its answer is the
    right one, empty there, as past retention). With local holding node_* for the last 6 h:

        node_load1 over [now-24h, now-23h]  ->  local, node_load1, [now-24h-5m, now-23h],
            held_by [], "no store holds node_load1 at ... : local answers empty there"

    `[]` for an unroutable route, or when every routed store holds some of each read."""
    if route.kind == "unroutable":
        return []
    if route.kind == "split_time":
        spans = [(p.start_ms, p.end_ms, p.backends) for p in route.parts]
    else:
        spans = [(start_ms, end_ms, route.backends)]
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str | None, int, int]] = set()
    for a, b, backends in spans:
        for r in reads(expr, a, b, lookback_ms):
            held_by = [n for n in dict.fromkeys(h.name for h in holdings)
                       if partition_window([h for h in holdings if h.name == n], r.metric, r.from_ms, r.to_ms)]
            for name in backends:
                key = (name, r.metric, r.from_ms, r.to_ms)
                if name in held_by or key in seen:
                    continue
                seen.add(key)
                what = r.metric if r.metric is not None else "a selector without a fixed metric name"
                when = f"{fmt_time(r.from_ms)}..{fmt_time(r.to_ms)}"
                own = "; ".join(h.describe() for h in holdings if h.name == name) or f"{name} holds nothing"
                if held_by:
                    note = (f"{name} holds no samples of {what} in {when} ({own}); "
                            f"{', '.join(held_by)} hold some of them")
                else:
                    note = (f"no store holds {what} in {when} ({own}): "
                            f"{name} answers empty there, as past retention")
                out.append({"backend": name, "metric": r.metric, "from_ms": r.from_ms, "to_ms": r.to_ms,
                            "held_by": held_by, "note": note})
    return out
