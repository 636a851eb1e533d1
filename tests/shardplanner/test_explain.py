"""A plan as JSON-ready data and as text (shardplanner/explain.py), the fixed reason codes
of plan notes, and the reads a routed store holds nothing of."""

from __future__ import annotations

import json

import pytest

from shardplanner.explain import REASON_CODES, explain, explain_text, reason_code, unheld_reads
from shardplanner.holdings import BackendHolding
from shardplanner.plan import PlannerSettings, QueryRequest, Span
from shardplanner.planner import plan
from shardplanner.promql import parse
from shardplanner.routing import Route, route_piece
from tests.shardplanner.fleet import HOSTS, HOUR, VALUES, T


def test_explain() -> None:
    req = QueryRequest("avg(DCGM_FI_DEV_GPU_UTIL)", Span.range(0, 2 * HOUR, 60_000))
    p = plan(req, PlannerSettings(shards=2, split_interval_ms=HOUR), VALUES)
    d = explain(p)
    assert d["type"] == "range" and d["sharded"] and d["time_split"]
    assert d["merge"] == {
        "kind": "aggregate",
        "op": "avg",
        "by": [],
        "without": False,
        "param": None,
        "combine_time": False,
    }
    assert d["shards"][0] == {
        "index": 0,
        "count": 2,
        "label": "Hostname",
        "matcher": 'Hostname=~"' + "|".join(HOSTS[:5]) + '"',
    }
    assert d["time_pieces"] == [[0, HOUR - 60_000], [HOUR, 2 * HOUR - 60_000], [2 * HOUR, 2 * HOUR]]
    assert d["piece_count"] == len(d["pieces"]) == 12
    assert d["pieces"][1] == {
        "query": 'count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"' + "|".join(HOSTS[:5]) + '"})',
        "start_ms": 0,
        "end_ms": HOUR - 60_000,
        "step_ms": 60_000,
        "shard": 0,
        "role": "count",
    }
    json.dumps(d)
    text = explain_text(p, max_pieces=3)
    assert "merge: aggregate avg by ()" in text
    assert "pieces: 12 = 3 time x 2 shard(s) x 2 roles (sum, count)" in text
    assert "... 9 more" in text


def test_explain_an_instant_plan_lists_evaluation_times() -> None:
    p = plan(QueryRequest("max(DCGM_FI_DEV_GPU_TEMP)", Span.instant(T)), PlannerSettings(shards=2), VALUES)
    d = explain(p)
    assert d["type"] == "instant" and d["time_ms"] == T and d["start_ms"] is None
    assert d["time_pieces"] == [T] and d["piece_count"] == 2
    assert [x["shard"] for x in d["pieces"]] == [0, 1] and all("start_ms" not in x for x in d["pieces"])
    text = explain_text(p)
    assert f"instant: {T} ms" in text and "merge: aggregate max by ()" in text
    assert f"  @{T} [shard 1]: " in text and "more" not in text


# Each note the planner writes maps to its own code (the metric label of
# promaccel_queries_planned_total): the prefix table must follow the planner's wording.
@pytest.mark.parametrize(("query", "settings", "values", "code"), [
    ("sum(rate(", PlannerSettings(shards=2), VALUES, "unparsable"),
    ("sum(up)", PlannerSettings(shards=2), VALUES, "no_shard_label"),
    ("time()", PlannerSettings(shards=2), VALUES, "no_selectors"),
    ('sum({__name__=~"DCGM_.*"})', PlannerSettings(shards=2), VALUES, "no_metric_name"),
    ("sum(DCGM_FI_DEV_GPU_UTIL)", PlannerSettings(shards=2), {}, "no_shard_values"),
    ("sum(DCGM_FI_DEV_GPU_UTIL)", PlannerSettings(shards=2, max_pieces=1), VALUES, "shards_reduced"),
    ("sum(DCGM_FI_DEV_GPU_UTIL)", PlannerSettings(shards=2), VALUES, ""),  # no note
])
def test_reason_codes_of_real_plans(query: str, settings: PlannerSettings, values: dict[str, list[str]],
                                    code: str) -> None:
    p = plan(QueryRequest(query, Span.instant(T)), settings, values)
    assert reason_code(p.notes) == code and code in REASON_CODES


def test_a_reason_code_never_carries_note_text() -> None:
    # Notes hold metric names and numbers: a label value made of them would be unbounded.
    assert reason_code(["something new about my_metric_name"]) == "other"
    assert reason_code(("not sharded: whatever comes next",)) == "not_shardable"  # the catch-all prefix
    assert reason_code(()) == ""


NOW = 100 * 24 * HOUR
LOCAL = BackendHolding("local", ("node_.*",), since_ms=NOW - 6 * HOUR, primary=True)
AMP = BackendHolding("amp", ("DCGM_.*",), until_ms=NOW - 12 * HOUR)


def test_unheld_reads_past_everyones_retention() -> None:
    # The docstring's example: local holds node_* for the last 6 h; a query a day back reads
    # node_load1 over [t - 5m lookback, t] for t in the hour: nobody holds that time.
    start, end = NOW - 24 * HOUR, NOW - 23 * HOUR
    route = route_piece("node_load1", start, end, [LOCAL], step_ms=60_000)
    assert route.backends == ("local",)
    (got,) = unheld_reads(parse("node_load1"), route, [LOCAL], start, end)
    assert (got["backend"], got["metric"], got["held_by"]) == ("local", "node_load1", [])
    assert (got["from_ms"], got["to_ms"]) == (start - 300_000, end)
    assert got["note"].startswith("no store holds node_load1 in ") and "answers empty there" in got["note"]
    # Within local's window nothing is unheld.
    inside = route_piece("node_load1", NOW - HOUR, NOW, [LOCAL], step_ms=60_000)
    assert unheld_reads(parse("node_load1"), inside, [LOCAL], NOW - HOUR, NOW) == []


def test_unheld_reads_names_the_stores_that_hold_some() -> None:
    start, end = NOW - 24 * HOUR, NOW - 13 * HOUR  # amp holds DCGM_* there, local does not
    (got,) = unheld_reads(parse("max_over_time(DCGM_A[1h])"), Route("single", ("local",)), [LOCAL, AMP], start, end)
    assert got["held_by"] == ["amp"] and (got["from_ms"], got["to_ms"]) == (start - HOUR, end)
    assert got["note"].startswith("local holds no samples of DCGM_A in ") and "amp hold some of them" in got["note"]
    assert unheld_reads(parse("DCGM_A"), Route("unroutable", ()), [LOCAL, AMP], start, end) == []
