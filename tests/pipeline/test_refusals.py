"""The refusal splitter (proxy/pipeline/refusals.py) in-process (issue 28 item 3; real servers in
test_refusal_split.py): which errors are cut finer, shards before time (time when a tied
topk/bottomk cannot be merged from shards), the depth bound, the call budget, the deadline,
and what is remembered per metric. Moved from test_refusal_decisions.py (issue 29 item 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.backends import BackendReply
from proxy.backends.circuit import ClientDeadline
from proxy.codec.json_decode import decode_prometheus_json
from proxy.errors import PromError
from proxy.pipeline.context import Budget, Refused, RequestContext
from proxy.pipeline.refusals import Memory, RefusalSplitter, _cut_time, _halves, refusal
from proxy.pipeline.units import Fetch
from proxy.pipeline.values import PieceFailed
from proxy.result import QueryResult
from shardplanner.plan import PlannerSettings, Span

STEP = 30_000
T0 = 1_793_470_000_000 - 1_793_470_000_000 % STEP
PROM_SIZE = (b'{"status":"error","errorType":"execution","error":"query processing would load too many samples '
             b'into memory in query execution"}')
PROM_TIME = b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}'


def reply(status: int, body: bytes) -> PieceFailed:
    return PieceFailed(BackendReply(status, body, "application/json"))


def test_which_errors_are_refusals() -> None:
    assert refusal(reply(422, PROM_SIZE)) == "size"
    assert refusal(reply(422, b'{"status":"error","errorType":"execution","error":"expanding series: the query '
                              b'exceeded the maximum number of samples (limit: 50000000)"}')) == "size"  # Mimir/Cortex
    assert refusal(reply(400, b'{"status":"error","errorType":"bad_data","error":"the query hit the max number of '
                              b'chunks limit (limit: 2000000 chunks)"}')) == "size"
    assert refusal(reply(503, PROM_TIME)) == "time"
    assert refusal(reply(422, b'{"status":"error","errorType":"execution","error":"query timed out in query '
                              b'execution"}')) == "time"  # AMP
    assert refusal(PromError("timeout", "backend 'prom' did not answer in time")) == "time"  # its own timeout
    # Not refusals: a bad query, the backend down or throttled, the client's deadline.
    assert refusal(reply(400, b'{"status":"error","errorType":"bad_data","error":"parse error"}')) is None
    assert refusal(reply(422, b'{"status":"error","errorType":"execution","error":"many-to-many matching"}')) is None
    assert refusal(reply(503, b'{"status":"error","errorType":"unavailable","error":"down"}')) is None
    assert refusal(reply(429, PROM_SIZE)) is None
    assert refusal(ClientDeadline(PromError("timeout", "x"))) is None
    assert refusal(PromError("unavailable", "connection refused")) is None


def test_halves_and_cuts_keep_the_grid() -> None:
    span = Span.range(T0, T0 + 120 * STEP, STEP)  # 121 points
    a, b = _halves(span) or []
    assert (a.points, b.points) == (61, 60) and b.start_ms == a.end_ms + STEP and b.end_ms == span.end_ms
    assert _halves(Span.range(T0, T0, STEP)) is None and _halves(Span.instant(T0)) is None
    parts = _cut_time(span, 30 * STEP)
    assert all(p.end_ms - p.start_ms <= 30 * STEP for p in parts)
    assert sum(p.points for p in parts) == 121 and parts[0].start_ms == T0 and parts[-1].end_ms == span.end_ms
    assert all(q.start_ms == p.end_ms + STEP for p, q in zip(parts, parts[1:]))


class Fake:
    """A backend refusing what `refuse(query, span)` says (with `error`), else answering one
    series of 1s on the span's grid (per shard matcher: the sum merge then counts shards)."""

    def __init__(self, refuse: Any, error: BaseException | None = None) -> None:
        self.refuse = refuse
        self.error = error or reply(422, PROM_SIZE)
        self.calls: list[tuple[str, Span, bool]] = []

    async def answer(self, f: Fetch, path: str, form: Any, timeout_s: float, router: Any,
                     ctx: RequestContext) -> QueryResult:
        ctx.budget.charge()
        refused = bool(self.refuse(f.query, f.span))
        self.calls.append((f.query, f.span, refused))
        if refused:
            raise self.error
        ts = range(f.span.start_ms, f.span.end_ms + 1, f.span.step)
        body = {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {}, "values": [[t / 1000, "1"] for t in ts]}]}}
        return decode_prometheus_json(orjson.dumps(body))


