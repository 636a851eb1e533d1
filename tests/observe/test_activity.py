"""proxy/observe/activity.py: the operator page's recorder, in process with a fake clock.

A query's record lives in flight (the first `max_in_flight` listed, all counted), then among
the last `recent` finished ones, newest first; only the listed fields are kept and texts are
cut; every minute of the last hour tallies queries, errors, cache lookups and backend calls,
the process's and each tenant's (a bounded number of them); a backend's last call and last
error are kept, readiness probes counting only as errors; lookups and calls are charged to the
query they were made for while it runs, never after; a tenant's snapshot holds its own queries
and minutes only.

The record a lookup or call is charged to is handed over explicitly (issue 29 item 1: the
query's RequestContext carries it)."""

from __future__ import annotations

import pytest

from proxy.observe import activity
from proxy.observe.activity import MAX_TEXT, MINUTES, SHOWN_FIELDS, Activity, QueryRecord, cut

T0 = 60 * 29_000_000  # a minute boundary


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _activity(recent: int = 5, max_in_flight: int = 200) -> tuple[Activity, Clock]:
    clock = Clock()
    return Activity(recent=recent, max_in_flight=max_in_flight, clock=clock, perf=clock), clock


def _minute(act: Activity, tenant: str | None = None, back: int = 0) -> dict[str, object]:
    """The tally of the current minute (`back` minutes before it)."""
    minutes = act.snapshot(tenant)["minutes"]
    assert len(minutes) == MINUTES
    tally: dict[str, object] = minutes[-1 - back]
    return tally


# --- cut and note ---------------------------------------------------------------------------------


def test_cut_keeps_texts_up_to_the_limit_and_says_how_much_it_dropped() -> None:
    assert cut("x" * MAX_TEXT) == "x" * MAX_TEXT
    assert cut("x" * (MAX_TEXT + 1)) == "x" * MAX_TEXT + "... (1 more characters)"
    assert cut("abcdef", 3) == "abc... (3 more characters)"
    assert cut("", 0) == ""


def test_note_keeps_only_shown_fields_and_cuts_texts() -> None:
    rec = QueryRecord(1, "q", "GET", "/api/v1/query", 0.0, 0.0)
    rec.note(query="y" * (MAX_TEXT + 10), pieces=12, sharded=True, authorization="Bearer x",
             x_scope_orgid="t", headers={"cookie": "c"})
    assert set(rec.fields) == {"query", "pieces", "sharded"} <= set(SHOWN_FIELDS)
    assert rec.fields["pieces"] == 12 and rec.fields["sharded"] is True
    assert rec.fields["query"] == cut("y" * (MAX_TEXT + 10))


# --- in flight, then recent -----------------------------------------------------------------------


def test_records_are_numbered_listed_in_flight_then_recent_newest_first() -> None:
    act, clock = _activity(recent=2)
    a, b, c = (act.begin(f"id{i}", "POST", "/api/v1/query_range") for i in range(3))
    assert [a.seq, b.seq, c.seq] == sorted({a.seq, b.seq, c.seq})  # distinct, increasing
    clock.t += 1.5
    snap = act.snapshot()
    assert snap["running"] == 3 and [r["query_id"] for r in snap["in_flight"]] == ["id0", "id1", "id2"]
    assert snap["in_flight"][0]["running_ms"] == 1500.0 and snap["in_flight"][0]["status"] is None
    act.finish(b, 200, 0.1234, {})
    act.finish(a, 503, 2.0, {}, error="unavailable: backend 'amp' is down")
    act.finish(c, 200, 0.01, {})
    snap = act.snapshot()
    assert snap["running"] == 0 and snap["in_flight"] == []
    assert [r["query_id"] for r in snap["recent"]] == ["id2", "id0"]  # the last 2 finished, newest first
    assert snap["recent"][1]["duration_ms"] == 2000.0 and "running_ms" not in snap["recent"][1]
    assert snap["recent"][1]["error"] == "unavailable: backend 'amp' is down"


def test_beyond_max_in_flight_a_query_is_counted_and_listed_once_done() -> None:
    act, _ = _activity(recent=10, max_in_flight=1)
    first, second = act.begin("a", "GET", "/api/v1/query"), act.begin("b", "GET", "/api/v1/query")
    snap = act.snapshot()
    assert snap["running"] == 2 and [r["query_id"] for r in snap["in_flight"]] == ["a"]
    act.finish(second, 200, 0.1, {})  # never listed in flight: finishing it leaves the first listed
    snap = act.snapshot()
    assert snap["running"] == 1 and [r["query_id"] for r in snap["in_flight"]] == ["a"]
    assert [r["query_id"] for r in snap["recent"]] == ["b"]
    act.finish(first, 200, 0.1, {})
    assert act.snapshot()["running"] == 0


