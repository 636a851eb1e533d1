"""proxy.engine.windows against a real Prometheus 2.42, the way hybrid evaluation will use it:
the raw samples of a selector come from Prometheus itself (the matrix selector `sel[W]` asked
as an instant query at the last evaluation time, W = range + offset + the span of the
evaluation times), eval_range_function computes `func(sel[range] offset o)` over the step
grid of a range query, and the encoded answer must equal Prometheus's own /api/v1/query_range
answer byte for byte (labels, order, timestamps, every value's digits). No tolerance: the
kernels repeat Go's arithmetic operation for operation, and on amd64 Go does not fuse
multiply-adds. Where Prometheus answers an error, the PromError must carry its type and text.

Subqueries: the inner expression is fetched with query_range over the grid subquery_times()
computes, and `func(inner[range:step] offset o)` evaluated from it must equal Prometheus's
answer too (this also checks the grid: inner times off the multiples of the step give other
values; tests/result/test_windows.py pins the first and last inner time).

Every function of RANGE_FUNCTIONS runs every scenario of SCENARIOS (counters with resets,
gauges with NaN samples, ranges that are not multiples of the scrape interval, offsets, odd
steps and unaligned starts); test_every_function_has_cases walks the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from loadtests.compare import answer_kind, diff_answers
from proxy.codec.json_decode import decode_prometheus_json
from proxy.codec.json_encode import encode_prometheus_json
from proxy.engine.windows import RANGE_FUNCTIONS, eval_range_function, subquery_times
from proxy.errors import PromError
from tests.equivalence import TALLY

pytestmark = pytest.mark.prom

SELECTORS = {
    # counters; gpu-node-0001 and gpu-node-0009 reboot (counters restart from 0)
    "energy": 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname=~"gpu-node-000[0-3]"}',
    "rx_ib0": 'node_network_receive_bytes_total{device="ib0"}',
    "nvlink": 'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{Hostname=~"gpu-node-00(0[0-3]|09)"}',
    # gauges; gpu-node-0000 gpu 0 reports NaN power at five scrapes, its last GPU an XID
    "util": 'DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-node-000[4-7]"}',
    "power": 'DCGM_FI_DEV_POWER_USAGE{Hostname="gpu-node-0000"}',
    "temp": 'DCGM_FI_DEV_GPU_TEMP{gpu="0"}',
    "xid": 'DCGM_FI_DEV_XID_ERRORS{Hostname=~"gpu-node-00(00|15)"}',
    "load": "node_load1",
}


@dataclass(frozen=True)
class Grid:
    """A query_range grid, in seconds before the end of the data."""
    start_before: int
    end_before: int
    step: int

    def params(self, end_s: int) -> tuple[int, int, int]:
        return end_s - self.start_before, end_s - self.end_before, self.step


G_47S = Grid(5 * 3600 - 17, 3 * 3600 - 11, 47)      # 2 h, odd step, unaligned start
G_5M = Grid(4 * 3600 - 3, 3600, 300)
G_ONE = Grid(2 * 3600 - 11, 2 * 3600 - 11, 60)     # one evaluation
G_15S = Grid(3 * 3600 - 7, 2 * 3600 + 2400, 15)     # a step below the scrape interval
G_WIDE = Grid(5 * 3600 - 1, 100, 3700)             # a step longer than a 1 h range

# (selector, range s, offset s, grid)
SCENARIOS: list[tuple[str, int, int, Grid]] = [
    ("energy", 300, 0, G_47S),
    ("rx_ib0", 3600, 600, G_5M),
    ("nvlink", 95, 0, G_15S),
    ("energy", 95, 3607, G_47S),
    ("util", 300, 0, G_47S),
    ("power", 3600, 0, G_WIDE),
    ("power", 95, 600, G_5M),
    ("temp", 300, 3607, G_ONE),
    ("xid", 3600, 0, G_47S),
    ("load", 120, 600, G_15S),
]

PARAMS: dict[str, list[list[float]]] = {
    "quantile_over_time": [[0.5], [0.0], [1.0], [0.25], [0.9], [-0.5], [1.5], [0.75], [0.1], [0.33]],
    "predict_linear": [[600.0], [-3600.0], [0.0], [95.5], [7200.0]],
    "holt_winters": [[0.3, 0.6], [0.9, 0.1], [0.5, 0.5], [0.1, 0.9], [0.75, 0.25]],
}

# Cases beyond the scenarios: (function, params, selector, range s, offset s, grid).
EXTRA: list[tuple[str, list[float], str, int, int, Grid]] = [
    ("holt_winters", [1.5, 0.5], "util", 300, 0, G_5M),       # Prometheus: execution error
    ("holt_winters", [0.5, 0.0], "util", 300, 0, G_5M),
    ("holt_winters", [0.0, 1.0], "temp", 300, 0, G_ONE),
    ("holt_winters", [math.nan, 0.5], "util", 300, 0, G_5M),  # NaN passes Go's checks
    ("quantile_over_time", [math.nan], "power", 300, 0, G_5M),
]
NAME_CLASH = '{__name__=~"node_network_(receive|transmit)_bytes_total", device="ib0"}'

# (function, params, inner expression, range s, step s, offset s)
SUBQUERIES: list[tuple[str, list[float], str, int, int, int]] = [
    ("max_over_time", [], "avg(DCGM_FI_DEV_GPU_UTIL)", 1800, 60, 0),
    ("max_over_time", [], "avg(DCGM_FI_DEV_GPU_UTIL)", 1800, 60, 600),
    ("rate", [], "sum(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)", 600, 45, 0),
    ("rate", [], "sum(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)", 600, 45, 420),
    ("quantile_over_time", [0.9], "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)", 1200, 90, 0),
    ("deriv", [], "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", 900, 60, 180),
    ("increase", [], "sum by (Hostname) (node_network_receive_bytes_total)", 3600, 300, 0),
    ("last_over_time", [], 'DCGM_FI_DEV_GPU_TEMP{gpu="1"}', 300, 60, 0),
    ("holt_winters", [0.5, 0.5], "avg by (namespace) (DCGM_FI_DEV_GPU_UTIL)", 1800, 120, 0),
    ("stddev_over_time", [], "sum(DCGM_FI_DEV_POWER_USAGE)", 1500, 77, 3607),
]


def _num(x: float) -> str:
    return "NaN" if math.isnan(x) else repr(x)


def _expr(func: str, params: list[float], matrix: str) -> str:
    if func == "quantile_over_time":
        return f"{func}({_num(params[0])}, {matrix})"
    return f"{func}({', '.join([matrix, *map(_num, params)])})"


def _post(url: str, path: str, data: dict[str, str]) -> tuple[int, bytes]:
    r = httpx.post(url + path, data=data, timeout=120)
    return r.status_code, r.content


def _compare(func: str, params: list[float], raw_body: bytes, times: np.ndarray, rng_ms: int,
             off_ms: int, direct: tuple[int, bytes], what: str) -> str:
    """Asserts equality; returns the kind of Prometheus's answer (data, empty, error)."""
    status, body = direct
    ref = orjson.loads(body)
    kind = answer_kind(ref)
    TALLY[("windows", kind)] += 1
    raw = decode_prometheus_json(raw_body)
    try:
        mine = encode_prometheus_json(eval_range_function(func, params, raw, times, rng_ms, offset_ms=off_ms))
    except PromError as exc:
        assert kind == "error", (what, "promaccel refused", exc.kind, exc.message, body[:300])
        assert (exc.kind, exc.message, exc.status) == (ref["errorType"], ref["error"], status), (what, exc)
        return kind
    assert status == 200 and kind != "error", (what, "Prometheus refused", body[:300])
    if mine != body:
        problems = diff_answers(ref, orjson.loads(mine), ordered=True, rel=0.0)
        raise AssertionError((what, problems[:5] or [mine[:300], body[:300]]))
    return kind


