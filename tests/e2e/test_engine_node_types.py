"""Golden table per node type of promaccel's PromQL engine (issue 27 item 6), across stores.

Each case is one node type the evaluator (proxy/engine/evaluator.py) handles, placed where
promaccel must evaluate it itself: over tests/hybrid.py's `by_metric` fleet (DCGM_* in one
store, node_*/kube_*/up in the other) for joins, and its `by_time` fleet (one store until
T+30m, the other since T) for windows, subqueries and `@`/offset reaching across T. Every
case is asked of a fresh promaccel (cold), asked again (warm: the cached leaves), and both
answers must be the reference Prometheus 2.42's (holding all data), errors by status,
errorType and text. Explain must say the query is evaluated across stores and that its tree
holds the node kinds the case is about (`KIND` of proxy/engine/nodes.py, `number`/`string`
for literals), so the table exercises the engine, not a single store.

The semantics compared are Prometheus's own (promql/engine.go v2.42: `eval` switches on the
parser's node types, VectorBinop/VectorAnd/VectorOr/VectorUnless, aggregation(), rangeEval
with per-step parameters, the subquery's step grid and `@`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import DATA, EMPTY, Expect, error
from loadtests.load import start_prometheus, stop_prometheus
from proxy.engine.nodes import Inner
from tests.e2e.test_hybrid import EVERY_STEP, LONG, NEAR_T, reference
from tests.equivalence import compare_case
from tests.hybrid import (
    HOUR,
    MIN,
    SLICES,
    AmpProcess,
    Scenario,
    SliceServer,
    T,
    build_slice,
    promaccel_config,
    start_promaccel,
)
from tests.servers import require, serving_copy

pytestmark = pytest.mark.prom

TOPOLOGIES = ("by_metric", "by_time")
ADMIN = "engine-node-types-admin"
# by_metric: routing by metric does not depend on time. by_time: an instant at T+2h, whose 3h
# windows start in the first store and end in the second; EVERY_STEP's steps all straddle.
INSTANT = {"by_metric": T + 11, "by_time": T + 2 * HOUR}
RANGE = {"by_metric": LONG, "by_time": EVERY_STEP}

# by_metric building blocks: D on the DCGM store, N on the node store, both labelled by Hostname.
D = "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"
DU = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
N = 'label_replace(node_load1, "Hostname", "$1", "instance", "(.+):9100")'
X = f"({D} + on (Hostname) {N})"  # one-to-one: labelled {Hostname}
# many-to-one: every GPU's series with its node's load (labels of the DCGM series)
G = f"(DCGM_FI_DEV_POWER_USAGE * on (Hostname) group_left {N})"
SD = "scalar(sum(DCGM_FI_DEV_POWER_USAGE))"  # a scalar from the DCGM store
SN = "scalar(max(node_load1))"  # a scalar from the node store
RATIO = "(sum(DCGM_FI_DEV_POWER_USAGE) / sum(node_load1))"
HIST = (f'(label_replace({D}, "le", "+Inf", "", "") or '
        f'label_replace(sum by (Hostname) ({N}) * 100, "le", "1000", "", ""))')
# by_time building blocks: windows of 3h at T+2h straddle T.
W = "DCGM_FI_DEV_GPU_TEMP[3h]"
C = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h]"
S = "sum by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"
AT_AMP = T - HOUR + 7  # only the first store holds it
AT_LOCAL = T + 90 * MIN + 7  # only the second
EDGE = T + 45 * MIN - 16  # a sample time of some series, as is EDGE - 45m


@dataclass(frozen=True)
class Case:
    topology: str
    query: str
    kinds: tuple[str, ...]  # node kinds explain must show in the cross-store tree
    forms: str = "i"  # "i" instant, "r" range, "ir" both
    expect: Expect = DATA
    window: dict[str, str] | None = None  # the range query's, when not RANGE[topology]
    at: int | None = None  # the instant query's time, when not INSTANT[topology]
    # The error names the series it found first, in Go map order when they come out of an
    # aggregation (Prometheus's own text varies from run to run): compared up to the names.
    names_in_map_order: bool = False


def _cases() -> dict[str, Case]:
    m, t = "by_metric", "by_time"
    out: dict[str, Case] = {
        # -- literals in context, unary minus, parentheses -----------------------------------
        "number_rhs": Case(m, f"{X} * 2", ("binary", "number")),
        "number_lhs": Case(m, f"2 - {X}", ("binary", "number")),
        "number_hex_exp": Case(m, f"{X} * 0x10 + 1e-3", ("binary", "number")),
        "number_inf": Case(m, f"{X} < Inf", ("binary", "number")),
        "number_nan": Case(m, f"{X} + NaN", ("binary", "number")),
        "string_label_replace": Case(m, f'label_replace({X}, "h", "$1", "Hostname", "(.*)-.*")',
                                     ("function", "string")),
        "string_label_join": Case(m, f'label_join({X}, "j", "/", "Hostname", "Hostname")', ("function", "string")),
        "unary_minus_vector": Case(m, f"-{X}", ("binary",), "ir"),
        "unary_minus_scalar": Case(m, f"{X} * -{SN}", ("binary",)),
        "unary_minus_nested": Case(m, f"-(-{RATIO})", ("binary",)),
        "parens_vector": Case(m, f"(({X}))", ("binary",)),
        "parens_precedence": Case(m, f"({D} + on (Hostname) {N}) * 2", ("binary", "number")),
        # -- scalar operands from either store, on either side ---------------------------------
        "scalar_vector": Case(m, f"{SN} * {D}", ("binary",), "ir"),
        "vector_scalar": Case(m, f"{D} / {SN}", ("binary",), "ir"),
        "scalar_scalar": Case(m, f"{SD} - {SN}", ("binary",), "ir"),
        "scalar_compare_bool": Case(m, f"{SD} > bool {SN}", ("binary",), "ir"),
        "scalar_vector_filter": Case(m, f"{SN} < {D}", ("binary",)),
        "vector_scalar_bool": Case(m, f"{D} >= bool {SN}", ("binary",)),
        # -- sets -------------------------------------------------------------------------------
        "and_on": Case(m, f"{G} and on (Hostname) ({N} > 0.5)", ("binary",), "ir"),
        "or": Case(m, f"{D} or {N}", ("binary",), "ir"),
        "or_on": Case(m, f"({D} > 1000) or on (Hostname) {N}", ("binary",)),
        "unless_on": Case(m, f"{G} unless on (Hostname) ({N} > 6)", ("binary",), "ir"),
        "unless_ignoring": Case(m, f"{D} unless ignoring (instance, job) ({N} > 6)", ("binary",)),
        # -- matching -----------------------------------------------------------------------------
        "ignoring_one_to_one": Case(m, f"{DU} / ignoring (instance, job) {N}", ("binary",)),
        "group_left_include": Case(m, f"DCGM_FI_DEV_GPU_UTIL * on (Hostname) group_left (instance, job) {N}",
                                   ("binary",), "ir"),
        "group_right_include": Case(m, f"{N} / on (Hostname) group_right (instance) DCGM_FI_DEV_GPU_UTIL",
                                    ("binary",), "ir"),
        "group_left_compare": Case(m, f"DCGM_FI_DEV_GPU_TEMP > on (Hostname) group_left {N} * 10", ("binary",)),
        "group_left_compare_bool": Case(m, f"DCGM_FI_DEV_GPU_TEMP > bool on (Hostname) group_left (instance) {N}",
                                        ("binary",)),
        "many_to_one_unmarked": Case(m, f"DCGM_FI_DEV_GPU_UTIL * on (Hostname) {N}", ("binary",), "ir",
                                     error("execution", "many-to-one matching must be explicit")),
        "group_left_wrong_side": Case(m, f"{N} * on (Hostname) group_left DCGM_FI_DEV_GPU_UTIL", ("binary",), "i",
                                      error("execution", "found duplicate series for the match group")),
        "group_right_wrong_side": Case(m, f"DCGM_FI_DEV_GPU_UTIL * on (Hostname) group_right {N}", ("binary",), "i",
                                       error("execution", "found duplicate series for the match group")),
        "group_left_computed_many_side": Case(m, f"{G} * 0 + on (Hostname) group_left {N}", ("binary",)),
        # -- range functions over a selector, straddling T --------------------------------------
        "window_rate": Case(t, f"rate({C})", ("window",), "ir"),
        "window_max": Case(t, f"max_over_time({W})", ("window",), "ir"),
        "window_quantile_expr": Case(t, f"quantile_over_time(1 - 0.1, {W})", ("window",), "ir"),
        "window_param_other_time": Case(t, f"quantile_over_time(scalar(max(DCGM_FI_DEV_GPU_UTIL @ {AT_AMP})) / 100, "
                                           f"{W})", ("window",), "ir"),
        "window_offset": Case(t, "increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h] offset 30m)", ("window",), "ir"),
        "window_at_start": Case(t, f"avg_over_time({W} @ start())", ("window",), "ir"),
        "window_at_end": Case(t, f"max_over_time({W} @ end())", ("window",), "ir"),
        "window_at_literal": Case(t, f"changes({W} @ {AT_LOCAL})", ("window",), "ir"),
        "window_at_offset": Case(t, f"deriv({W} @ {AT_LOCAL} offset 10m)", ("window",), "ir"),
        "window_under_agg": Case(t, f"sum by (Hostname) (rate({C}))", ("window", "aggregate"), "ir"),
        # -- range functions over a subquery ------------------------------------------------------
        "subquery_step": Case(t, f"max_over_time({S}[3h:5m])", ("subquery",), "ir"),
        "subquery_no_step": Case(t, f"min_over_time({S}[3h:])", ("subquery",), "ir"),
        "subquery_offset": Case(t, f"avg_over_time({S}[3h:7m] offset 11m)", ("subquery",), "ir"),
        "subquery_at_start": Case(t, f"max_over_time({S}[3h:5m] @ start())", ("subquery",), "ir"),
        "subquery_at_end": Case(t, f"last_over_time({S}[3h:5m] @ end())", ("subquery",), "ir"),
        "subquery_at_literal": Case(t, f"count_over_time({S}[3h:10m] @ {AT_LOCAL})", ("subquery",), "ir"),
        "subquery_of_window": Case(t, f"max_over_time(rate({C})[1h:10m])", ("subquery",), "ir"),
        "subquery_join": Case(m, f"max_over_time({RATIO}[30m:5m])", ("subquery", "binary"), "ir"),
        "subquery_join_at_end": Case(m, f"min_over_time({X}[30m:5m] @ end())", ("subquery", "binary"), "ir"),
        "subquery_join_offset": Case(m, f"avg_over_time({X}[30m:] offset 10m)", ("subquery", "binary"), "ir"),
        "window_predict_linear_expr": Case(t, f"predict_linear({W}, 4 * 3600)", ("window",), "ir"),
        "window_holt_winters_expr": Case(t, f"holt_winters({W}, 0.1 + 0.2, 0.5)", ("window",), "ir"),
        "window_negative_offset": Case(t, "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h] offset -30m))",
                                       ("window",), "i"),
        "subquery_inner_at": Case(t, f"max_over_time(sum(DCGM_FI_DEV_GPU_TEMP @ {AT_AMP})[3h:5m]) - sum({W.split('[')[0]})",
                                  ("binary",), "ir"),
        "subquery_inner_offset": Case(t, "max_over_time(sum by (Hostname) (DCGM_FI_DEV_GPU_TEMP offset 1h)[2h:5m])",
                                      ("subquery",), "ir"),
        "subquery_of_subquery": Case(t, f"max_over_time(avg_over_time({S}[20m:5m])[2h:10m])", ("subquery",), "ir"),
        "subquery_join_at_literal": Case(m, f"max_over_time({RATIO}[30m:5m] @ {T + 7})", ("subquery", "binary"),
                                         "ir"),
        "window_absent_over_time": Case(t, 'absent_over_time(DCGM_FI_DEV_GPU_TEMP{gpu="9"}[3h])', ("absent",),
                                        "ir"),
        "window_absent_over_time_present": Case(t, f"absent_over_time({W})", ("absent",), "i", EMPTY),
        # createLabelsForAbsentFunction walks the matchers in order: a regex before the equality
        # one keeps the label; an equality one after a != drops it (proxy/engine/local_ops.py)
        "window_absent_matcher_order": Case(t, 'absent_over_time(DCGM_FI_DEV_GPU_TEMP{gpu=~"9.*", gpu="9", '
                                               'Hostname="h", Hostname!="x"}[3h])', ("absent",), "ir"),
        # 2.42's windows are closed on both ends: at EDGE, samples of some series sit on the 45m
        # window's first second (held by the first store only) or its last (the second only)
        # -- their counts differ a second either side
        "window_closed_edges": Case(t, "count_over_time(DCGM_FI_DEV_GPU_TEMP[45m])", ("window",), "i",
                                    at=EDGE),
        "window_closed_edges_rate": Case(t, "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[45m])", ("window",), "i",
                                         at=EDGE),
        "subquery_closed_edges": Case(t, f"count_over_time({S}[45m:1m])", ("subquery",), "i", at=EDGE),
        "segments_subquery_offset": Case(t, f"max_over_time({S}[1h:5m] offset 10m)", ("segments", "subquery"), "r",
                                         window=NEAR_T),
        "window_at_end_near_t": Case(t, "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h] @ end())", ("window",), "r",
                                     window=NEAR_T),
        # -- a range query's steps in three stretches (first store, both, second store): only
        # the middle one is evaluated here, the others routed whole
        "segments_window": Case(t, f"sum by (Hostname) (rate({C.replace('3h', '1h')}))", ("segments", "window"),
                                "r", window=NEAR_T),
        "segments_subquery": Case(t, f"max_over_time({S}[1h:5m])", ("segments", "subquery"), "r", window=NEAR_T),
        "segments_join": Case(t, f"sum by (Hostname) (max_over_time({W.replace('3h', '1h')})) - on (Hostname) {S}",
                              ("segments", "binary"), "r", window=NEAR_T),
        # -- one selector listing metrics of both stores: each store's series, joined ----------
        "union_bare": Case(m, '{__name__=~"DCGM_FI_DEV_POWER_USAGE|node_load1"}', ("union",), "ir"),
        "union_aggregated": Case(m, 'count by (__name__) ({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"})',
                                 ("union",), "ir"),
        "union_window": Case(m, 'max_over_time({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"}[10m])', ("union",)),
        "union_at_offset": Case(m, 'sum by (__name__) ({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"} @ end() offset 1h)',
                                ("union",), "ir"),
        "subquery_time_in_inner": Case(t, "max_over_time(max by (Hostname) (time() - timestamp(DCGM_FI_DEV_GPU_TEMP))"
                                          "[3h:5m])", ("subquery",), "ir"),
        "subquery_absent_inner": Case(t, 'count_over_time(absent(DCGM_FI_DEV_GPU_TEMP{gpu="9"})[3h:10m])',
                                      ("subquery",), "ir"),
        "subquery_absent_matcher_order": Case(t, 'count_over_time(absent(DCGM_FI_DEV_GPU_TEMP{gpu!~"1", gpu="9"})'
                                                 '[3h:10m])', ("subquery",), "ir"),
        "window_present_last": Case(t, f"present_over_time({W}) * last_over_time({W})", ("window",), "ir"),
        "window_resets_irate": Case(t, f"resets({C}) + irate({C})", ("window",)),
        # -- a bare range selector / subquery at the top of an instant query --------------------
        "bare_range_selector": Case(t, W, ("window",)),
        "bare_range_selector_offset": Case(t, f"{W} offset 15m", ("window",)),
        "bare_range_selector_at": Case(t, f"{W} @ {AT_LOCAL}", ("window",)),
        "bare_range_selector_at_end": Case(t, f"{W} @ end()", ("window",)),
        "bare_subquery_at_start": Case(t, f"{S}[3h:10m] @ start()", ("subquery",)),
        "bare_subquery": Case(t, f"{S}[3h:10m]", ("subquery",)),
        "bare_subquery_at_offset": Case(t, f"{S}[3h:10m] @ {AT_LOCAL} offset 5m", ("subquery",)),
        "bare_subquery_join": Case(m, f"{X}[30m:5m]", ("subquery", "binary")),
        "bare_subquery_join_at_offset": Case(m, f"{RATIO}[30m:5m] @ end() offset 10m", ("subquery", "binary")),
        # -- @ and offset on instant selectors in a cross-store tree ---------------------------
        "selector_at_vs_now": Case(t, f"sum(DCGM_FI_DEV_GPU_TEMP @ {AT_AMP}) - sum(DCGM_FI_DEV_GPU_TEMP)",
                                   ("binary",), "ir"),
        "selector_offset_vs_now": Case(t, "sum by (Hostname) (DCGM_FI_DEV_GPU_TEMP offset 2h) - "
                                          "sum by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", ("binary",), "ir"),
        "selector_at_start_join": Case(m, f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE @ start()) / on (Hostname) {N}",
                                       ("binary",), "ir"),
        "selector_at_end_offset_join": Case(m, f"{D} - on (Hostname) label_replace(node_load1 @ end() offset 5m, "
                                               '"Hostname", "$1", "instance", "(.+):9100")', ("binary",), "ir"),
        "selector_at_end_vs_literal": Case(t, f"sum(DCGM_FI_DEV_GPU_TEMP @ end()) - sum(DCGM_FI_DEV_GPU_TEMP @ {AT_AMP})",
                                           ("binary",), "ir"),
        "window_offset_join": Case(m, "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] offset 1h)) "
                                      f"/ on (Hostname) {N}", ("binary",), "ir"),
        "window_at_start_join": Case(m, "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] @ start())) "
                                        f"/ on (Hostname) {N}", ("binary",), "ir"),
        # `@` a time both stores hold (T..T+30m): the subtree is asked at that instant and merged
        # from both, then restamped at every step (PinnedNode)
        "selector_at_overlap": Case(t, f"sum(DCGM_FI_DEV_GPU_TEMP @ {T + 15 * MIN + 7}) - sum(max_over_time({W}))",
                                    ("pinned", "binary", "window"), "ir"),
        "timestamp_at_start": Case(t, "max(timestamp(DCGM_FI_DEV_GPU_TEMP @ start())) - "
                                         f"min(timestamp(DCGM_FI_DEV_GPU_TEMP @ {AT_AMP}))",
                                   ("binary",), "ir"),
        # -- instant function calls ---------------------------------------------------------------
        # the "many" side's series equal once __name__ is dropped (VectorBinop's signature check)
        # containers come and go: several per node at some steps only, and one is enough
        "group_left_duplicates_at_some_steps": Case(
            m, f"{N} * on (Hostname) group_left max by (Hostname, container) (DCGM_FI_DEV_GPU_UTIL)", ("binary",),
            "ir", error("execution", "found duplicate series for the match group"), names_in_map_order=True),
        "group_left_many_side_collides": Case(
            m, f'{{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_TEMP"}} * on (Hostname) group_left {N}', ("binary",),
            "i", error("execution", "multiple matches for labels: grouping labels must ensure unique matches")),
        "duplicate_labelset_in_function": Case(
            m, f'abs({{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_TEMP"}} and on (Hostname) {N})',
            ("function",), "i", error("execution", "vector cannot contain metrics with the same labelset")),
        "arith_mod_negative": Case(m, f"{D} % -{SN}", ("binary",)),
        "arith_atan2_scalars": Case(m, f"{SD} atan2 {SN}", ("binary",), "ir"),
        "on_empty_group_left": Case(m, f"{D} / on () group_left sum(node_load1)", ("binary",), "ir"),
        "and_on_empty": Case(m, f"{D} and on () (sum(node_load1) > 0)", ("binary",)),
        "unless_empty_rhs": Case(m, f"{D} unless on (Hostname) ({N} > 1e9)", ("binary",)),
        "or_lhs_wins": Case(m, f"{X} or on (Hostname) ({N} * 0)", ("binary",), "ir"),
        "unary_minus_pow_precedence": Case(m, f"-{X} ^ 0.5", ("binary",)),
        "compare_division_by_zero": Case(m, f"{X} / 0 > bool 1", ("binary",)),
        "nested_aggregations": Case(m, f"max(sum by (Hostname) ({G}))", ("aggregate",), "ir"),
        # buckets from both stores: le="+Inf" from the DCGM store, le="1000" from the node one
        "fn_histogram_quantile": Case(m, f"histogram_quantile(0.5, {HIST})", ("function",), "ir"),
        "fn_histogram_quantile_param_other_store": Case(m, f"histogram_quantile({SN} / 10, {HIST})", ("function",)),
        "fn_clamp_max_per_step": Case(m, f"clamp_max({D}, {SN} * 300)", ("function",), "r"),
        "fn_day_of_month_scalar_vector": Case(m, f"day_of_month(vector({SD} * 0 + {SN} * 0 + {T}))", ("function",)),
        "fn_absent_of_union": Case(m, 'absent({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"})', ("absent",), "i",
                                   EMPTY),
        "fn_label_replace_of_union": Case(m, 'label_replace({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"}, "n", "$1", '
                                             '"__name__", "(.*)_.*")', ("union",)),
        "mod_by_zero": Case(m, f"{D} % on (Hostname) ({N} * 0)", ("binary",)),
        "nan_never_equal": Case(m, f"{X} / 0 * 0 == on (Hostname) ({N} / 0 * 0)", ("binary",), "i", EMPTY),
        "nan_bool_compare": Case(m, f"{X} / 0 * 0 != bool on (Hostname) ({N} / 0 * 0)", ("binary",)),
        "agg_by_absent_label": Case(m, f"sum by (nonexistent) ({G})", ("aggregate",)),
        "agg_without_match_label": Case(m, f"max without (Hostname) ({X})", ("aggregate",)),
        "fn_abs": Case(m, f"abs(-{X})", ("function",), "ir"),
        "fn_sqrt_ln": Case(m, f"ln(sqrt({X}))", ("function",)),
        "fn_round_param_other_store": Case(m, f"round({D}, {SN})", ("function",), "ir"),
        "fn_clamp_expr": Case(m, f"clamp({G}, {SN} * 100, 2 * 1500)", ("function",), "ir"),
        "fn_clamp_min": Case(m, f"clamp_min({X}, 300)", ("function",)),
        "fn_scalar": Case(m, f"scalar({RATIO}) + 1", ("absent",), "ir"),
        "fn_vector": Case(m, f"vector({SD} / {SN})", ("function",), "ir"),
        "fn_sort_desc": Case(m, f"sort_desc({X})", ("function",)),
        "fn_sort": Case(m, f"sort({G})", ("function",)),
        "fn_scalar_of_many": Case(m, f"{D} + scalar({X})", ("absent",), "ir"),
        "fn_label_replace_collides": Case(m, f'label_replace({X}, "Hostname", "x", "", "")', ("function",), "i",
                                          error("execution", "vector cannot contain metrics with the same labelset")),
        "fn_timestamp": Case(m, f"timestamp({X})", ("function",)),
        "fn_time_in_context": Case(m, f"{X} + time()", ("binary",)),
        "fn_hour_of_vector": Case(m, f"hour(timestamp({G}))", ("function",)),
        "fn_absent_of_join": Case(m, f"absent({X} > 1e9)", ("absent",), "ir"),
        "fn_absent_present": Case(m, f"absent({X})", ("absent",), "i", EMPTY),
    }
    # every arithmetic and comparison operator between the stores
    for name, op in [("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"), ("mod", "%"), ("pow", "^"),
                     ("atan2", "atan2")]:
        out[f"arith_{name}"] = Case(m, f"{D} {op} on (Hostname) {N}", ("binary",), "ir" if name in ("div", "pow")
                                    else "i")
        out[f"arith_{name}_scalar"] = Case(m, f"{N} {op} {SD}", ("binary",))
    for name, op in [("eq", "=="), ("ne", "!="), ("gt", ">"), ("lt", "<"), ("ge", ">="), ("le", "<=")]:
        # GPU utilisation summed per node (40..380) against 28 x its load (about 170); for
        # equality, GPUs per node (4 or 5) against 4
        lhs, rhs = ("count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", f"({N} * 0 + 4)") if name in ("eq", "ne") \
            else (DU, f"({N} * 28)")
        out[f"cmp_{name}"] = Case(m, f"{lhs} {op} on (Hostname) {rhs}", ("binary",))
        out[f"cmp_{name}_bool"] = Case(m, f"{lhs} {op} bool on (Hostname) {rhs}", ("binary",),
                                       "ir" if name == "gt" else "i")
    # every aggregation, without grouping, by and without
    for op, param in [("sum", ""), ("avg", ""), ("min", ""), ("max", ""), ("count", ""), ("group", ""),
                      ("stddev", ""), ("stdvar", ""), ("topk", "3, "), ("bottomk", "2, "), ("quantile", "0.9, "),
                      ("count_values", '"v", ')]:
        inner = f"round({G})" if op == "count_values" else G
        out[f"agg_{op}"] = Case(m, f"{op}({param}{inner})", ("aggregate",), "ir")
        out[f"agg_{op}_by"] = Case(m, f"{op} by (Hostname) ({param}{inner})", ("aggregate",))
        out[f"agg_{op}_without"] = Case(m, f"{op} without (gpu, UUID) ({param}{inner})", ("aggregate",))
    # aggregation parameters that are expressions: literal arithmetic, parentheses, a scalar
    # from the other store (per step in a range query, as rangeEval passes it)
    out |= {
        "agg_topk_param_arith": Case(m, f"topk(2 * 3, {G})", ("aggregate",)),
        "agg_bottomk_param_paren": Case(m, f"bottomk((2), {X})", ("aggregate",)),
        "agg_topk_param_other_store": Case(m, f"topk by (Hostname) (scalar(count(node_load1 > 1)), {G})",
                                           ("aggregate",), "ir"),
        "agg_quantile_param_fraction": Case(m, f"quantile(99/100, {X})", ("aggregate",)),
        "agg_quantile_param_other_store": Case(m, f"quantile({SN} / 10, {D})", ("aggregate",), "ir"),
        "agg_quantile_param_out_of_range": Case(m, f"quantile(1 + 1, {X})", ("aggregate",)),
        "agg_count_values_of_join": Case(m, f'count_values without (Hostname) ("load", round({X}, 50))',
                                         ("aggregate",), "ir"),
        "agg_over_windows_topk": Case(t, f"topk(5, max_over_time({W}))", ("aggregate", "window"), "ir"),
        "agg_over_windows_quantile": Case(t, f"quantile by (Hostname) (0.5, rate({C}))", ("aggregate", "window"), "ir"),
        "agg_over_windows_count_values": Case(t, f'count_values("changes", changes({W}))', ("aggregate", "window"),
                                              "ir"),
        "agg_stddev_of_inf": Case(m, f"stddev by (Hostname) ({G} * Inf)", ("aggregate",)),
        "agg_avg_of_division_by_zero": Case(m, f"avg({X} / 0)", ("aggregate",)),
        "agg_topk_with_nan": Case(m, f"topk(20, {G} ^ 0.5 - (DCGM_FI_DEV_GPU_UTIL > 90) * 0 / 0)", ("aggregate",)),
        "agg_count_values_overwrites_label": Case(m, f'count_values("Hostname", round({X}, 100))', ("aggregate",)),
        "agg_group_without_name": Case(m, f"group without (gpu, UUID, device, pci_bus_id) ({G})", ("aggregate",)),
        # parameters at their edges, as aggregation() reads them: k truncated to an int64,
        # k < 1 selects nothing, a quantile outside [0, 1] is -Inf/+Inf, NaN params
        "agg_topk_fraction": Case(m, f"topk(1.7, {X})", ("aggregate",)),
        "agg_topk_zero": Case(m, f"topk(0, {X})", ("aggregate",), "i", EMPTY),
        "agg_bottomk_negative": Case(m, f"bottomk(-{SN}, {X})", ("aggregate",), "i", EMPTY),
        "agg_topk_nan": Case(m, f"topk(NaN, {X})", ("aggregate",), "i",
                             error("execution", "Scalar value NaN overflows int64")),
        "agg_quantile_negative": Case(m, f"quantile(-0.5, {X})", ("aggregate",)),
        "agg_quantile_nan": Case(m, f"quantile(NaN, {X})", ("aggregate",)),
        # avg's running mean once the sum overflows (engine.go aggregation, "avg": mean += v/n - mean/n)
        "agg_avg_overflow": Case(m, f"avg by (Hostname) ({G} * 1e306)", ("aggregate",)),
        "agg_sum_overflow": Case(m, f"sum({G} * 1e306)", ("aggregate",)),
        # the value as Go formats it (strconv.FormatFloat 'f', -1): no exponent, "-0", "+Inf"
        "agg_count_values_large": Case(m, f'count_values("v", {X} * 1e6)', ("aggregate",)),
        "agg_count_values_negative_zero": Case(m, f'count_values("v", {X} * -0)', ("aggregate",)),
        "agg_count_values_inf": Case(m, f'count_values("v", {X} / 0)', ("aggregate",)),
        "agg_count_values_nan": Case(m, f'count_values("v", {X} * NaN)', ("aggregate",)),
        "agg_bottomk_range_by": Case(m, f"bottomk by (Hostname) (1, {G})", ("aggregate",), "r"),
        "agg_by_name": Case(m, f"sum by (__name__) ({G})", ("aggregate",)),
        "agg_topk_over_int64": Case(m, f"topk(9223372036854775807, {X})", ("aggregate",), "i",
                                    error("execution", "overflows int64")),
    }
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def stores(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scenario]]:
    """by_metric and by_time only (tests/hybrid.py's slices, AMP endpoint and config), each
    under a promaccel of this module's own, so that a case's first ask is cold."""
    require("promtool")
    require("prometheus")
    work = tmp_path_factory.mktemp("engine-node-types")
    procs: list[Any] = []
    amps: list[AmpProcess] = []
    proxies: list[Any] = []
    try:
        out: dict[str, Scenario] = {}
        for name in TOPOLOGIES:
            served: dict[str, SliceServer] = {}
            for spec in (s for s in SLICES if s.scenario == name):
                built, manifest = build_slice(spec)
                data = serving_copy(built, work / f"{name}-{spec.backend}")
                proc = start_prometheus(str(data), log_path=str(work / f"{name}-{spec.backend}.log"))
                procs.append(proc)
                served[spec.backend] = SliceServer(spec, proc.url, data, proc, manifest)  # type: ignore[attr-defined]
            amp = AmpProcess.start(served["amp"].url, work, "--seed", "1")
            amps.append(amp)
            # an admin token: each case starts from an empty cache (a new generation)
            cfg = {**promaccel_config(name, served["local"].url, amp.workspace), "cache": {"admin_token": ADMIN}}
            proxy = start_promaccel(f"engine-{name}", cfg, work)
            proxies.append(proxy)
            out[name] = Scenario(name, served["local"], served["amp"], amp, proxy, cfg)
        yield out
    finally:
        for p in proxies:
            p.stop()
        for a in amps:
            a.stop()
        for proc in procs:
            stop_prometheus(proc)


def tree_kinds(tree: dict[str, Any]) -> set[str]:
    """The node kinds of explain's cross_store tree (literals as `number` / `string`)."""
    if "evaluate" in tree:
        return {tree["kind"]}.union(*(tree_kinds(a) for a in tree["args"]))
    return {k for k in ("number", "string") if k in tree}


def _forms(case: Case) -> list[tuple[str, dict[str, str]]]:
    forms = []
    if "i" in case.forms:
        forms.append(("/api/v1/query", {"query": case.query, "time": str(case.at or INSTANT[case.topology])}))
    if "r" in case.forms:
        forms.append(("/api/v1/query_range", {"query": case.query, **(case.window or RANGE[case.topology])}))
    return forms


def test_the_table_covers_every_node_type() -> None:
    """Every operator node the evaluator has (proxy/engine/nodes.py `Inner` subclasses) and both
    literal kinds are what some case asserts explain shows: a node type added to the engine
    fails here until the table has a case for it."""
    kinds = {cls.KIND for cls in Inner.__subclasses__()} | {"number", "string"}
    assert len(kinds) >= 11, kinds
    covered = {k for case in CASES.values() for k in case.kinds}
    assert kinds <= covered, sorted(kinds - covered)


def _up_to_names(answer: dict[str, Any], expect: Expect) -> dict[str, Any]:
    """An error answer whose text starts with the expected one, cut there (the series it
    names follow); any other answer as it is."""
    text = str(answer.get("error", ""))
    if answer.get("status") == "error" and expect.error_text and text.startswith(expect.error_text):
        return {**answer, "error": expect.error_text}
    return answer


@pytest.mark.parametrize("name", list(CASES))
def test_engine_node_type_answers_as_prometheus(prom: Any, stores: dict[str, Scenario], name: str) -> None:
    case = CASES[name]
    proxy = stores[case.topology].proxy.url
    with httpx.Client(timeout=120) as client:
        for path, form in _forms(case):
            status, direct = reference(prom.url, path, form)
            # Cold: nothing cached, not even the leaves an earlier case shares with this one.
            bumped = client.post(proxy + "/api/v1/admin/cache/generation", headers={"Authorization": f"Bearer {ADMIN}"})
            assert bumped.status_code == 200, bumped.text[:300]
            for ask, cached in (("cold", ("MISS",)), ("warm", ("HIT",))):
                r = client.post(proxy + path, data=form)
                proxied = orjson.loads(r.content)
                reference_answer = direct
                if case.names_in_map_order:
                    reference_answer, proxied = _up_to_names(direct, case.expect), _up_to_names(proxied, case.expect)
                problems = compare_case("engine_node_types", name, case.query, path, status, reference_answer,
                                        r.status_code, proxied, expect=case.expect)
                assert problems == [], (name, path, ask, problems[:3], r.text[:300])
                if r.status_code == 200:  # an error is not cached
                    assert r.headers.get("X-Cache") in cached, (name, path, ask, dict(r.headers))
            explained = client.post(proxy + "/api/v1/explain", data=form)
            assert explained.status_code == 200, explained.text[:300]
            data = explained.json()["data"]
            # promaccel evaluated it: no single store holds what it reads
            assert data["route"]["kind"] == "cross_store", (name, path, data["route"])
            kinds = tree_kinds(data["cross_store"])
            assert set(case.kinds) <= kinds, (name, path, sorted(kinds))