def splitter(fake: Fake, values: dict[str, tuple[str, ...]] | None = None, **kw: Any) -> RefusalSplitter:
    async def get(tenant: Any) -> dict[str, tuple[str, ...]]:
        return values or {}

    return RefusalSplitter(fake, PlannerSettings(), get, **kw)


def run(s: RefusalSplitter, query: str, span: Span, timeout_s: float = 30.0, budget: Budget | None = None) -> QueryResult:
    async def go() -> QueryResult:
        ctx = RequestContext(budget=budget or Budget())
        return await s.answer(Fetch(query, None, -1, span), "/api/v1/query_range", [("query", query)], timeout_s, None,
                              ctx)

    return asyncio.run(go())


SPAN = Span.range(T0, T0 + 120 * STEP, STEP)


def test_time_halves_recursively_until_answered() -> None:
    fake = Fake(lambda q, span: span.points > 40)
    got = run(splitter(fake), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN)  # not shardable
    assert list(got.t_ms) == list(range(SPAN.start_ms, SPAN.end_ms + 1, STEP))
    answered = [span.points for _, span, refused in fake.calls if not refused]
    assert sorted(answered) == [30, 30, 30, 31] and sum(1 for c in fake.calls if c[2]) == 3  # 121, 61, 60


def test_shards_before_time() -> None:
    values: dict[str, tuple[str, ...]] = {"Hostname": ("a", "b", "c", "d")}
    fake = Fake(lambda q, span: "Hostname" not in q)  # any shard fits
    got = run(splitter(fake, values, shards=4), "sum(DCGM_FI_DEV_GPU_UTIL)", SPAN)
    shard_calls = [q for q, _, refused in fake.calls if not refused]
    assert len(fake.calls) == 5 and len(shard_calls) == 4 and all("Hostname" in q for q in shard_calls)
    assert {span for _, span, _ in fake.calls} == {SPAN}  # not cut in time
    assert list(got.value) == [4.0] * SPAN.points  # sum of the four shards' sums


def test_depth_bound_then_the_refusal_stands() -> None:
    fake = Fake(lambda q, span: True)
    with pytest.raises(PieceFailed) as e:
        run(splitter(fake, max_depth=2), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN)
    assert e.value.reply.status == 422
    assert len(fake.calls) == 1 + 2 + 4  # the piece, its halves, their halves: no deeper


def test_budget_bounds_the_cut() -> None:
    fake = Fake(lambda q, span: span.points > 40)
    with pytest.raises(PieceFailed):  # 1 call made, 2 more allowed, 6 needed
        run(splitter(fake), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN, budget=Budget(3, 0))
    assert len(fake.calls) <= 3
    fake = Fake(lambda q, span: span.points > 40)
    with pytest.raises(PieceFailed):  # no room for any cut: the refusal is the answer
        run(splitter(fake), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN, budget=Budget(2, 0))
    assert len(fake.calls) == 1


