"""proxy.engine.functions / proxy.engine.aggregate against a real Prometheus 2.42.

For every case, the arguments of the outermost call or aggregation are asked of Prometheus on
their own (a range query over an unaligned start with an odd step, and instant queries at an
aligned and an unaligned time), decoded with proxy.codec, evaluated locally, encoded, and
compared with Prometheus's answer to the whole expression:
- values as Prometheus writes them, string for string (flag "ulp": within 1e-15 relative,
  for exp, sinh, cosh, tanh, asinh, acosh, atanh, which use the C library's exp/log1p where Go
  has its own (amd64 assembly Exp, pure-Go Log1p): about 1 value in 6 differs in the last bit;
  flag "sum_order": within 1e-12 relative, for sums/means over a *computed* range input, which
  Prometheus feeds in Go map order);
- series in the same order (range answers sorted; instant vectors in Prometheus's evaluation
  order, except "unordered": Prometheus emits histogram_quantile's groups in Go map order);
- "map_order": topk/bottomk of a computed range input, which Prometheus feeds in Go map order:
  which of equal values (or NaNs) win differs from run to run, so the range answer is compared
  as the values selected at each step; instant answers exactly;
- errors by text.
The table must name every function of INSTANT_FUNCTIONS and every operator of AGGREGATIONS
(`test_every_name_is_covered`).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json
from proxy.engine.aggregate import AGGREGATIONS, evaluate_aggregation
from proxy.engine.errors import EvalError
from proxy.engine.functions import INSTANT_FUNCTIONS, evaluate_call
from proxy.result import QueryResult
from shardplanner.ast import Agg, Call, Number, String, unparen
from shardplanner.promql import parse
from shardplanner.serialize import to_promql

pytestmark = pytest.mark.prom

U = "DCGM_FI_DEV_GPU_UTIL"
T = "DCGM_FI_DEV_GPU_TEMP"
P = "DCGM_FI_DEV_POWER_USAGE"
FBU = "DCGM_FI_DEV_FB_USED"
XID = "DCGM_FI_DEV_XID_ERRORS"
NAN = f"({XID} / {XID})"  # NaN on every GPU
TWO_NAMES = '{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}'
# A cross-store-looking join: DCGM per GPU against node exporter per host.
JOIN = f'{U} * on(Hostname) group_left label_replace(node_load1, "Hostname", "$1", "instance", "(.*):.*")'


def _le(expr: str, le: str) -> str:
    return f'label_replace({expr}, "le", "{le}", "", "")'


# A classic cumulative histogram per host: GPUs at or under a temperature.
HIST = " or ".join([*(_le(f"sum by (Hostname) ({T} <= bool {b})", str(b)) for b in (30, 40, 50, 60, 70)),
                    _le(f"count by (Hostname) ({T})", "+Inf")])
# Buckets whose counts go down (ensureMonotonic), an unparsable le, a duplicate bound.
HIST_ODD = " or ".join([_le(f"sum by (Hostname) ({U})", "10"), _le(f"max by (Hostname) ({U})", "20"),
                        _le(f"min by (Hostname) ({U})", "abc"), _le(f"sum by (Hostname) ({T})", "+Inf"),
                        _le(f"count by (Hostname) ({U})", "1e1")])
HIST_NO_INF = " or ".join([_le(f"sum by (Hostname) ({T} <= bool {b})", str(b)) for b in (30, 60)])
HIST_NEG = " or ".join([_le(f"sum by (Hostname) ({T} <= bool 40)", "-5"), _le(f"sum by (Hostname) ({T} <= bool 60)", "0"),
                        _le(f"count by (Hostname) ({T})", "+Inf")])
# Two metrics whose series differ only by name: two groups, one output label set.
HIST_TWO_NAMES = " or ".join(_le(TWO_NAMES, le) for le in ("1e9", "+Inf"))

# name: (expression, flags). Flags: "ulp", "sum_order", "unordered", "map_order" (see the
# module doc), "error" (Prometheus must refuse it at least once), "maybe_error" (it may),
# "maybe_empty" (an empty answer is fine).
CASES: dict[str, tuple[str, str]] = {
    # --- math -------------------------------------------------------------------------------
    "abs": (f"abs({T} - 50)", ""),
    "abs_join": (f"abs({JOIN})", ""),
    "ceil": (f"ceil({P} / 7)", ""),
    "floor": (f"floor({P} / 7)", ""),
    "exp": (f"exp({T} / 10)", "ulp"),
    "exp_overflow": (f"exp({P} * 10)", "ulp"),
    "sqrt": (f"sqrt({P} - 200)", ""),
    "ln": (f"ln({P} - 150)", ""),
    "log2": (f"log2({FBU})", ""),
    "log10": (f"log10({FBU} - 1000)", ""),
    "sgn": (f"sgn({T} - 45)", ""),
    "sgn_nan": (f"sgn({NAN})", ""),
    "deg": (f"deg({P})", ""),
    "rad": (f"rad({T})", ""),
    "sin": (f"sin({P})", ""),
    "cos": (f"cos({P})", ""),
    "tan": (f"tan({P})", ""),
    "asin": (f"asin({U} / 100)", ""),
    "acos": (f"acos({U} / 50 - 1)", ""),
    "atan": (f"atan({T} - 50)", ""),
    "sinh": (f"sinh({T} / 10)", "ulp"),
    "cosh": (f"cosh({T} / 10 - 4)", "ulp"),
    "tanh": (f"tanh({T} / 30 - 1)", "ulp"),
    "asinh": (f"asinh({T} - 50)", "ulp"),
    "acosh": (f"acosh({T} / 20)", "ulp"),
    "atanh": (f"atanh({U} / 100)", "ulp"),
    "pi": ("pi()", ""),
    "round": (f"round({P})", ""),
    "round_to": (f"round({P}, 2.5)", ""),
    "round_to_scalar_fn": (f"round({P}, scalar(min({T})) / 10)", ""),
    "round_to_zero": (f"round({P}, 0)", ""),
    "clamp": (f"clamp({T}, 40, 60)", ""),
    "clamp_inverted_empty": (f"clamp({T}, 60, 40)", "maybe_empty"),
    "clamp_nan": (f"clamp({NAN}, 0, 1)", ""),
    "clamp_inf_bounds": (f"clamp({NAN}, -Inf, +Inf)", ""),
    "clamp_min": (f"clamp_min({P}, 300)", ""),
    "clamp_max": (f"clamp_max({P}, 300)", ""),
    "clamp_max_neg_inf": (f"clamp_max({NAN}, -Inf)", ""),
    "err_two_names_abs": (f"abs({TWO_NAMES})", "error"),
    # --- time ---------------------------------------------------------------------------------
    "time": ("time()", ""),
    "timestamp": (f"timestamp({T} * 2)", ""),
    "year": ("year()", ""),
    "month": ("month()", ""),
    "day_of_month": ("day_of_month()", ""),
    "day_of_week": ("day_of_week()", ""),
    "day_of_year": ("day_of_year()", ""),
    "days_in_month": ("days_in_month()", ""),
    "hour": ("hour()", ""),
    "minute": ("minute()", ""),
    "year_of": (f"year({FBU} * 10000)", ""),
    "month_of": (f"month({FBU} * 1000)", ""),
    "day_of_month_of": (f"day_of_month({FBU} * 1000)", ""),
    "day_of_week_of": (f"day_of_week({FBU} * 1000)", ""),
    "day_of_year_of": (f"day_of_year({FBU} * 997)", ""),
    "days_in_month_of": (f"days_in_month({FBU} * 1000)", ""),
    "hour_of": (f"hour({FBU} * 17)", ""),
    "minute_of": (f"minute({P} * 13)", ""),
    "year_of_nan": (f"year({NAN})", ""),
    "days_in_month_of_nan": (f"days_in_month({NAN})", ""),
    "hour_of_negative": (f"hour(-{FBU} * 100000)", ""),
    # --- series and scalars -------------------------------------------------------------------
    "vector": ("vector(3.5)", ""),
    "vector_of_scalar_fn": (f"vector(scalar(max({T})))", ""),
    "scalar": (f"scalar(max({T}))", ""),
    "scalar_many_nan": (f"scalar({T})", ""),
    "scalar_join": (f"scalar(max({JOIN}))", ""),
    # --- labels ---------------------------------------------------------------------------------
    "label_replace": (f'label_replace({U}, "host", "$1-x", "Hostname", "gpu-(.*)")', ""),
    "label_replace_join": (f'label_replace({JOIN}, "host", "${{1}}_$2", "Hostname", "(gpu)-node-(.*)")', ""),
    "label_replace_named_group": (f'label_replace({T}, "n", "$num$$", "Hostname", ".*-(?P<num>[0-9]+)")', ""),
    "label_replace_no_match": (f'label_replace({T}, "Hostname", "x", "Hostname", "nomatch")', ""),
    # Without `pod`, a GPU's series before and after a job change collide where both are live.
    "label_replace_delete": (f'label_replace({T}, "pod", "", "pod", ".*")', "maybe_error"),
    "label_replace_odd_refs": (f'label_replace({T}, "x", "$ a $1x ${{2 $1", "gpu", "([0-9])")', ""),
    "err_label_replace_regex": (f'label_replace({T}, "x", "y", "gpu", "(")', "error"),
    "err_label_replace_dst": (f'label_replace({T}, "1x", "y", "gpu", ".*")', "error"),
    "err_label_replace_dup": (f'label_replace(max by (Hostname, gpu) ({T}), "gpu", "0", "gpu", ".*")', "error"),
    "label_join": (f'label_join({T}, "where", "/", "Hostname", "gpu", "nosuch")', ""),
    "label_join_empty_deletes": (f'label_join({T}, "pod", ",", "nosuch")', "maybe_error"),
    "err_label_join_src": (f'label_join({T}, "x", ",", "a-b")', "error"),
    "err_label_join_dup": (f'label_join(max by (Hostname, gpu) ({T}), "gpu", "", "Hostname")', "error"),
    # --- ordering -------------------------------------------------------------------------------
    "sort": (f"sort({T})", ""),
    "sort_desc": (f"sort_desc({T})", ""),
    "sort_nan": (f"sort({XID} / ({T} - 30))", ""),
    "sort_desc_nan": (f"sort_desc({NAN} or {T})", ""),
    "sort_join": (f"sort_desc({JOIN})", ""),
    # --- histograms -----------------------------------------------------------------------------
    "histogram_quantile": (f"histogram_quantile(0.9, {HIST})", "unordered"),
    "histogram_quantile_median": (f"histogram_quantile(0.5, {HIST})", "unordered"),
    "histogram_quantile_0_1": (f"histogram_quantile(0, {HIST}) + histogram_quantile(1, {HIST})", "unordered"),
    "histogram_quantile_odd": (f"histogram_quantile(0.75, {HIST_ODD})", "unordered"),
    "histogram_quantile_no_inf": (f"histogram_quantile(0.5, {HIST_NO_INF})", "unordered"),
    "histogram_quantile_neg": (f"histogram_quantile(0.1, {HIST_NEG})", "unordered"),
    "histogram_quantile_q_out": (f"histogram_quantile(-1, {HIST})", "unordered"),
    "histogram_quantile_q_nan": (f"histogram_quantile(NaN, {HIST})", "unordered"),
    "histogram_quantile_q_scalar": (f"histogram_quantile(scalar(min({T})) / 100, {HIST})", "unordered"),
    "err_histogram_quantile_two_names": (f"histogram_quantile(0.5, {HIST_TWO_NAMES})", "error"),
    "histogram_count": (f"histogram_count({HIST})", "maybe_empty"),
    "histogram_sum": (f"histogram_sum({HIST})", "maybe_empty"),
    "histogram_fraction": (f"histogram_fraction(0, 50, {HIST})", "maybe_empty"),
    # --- aggregations ---------------------------------------------------------------------------
    "sum": (f"sum by (Hostname) ({P})", ""),
    "sum_rate": ("sum by (instance) (rate(node_network_receive_bytes_total[5m]))", ""),
    "sum_join": (f"sum by (Hostname) ({JOIN})", "sum_order"),
    "sum_nan_inf": (f"sum({NAN} or {U} / 0)", ""),
    "min": (f"min by (Hostname) ({T})", ""),
    "min_nan": (f"min by (Hostname) ({NAN} or {T})", ""),
    "max": (f"max without (gpu, UUID, device, pci_bus_id, pod, namespace, container) ({T})", ""),
    "max_nan_first": (f"max({T} - 100 or {NAN})", ""),
    "avg": (f"avg by (modelName) ({P})", ""),
    "avg_inf": (f"avg({U} / {XID} or {P})", ""),
    "avg_join": (f"avg by (Hostname) ({JOIN})", "sum_order"),
    "count": (f"count by (namespace) ({U})", ""),
    "count_without": (f"count without (gpu) ({U})", ""),
    "group": (f"group by (Hostname, modelName) ({U})", ""),
    "stddev": (f"stddev by (Hostname) ({P})", ""),
    "stdvar": (f"stdvar by (Hostname) ({T})", ""),
    "stddev_all": (f"stddev({P})", ""),
    "stdvar_nan": (f"stdvar({NAN} or {T})", ""),
    "topk": (f"topk(3, {T})", ""),
    "topk_by": (f"topk by (Hostname) (2, {U})", ""),
    "topk_ties": (f"topk(20, {T})", ""),
    "bottomk_ties": (f"bottomk by (modelName) (30, {T})", ""),
    "topk_nan": (f"topk(5, {NAN} or {T})", "map_order"),
    "topk_k1": (f"topk by (Hostname) (1, {T})", ""),
    "topk_k0": (f"topk(0, {T})", "maybe_empty"),
    "topk_k_fraction": (f"topk(2.9, {T})", ""),
    "topk_k_scalar": (f"topk(scalar(count({T})) / 10, {T})", ""),
    "topk_k_per_step": (f"topk(scalar(avg({U})) / 5 - 8, {T})", ""),  # k from 0 to 3 over the range
    "bottomk_k_per_step": (f"bottomk by (Hostname) (scalar(avg({U})) / 5 - 8, {P})", ""),
    "topk_join": (f"topk(4, {JOIN})", "map_order"),
    "err_topk_overflow": (f"topk(1e19, {T})", "error"),
    "err_topk_nan": (f"topk(NaN, {T})", "error"),
    "bottomk": (f"bottomk(3, {T})", ""),
    "bottomk_without": (f"bottomk without (gpu, UUID, device, pci_bus_id, pod, namespace, container) (2, {P})", ""),
    "bottomk_nan": (f"bottomk(5, {NAN} or {T})", "map_order"),
    "quantile": (f"quantile(0.9, {P})", ""),
    "quantile_by": (f"quantile by (Hostname) (0.25, {T})", ""),
    "quantile_nan_inputs": (f"quantile(0.5, {NAN} or {T})", ""),
    "quantile_out_of_range": (f"quantile(1.5, {T}) + quantile(-1, {T})", "maybe_empty"),
    "quantile_q_nan": (f"quantile(NaN, {T})", ""),
    "count_values": (f'count_values("v", {T})', ""),
    "count_values_by": (f'count_values by (Hostname) ("t", {T})', ""),
    "count_values_without": (f'count_values without (gpu, UUID) ("t", {T})', ""),
    "count_values_fractions": (f'count_values("p", {P} / 3)', ""),
    "count_values_nan": (f'count_values("v", {NAN})', ""),
    "err_count_values_label": (f'count_values("a-b", {T})', "error"),
    "quantile_join": (f"quantile(0.9, {JOIN})", ""),
    "stddev_join": (f"stddev by (Hostname) ({JOIN})", "sum_order"),
    "count_values_join": (f'count_values("v", round({JOIN}))', ""),
}


def _top(expr: str) -> Call | Agg:
    node = unparen(parse(expr))
    if isinstance(node, (Call, Agg)):
        return node
    # "a + b" cases: the operand that names the case (its left side)
    lhs = unparen(node.lhs)  # type: ignore[union-attr]
    assert isinstance(lhs, (Call, Agg)), expr
    return lhs


def test_every_name_is_covered() -> None:
    named = {n.func if isinstance(n, Call) else n.op for n in (_top(e) for e, _ in CASES.values())}
    assert INSTANT_FUNCTIONS | AGGREGATIONS <= named, sorted((INSTANT_FUNCTIONS | AGGREGATIONS) - named)


def _ask(url: str, expr: str, params: dict[str, str]) -> dict[str, Any]:
    path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
    r = httpx.post(url + path, data={"query": expr, **params}, timeout=60)
    assert r.status_code in (200, 422), (expr, r.status_code, r.text[:300])
    return orjson.loads(r.content)  # type: ignore[no-any-return]


def _arg(url: str, node: Any, params: dict[str, str]) -> QueryResult | float | str:
    node = unparen(node)
    if isinstance(node, Number):
        return node.value
    if isinstance(node, String):
        return node.value
    path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
    r = httpx.post(url + path, data={"query": to_promql(node), **params}, timeout=60)
    assert r.status_code == 200, (to_promql(node), r.text[:300])
    return decode_prometheus_json(r.content)


def _grid(params: dict[str, str]) -> list[int]:
    if "step" not in params:
        return [round(float(params["time"]) * 1000)]
    start, end, step = (int(params[k]) for k in ("start", "end", "step"))
    return list(range(start * 1000, end * 1000 + 1, step * 1000))


def _local(url: str, node: Call | Agg, params: dict[str, str]) -> dict[str, Any]:
    grid, is_range = _grid(params), "step" in params
    try:
        if isinstance(node, Call):
            out = evaluate_call(node, [_arg(url, a, params) for a in node.args], grid, is_range)
        else:
            param = None if node.param is None else _arg(url, node.param, params)
            inner = _arg(url, node.expr, params)
            assert isinstance(inner, QueryResult)
            out = evaluate_aggregation(node, inner, param, grid, is_range)
    except EvalError as exc:
        return {"status": "error", "errorType": "execution", "error": exc.message}
    return orjson.loads(encode_prometheus_json(out))  # type: ignore[no-any-return]


def _rows(ans: dict[str, Any]) -> list[tuple[Any, list[Any]]]:
    data = ans["data"]
    if data["resultType"] == "scalar":
        return [((), [data["result"]])]
    return [(tuple(sorted(s["metric"].items())), s.get("values") or [s["value"]]) for s in data["result"]]


def _by_step(rows: list[tuple[Any, list[Any]]]) -> list[tuple[Any, list[Any]]]:
    """Each step's values, sorted (their series left out)."""
    steps: dict[Any, list[str]] = {}
    for _, values in rows:
        for t, v in values:
            steps.setdefault(t, []).append(v)
    return [(t, [(t, v) for v in sorted(vs)]) for t, vs in sorted(steps.items())]