def _range_case(prom: Any, func: str, params: list[float], sel: str, rng: int, off: int, grid: Grid) -> str:
    start, end, step = grid.params(prom.end_s)
    offset = f" offset {off}s" if off else ""
    expr = _expr(func, params, f"{sel}[{rng}s]{offset}")
    direct = _post(prom.url, "/api/v1/query_range", {"query": expr, "start": str(start), "end": str(end),
                                                      "step": str(step)})
    window_ms = (rng + off + (end - start)) * 1000
    status, raw_body = _post(prom.url, "/api/v1/query", {"query": f"{sel}[{window_ms}ms]", "time": str(end)})
    assert status == 200, raw_body[:300]
    times = np.arange(start * 1000, end * 1000 + 1, step * 1000, dtype=np.int64)
    return _compare(func, params, raw_body, times, rng * 1000, off * 1000, direct, expr)


@pytest.fixture(scope="module")
def fleet_names(prom: Any) -> set[str]:
    r = httpx.get(prom.url + "/api/v1/label/__name__/values", timeout=30)
    return set(r.json()["data"])


def test_every_function_has_cases() -> None:
    assert RANGE_FUNCTIONS == set(_cases_by_function()), sorted(RANGE_FUNCTIONS ^ set(_cases_by_function()))
    for func, cases in _cases_by_function().items():
        assert len(cases) >= len(SCENARIOS), func
    assert {s[0] for s in SUBQUERIES} <= RANGE_FUNCTIONS


