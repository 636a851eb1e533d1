"""Sharded plans recombined in PromQL give what the original query gives, on Prometheus 2.42's
own engine (promtool rule unit tests), over data with odd hosts, gaps and counters."""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import replace
from pathlib import Path

from shardplanner.ast import Expr, Selector, Subquery, transform
from shardplanner.plan import Plan, PlannerSettings, QueryRequest, Span
from shardplanner.planner import plan
from shardplanner.promql import parse
from shardplanner.serialize import quote_string, to_promql
from tests.servers import require
from tests.shardplanner.fleet import HOSTS, VALUES

# --- equivalence on Prometheus 2.42's engine (promtool rule unit tests) ----------------------
#
# For each query, shard count and evaluation time, the plan's pieces are recombined *in
# PromQL* following the merge recipe, and promtool checks that the recombination and the
# original query return the same series with the same values:
#   concat:        (p0) or (p1) or ...
#   aggregate op:  op by (g) (label_replace((p0), "shard__", "0", "", "") or ...)
#   avg:           sum of the "sum" pieces / sum of the "count" pieces (same grouping)
#   topk/bottomk:  topk by (g) (k, (p0) or (p1) ...)      (winners of shards are disjoint)
#   combine_time:  each piece pinned with @ at its evaluation time, then as aggregate.

EQUIV_QUERIES = [
    "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "sum(DCGM_FI_DEV_GPU_UTIL)",
    "sum without (gpu, Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "avg(DCGM_FI_DEV_GPU_UTIL)",
    "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "min by (namespace) (DCGM_FI_DEV_GPU_TEMP)",
    "max(DCGM_FI_DEV_GPU_TEMP)",
    "count(DCGM_FI_DEV_XID_ERRORS > 0)",
    "count by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "group by (namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "topk(3, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    "bottomk by (namespace) (2, DCGM_FI_DEV_GPU_TEMP)",
    "topk by (Hostname) (1, DCGM_FI_DEV_GPU_TEMP)",
    "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))",
    "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))",
    "max(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL))",
    "quantile by (Hostname) (0.5, DCGM_FI_DEV_GPU_TEMP)",
    "stddev by (Hostname, namespace) (DCGM_FI_DEV_GPU_TEMP)",
    'count_values by (Hostname) ("v", DCGM_FI_DEV_XID_ERRORS)',
    "DCGM_FI_DEV_GPU_TEMP > 60",
    "DCGM_FI_DEV_GPU_UTIL / on(Hostname, gpu) DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_XID_ERRORS > 0",
    'label_replace(DCGM_FI_DEV_GPU_TEMP, "node", "$1", "Hostname", "gpu-(.*)")',
    'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu-node-000[0-5]|weird\\\\.host|"}',
    "DCGM_FI_DEV_GPU_TEMP{Hostname=~`gpu-node-00(0|1)\\d`}",
    "max_over_time(sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)[20m:2m])",
    "sum(DCGM_FI_DEV_GPU_UTIL offset 10m)",
    "avg(DCGM_FI_DEV_GPU_UTIL @ start())",
    "histogram_quantile(0.9, rate(DCGM_LAT_bucket[10m]))",
    "DCGM_FI_DEV_XID_ERRORS > 0 or DCGM_FI_DEV_GPU_UTIL > 80",
    "DCGM_FI_DEV_GPU_UTIL unless on(Hostname) DCGM_FI_DEV_XID_ERRORS > 0",
    "DCGM_FI_DEV_GPU_UTIL * on(Hostname, gpu) group_left(namespace) DCGM_FI_DEV_GPU_TEMP",
    "count without (gpu, namespace) (DCGM_FI_DEV_GPU_UTIL)",
    "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL > 50)",
    "clamp_max(-DCGM_FI_DEV_GPU_TEMP + 100, 50)",
    "max_over_time(DCGM_FI_DEV_GPU_TEMP[90m])",
    "max by (namespace) (max_over_time(DCGM_FI_DEV_GPU_TEMP[100m]))",
    "min_over_time(DCGM_FI_DEV_GPU_TEMP[95m] offset 3m)",
    # Disjoint sub-windows: the 1m samples lie exactly on the 30m boundaries.
    "sum_over_time(DCGM_FI_DEV_GPU_TEMP[90m])",
    "count_over_time(DCGM_FI_DEV_GPU_UTIL[100m])",
    "sum by (namespace) (sum_over_time(DCGM_FI_DEV_GPU_UTIL[95m] offset 3m))",
    "sum(count_over_time(DCGM_FI_DEV_XID_ERRORS[61m]))",
    "sum without (gpu) (count_over_time(DCGM_FI_DEV_GPU_TEMP[120m]))",
]
# Known to the planner: 0000..0009. In the data: also 0010, 0011 (new nodes), odd names, and
# series without the label.
DATA_HOSTS = [*HOSTS, "gpu-node-0010", "gpu-node-0011", "weird.host", "weird\\host", None]
NAMESPACES = ["team-a", "team-b", "kube-system"]


def _series_values(rng: random.Random, counter: bool, frac: float = 0.0) -> str:
    """promtool series notation over 150 minutes, with gaps. `frac` makes gauges unique,
    so topk/bottomk never meet ties (whose winner Prometheus leaves to series order)."""
    parts = []
    value = rng.randint(0, 20) if counter else rng.randint(10, 90)
    n = 0
    while n < 150:
        run = rng.randint(5, 40)
        if rng.random() < 0.15:
            parts.append(f"_x{run}")  # a gap: the series is absent for a while
        else:
            inc = rng.randint(0, 50) if counter else rng.randint(-2, 2)
            parts.append(f"{value + frac:.4f}{inc:+d}x{run}")
            value += inc * (run + 1)
        n += run + 1
    return " ".join(parts)


def _input_series() -> list[dict[str, str]]:
    rng = random.Random(42)
    out = []
    k = 0
    for h_i, host in enumerate(DATA_HOSTS):
        for gpu in ("0", "1"):
            ns = NAMESPACES[(h_i + int(gpu)) % 3]
            base = f'gpu="{gpu}", namespace="{ns}"'
            if host is not None:
                base += f", Hostname={quote_string(host)}"
            for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"):
                k += 1
                vals = _series_values(rng, counter=False, frac=k * 0.0001)
                out.append({"series": f"{metric}{{{base}}}", "values": vals})
            xid = " ".join(rng.choice(["0", "0", "0", "43", "79"]) for _ in range(150))
            out.append({"series": f"DCGM_FI_DEV_XID_ERRORS{{{base}}}", "values": xid})
            out.append(
                {
                    "series": f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{base}}}",
                    "values": _series_values(rng, counter=True),
                }
            )
            for le, per in (("0.1", 1), ("1", 3), ("+Inf", 4)):
                out.append(
                    {
                        "series": f'DCGM_LAT_bucket{{{base}, le="{le}"}}',
                        "values": f"0+{per * (h_i + 1)}x150",
                    }
                )
    return out


