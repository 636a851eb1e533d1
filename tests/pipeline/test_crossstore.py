"""CrossStore (proxy/pipeline/crossstore.py) in-process: the tree it decides for a query no
single backend answers -- which subtrees run as queries of their own, on which backend, over
which steps, and what promaccel evaluates above them -- and the stage's answer over a fake
planned path. Real servers: tests/e2e/test_crossstore_traps.py and tests/e2e/test_hybrid.py.

Two fleets, as tests/hybrid.py configures its scenarios (local is primary in each):

    by_metric  local holds node_*            amp holds DCGM_*
    by_time    local holds since T           amp holds until T + 30m
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from loadtests.gen import iso_utc
from proxy.backends import Backend, BackendReply
from proxy.config import build_config
from proxy.engine.nodes import (
    AggregateNode,
    BinaryNode,
    Literal,
    Node,
    SegmentsNode,
    SubqueryNode,
    UnionNode,
    WindowNode,
)
from proxy.errors import PromError
from proxy.pipeline.crossstore import CrossStore, Sub, cache_status, piece_count, subqueries, tree_backends
from proxy.pipeline.hybrid.route import router_for, whole_route
from proxy.pipeline.names import MetricNames
from proxy.pipeline.planning import Planner
from proxy.pipeline.values import Answer, PieceFailed, Query
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest, Span

MIN = 60_000
H = 60 * MIN
T = 1_793_480_400_000  # 2026-10-31T21:00:00Z, on an hour (tests/hybrid.py's T)
BY_METRIC = ({"metrics": ["node_.*"]}, {"metrics": ["DCGM_.*"]})
BY_TIME = ({"since": iso_utc(T // 1000)}, {"until": iso_utc((T + 30 * MIN) // 1000)})
JOIN = ('sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left '
        'label_replace(node_load1, "Hostname", "$1", "instance", "(.+):9100")')


def fleet(holds: tuple[dict[str, Any], dict[str, Any]]) -> tuple[Planner, list[Backend]]:
    cfg = build_config({"backends": [
        {"name": "local", "url": "http://127.0.0.1:1", "holds": holds[0]},
        {"name": "amp", "url": "http://127.0.0.1:2", "holds": holds[1]},
    ], "cache": {"enabled": False}})
    backends = [Backend(b) for b in cfg.backends]
    return Planner(cfg, backends[0]), backends


async def routed(planner: Planner, backends: Sequence[Backend], req: QueryRequest,
                 pairs: Sequence[tuple[str, str]] = ()) -> Query:
    """`req` as the Plan and Route stages hand it to CrossStore."""
    plan = await planner.plan(req)
    router = router_for(backends, req, plan)
    path = "/api/v1/query_range" if req.is_range else "/api/v1/query"
    return Query(req=req, pairs=list(pairs), path=path, timeout_s=5, plan=plan, router=router,
                 whole=whole_route(router, req))


def tree_of(holds: tuple[dict[str, Any], dict[str, Any]], req: QueryRequest,
            pairs: Sequence[tuple[str, str]] = (), names: frozenset[str] | None = None) -> Node:
    async def go() -> Node:
        planner, backends = fleet(holds)
        cross = CrossStore(planner, backends, _never)
        if names is not None:
            cross.names = KnownNames(backends, names)
        return await cross.tree(await routed(planner, backends, req, pairs))

    return asyncio.run(go())


async def _never(q: Query) -> Answer:
    raise AssertionError("tree() runs nothing")


class KnownNames(MetricNames):
    """The stores' metric names without asking them."""

    def __init__(self, backends: Sequence[Backend], names: frozenset[str]) -> None:
        super().__init__(backends, 60_000)
        self.fixed = names

    async def known(self, *args: Any, **kw: Any) -> frozenset[str]:  # any tenant, missed or not
        return self.fixed


def where(tree: Node) -> list[tuple[str, tuple[str, ...]]]:
    """Each subquery of a tree: its query and the backends its route asks."""
    return [(s.req.query, tuple(s.route.backends)) for s in subqueries(tree)]


# --- what runs where ------------------------------------------------------------------------------


def test_a_join_across_stores_runs_each_side_on_its_store_and_joins_here() -> None:
    tree = tree_of(BY_METRIC, QueryRequest.instant(JOIN, T))
    assert isinstance(tree, BinaryNode) and tree.text() == "* on (Hostname) group_left ()"
    assert where(tree) == [("sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", ("amp",)),
                           ('label_replace(node_load1, "Hostname", "$1", "instance", "(.+):9100")', ("local",))]
    assert all(s.req.span == Span.instant(T) for s in subqueries(tree))  # at the query's own time
    assert tree_backends(tree) == ["amp", "local"]
    # Each side is one piece: an instant query, no shard values (nobody answers here).
    assert [len(s.plan.pieces) for s in subqueries(tree)] == [1, 1] and piece_count(tree) == 2