def test_other_errors_and_the_clients_deadline_are_not_cut() -> None:
    for error in (reply(400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'),
                  ClientDeadline(PromError("timeout", "x")), reply(503, b'{"status":"error","errorType":"unavailable",'
                                                                        b'"error":"x"}')):
        fake = Fake(lambda q, span: True, error)
        with pytest.raises(type(error)):
            run(splitter(fake), "sum(DCGM_FI_DEV_GPU_UTIL)", SPAN)
        assert len(fake.calls) == 1


def test_backend_timeouts_are_cut_within_the_deadline() -> None:
    fake = Fake(lambda q, span: span.points > 61, reply(503, PROM_TIME))
    got = run(splitter(fake), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN)
    assert got.n_samples == SPAN.points and len(fake.calls) == 3
    fake = Fake(lambda q, span: True, reply(503, PROM_TIME))
    with pytest.raises(PieceFailed):  # no time left to cut
        run(splitter(fake), "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN, timeout_s=0.01)
    assert len(fake.calls) == 1


def test_what_worked_is_remembered_per_metric() -> None:
    fake = Fake(lambda q, span: span.points > 40)
    s = splitter(fake)
    run(s, "quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN)
    assert s.memory.get(("", "DCGM_FI_DEV_GPU_TEMP")) is not None
    fake.calls.clear()
    # Another query of the same metric starts cut: nothing refused.
    got = run(s, "max(DCGM_FI_DEV_GPU_TEMP)", SPAN)
    assert got.n_samples == SPAN.points and fake.calls and not any(r for _, _, r in fake.calls)
    # A call shorter than any refused one is asked whole first.
    fake.calls.clear()
    short = Span.range(T0, T0 + 20 * STEP, STEP)
    assert run(s, "max(DCGM_FI_DEV_GPU_TEMP)", short).n_samples == 21 and len(fake.calls) == 1
    # Another metric is asked whole first.
    fake.calls.clear()
    run(s, "quantile(0.9, DCGM_FI_DEV_POWER_USAGE)", SPAN)
    assert fake.calls[0][1] == SPAN and fake.calls[0][2]


def test_a_forwarded_refusal_is_not_asked_again() -> None:
    fake = Fake(lambda q, span: span.points > 61)
    s = splitter(fake)

    async def go() -> QueryResult:
        ctx = RequestContext(refused=Refused("quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", SPAN, reply(422, PROM_SIZE)))
        return await s.answer(Fetch("quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", None, -1, SPAN),
                              "/api/v1/query_range", [], 30.0, None, ctx)

    assert asyncio.run(go()).n_samples == SPAN.points
    assert [span.points for _, span, _ in fake.calls] == [61, 60]


def test_memory_ttl_and_finer_wins() -> None:
    now = [0.0]
    m = Memory(10.0, max_entries=2, clock=lambda: now[0])
    m.learn(("", "x"), 4, 3_600_000)
    m.learn(("", "x"), 2, 1_800_000)
    got = m.get(("", "x"))
    assert got is not None and (got.shards, got.max_ms) == (4, 1_800_000)
    m.learn(("", "y"), 1, None)
    m.learn(("", "z"), 1, None)
    assert len(m) == 2 and m.get(("", "x")) is None  # the oldest dropped
    now[0] = 11.0
    assert m.get(("", "y")) is None  # expired


def test_a_tied_topk_is_cut_in_time_instead_of_shards() -> None:
    # Every shard answers the same series with the same value: which of them Prometheus's
    # topk(1) keeps is not decided by value, so the shard answers are not merged; the piece
    # unsharded is halved in time instead.
    fake = Fake(lambda q, span: "Hostname" not in q and span.points > 61)
    got = run(splitter(fake, {"Hostname": ("a", "b", "c", "d")}, shards=4), "topk(1, DCGM_FI_DEV_GPU_UTIL)", SPAN)
    assert sum(1 for q, _, _ in fake.calls if "Hostname" in q) == 4
    assert [(q, span.points) for q, span, _ in fake.calls[-2:]] == [("topk(1, DCGM_FI_DEV_GPU_UTIL)", 61),
                                                                   ("topk(1, DCGM_FI_DEV_GPU_UTIL)", 60)]
    assert list(got.t_ms) == list(range(SPAN.start_ms, SPAN.end_ms + 1, STEP))


def test_never_cut_a_query_the_planner_cannot_read_or_with_depth_zero() -> None:
    for query, depth in (("sum(DCGM_FI_DEV_GPU_UTIL", 6), ("quantile(0.9, DCGM_FI_DEV_GPU_TEMP)", 0)):
        fake = Fake(lambda q, span: True)
        with pytest.raises(PieceFailed):
            run(splitter(fake, max_depth=depth), query, SPAN)
        assert len(fake.calls) == 1, query