def test_finish_keeps_the_text_noted_first_and_the_errors_start() -> None:
    act, _ = _activity()
    rec = act.begin("q", "GET", "/api/v1/query")
    rec.note(query="the query as read")
    act.finish(rec, 400, 0.0004, {"query": "cut by the access log", "cache": "MISS", "bytes": 99},
               error="e" * 600)
    shown = act.snapshot()["recent"][0]
    assert shown["query"] == "the query as read" and shown["cache"] == "MISS" and shown["bytes"] == 99
    assert shown["error"] == cut("e" * 600, 500) and shown["duration_ms"] == 0.4
    ok = act.begin("r", "GET", "/api/v1/query")
    act.finish(ok, 200, 0.1, {"query": "taken when none was noted"}, error="")
    shown = act.snapshot()["recent"][0]
    assert shown["query"] == "taken when none was noted" and shown["error"] is None


def test_resize_keeps_the_newest() -> None:
    act, _ = _activity(recent=5)
    for i in range(5):
        act.finish(act.begin(f"id{i}", "GET", "/api/v1/query"), 200, 0.1, {})
    act.resize(2)
    assert [r["query_id"] for r in act.snapshot()["recent"]] == ["id4", "id3"]
    act.resize(0)  # at least one
    assert [r["query_id"] for r in act.snapshot()["recent"]] == ["id4"]


# --- minutes --------------------------------------------------------------------------------------


def test_each_minute_tallies_queries_and_errors() -> None:
    act, clock = _activity()
    for status in (200, 200, 400, 503):
        act.finish(act.begin("q", "GET", "/api/v1/query"), status, 0.1, {})
    clock.t += 60
    act.finish(act.begin("q", "GET", "/api/v1/query"), 422, 0.1, {})
    now, before = _minute(act), _minute(act, back=1)
    assert (before["queries"], before["errors"]) == (4, 2)
    assert (now["queries"], now["errors"]) == (1, 1) and now["t"] == T0 + 60
    assert before["hit_ratio"] is None and before["backend_avg_ms"] is None  # nothing looked up or called


def test_minute_slots_are_reused_an_hour_later_and_start_afresh() -> None:
    act, clock = _activity()
    act.pieces_looked_up(4, 0)
    act.backend_call("local", "query", 0.5, 200)
    clock.t += 60 * MINUTES  # the same slot, an hour later
    act.pieces_looked_up(0, 1)
    minutes = act.snapshot()["minutes"]
    assert sum(m["piece_hits"] for m in minutes) == 0 and sum(m["piece_misses"] for m in minutes) == 1
    assert sum(m["backend_calls"] for m in minutes) == 0
    assert [m["t"] for m in minutes] == [T0 + 60 * k for k in range(1, MINUTES + 1)]


def test_lookups_and_calls_are_tallied_with_their_ratio_average_and_maximum() -> None:
    act, _ = _activity()
    act.pieces_looked_up(3, 1)
    act.pieces_looked_up(0, 4)
    for seconds, status, error in ((0.1, 200, None), (0.3, 503, None), (0.2, None, "ConnectError"),
                                   (0.4, 404, None)):
        act.backend_call("amp", "query_range", seconds, status, error)
    m = _minute(act)
    assert (m["piece_hits"], m["piece_misses"], m["hit_ratio"]) == (3, 5, 0.375)
    assert m["backend_calls"] == 4 and m["backend_errors"] == 2  # a 5xx and no answer; a 404 is an answer
    assert m["backend_avg_ms"] == pytest.approx(250.0) and m["backend_max_ms"] == pytest.approx(400.0)


# --- backends -------------------------------------------------------------------------------------