def test_the_largest_subtree_one_store_answers_stays_whole() -> None:
    # The ratio of two DCGM sums is AMP's to answer: one subquery, not two joined here.
    tree = tree_of(BY_METRIC, QueryRequest.instant(
        "sum(DCGM_FI_DEV_GPU_UTIL) / sum(DCGM_FI_DEV_POWER_USAGE) + sum(node_load1)", T))
    assert isinstance(tree, BinaryNode) and tree.text() == "+"
    assert where(tree) == [("sum(DCGM_FI_DEV_GPU_UTIL) / sum(DCGM_FI_DEV_POWER_USAGE)", ("amp",)),
                           ("sum(node_load1)", ("local",))]
    # A query one store holds whole is one subquery of that store's.
    whole = tree_of(BY_METRIC, QueryRequest.instant("sum(DCGM_FI_DEV_GPU_UTIL)", T))
    assert isinstance(whole, Sub) and where(whole) == [("sum(DCGM_FI_DEV_GPU_UTIL)", ("amp",))]


def test_an_aggregation_above_a_join_with_an_expression_parameter() -> None:
    tree = tree_of(BY_METRIC, QueryRequest.instant(
        "topk(2 * 3, sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL) + on (Hostname) sum by (Hostname) (node_load1))", T))
    assert isinstance(tree, AggregateNode) and tree.text() == "topk"
    assert isinstance(tree.expr, BinaryNode) and isinstance(tree.param, Literal) and tree.param.value == 6.0
    assert [b for _, b in where(tree)] == [("amp",), ("local",)]


def test_one_selector_over_metrics_of_both_stores_is_a_union_of_each_stores_share() -> None:
    names = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "node_load1"})
    tree = tree_of(BY_METRIC, QueryRequest.instant('sum({__name__=~"DCGM_FI_DEV_GPU_UTIL|node_load1"})', T),
                   names=names)
    assert isinstance(tree, AggregateNode) and isinstance(tree.expr, UnionNode)
    assert sorted(b for _, b in where(tree)) == [("amp",), ("local",)]
    for query, (backend,) in where(tree):  # each store is asked for its own metric only
        assert ("DCGM_FI_DEV_GPU_UTIL" in query) == (backend == "amp")
        assert ("node_load1" in query) == (backend == "local")


# --- across time ----------------------------------------------------------------------------------


def test_only_the_steps_no_store_answers_are_evaluated_here() -> None:
    """sum(increase(x[2h])) from T-2h to T+3h every 5m: amp (until T+30m) holds the whole
    window of the steps up to T+30m, local (since T) of the steps from T+2h; the steps
    between read a window that straddles T and are evaluated here over raw samples."""
    step = 5 * MIN
    req = QueryRequest.range("sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h]))", T - 2 * H, T + 3 * H, step)
    tree = tree_of(BY_TIME, req)
    assert isinstance(tree, SegmentsNode) and len(tree.parts) == 3
    first, middle, last = tree.parts
    assert isinstance(first, Sub) and first.route.backends == ("amp",)
    assert (first.req.span.start_ms, first.req.span.end_ms) == (T - 2 * H, T + 30 * MIN)
    assert isinstance(last, Sub) and last.route.backends == ("local",)
    assert (last.req.span.start_ms, last.req.span.end_ms) == (T + 2 * H, T + 3 * H)
    assert isinstance(middle, AggregateNode) and isinstance(middle.expr, WindowNode)
    assert (middle.req.span.start_ms, middle.req.span.end_ms) == (T + 35 * MIN, T + 115 * MIN)
    window = middle.expr.window
    # The windows of the middle steps: from the first one's start to the last one's end.
    assert (window.lo, window.hi) == (T + 35 * MIN - 2 * H, T + 115 * MIN)
    assert_reads_cover(window.reads, window.lo, window.hi)
    assert window.uncovered() == []


def assert_reads_cover(reads: Sequence[tuple[str, int, int]], lo: int, hi: int) -> None:
    """Each instant of [lo, hi] read once, from a store that holds it."""
    spans = sorted(reads, key=lambda r: r[1])
    assert spans[0][1] == lo and spans[-1][2] == hi
    assert all(b[1] == a[2] + 1 for a, b in zip(spans, spans[1:]))  # no gap, no overlap
    for backend, a, b in spans:
        assert (backend == "amp" and b <= T + 30 * MIN) or (backend == "local" and a >= T), (backend, a, b)


def test_a_window_straddling_the_stores_reads_each_stretch_from_its_store() -> None:
    tree = tree_of(BY_TIME, QueryRequest.instant("increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h])", T + 2 * H))
    assert isinstance(tree, WindowNode) and subqueries(tree) == []
    assert (tree.window.lo, tree.window.hi) == (T - H, T + 2 * H)
    assert_reads_cover(tree.window.reads, tree.window.lo, tree.window.hi)
    assert set(tree_backends(tree)) == {"amp", "local"}


