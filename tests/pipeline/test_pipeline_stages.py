"""Each stage of the request path on its own, with a fake next stage (no socket, no server).

The end-to-end equivalence suites prove the answers; these pin down what each stage does to
the value it receives and to the answer it returns (proxy/pipeline/path.py lists them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.backends import BackendReply
from proxy.codec.errors import Undecodable
from proxy.pipeline.lookup import Pieces
from proxy.pipeline.merging import Fallback, Merge
from proxy.pipeline.planning import Planner
from proxy.pipeline.values import PieceFailed, Query
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest, Span
from tests.pipeline.stage_helpers import T0, FakeBackend, H, Recorder, config, range_query, run, series
from tests.pipeline.stage_helpers import values_of as _values

# --- Fallback -------------------------------------------------------------------------------


def test_fallback_relays_a_piece_error_and_forwards_undecodable_shapes() -> None:
    backend = FakeBackend()
    q = range_query("up")
    q = replace(q, plan=run(Planner(config(split_interval="1h"), backend).plan(q.req)))
    reply = BackendReply(400, b'{"status":"error","errorType":"bad_data","error":"x"}', "application/json")
    answer = run(Fallback({"default": backend}, backend, Recorder(PieceFailed(reply)))(q))  # type: ignore[arg-type]
    assert answer.reply is reply and answer.headers["X-Promaccel-Pieces"] == "3"
    answer = run(Fallback({"default": backend}, backend, Recorder(Undecodable("native histogram")))(q))  # type: ignore[arg-type]
    assert backend.calls == [("POST", "/api/v1/query_range")] and answer.reply is not None


# --- Merge ----------------------------------------------------------------------------------


def test_merge_concatenates_time_pieces_in_order() -> None:
    q = range_query("up", hours=2)
    planner = Planner(config(split_interval="1h"), FakeBackend())
    q = replace(q, plan=run(planner.plan(q.req)))
    a = QueryResult.from_series("matrix", [series({T0: 1.0}, job="a")])
    b = QueryResult.from_series("matrix", [series({T0 + H: 2.0}, job="a")])
    pieces = Pieces([((-1, "", T0 + H), -1, None, b), ((-1, "", T0), -1, None, a)][::-1], "PARTIAL")
    answer = run(Merge(planner, Recorder(pieces))(q))
    assert answer.result is not None and answer.result.to_pylist() == [({"job": "a"}, [T0, T0 + H], [1.0, 2.0])]
    assert answer.headers == {"X-Promaccel-Pieces": "2", "X-Cache": "PARTIAL"}


def test_merge_reruns_a_tied_topk_unsharded() -> None:
    planner = Planner(config(shards=2), FakeBackend())
    planner.shard_values.get = lambda labels, tenant=None: _values({"Hostname": ("a", "b", "c", "d")})  # type: ignore[method-assign]
    q = Query(req=QueryRequest(query="topk(1, DCGM_FI_DEV_GPU_UTIL)", span=Span.instant(T0)), pairs=[], path="/api/v1/query",
              timeout_s=5)
    q = replace(q, plan=run(planner.plan(q.req)))
    assert q.plan is not None and q.plan.sharded
    tie_a = QueryResult.from_series("vector", [series({T0: 5.0}, Hostname="a")])
    tie_b = QueryResult.from_series("vector", [series({T0: 5.0}, Hostname="c")])
    plans: list[Any] = []

    def answer(query: Query) -> Pieces:
        plans.append(query.plan)
        if query.plan.sharded:
            return Pieces([((0, "", T0), 0, None, tie_a), ((1, "", T0), 1, None, tie_b)], "MISS")
        return Pieces([((-1, "", T0), -1, None, tie_a)], "MISS")

    result = run(Merge(planner, Recorder(answer))(q))
    assert [p.sharded for p in plans] == [True, False]
    assert result.result.to_pylist() == [({"Hostname": "a"}, [T0], [5.0])]
