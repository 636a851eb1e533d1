"""The top of the planned path (proxy/pipeline/merging.py), each stage with a fake next stage:
Fallback (a piece's backend error is the answer; a shape the merge cannot model goes to the
relay, unless the query spans backends) and Merge (pieces merged in one order, a tied topk
rerun unsharded, nothing merged under explain)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxy.backends import BackendReply
from proxy.codec.errors import Undecodable
from proxy.errors import PromError
from proxy.pipeline.context import RequestContext
from proxy.pipeline.explain import Explanation
from proxy.pipeline.lookup import Pieces, Segment
from proxy.pipeline.merging import Fallback, Merge
from proxy.pipeline.planning import Planner
from proxy.pipeline.values import Answer, PieceFailed, Query
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest, Span
from shardplanner.routing import Route, TimePart
from tests.pipeline.stage_helpers import T0, FakeBackend, H, Recorder, config, range_query, run, series, values_of

ERROR = BackendReply(400, b'{"status":"error","errorType":"bad_data","error":"x"}', "application/json")


def planned(hours: int = 3) -> Query:
    q = range_query("up", hours=hours)
    return replace(q, plan=run(Planner(config(split_interval="1h"), FakeBackend()).plan(q.req)))  # type: ignore[arg-type]


def test_fallback_answers_with_a_pieces_backend_error() -> None:
    relay = Recorder()
    answer = run(Fallback(relay, Recorder(PieceFailed(ERROR)))(planned(3)))
    assert answer.reply is ERROR and answer.headers == {"X-Promaccel-Pieces": "3"} and relay.got == []


def test_fallback_hands_an_unmergeable_shape_to_the_relay() -> None:
    whole = Answer(reply=BackendReply(200, b"{}", "application/json"), headers={"X-Promaccel-Pieces": "1"})
    relay = Recorder(whole)
    q = planned(3)
    assert run(Fallback(relay, Recorder(Undecodable("native histogram")))(q)) is whole
    assert relay.got == [q]
    single = replace(q, whole=Route.single("prom"))
    run(Fallback(relay, Recorder(Undecodable("native histogram")))(single))
    assert relay.got[-1] is single


def test_fallback_refuses_an_unmergeable_shape_across_backends() -> None:
    relay = Recorder()
    q = replace(planned(3), whole=Route("split_time", ("prom", "amp"),
                                         (TimePart(T0, T0 + H, ("amp",)), TimePart(T0 + H, T0 + 3 * H, ("prom",)))))
    with pytest.raises(PromError, match="cannot be merged across backends") as err:
        run(Fallback(relay, Recorder(Undecodable("native histogram")))(q))
    assert err.value.status == 422 and relay.got == []


def test_fallback_lets_other_errors_through() -> None:
    with pytest.raises(PromError, match="deadline"):
        run(Fallback(Recorder(), Recorder(PromError("timeout", "deadline")))(planned(1)))


def test_merge_under_explain_merges_nothing() -> None:
    rec = Recorder(Pieces([], "MISS"))
    q = replace(planned(2), ctx=RequestContext(explain=Explanation(False)))
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    answer = run(Merge(planner, rec)(q))
    assert rec.got == [q] and answer.result is None and answer.reply is None and answer.headers == {}


def test_merge_keeps_the_arrow_choice() -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    a = QueryResult.from_series("matrix", [series({T0: 1.0}, job="a")])
    q = replace(planned(1), want_arrow=True)
    answer = run(Merge(planner, Recorder(Pieces([((-1, "", T0), -1, None, a)], "HIT")))(q))
    assert answer.arrow and answer.headers["X-Cache"] == "HIT"


def test_merge_concatenates_time_pieces_in_order() -> None:
    q = range_query("up", hours=2)
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    q = replace(q, plan=run(planner.plan(q.req)))
    a = QueryResult.from_series("matrix", [series({T0: 1.0}, job="a")])
    b = QueryResult.from_series("matrix", [series({T0 + H: 2.0}, job="a")])
    segments: list[Segment] = [((-1, "", T0), -1, None, a), ((-1, "", T0 + H), -1, None, b)]
    pieces = Pieces(segments, "PARTIAL")
    answer = run(Merge(planner, Recorder(pieces))(q))
    assert answer.result is not None and answer.result.to_pylist() == [({"job": "a"}, [T0, T0 + H], [1.0, 2.0])]
    assert answer.headers == {"X-Promaccel-Pieces": "2", "X-Cache": "PARTIAL"}


def test_merge_reruns_a_tied_topk_unsharded() -> None:
    planner = Planner(config(shards=2), FakeBackend())  # type: ignore[arg-type]
    planner.shard_values.get = lambda labels, tenant=None: values_of({"Hostname": ("a", "b", "c", "d")})  # type: ignore[method-assign]
    q = Query(req=QueryRequest(query="topk(1, DCGM_FI_DEV_GPU_UTIL)", span=Span.instant(T0)), pairs=[], path="/api/v1/query",
              timeout_s=5)
    q = replace(q, plan=run(planner.plan(q.req)))
    assert q.plan is not None and q.plan.sharded
    tie_a = QueryResult.from_series("vector", [series({T0: 5.0}, Hostname="a")])
    tie_b = QueryResult.from_series("vector", [series({T0: 5.0}, Hostname="c")])
    plans: list[Any] = []

    def answer(query: Query) -> Pieces:
        plans.append(query.plan)
        if query.plan is not None and query.plan.sharded:
            return Pieces([((0, "", T0), 0, None, tie_a), ((1, "", T0), 1, None, tie_b)], "MISS")
        return Pieces([((-1, "", T0), -1, None, tie_a)], "MISS")

    result = run(Merge(planner, Recorder(answer))(q))
    assert [p.sharded for p in plans] == [True, False]
    assert result.result.to_pylist() == [({"Hostname": "a"}, [T0], [5.0])]
