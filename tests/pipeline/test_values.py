"""The values that flow down the pipeline (proxy/pipeline/values.py): a `Query` is never changed
in place, only derived; what a client sent besides the planned parameters rides along with
every piece's call; an `Answer`'s mutable parts are its own."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.backends import BackendReply
from proxy.pipeline.values import PLANNED_PARAMS, Answer, CacheCtx, PieceFailed, Query
from shardplanner.plan import QueryRequest

T0 = 1_700_000_000_000


def query(pairs: list[tuple[str, str]]) -> Query:
    return Query(req=QueryRequest.instant("sum(up)", T0), pairs=pairs, path="/api/v1/query", timeout_s=5)


def test_a_query_is_derived_never_changed() -> None:
    q = query([("query", "sum(up)")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.timeout_s = 1  # type: ignore[misc]
    derived = dataclasses.replace(q, want_arrow=True, client="10.0.0.1")
    assert (derived.want_arrow, derived.client) == (True, "10.0.0.1")
    assert (q.want_arrow, q.client) == (False, "")  # the one a stage was handed is as it was
    assert derived.req is q.req and derived.pairs is q.pairs
    assert derived.ctx is q.ctx  # one request's context (its budget, its tally) all the way down


def test_extra_is_what_the_client_sent_besides_the_planned_parameters() -> None:
    sent = [("query", "sum(up)"), ("timeout", "10s"), ("time", "1700000000"), ("dedup", "true"),
            ("query", "sum(other)"), ("dedup", "false"), ("step", "60")]
    # In the order sent, repeats kept; a second `query` (or start/end/step/time) never rides
    # along with a piece's call: the plan sets those.
    assert query(sent).extra == [("timeout", "10s"), ("dedup", "true"), ("dedup", "false")]
    assert {"query", "start", "end", "step", "time"} <= PLANNED_PARAMS


def test_a_query_asking_for_stats_cannot_be_merged_from_pieces() -> None:
    assert query([("query", "sum(up)"), ("stats", "all")]).unmergeable
    assert not query([("query", "sum(up)"), ("timeout", "5s")]).unmergeable


def test_answers_do_not_share_their_headers_or_info() -> None:
    a, b = Answer(), Answer()
    a.headers["X-Cache"] = "HIT"
    a.info["pieces"] = 3
    assert b.headers == {} and b.info == {}
    assert (a.result, a.reply, a.arrow, a.release) == (None, None, False, None)


def test_cache_context_is_a_value() -> None:
    ctx = CacheCtx("team-a", ("prometheus",), T0, 300_000)
    assert ctx == CacheCtx("team-a", ("prometheus",), T0, 300_000) and hash(ctx) == hash(
        CacheCtx("team-a", ("prometheus",), T0, 300_000))
    assert ctx != dataclasses.replace(ctx, tenant="team-b")


def test_a_failed_piece_carries_the_backends_reply() -> None:
    reply = BackendReply(422, b'{"status":"error","errorType":"execution","error":"x"}', "application/json")
    failed = PieceFailed(reply)
    assert failed.reply is reply and str(failed) == "422"
