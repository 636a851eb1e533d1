"""The equivalence corpus: named PromQL over the generated GPU fleet.

Each query runs through promaccel and straight to Prometheus; the answers must match.
Dashboard panels first, then PromQL coverage (every aggregation, binary matching, offset,
@, subqueries, *_over_time, rate family, label functions, escapes, raw strings).
"""

from __future__ import annotations

from loadtests.compare import Expect, error

GPU = "DCGM_FI_DEV_GPU_UTIL"

QUERIES: dict[str, str] = {
    # --- GPU fleet dashboard panels -------------------------------------------------------
    "util_by_node": f"avg by (Hostname) ({GPU})",
    "util_by_namespace": f"avg by (namespace) ({GPU})",
    "fb_used_by_namespace": "sum by (namespace) (DCGM_FI_DEV_FB_USED)",
    "tensor_active_by_ns": "avg by (namespace) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
    "temp_top10": "topk(10, avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
    "power_by_node": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "power_total": "sum(DCGM_FI_DEV_POWER_USAGE)",
    # GPUs reporting an XID now, 0 when none (XIDs are rare: `count(x > 0)` is empty at most
    # instants; `or_vector0` is that form)
    "xid_count": "sum(DCGM_FI_DEV_XID_ERRORS > bool 0)",
    "nvlink_by_node": "sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]))",
    "net_rx_by_instance": "sum by (instance) (rate(node_network_receive_bytes_total[5m]))",
    "net_tx_by_instance": "sum by (instance) (rate(node_network_transmit_bytes_total[5m]))",
    "pod_phases": "sum by (phase) (kube_pod_status_phase)",
    "energy_increase": "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h]))",
    # --- aggregations ---------------------------------------------------------------------
    "sum_all": f"sum({GPU})",
    "sum_by_model": f"sum by (modelName) ({GPU})",
    "sum_without": f"sum without (gpu, UUID, device, pci_bus_id) ({GPU})",
    "avg_all": f"avg({GPU})",
    "avg_by_ns_host": f"avg by (namespace, Hostname) ({GPU})",
    "min_by_ns": "min by (namespace) (DCGM_FI_DEV_GPU_TEMP)",
    "max_by_ns": "max by (namespace) (DCGM_FI_DEV_GPU_TEMP)",
    "count_by_ns": f"count by (namespace) ({GPU})",
    "group_by_ns": f"group by (namespace) ({GPU})",
    "stddev_all": "stddev(DCGM_FI_DEV_GPU_TEMP)",
    "stdvar_by_ns": "stdvar by (namespace) (DCGM_FI_DEV_GPU_TEMP)",
    "topk5": f"topk(5, {GPU})",
    "bottomk3_by_ns": "bottomk by (namespace) (3, DCGM_FI_DEV_POWER_USAGE)",
    # by the shard labels: each group whole in one shard, winners in Prometheus's value order
    "topk_by_node": "topk by (Hostname) (2, DCGM_FI_DEV_POWER_USAGE)",
    "bottomk_by_instance": "bottomk by (instance) (2, rate(node_network_receive_bytes_total[5m]))",
    "quantile_09": "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)",
    "quantile_by_ns": f"quantile by (namespace) (0.5, {GPU})",
    "count_values": "count_values(\"xid\", DCGM_FI_DEV_XID_ERRORS)",
    "sum_of_rate": "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))",
    "max_by_host_of_avg_over": "max by (Hostname) (avg_over_time(DCGM_FI_DEV_GPU_TEMP[10m]))",
    "nested_agg": f"max(avg by (Hostname) ({GPU}))",
    "sum_by_empty": f"sum by () ({GPU})",
    # --- selectors, per-series expressions ------------------------------------------------
    "raw_selector": "DCGM_FI_DEV_GPU_TEMP",
    "selector_eq": 'DCGM_FI_DEV_GPU_TEMP{gpu="0"}',
    "selector_neq": 'DCGM_FI_DEV_POWER_USAGE{gpu!="0"}',
    "selector_re": 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu-node-000[0-3]"}',
    "selector_nre": 'DCGM_FI_DEV_GPU_TEMP{namespace!~"team-.*"}',
    "selector_escaped_dot": 'node_network_receive_bytes_total{instance=~"gpu-node-000\\\\d.*:9100"}',
    "selector_escaped_regex_dot": 'DCGM_FI_DEV_FB_USED{modelName=~"NVIDIA H100.*"}',
    "selector_raw_string": "DCGM_FI_DEV_GPU_TEMP{Hostname=~`gpu-node-000\\d`}",
    "name_regex": '{__name__=~"DCGM_FI_DEV_FB_(USED|FREE)", gpu="1"}',
    # metrics of two stores in a hybrid fleet (DCGM_* in AMP, node_* local): a union
    "name_regex_stores": 'rate({__name__=~"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION|node_network_receive_bytes_.*"}[5m])',
    "name_regex_stores_sum": 'sum by (__name__) ({__name__=~"DCGM_FI_DEV_GPU_(UTIL|TEMP)|node_load.*"})',
    "scalar_compare": f"{GPU} > 50",
    "scalar_compare_bool": f"{GPU} > bool 50",
    "scalar_arith": "DCGM_FI_DEV_FB_USED / 1024",
    "unary_minus": "-DCGM_FI_DEV_GPU_TEMP",
    "paren_arith": "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) / 1024",
    "abs_clamp": "clamp(abs(DCGM_FI_DEV_GPU_TEMP - 60), 0, 10)",
    "round_ceil": "round(ceil(DCGM_FI_DEV_POWER_USAGE / 7), 5)",
    "timestamp_fn": "timestamp(DCGM_FI_DEV_XID_ERRORS)",
    # --- binary ops with vector matching --------------------------------------------------
    "fb_ratio_same_labels": "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
    # on (UUID) alone is a duplicate-series error: an ended pod's series stays visible for the
    # lookback next to the GPU's next series; (UUID, pod) is unique, as is everything but
    # the two labels ignored (both fixed per GPU)
    "on_matching": "DCGM_FI_DEV_FB_USED / on (UUID, pod) DCGM_FI_DEV_FB_FREE",
    "ignoring_matching": "DCGM_FI_DEV_FB_USED - ignoring (pci_bus_id, modelName) DCGM_FI_DEV_FB_FREE",
    "group_left": (
        "sum by (Hostname, namespace) (DCGM_FI_DEV_POWER_USAGE) / on (Hostname) "
        "group_left sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"
    ),
    # modelName is one per node: copied from the "one" side onto each (Hostname, namespace)
    "group_right_labels": (
        "sum by (Hostname, modelName) (DCGM_FI_DEV_POWER_USAGE) / on (Hostname) "
        "group_right (modelName) sum by (Hostname, namespace) (DCGM_FI_DEV_POWER_USAGE)"
    ),
    # an error on purpose: the "one" side has no namespace to copy, so the results collide
    "group_right_error": (
        "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE) / on (Hostname) "
        "group_right (namespace) sum by (Hostname, namespace) (DCGM_FI_DEV_POWER_USAGE)"
    ),
    "and_op": f"{GPU} and DCGM_FI_DEV_GPU_TEMP > 60",
    # both sides contribute: hot GPUs' temperatures, busy GPUs' utilisation where not hot
    "or_op": "DCGM_FI_DEV_GPU_TEMP > 60 or DCGM_FI_DEV_GPU_UTIL > 50",
    "unless_op": f"{GPU} unless {GPU} < 20",
    "vector_vector_compare_bool": "DCGM_FI_DEV_FB_USED > bool DCGM_FI_DEV_FB_FREE",
    "or_vector0": "count(DCGM_FI_DEV_XID_ERRORS > 0) or vector(0)",
    "agg_ratio": "sum(DCGM_FI_DEV_FB_USED) / sum(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
    "scalar_times_agg": f"100 * avg({GPU})",
    # --- offset, @, subqueries ------------------------------------------------------------
    "offset_5m": "sum(DCGM_FI_DEV_POWER_USAGE offset 5m)",
    # 20m: the edge windows end 30 min into the data
    "offset_rate": "sum by (instance) (rate(node_network_receive_bytes_total[5m] offset 20m))",
    # over a window, so that it still reads data 60 s before the data's end
    "negative_offset": "avg(max_over_time(DCGM_FI_DEV_GPU_TEMP[15m] offset -10m))",
    # Range windows start up to 15 min before the data and instants reach 60 s before its
    # end: `@ start()` is moved into the data by an offset, over a range window reaching back
    # (and short enough that no hybrid scenario's store boundary falls inside it)
    "at_start": "sum(max_over_time(DCGM_FI_DEV_POWER_USAGE[30m] @ start() offset -20m))",
    "at_end": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP @ end())",
    "at_start_offset": "avg(avg_over_time(DCGM_FI_DEV_GPU_TEMP[25m] @ start() offset -20m))",
    "offset_then_at_end": "avg(DCGM_FI_DEV_GPU_TEMP offset 5m @ end())",
    "subquery_step": f"max_over_time(avg({GPU})[30m:1m])",
    "subquery_nostep": "max_over_time(rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m])[20m:])",
    "subquery_nested": f"avg_over_time(max_over_time(avg({GPU})[10m:1m])[30m:5m])",
    "deriv_subquery": "deriv(sum(DCGM_FI_DEV_FB_USED)[15m:1m])",
    # --- range functions ------------------------------------------------------------------
    "rate": "rate(node_network_transmit_bytes_total[5m])",
    "irate": "irate(node_network_receive_bytes_total[2m])",
    "increase": "increase(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[10m])",
    "delta": "delta(DCGM_FI_DEV_GPU_TEMP[10m])",
    "idelta": "idelta(DCGM_FI_DEV_FB_USED[5m])",
    "deriv": "deriv(DCGM_FI_DEV_FB_USED[10m])",
    "resets": "resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[30m])",
    "changes": "changes(DCGM_FI_DEV_XID_ERRORS[30m])",
    "avg_over_time": "avg_over_time(DCGM_FI_DEV_GPU_TEMP[5m])",
    "min_over_time": "min_over_time(DCGM_FI_DEV_POWER_USAGE[10m])",
    "max_over_time": "max_over_time(DCGM_FI_DEV_POWER_USAGE[10m])",
    "sum_over_time": "sum_over_time(DCGM_FI_DEV_XID_ERRORS[15m])",
    "count_over_time": "count_over_time(DCGM_FI_DEV_GPU_TEMP[5m])",
    "last_over_time": "last_over_time(DCGM_FI_DEV_GPU_TEMP[5m])",
    "present_over_time": "present_over_time(DCGM_FI_DEV_XID_ERRORS[5m])",
    "stddev_over_time": "stddev_over_time(DCGM_FI_DEV_GPU_TEMP[10m])",
    "quantile_over_time": "quantile_over_time(0.95, DCGM_FI_DEV_POWER_USAGE[10m])",
    "predict_linear": "predict_linear(DCGM_FI_DEV_FB_USED[15m], 3600)",
    "holt_winters": "holt_winters(DCGM_FI_DEV_GPU_TEMP[10m], 0.5, 0.5)",
    "absent_over_time": "absent_over_time(nonexistent_metric[5m])",
    "sum_rate_by_ns": "sum by (namespace) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))",
    "avg_by_ns_irate": "avg by (namespace) (irate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[2m]))",
    # --- other functions ------------------------------------------------------------------
    "absent_missing": "absent(nonexistent_metric)",
    "absent_present": "absent(DCGM_FI_DEV_GPU_TEMP)",
    "scalar_fn": "scalar(sum(DCGM_FI_DEV_POWER_USAGE))",
    "vector_fn": "vector(1)",
    "time_fn": "time()",
    "sort": "sort(sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE))",
    "sort_desc": "sort_desc(avg by (namespace) (DCGM_FI_DEV_GPU_TEMP))",
    "label_replace": (
        'label_replace(sum by (instance) (rate(node_network_receive_bytes_total[5m])), '
        '"host", "$1", "instance", "(.+):\\\\d+")'
    ),
    "label_replace_onto_shard_label": (
        'sum by (Hostname) (label_replace(DCGM_FI_DEV_POWER_USAGE, "Hostname", "$1", "namespace", "(.*)"))'
    ),
    "label_join": 'label_join(DCGM_FI_DEV_GPU_TEMP, "id", "/", "Hostname", "gpu")',
    "histogram_like_minmax": "max by (Hostname) (DCGM_FI_DEV_SM_CLOCK) - min by (Hostname) (DCGM_FI_DEV_SM_CLOCK)",
    "clamp_max_min": "clamp_min(clamp_max(DCGM_FI_DEV_GPU_TEMP, 70), 40)",
    "ln_exp": "ln(DCGM_FI_DEV_POWER_USAGE + 1)",
    "sgn": "sgn(DCGM_FI_DEV_GPU_TEMP - 65)",
    "days_hour": "hour(timestamp(DCGM_FI_DEV_XID_ERRORS))",
    "kube_alloc": 'sum by (resource) (kube_node_status_allocatable{resource="nvidia_com_gpu"})',
    "running_pods_by_ns": 'sum by (namespace) (kube_pod_status_phase{phase="Running"})',
    "gpus_per_ns_join": (
        'count by (namespace) (DCGM_FI_DEV_GPU_UTIL) * on (namespace) group_left '
        'count by (namespace) (kube_pod_status_phase{phase="Running"} == 1)'
    ),
    # --- escapes next to injected shard matchers --------------------------------------------
    "escaped_parens_model": 'sum by (Hostname) (DCGM_FI_DEV_FB_USED{modelName=~"NVIDIA H100 80GB HBM3 \\\\(MIG 3g\\\\.40gb\\\\)"})',
    "quote_backslash_model": 'avg(DCGM_FI_DEV_GPU_TEMP{modelName="NVIDIA Graphics Device \\"ES\\\\B0\\""})',
    "raw_string_model_regex": "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{modelName=~`NVIDIA A100-SXM4-80GB|.*\\(MIG.*`})",
    # every pod with a dot in its name (qwen2.5-..., jupyter-bob.smith-...): one runs at any time
    "dotted_pod_regex": 'sum by (pod) (DCGM_FI_DEV_FB_USED{pod=~".+\\\\..+"})',
    "label_replace_digit_class_sum": (
        'sum by (node) (label_replace(DCGM_FI_DEV_POWER_USAGE, "node", "$1", "Hostname", "gpu-node-(\\\\d+)"))'
    ),
    "number_literal": "1 + 2 * 3",
    "string_literal": '"hello"',
}

# What each case's reference answer (Prometheus directly) is in every window the suites use;
# a case not listed must have data (tests/equivalence.py fails it otherwise).
EXPECT: dict[str, Expect | dict[str, Expect]] = {  # one Expect, or one per "instant" / "range"
    "string_literal": {"instant": Expect("data"),
                       "range": error("bad_data", 'invalid expression type "string" for range query')},
    # empty wherever the metric is there; windows reaching before the data have absent()'s 1
    "absent_present": Expect("empty", also=("data",)),
    "group_right_error": error("execution", "multiple matches for labels: grouping labels must ensure unique matches"),
}