def _pin_all(node: Expr, at_ms: int) -> Expr:
    def pin(n: Expr) -> Expr:
        if isinstance(n, Selector | Subquery) and n.at is None:
            return replace(n, at=at_ms)
        return n

    return transform(node, pin)


def _recombined(p: Plan) -> str:
    m = p.merge
    texts = []
    for x in p.pieces:
        node = parse(x.query)
        if m.combine_time:
            assert x.time_ms is not None
            node = _pin_all(node, x.time_ms)
        texts.append(to_promql(node))
    if m.kind == "passthrough":
        return texts[0]
    if m.kind == "concat":
        return " or ".join(f"({t})" for t in texts)
    clause = ""
    if m.without:
        clause = f" without ({', '.join((*m.grouping, 'shard__'))})"
    elif m.grouping:
        clause = f" by ({', '.join(m.grouping)})"

    def tagged(idx: list[int]) -> str:
        return " or ".join(f'label_replace(({texts[i]}), "shard__", "{i}", "", "")' for i in idx)

    if m.op in ("topk", "bottomk"):
        assert m.param is not None
        by = f" by ({', '.join(m.grouping)})" if m.grouping else ""
        return f"{m.op}{by} ({m.param:g}, " + " or ".join(f"({t})" for t in texts) + ")"
    if m.op == "avg":
        sums = [i for i, x in enumerate(p.pieces) if x.role == "sum"]
        counts = [i for i, x in enumerate(p.pieces) if x.role == "count"]
        return f"(sum{clause} ({tagged(sums)})) / (sum{clause} ({tagged(counts)}))"
    op = {"count": "sum"}.get(m.op or "", m.op)
    return f"{op}{clause} ({tagged(list(range(len(texts))))})"


def test_sharded_plans_match_prometheus(tmp_path: Path) -> None:
    require("promtool")
    series = _input_series()
    tests = []
    planned = 0
    for query in EQUIV_QUERIES:
        for shards in (2, 3, 4, 8):
            for minutes in (40, 100, 149):
                t_ms = minutes * 60_000
                s = PlannerSettings(
                    shards=shards, split_interval_ms=30 * 60_000, split_instant_windows=True
                )
                p = plan(QueryRequest(query, Span.instant(t_ms)), s, VALUES)
                assert p.sharded or p.merge.combine_time, (query, p.notes)
                planned += 1
                merged = _recombined(p)
                orig = query
                for expr in (
                    f"abs(({orig}) - ({merged})) > 1e-9",
                    f"({orig}) unless ({merged})",
                    f"({merged}) unless ({orig})",
                    f"absent({orig})",  # not vacuous: the query returns something
                ):
                    tests.append({"expr": expr, "eval_time": f"{minutes}m", "exp_samples": []})
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "equivalence_test.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    proc = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert planned == len(EQUIV_QUERIES) * 12