def _close(a: str, b: str, rel: float) -> bool:
    if a == b:
        return True
    if rel == 0:
        return False
    fa, fb = float(a.replace("Inf", "inf")), float(b.replace("Inf", "inf"))
    return abs(fa - fb) <= rel * max(abs(fa), abs(fb))


def _compare(name: str, direct: dict[str, Any], mine: dict[str, Any], params: dict[str, str], flags: set[str]) -> None:
    if direct["status"] != "success" or mine["status"] != "success":
        assert (mine["status"], mine.get("error")) == (direct["status"], direct.get("error")), (name, params)
        return
    assert mine["data"]["resultType"] == direct["data"]["resultType"], (name, params)
    rel = 1e-15 if "ulp" in flags else 1e-12 if "sum_order" in flags and "step" in params else 0.0
    d_rows, m_rows = _rows(direct), _rows(mine)
    if "map_order" in flags and "step" in params:
        d_rows, m_rows = _by_step(d_rows), _by_step(m_rows)
    if "unordered" in flags and "step" not in params:
        d_rows, m_rows = sorted(d_rows), sorted(m_rows)
    assert [k for k, _ in m_rows] == [k for k, _ in d_rows], (name, params, "series or their order differ")
    for (k, dv), (_, mv) in zip(d_rows, m_rows):
        assert [t for t, _ in mv] == [t for t, _ in dv], (name, params, k, "timestamps differ")
        bad = [(t, a, b) for (t, a), (_, b) in zip(dv, mv) if not _close(a, b, rel)]
        assert not bad, (name, params, k, bad[:3])


@pytest.mark.parametrize("name", sorted(CASES))
def test_function_matches_prometheus(prom: Any, name: str) -> None:
    expr, flag_text = CASES[name]
    flags = set(flag_text.split())
    top = _top(expr)
    whole = expr if top is unparen(parse(expr)) else to_promql(top)
    end = prom.end_s
    evaluations = [
        {"start": str(end - 3 * 3600 + 17), "end": str(end - 600), "step": "247"},
        {"time": str(end - 60)},
        {"time": str(end - 2 * 3600 + 0.123)},
    ]
    answers = []
    for params in evaluations:
        direct = _ask(prom.url, whole, params)
        _compare(name, direct, _local(prom.url, top, params), params, flags)
        answers.append(direct)
    errors = [a for a in answers if a["status"] != "success"]
    if "error" in flags:
        assert errors, f"{name}: Prometheus was expected to refuse this"
        return
    if "maybe_error" not in flags:
        assert not errors, (name, errors[0].get("error"))
    if "maybe_empty" not in flags and answers[0]["status"] == "success":
        assert answers[0]["data"]["result"], f"{name}: Prometheus's range answer is empty (compares nothing)"
