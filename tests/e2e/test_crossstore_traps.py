"""Cross-store traps (issue 27): queries promaccel evaluates itself across two stores, one
class of Prometheus 2.42 semantics each, compared with the reference Prometheus on data.

Before round 3 each of these answered a 422 "cannot route" or a wrong value:
- aggregation parameters that are expressions (`topk(2 * 3, ...)`, `topk((3), ...)`,
  `quantile(99/100, ...)`, `quantile(scalar(...), ...)` from the other store) and `k` at the
  int64 bound (engine.go convertibleToInt64: above 9223372036854774784 is an error);
- range-function parameters that are expressions (`predict_linear(x[3h], 4 * 3600)`,
  `holt_winters(x[3h], 0.1 + 0.2, 0.5)`) over a window straddling the stores;
- a subquery without a step (`[3h:]`): the backend's global.evaluation_interval (30 s
  here), not a fixed 1 m;
- `@` on AtModifierUnsafeFunctions (`predict_linear(x[3h] @ start(), 600)`: evaluated at
  every step over the window fixed at T), `timestamp(x @ start())`, `@ end()`/`@ start()`
  on a subquery over a join;
- a bare range selector or subquery at the top of an instant query;
- Go 1.19's regexp (2.42) rejects `(?<name>...)`: in label_replace (422) and in a selector
  (400 parse error), the backend's own answer;
- a Prometheus 3 function (`sort_by_label`): the backend's 400, not a routing refusal;
- topk/bottomk over equal values in an overlap: k holds after the merge.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from loadtests.compare import Expect, error
from tests.e2e.test_hybrid import EVERY_STEP, LONG, reference, route_kind
from tests.equivalence import compare_case
from tests.hybrid import END, HOUR, MIN, Scenario, T

pytestmark = pytest.mark.prom

LR = 'label_replace(node_load1, "Hostname", "$1", "instance", "(.+):9100")'
JOIN = f"sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left {LR}"
RATIO = "(sum(DCGM_FI_DEV_POWER_USAGE) / sum(node_load1))"

# scenario -> name -> (query, expectation of the reference answer)
TRAPS: dict[str, dict[str, tuple[str, Expect | None]]] = {
    "by_metric": {
        "k_expression": (f"topk(2 * 3, {JOIN})", None),
        "k_parenthesised": (f"topk((3), {JOIN})", None),
        "quantile_fraction": (f"quantile(99/100, {JOIN})", None),
        "quantile_from_other_store": ("quantile(scalar(max(node_load1)) / 10, sum by (Hostname) "
                                      "(DCGM_FI_DEV_GPU_UTIL))", None),
        "k_over_int64": (f"topk(9223372036854775807, {JOIN})", error("execution", "overflows int64")),
        "k_at_int64_bound": (f"topk(9223372036854774784, {JOIN})", None),
        "named_group_label_replace": (f'label_replace({JOIN}, "x", "$1", "Hostname", "(?<n>.+)")',
                                      error("execution", "invalid regular expression in label_replace()")),
        "named_group_selector": ('sum({__name__=~"(?<n>DCGM_FI_DEV_GPU_UTIL)|node_load1"})',
                                 error("bad_data", "invalid or unsupported Perl syntax")),
        "at_end_subquery_join": (f"max_over_time({RATIO}[30m:5m] @ end())", None),
        "at_start_subquery_join": (f"max_over_time({RATIO}[30m:5m] @ start())", None),
        "prometheus3_function": (f'sort_by_label({JOIN}, "Hostname")',
                                 error("bad_data", 'unknown function with name "sort_by_label"')),
        "bare_subquery_join": (f"{RATIO}[30m:5m]", None),
    },
    "by_time": {
        "predict_linear_expression": ("predict_linear(DCGM_FI_DEV_GPU_TEMP[3h], 4 * 3600)", None),
        "holt_winters_expression": ("holt_winters(DCGM_FI_DEV_GPU_TEMP[3h], 0.1 + 0.2, 0.5)", None),
        "subquery_without_step": ("max_over_time(sum(DCGM_FI_DEV_GPU_UTIL)[3h:])", None),
        "predict_linear_at_start": ("predict_linear(DCGM_FI_DEV_GPU_TEMP[3h] @ start(), 600)", None),
        "timestamp_at_start": ("timestamp(DCGM_FI_DEV_GPU_UTIL @ start())", None),
        "bare_range_selector": ("DCGM_FI_DEV_GPU_UTIL[3h]", None),
        "bare_subquery": ("sum(DCGM_FI_DEV_GPU_UTIL)[3h:5m]", None),
    },
    "overlap": {
        "topk_equal_values": ("topk(3, DCGM_FI_DEV_XID_ERRORS)", None),
        "bottomk_equal_values": ("bottomk(2, DCGM_FI_DEV_XID_ERRORS)", None),
    },
}
RANGE = {"by_metric": LONG, "by_time": EVERY_STEP, "overlap": LONG}
INSTANT = {"by_metric": [T + 11], "by_time": [T + 2 * HOUR], "overlap": [END - 40 * MIN + 11, END - 2 * HOUR - 37 * MIN]}


def _forms(scenario: str, name: str, query: str) -> list[tuple[str, dict[str, str]]]:
    forms = [("/api/v1/query", {"query": query, "time": str(t)}) for t in INSTANT[scenario]]
    if not name.startswith("bare"):  # a range vector is not a range query's answer type
        forms.append(("/api/v1/query_range", {"query": query, **RANGE[scenario]}))
    return forms


@pytest.mark.parametrize(("scenario", "name"), [(s, n) for s in TRAPS for n in TRAPS[s]])
def test_cross_store_trap_answers_as_prometheus(prom: Any, hybrid: dict[str, Scenario], scenario: str,
                                                name: str) -> None:
    query, expect = TRAPS[scenario][name]
    for path, form in _forms(scenario, name, query):
        status, direct = reference(prom.url, path, form)
        r = httpx.post(hybrid[scenario].proxy.url + path, data=form, timeout=60)
        problems = compare_case("hybrid", name, query, path, status, direct, r.status_code, orjson.loads(r.content),
                                expect=expect)
        assert problems == [], (scenario, name, path, problems[:3], r.text[:300])


@pytest.mark.parametrize(("scenario", "query"), [
    ("by_metric", f"sum({JOIN}) / 2"),
    ("by_time", "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h] offset 7s))"),
])
def test_cross_store_answers_say_when_the_cache_served_them(hybrid: dict[str, Scenario], scenario: str,
                                                            query: str) -> None:
    """X-Cache of a cross-store answer is its parts': MISS when asked first, HIT when every
    subquery and raw window came from the cache (it was always MISS)."""
    # A step no other test uses: its pieces are not in the cache yet.
    form = {"query": query, **RANGE[scenario], "step": "61"}
    assert route_kind(hybrid[scenario], query, form) == "unroutable"  # promaccel evaluates it
    url = hybrid[scenario].proxy.url + "/api/v1/query_range"
    first = httpx.post(url, data=form, timeout=60)
    again = httpx.post(url, data=form, timeout=60)
    assert first.status_code == again.status_code == 200, first.text[:300]
    assert first.headers["X-Cache"] in ("MISS", "PARTIAL")
    assert again.headers["X-Cache"] == "HIT", dict(again.headers)
    assert orjson.loads(first.content) == orjson.loads(again.content)