def test_a_subquery_straddling_the_stores_asks_its_inner_query_on_its_own_grid() -> None:
    tree = tree_of(BY_TIME, QueryRequest.instant("max_over_time(sum(DCGM_FI_DEV_GPU_UTIL)[3h:5m])", T + 2 * H))
    assert isinstance(tree, SubqueryNode)
    (inner,) = subqueries(tree)
    # The 5m grid's steps in (T+2h-3h, T+2h], the first on a multiple of 5m: T-1h is one.
    assert inner.req.query == "sum(DCGM_FI_DEV_GPU_UTIL)"
    assert inner.req.span == Span.range(T - H, T + 2 * H, 5 * MIN)
    assert inner.route.kind == "split_time" and set(inner.route.backends) == {"amp", "local"}


# --- what is refused --------------------------------------------------------------------------


@pytest.mark.parametrize(("holds", "req", "pairs", "says"), [
    # query stats are per backend (no merge of them exists): the 422 names the metrics and
    # the stores that hold them
    (BY_METRIC, QueryRequest.instant(JOIN, T), [("stats", "all")],
     ("DCGM_FI_DEV_GPU_UTIL", "node_load1", "-> amp", "-> local")),
    # a subquery's inner grid is bounded like a client's range query
    (BY_TIME, QueryRequest.instant("max_over_time(sum(DCGM_FI_DEV_GPU_UTIL)[30d:1s])", T + 2 * H), [],
     ("limits.max_points",)),
])
def test_what_cannot_be_answered_exactly_is_a_422(holds: Any, req: QueryRequest, pairs: list[tuple[str, str]],
                                                  says: tuple[str, ...]) -> None:
    with pytest.raises(PromError) as err:
        tree_of(holds, req, pairs)
    assert err.value.kind == "execution" and err.value.status == 422
    text = str(err.value)
    assert all(s in text for s in says), text


# --- the stage ------------------------------------------------------------------------------------


def answer_of(per_store: Callable[[Query], Answer], query: str = JOIN) -> Answer:
    async def run(sub: Query) -> Answer:
        return per_store(sub)

    async def go() -> Answer:
        planner, backends = fleet(BY_METRIC)
        return await CrossStore(planner, backends, run)(await routed(planner, backends, QueryRequest.instant(query, T)))

    return asyncio.run(go())


def test_the_stage_evaluates_above_the_answers_of_the_subqueries() -> None:
    def per_store(sub: Query) -> Answer:
        assert sub.router is not None and sub.whole is None  # each subquery is routed on its own
        if "DCGM" in sub.req.query:
            series = [({"Hostname": "a"}, [T], [10.0]), ({"Hostname": "b"}, [T], [20.0])]
            return Answer(result=QueryResult.from_series("vector", series), headers={"X-Cache": "HIT"})
        series = [({"__name__": "node_load1", "instance": "a:9100", "Hostname": "a"}, [T], [0.5])]
        return Answer(result=QueryResult.from_series("vector", series), headers={"X-Cache": "MISS"})

    answer = answer_of(per_store)
    assert answer.result is not None
    # `* on (Hostname) group_left`: only host a matches; the result keeps the many side's labels
    # and drops the metric name.
    assert answer.result.to_pylist() == [({"Hostname": "a"}, [T], [5.0])]
    assert answer.headers["X-Cache"] == "PARTIAL"  # one part from the cache, one not
    assert answer.headers["X-Promaccel-Pieces"] == "2"  # one piece per side


def test_a_subquerys_backend_error_is_relayed() -> None:
    refused = BackendReply(422, b'{"status":"error","errorType":"execution","error":"too many samples"}',
                           "application/json")

    def per_store(sub: Query) -> Answer:
        if "DCGM" in sub.req.query:
            raise PieceFailed(refused)
        return Answer(result=QueryResult.from_series("vector", [({"Hostname": "a"}, [T], [1.0])]))

    answer = answer_of(per_store)
    assert answer.result is None and answer.reply is refused


def test_cache_status_of_the_parts() -> None:
    assert cache_status(["HIT", "HIT"]) == "HIT"
    assert cache_status(["MISS", "MISS"]) == cache_status([]) == "MISS"
    assert cache_status(["HIT", "MISS"]) == cache_status(["PARTIAL"]) == "PARTIAL"


def test_subqueries_of_a_tree_are_its_sub_leaves_left_to_right() -> None:
    tree = tree_of(BY_METRIC, QueryRequest.instant(
        "sum(node_load1) + sum(DCGM_FI_DEV_GPU_UTIL) * sum(node_load5)", T))
    assert [q for q, _ in where(tree)] == ["sum(node_load1)", "sum(DCGM_FI_DEV_GPU_UTIL)", "sum(node_load5)"]
    assert tree_backends(tree) == ["local", "amp"]