def _cases_by_function() -> dict[str, list[tuple[list[float], str, int, int, Grid]]]:
    cases: dict[str, list[tuple[list[float], str, int, int, Grid]]] = {}
    for func in sorted(RANGE_FUNCTIONS):
        variants = PARAMS.get(func, [[]])
        cases[func] = [(variants[i % len(variants)], SELECTORS[s], rng, off, grid)
                       for i, (s, rng, off, grid) in enumerate(SCENARIOS)]
    for func, params, s, rng, off, grid in EXTRA:
        cases[func].append((params, SELECTORS[s], rng, off, grid))
    return cases


def test_selectors_are_fleet_metrics(fleet_names: set[str]) -> None:
    for sel in SELECTORS.values():
        assert sel.split("{")[0] in fleet_names, sel


@pytest.mark.parametrize("func", sorted(RANGE_FUNCTIONS))
def test_range_function_matches_prometheus(prom: Any, func: str) -> None:
    kinds = [_range_case(prom, func, *case) for case in _cases_by_function()[func]]
    # Most scenarios must compare data: an empty answer on both sides proves little.
    assert kinds.count("data") >= len(SCENARIOS) - 1, (func, kinds)


def test_holt_winters_errors_are_prometheus_errors(prom: Any) -> None:
    kinds = [_range_case(prom, "holt_winters", p, SELECTORS[s], r, o, g)
             for f, p, s, r, o, g in EXTRA if f == "holt_winters"]
    assert kinds == ["error", "error", "error", "data"]


def test_same_labelset_once_the_name_is_dropped(prom: Any) -> None:
    assert _range_case(prom, "max_over_time", [], NAME_CLASH, 300, 0, G_5M) == "error"
    assert _range_case(prom, "last_over_time", [], NAME_CLASH, 300, 0, G_5M) == "data"


@pytest.mark.parametrize("grid", [G_47S, G_ONE, G_5M], ids=["47s", "one", "5m"])
@pytest.mark.parametrize("case", range(len(SUBQUERIES)))
def test_subquery_matches_prometheus(prom: Any, case: int, grid: Grid) -> None:
    func, params, inner, rng, step, off = SUBQUERIES[case]
    start, end, outer_step = grid.params(prom.end_s)
    offset = f" offset {off}s" if off else ""
    expr = _expr(func, params, f"({inner})[{rng}s:{step}s]{offset}")
    direct = _post(prom.url, "/api/v1/query_range", {"query": expr, "start": str(start), "end": str(end),
                                                      "step": str(outer_step)})
    times = np.arange(start * 1000, end * 1000 + 1, outer_step * 1000, dtype=np.int64)
    inner_times = subquery_times(times, rng * 1000, step * 1000, off * 1000)
    status, inner_body = _post(prom.url, "/api/v1/query_range", {
        "query": inner, "start": f"{inner_times[0] / 1000:.3f}", "end": f"{inner_times[-1] / 1000:.3f}",
        "step": str(step)})
    assert status == 200, inner_body[:300]
    kind = _compare(func, params, inner_body, times, rng * 1000, off * 1000, direct, expr)
    assert kind == "data", expr