def test_a_backends_last_call_and_last_error() -> None:
    act, clock = _activity()
    act.backend_call("amp", "query_range", 0.25, 503)
    clock.t += 5
    act.backend_call("amp", "query_range", 0.05, 200)
    clock.t += 5
    act.backend_call("amp", "ready", 10.0, None, "ReadTimeout")  # a probe: an error, not a call
    act.backend_call("amp", "ready", 0.01, 200)
    seen = act.snapshot()["backends"]["amp"]
    assert seen["calls"] == 2 and seen["errors"] == 2
    assert seen["last_status"] == 200 and seen["last_ms"] == 50.0 and seen["last_call"] == T0 + 5
    assert seen["last_error"] == "ready: ReadTimeout" and seen["last_error_at"] == T0 + 10
    assert _minute(act)["backend_calls"] == 2  # probes are not traffic
    act.backend_call("local", "query", 0.1, 500, None)
    assert act.snapshot()["backends"]["local"]["last_error"] == "query: HTTP 500"
    act.backend_call("local", "query", 0.1, None, "x" * 500)
    assert len(act.snapshot()["backends"]["local"]["last_error"]) < 260


# --- charged to the query -------------------------------------------------------------------------


def test_lookups_and_calls_are_charged_to_their_query_while_it_runs() -> None:
    act, _ = _activity()
    rec = act.begin("q", "POST", "/api/v1/query_range")
    act.pieces_looked_up(2, 3, rec)
    act.backend_call("local", "query_range", 0.1, 200, None, rec)
    act.backend_call("local", "query_range", 0.3, 502, None, rec)
    act.backend_call("local", "query_range", 9.0, 200)  # another query's call (or nobody's)
    act.pieces_looked_up(7, 7)
    act.finish(rec, 200, 0.5, {})
    act.pieces_looked_up(5, 5, rec)  # after it finished: not its own any more
    act.backend_call("local", "query_range", 1.0, 200, None, rec)
    shown = act.snapshot()["recent"][0]
    assert (shown["piece_hits"], shown["piece_misses"]) == (2, 3)
    assert shown["backend_ms"] == pytest.approx(400.0) and shown["backend_max_ms"] == pytest.approx(300.0)
    assert shown["backend_errors"] == 1
    m = _minute(act)  # the minute counts everything
    assert (m["piece_hits"], m["piece_misses"], m["backend_calls"]) == (14, 15, 4)


# --- tenants --------------------------------------------------------------------------------------


def test_a_tenants_snapshot_holds_its_own_queries_and_minutes_only() -> None:
    act, _ = _activity(recent=10)
    recs = {}
    for qid, tenant in (("g1", "gpu"), ("n1", "nodes"), ("anon", None), ("g2", "gpu")):
        recs[qid] = act.begin(qid, "GET", "/api/v1/query")
        recs[qid].tenant = tenant
    act.pieces_looked_up(1, 1, recs["g1"])
    act.backend_call("amp", "query", 0.2, 200, None, recs["n1"])
    act.finish(recs["g1"], 400, 0.1, {}, error="bad_data: gpu's own error")
    act.finish(recs["n1"], 200, 0.1, {})
    gpu = act.snapshot("gpu")
    assert [r["query_id"] for r in gpu["recent"]] == ["g1"] and gpu["recent"][0]["tenant"] == "gpu"
    assert [r["query_id"] for r in gpu["in_flight"]] == ["g2"] and gpu["running"] == 1
    assert "backends" not in gpu and "pid" not in gpu
    mine = _minute(act, "gpu")
    assert (mine["queries"], mine["errors"], mine["piece_hits"], mine["backend_calls"]) == (1, 1, 1, 0)
    theirs = _minute(act, "nodes")
    assert (theirs["queries"], theirs["errors"], theirs["piece_hits"], theirs["backend_calls"]) == (1, 0, 0, 1)
    assert _minute(act, "nobody-here")["queries"] == 0 and act.snapshot("nobody-here")["recent"] == []
    everything = act.snapshot()
    assert {r["query_id"] for r in everything["in_flight"] + everything["recent"]} == {"g1", "n1", "anon", "g2"}
    assert everything["running"] == 2 and _minute(act)["queries"] == 2 and "amp" in everything["backends"]


def test_tenant_tallies_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activity, "MAX_TENANTS", 2)
    act, _ = _activity(recent=10)
    for tenant in ("a", "b", "c"):
        rec = act.begin(tenant, "GET", "/api/v1/query")
        rec.tenant = tenant
        act.finish(rec, 200, 0.1, {})
    assert set(act.tenant_minutes) == {"a", "b"}
    assert _minute(act, "c")["queries"] == 0  # beyond the bound: not tallied for it...
    assert _minute(act)["queries"] == 3  # ... but in the process's tally
    assert [r["query_id"] for r in act.snapshot("c")["recent"]] == ["c"]  # and its queries are its own
