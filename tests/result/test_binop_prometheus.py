"""proxy.engine.binop against a real Prometheus 2.42: each side of `lhs op rhs` is queried alone,
decoded, combined by `evaluate_binary`, encoded, and compared with Prometheus's own answer to
the whole expression (instant at two times, and a range query at step 5m over 4 hours).

Values must be equal as Prometheus writes them (string for string), except for `^` with a
fractional exponent, where Go's exp/log and the C library's may differ by an ulp (1e-15).
Where Prometheus answers an error, `EvalError.message` must be its error text exactly.

The table mixes metric families the way dashboards join "stores" during a migration: DCGM_*
(Hostname, gpu, namespace, pod) against node_* (instance="<host>:9100") through
label_replace, and kube_* (namespace, node).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import diff_answers
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json, format_value
from proxy.engine.binop import evaluate_binary
from proxy.engine.errors import EvalError
from proxy.result import QueryResult
from shardplanner.ast import Binary, Number, unparen
from shardplanner.promql import parse

pytestmark = pytest.mark.prom

U = "DCGM_FI_DEV_GPU_UTIL"
T = "DCGM_FI_DEV_GPU_TEMP"
P = "DCGM_FI_DEV_POWER_USAGE"
FBU = "DCGM_FI_DEV_FB_USED"
FBF = "DCGM_FI_DEV_FB_FREE"
XID = "DCGM_FI_DEV_XID_ERRORS"
NODE_BY_HOST = 'label_replace(node_load1, "Hostname", "$1", "instance", "(.*):.*")'
RX_BY_HOST = ('label_replace(sum by (instance) (rate(node_network_receive_bytes_total[5m])), '
              '"Hostname", "$1", "instance", "(.*):.*")')
GPUS_BY_INSTANCE = 'label_replace(count by (Hostname) (DCGM_FI_DEV_GPU_UTIL), "instance", "$1:9100", "Hostname", "(.*)")'
GPUS_BY_NODE = 'label_replace(count by (Hostname) (DCGM_FI_DEV_GPU_UTIL), "node", "$1", "Hostname", "(.*)")'

# name: (lhs, operator with modifiers, rhs, flags). Flags: "approx" (ulp tolerance), "error"
# (Prometheus must refuse it, at least at one evaluation), "maybe_empty" (no data required).
CASES: dict[str, tuple[str, str, str, str]] = {
    # --- arithmetic, vector/vector one-to-one --------------------------------------------
    "add": (FBU, "+", FBF, ""),
    "sub": (FBU, "-", FBF, ""),
    "mul": (FBU, "*", U, ""),
    "div_ratio": (FBU, "/", f"{FBU} + {FBF}", ""),
    "mod_vv": (P, "%", T, ""),
    "div_by_zero_inf_nan": (U, "/", XID, ""),
    "mod_by_zero_nan": (U, "%", XID, ""),
    "pow_vv_fraction": (f"{T} / 10", "^", f"{U} / 50", "approx"),
    "pow_vv_integer": (f"{T} - 65", "^", f"{XID} + 3", ""),
    "atan2_vv_keeps_name": (T, "atan2", P, ""),
    "atan2_vv_signs": (f"{T} - 60", "atan2", f"{P} - 300", ""),
    # --- vector/scalar ---------------------------------------------------------------------
    "vs_sub": (T, "-", "60", ""),
    "sv_sub": ("100", "-", U, ""),
    "sv_div_inf": ("1", "/", XID, ""),
    "vs_pow_int": (f"{T} / 10", "^", "3", ""),
    "vs_pow_neg_base": (f"{T} - 65", "^", "3", ""),
    "vs_pow_sqrt": (U, "^", "0.5", ""),
    "vs_pow_sqrt_negative_nan": (f"{T} - 65", "^", "0.5", ""),
    "vs_pow_negative_int": (f"{T} / 10", "^", "-2", ""),
    "sv_pow_fraction": ("2", "^", f"{U} / 10", "approx"),
    "vs_mod_neg": (P, "%", "-7.5", ""),
    "vs_mod_neg_dividend": (f"-{P}", "%", "7", ""),
    "vs_atan2": (T, "atan2", "-3", ""),
    "sv_atan2": ("-7", "atan2", f"{U} - 50", ""),
    "vs_div_scalar_fn": (P, "/", f"scalar(sum({P}))", ""),
    "sv_scalar_fn_minus": (f"scalar(max({T}))", "-", T, ""),
    "sv_time": ("time()", "-", T, ""),
    # --- scalar/scalar ------------------------------------------------------------------------
    "ss_numbers": ("1.5", "*", "4", ""),
    "ss_bool": ("3", ">= bool", "2", ""),
    "ss_scalar_fns": (f"scalar(max({T}))", "-", f"scalar(min({T}))", ""),
    "ss_fn_bool": (f"scalar(max({T}))", "< bool", "70", ""),
    # --- comparisons -------------------------------------------------------------------------
    "vs_gt_filter": (U, ">", "50", ""),
    "vs_ge_bool": (U, ">= bool", "50", ""),
    "sv_lt_filter_keeps_vector_value": ("50", "<", U, ""),
    "sv_gt_bool": ("50", "> bool", U, ""),
    "vs_eq": (XID, "==", "0", ""),
    "vs_ne_bool": (XID, "!= bool", "0", ""),
    "vv_gt_filter_keeps_name": (FBU, ">", FBF, ""),
    "vv_lt_filter": (FBF, "<", f"{FBU} * 3", ""),
    "vv_le_bool": (FBU, "<= bool", FBF, ""),
    "vv_nan_ne_bool": (f"{XID} / {XID}", "!= bool", f"{XID} / {XID}", ""),
    "vv_nan_eq_filter": (f"{XID} / {XID}", "==", f"{XID} / {XID}", ""),
    # Job churn: a GPU's series with the old pod and with the new one both exist within the
    # lookback window at some steps, so matching on the GPU alone fails only at those steps.
    "vv_on_filter_churn": (T, "< on(UUID)", P, "error"),
    "vv_on_filter": (f"max by (UUID) ({T})", "< on(UUID)", f"max by (UUID, Hostname) ({P})", ""),
    "vv_ignoring_bool_churn": (T, "> bool ignoring(pod, namespace, container)", P, "error"),
    "vv_ignoring_bool": (f"max by (UUID, Hostname) ({T})", "> bool ignoring(Hostname)", f"max by (UUID) ({P}) / 5", ""),
    # --- on / ignoring ----------------------------------------------------------------------
    "on_uuid_churn": (FBU, "/ on(UUID)", FBF, "error"),
    "on_uuid_group_left": (FBU, "/ on(UUID) group_left", f"max by (UUID) ({FBF})", ""),
    "ignoring_pod_churn": (FBU, "- ignoring(pod)", FBF, "error"),
    "ignoring_hostname": (f"max by (UUID, Hostname) ({FBU})", "- ignoring(Hostname)", f"max by (UUID) ({FBF})", ""),
    "ignoring_namespace_churn": (f"sum by (Hostname, gpu, namespace) ({FBU})", "- ignoring(namespace)",
                                 f"sum by (Hostname, gpu) ({FBF})", "error"),
    "on_hostname_aggs": (f"sum by (Hostname) ({P})", "/ on(Hostname)", f"count by (Hostname) ({P})", ""),
    "ignoring_absent_label": (f"sum by (namespace) ({U})", "/ ignoring(nosuch)", f"sum by (namespace) ({T})", ""),
    "on_empty": (f"sum({P})", "/ on()", f"count({P})", ""),
    # --- group_left / group_right ---------------------------------------------------------------
    "group_left_share": (P, "/ on(Hostname) group_left", f"sum by (Hostname) ({P})", ""),
    "group_left_aggs": (f"sum by (Hostname, namespace) ({P})", "/ on(Hostname) group_left",
                        f"sum by (Hostname) ({P})", ""),
    "group_right_share": (f"sum by (Hostname) ({P})", "/ on(Hostname) group_right", P, ""),
    "group_right_include_missing_on_one_side": (
        f"sum by (Hostname) ({P})", "/ on(Hostname) group_right(namespace)",
        f"sum by (Hostname, namespace) ({P})", "error"),
    "group_left_filter": (P, "> on(Hostname) group_left", f"avg by (Hostname) ({P})", ""),
    "group_right_filter_value_from_left": (f"avg by (Hostname) ({P})", "< on(Hostname) group_right", P, ""),
    "group_left_bool": (P, "> bool on(Hostname) group_left", f"avg by (Hostname) ({P})", ""),
    "group_right_bool": (f"avg by (Hostname) ({P})", "<= bool on(Hostname) group_right", P, ""),
    "group_left_ignoring": (FBU, "/ ignoring(gpu, UUID, device, pci_bus_id, pod, namespace, container) group_left",
                            f"sum without (gpu, UUID, device, pci_bus_id, pod, namespace, container) ({FBU})", ""),
    "group_left_ignoring_include": (
        f"max by (Hostname, gpu, namespace) ({U})", "* ignoring(gpu, namespace, modelName) group_left(modelName)",
        f"max by (Hostname, modelName) ({T})", ""),
    # cross-store joins: DCGM (per GPU) against node exporter (per instance)
    "join_util_by_host_node_load": (f"avg by (Hostname) ({U})", "* on(Hostname) group_left", NODE_BY_HOST, ""),
    "join_copy_job_over_lhs_label": (U, "* on(Hostname) group_left(job)", NODE_BY_HOST, ""),
    "join_copy_instance_and_device": (U, "+ on(Hostname) group_left(instance, nosuch)", NODE_BY_HOST, ""),
    "join_node_many_right": (NODE_BY_HOST, "/ on(Hostname) group_right", U, ""),
    "join_rx_per_gpu": ("rate(node_network_receive_bytes_total[5m])", "/ on(instance) group_left", GPUS_BY_INSTANCE, ""),
    "join_rx_host_vs_power": (RX_BY_HOST, "/ on(Hostname)", f"sum by (Hostname) ({P})", ""),
    "join_kube_namespace": (f"count by (namespace) ({U})", "* on(namespace) group_left",
                            'count by (namespace) (kube_pod_status_phase{phase="Running"} == 1)', ""),
    "join_kube_allocatable": ('kube_node_status_allocatable{resource="nvidia_com_gpu"}', "- on(node) group_left",
                              GPUS_BY_NODE, ""),
    "join_kube_allocatable_bool": ('kube_node_status_allocatable', "> bool on(node) group_left", GPUS_BY_NODE, ""),
    # --- set operators ------------------------------------------------------------------------
    "and": (U, "and", f"{T} > 60", ""),
    "and_on_host": (U, "and on(Hostname)", f"{T} > 70", ""),
    "and_on_empty_scalar_like": (U, "and on()", f"sum({XID}) > 0", ""),
    "unless": (U, "unless", f"{U} < 20", ""),
    "unless_ignoring": (U, "unless ignoring(namespace, pod, container)", f"{T} > 65", ""),
    "unless_on_empty": (U, "unless on()", f"sum({XID}) > 0", ""),
    "or": (f"{XID} > 0", "or", f"{T} > 80", ""),
    "or_on_host_per_step": (f"{U} > 80", "or on(Hostname)", f"{T} > 70", ""),
    "or_aggs_two_families": (f"sum by (namespace) ({U})", "or", "sum by (namespace) (kube_pod_status_phase)", ""),
    "or_name_dropped_rhs": (U, "or", f"{U} * 2", ""),
    "or_vector0": (f"count({XID} > 0)", "or", "vector(0)", ""),
    "or_cross_store": (f"avg by (Hostname) ({U})", "or", NODE_BY_HOST, ""),
    # --- errors -------------------------------------------------------------------------------
    "err_dup_right": (U, "* on(Hostname)", T, "error"),
    "err_dup_right_group_left": (U, "* on(Hostname) group_left", T, "error"),
    "err_dup_left_group_right": (T, "* on(Hostname) group_right", f"sum by (Hostname) ({U})", "error"),
    "err_one_to_one_many_matches": (U, "* on(Hostname)", f"sum by (Hostname) ({T})", "error"),
    "err_grouping_not_unique": (f"sum by (Hostname, gpu) ({U})", "* on(Hostname) group_left(gpu)",
                                f"sum by (Hostname) ({T})", "error"),
    "err_same_labelset_arith": ('{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}', "/", "1024", "error"),
    "err_same_labelset_bool": ('{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}', "> bool", "0", "error"),
    "err_same_labelset_scalar_left": ("2", "*", '{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}', "error"),
    "err_lhs_two_names_one_to_one": ('{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}', "+", U, "error"),
    # Two names on the left match one right series, but only one of them passes the filter.
    "ok_filter_two_names_one_to_one": ('{__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"}', "> ignoring(x)",
                                       "DCGM_FI_DEV_FB_USED", ""),
    "err_dup_right_node_join": (NODE_BY_HOST, "* on(Hostname)", "node_network_receive_bytes_total", "error"),
}


def _whole(lhs: str, op: str, rhs: str) -> str:
    # `group_left (x)` would read `(x)` as the label list: spell out the empty list.
    if op.rstrip().endswith(("group_left", "group_right")):
        op = op + "()"
    return f"({lhs}) {op} ({rhs})"


def _query(url: str, expr: str, params: dict[str, str]) -> bytes:
    path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
    r = httpx.post(url + path, data={"query": expr, **params}, timeout=60)
    assert r.status_code in (200, 422), (expr, r.status_code, r.text[:300])
    return r.content


def _side(url: str, node: Any, expr: str, params: dict[str, str]) -> QueryResult | float:
    if isinstance(unparen(node), Number):
        return unparen(node).value
    body = _query(url, expr, params)
    assert orjson.loads(body)["status"] == "success", (expr, body[:300])
    return decode_prometheus_json(body)


def _grid(params: dict[str, str]) -> list[int]:
    start, end, step = (int(params[k]) for k in ("start", "end", "step"))
    return list(range(start, end + 1, step))


def _as_answer(out: QueryResult | float, params: dict[str, str]) -> dict[str, Any]:
    if isinstance(out, float):
        # A constant scalar: the executor spreads it over the request, as Prometheus does.
        if "step" in params:
            values = [[t, format_value(out)] for t in _grid(params)]
            data = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        else:
            data = {"resultType": "scalar", "result": [int(params["time"]), format_value(out)]}
        return {"status": "success", "data": data}
    return orjson.loads(encode_prometheus_json(out))


def _values(ans: dict[str, Any]) -> dict[Any, Any]:
    data = ans["data"]
    if data["resultType"] == "scalar":
        return {(): [data["result"]]}
    return {tuple(sorted(s["metric"].items())): s.get("values") or [s.get("value")] for s in data["result"]}


def _ulp_close(a: str, b: str) -> bool:
    if a == b:
        return True
    fa, fb = float(a.replace("Inf", "inf")), float(b.replace("Inf", "inf"))
    return abs(fa - fb) <= 1e-15 * max(abs(fa), abs(fb))


_DUP = re.compile(r"^(found duplicate series for the match group .* hand-side of the operation: )"
                  r"\[(\{.*\}), (\{.*\})\](;many-to-many matching not allowed.*)$")


def _same_error(direct: str, mine: str, is_range: bool) -> bool:
    """Equal texts; except that in a range query Prometheus lists the two duplicate series
    in the order of a Go map iteration when the "one" side is computed (rangeEval collects
    its output in a map), so there the pair may come in either order."""
    if direct == mine:
        return True
    a, b = _DUP.match(direct), _DUP.match(mine)
    return bool(is_range and a and b and a.group(1, 4) == b.group(1, 4)
                and {a.group(2), a.group(3)} == {b.group(2), b.group(3)})


def _run(url: str, name: str, params: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    lhs, op, rhs, flag_text = CASES[name]
    flags = set(flag_text.split())
    whole = _whole(lhs, op, rhs)
    node = unparen(parse(whole))
    assert isinstance(node, Binary), whole
    direct = orjson.loads(_query(url, whole, params))
    try:
        out = evaluate_binary(node, _side(url, node.lhs, lhs, params), _side(url, node.rhs, rhs, params))
        mine = _as_answer(out, params)
    except EvalError as exc:
        mine = {"status": "error", "errorType": "execution", "error": exc.message}
    if direct["status"] != "success" or mine["status"] != "success":
        assert mine["status"] == direct["status"], (name, params, mine.get("error"), direct.get("error"))
        assert _same_error(direct["error"], mine["error"], "step" in params), (name, params)
        return direct, mine
    problems = diff_answers(direct, mine, rel=1e-15 if "approx" in flags else 0.0)
    assert problems == [], (name, params, problems[:5])
    dv, mv = _values(direct), _values(mine)
    for k in dv:
        for (t1, a), (t2, b) in zip(dv[k], mv[k]):
            ok = _ulp_close(a, b) if "approx" in flags else a == b
            assert t1 == t2 and ok, (name, params, k, t1, a, b)
    return direct, mine


@pytest.mark.parametrize("name", sorted(CASES))
def test_binop_matches_prometheus(prom: Any, name: str) -> None:
    end = prom.end_s
    evaluations = [
        {"time": str(end - 3 * 3600 + 11)},
        {"time": str(end - 60)},
        {"start": str(end - 4 * 3600 + 17), "end": str(end - 600), "step": "300"},
    ]
    answers = [_run(prom.url, name, p)[0] for p in evaluations]
    flags = set(CASES[name][3].split())
    errors = [a for a in answers if a["status"] != "success"]
    if "error" in flags:
        assert errors, f"{name}: Prometheus was expected to refuse this at least once"
    elif "maybe_error" not in flags:
        assert not errors, (name, errors[0].get("error"))
    if not ({"maybe_empty", "error", "maybe_error"} & flags):
        # A case that compares two empty answers proves nothing.
        assert any(a["status"] == "success" and a["data"]["result"] for a in answers[2:]), (
            f"{name}: Prometheus's range answer is empty")
