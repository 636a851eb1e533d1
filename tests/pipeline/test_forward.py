"""A query the planner left whole (proxy/pipeline/forward.py): Forward branches, with a fake
relay and a fake next stage (the planned path) -- a whole query to the relay, anything else and
a whole query the backend refused for its size or time to the planned path with `ctx.refused`
set; Relay, the leaf, over a backend that records its calls: the backend's bytes untouched,
whole answers cached."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from proxy.backends import BackendReply
from proxy.backends.tenancy import Caller, Tenant
from proxy.cache import make_store
from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.ask import Asker
from proxy.pipeline.cache_read import CacheReader
from proxy.pipeline.cache_write import CacheWriter
from proxy.pipeline.context import RequestContext
from proxy.pipeline.explain import Explanation
from proxy.pipeline.forward import Forward, Relay, forwards_whole
from proxy.pipeline.landing import Landing
from proxy.pipeline.planning import Planner
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.values import Answer, PieceFailed, Query
from proxy.primitives.singleflight import SingleFlight
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest
from tests.pipeline.stage_helpers import (
    JSON,
    T0,
    FakeBackend,
    Recorder,
    RecordingBackend,
    config,
    range_query,
    run,
)

TOO_MANY = BackendReply(422, b'{"status":"error","errorType":"execution","error":"query processing would load '
                             b'too many samples into memory in query execution"}', JSON)
BAD = BackendReply(400, b'{"status":"error","errorType":"bad_data","error":"parse error"}', JSON)


def short(query: str = "up") -> Query:
    """A range query within one split interval: one piece, the client's own."""
    q = range_query(query, hours=1)
    req = replace(q.req, span=q.req.span.with_bounds(T0, T0 + 600_000))
    return replace(q, req=req, pairs=[("query", query), ("start", str(T0 / 1000)),
                                      ("end", str((T0 + 600_000) / 1000)), ("step", "60")])


def planned(planner: Planner, q: Query) -> Query:
    return replace(q, plan=run(planner.plan(q.req)))


def test_forwards_whole_only_what_was_not_rewritten() -> None:
    planner = Planner(config(split_interval="1h", shards=1), FakeBackend())  # type: ignore[arg-type]
    assert forwards_whole(planned(planner, short()))
    assert not forwards_whole(planned(planner, range_query("up", hours=3)))
    assert not forwards_whole(planned(planner, short("up @ start()")))  # rewritten text
    assert not forwards_whole(replace(planned(planner, short()), want_arrow=True))  # re-encoded
    assert forwards_whole(planned(planner, replace(range_query("up", hours=3), pairs=[("stats", "all")])))


class Refusals:
    """A fake refusal splitter: remembers nothing unless told to."""

    def __init__(self, remembers: bool = False) -> None:
        self.remembered = remembers

    def remembers(self, expr: Any, span: Any, scope: str) -> bool:
        return self.remembered


def branches(refusals: Any = None, relay_answer: Any = None) -> tuple[Recorder, Recorder, Forward]:
    relay = Recorder(relay_answer if relay_answer is not None else Answer(reply=BackendReply(200, b"{}", JSON)))
    rest = Recorder()
    return relay, rest, Forward(relay, rest, refusals=refusals)


def test_forward_sends_a_whole_query_to_the_relay_and_the_rest_down() -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    relay, rest, forward = branches()
    whole, split = planned(planner, short()), planned(planner, range_query("up", hours=3))
    answer = run(forward(whole))
    assert relay.got == [whole] and rest.got == [] and answer is relay.answer
    run(forward(split))
    assert rest.got == [split] and len(relay.got) == 1


def test_forward_explains_a_whole_query_as_its_piece_through_the_planned_path() -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    relay, rest, forward = branches()
    q = replace(planned(planner, short()), ctx=RequestContext(explain=Explanation(False)))
    run(forward(q))
    assert relay.got == [] and rest.got == [q]


@pytest.mark.parametrize("refused", [PromError("timeout", "backend timed out"), PieceFailed(TOO_MANY)])
def test_forward_reruns_a_refused_whole_query_through_the_planned_path(refused: BaseException) -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    answer = refused if isinstance(refused, PromError) else Answer(reply=refused.reply)  # type: ignore[attr-defined]
    relay, rest, forward = branches(Refusals(), answer)
    q = planned(planner, short())
    run(forward(q))
    (again,) = rest.got
    assert again.ctx.refused is not None and again.ctx.refused.error is not None
    assert q.plan is not None and again.ctx.refused.query == q.plan.pieces[0].query
    assert again.ctx.refused.span == q.plan.pieces[0].span
    assert again.ctx.budget is q.ctx.budget  # the same query: the same allowances
    assert len(relay.got) == 1  # asked whole once, not again


def test_forward_relays_what_is_no_refusal_for_size_or_time() -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    q = planned(planner, short())
    relay, rest, forward = branches(Refusals(), Answer(reply=BAD))
    assert run(forward(q)).reply is BAD and rest.got == []
    relay, rest, forward = branches(Refusals(), PromError("unavailable", "down"))
    with pytest.raises(PromError, match="down"):
        run(forward(q))
    # Without the splitter (planner.refusal_split_depth 0) a refusal is the answer.
    relay, rest, forward = branches(None, Answer(reply=TOO_MANY))
    assert run(forward(q)).reply is TOO_MANY and rest.got == []


def test_forward_starts_a_remembered_refusal_cut_finer() -> None:
    planner = Planner(config(split_interval="1h"), FakeBackend())  # type: ignore[arg-type]
    relay, rest, forward = branches(Refusals(remembers=True))
    q = planned(planner, short())
    run(forward(q))
    assert relay.got == [] and rest.got == [q]


def relay_for(cfg: Any, backend: Any) -> tuple[Relay, Planner, Any]:
    planner = Planner(cfg, backend)
    slots = SlotMaker(cfg, planner.settings.split_interval_ms)
    landing = Landing()
    store = make_store(cfg.cache)
    reader = CacheReader(cfg, lambda: store, landing, slots)
    writer = CacheWriter(cfg, lambda: store, landing)
    return Relay({backend.name: backend}, backend, slots, reader, writer, landing, SingleFlight("t"), Asker()), \
        planner, writer


def test_relay_passes_the_backends_bytes_untouched() -> None:
    body = b'{"status":"success","data":{"resultType":"vector","result":[]},  "extra":  "kept as sent"}'
    backend = RecordingBackend(handler=lambda *a: BackendReply(200, body, JSON))
    relay, planner, _ = relay_for(config(split_interval="1h"), backend)
    whole = Query(req=QueryRequest.instant("up", T0), pairs=[("query", "up"), ("time", str(T0 / 1000))],
                  path="/api/v1/query", timeout_s=5)
    answer = run(relay(planned(planner, whole)))
    assert answer.reply is not None and answer.reply.body == body
    assert answer.headers == {"X-Promaccel-Pieces": "1", "X-Cache": "MISS"}
    assert [(c[0], c[1], c[2]) for c in backend.calls] == [("POST", "/api/v1/query", whole.pairs)]


def test_relay_serves_a_whole_answer_it_cached() -> None:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={"planner": {"split_interval": "1h"}})
    backend = RecordingBackend()
    relay, planner, writer = relay_for(cfg, backend)
    q = planned(planner, short())
    q = replace(q, cache=planner.cache_ctx(q, backend))

    async def main() -> tuple[Answer, Answer, Answer]:
        first = await relay(q)
        await asyncio.gather(*writer.tasks)  # its put landed
        again = await relay(q)  # a recent call (or its landed cell)
        relay.landing.forget_all()
        relay.reader.decoded.clear()
        stored = await relay(q)  # from the store
        return first, again, stored

    first, again, stored = run(main())
    assert len(backend.queries()) == 1
    assert first.reply is not None and first.headers["X-Cache"] == "MISS"
    assert stored.result is not None and stored.headers == {"X-Promaccel-Pieces": "1", "X-Cache": "HIT"}
    assert isinstance(stored.result, QueryResult) and stored.result.to_pylist()[0][0] == {"job": "a"}
    assert again.headers["X-Promaccel-Pieces"] == "1"


def test_relay_does_not_cache_for_another_tenant() -> None:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={"planner": {"split_interval": "1h"}})
    backend = RecordingBackend()
    relay, planner, writer = relay_for(cfg, backend)
    q = planned(planner, short())
    mine = replace(q, ctx=RequestContext(Caller(Tenant((("x-scope-orgid", "a"),), "a"))))
    theirs = replace(q, ctx=RequestContext(Caller(Tenant((("x-scope-orgid", "b"),), "b"))))

    async def main() -> None:
        await relay(replace(mine, cache=planner.cache_ctx(mine, backend)))
        await asyncio.gather(*writer.tasks)
        await relay(replace(theirs, cache=planner.cache_ctx(theirs, backend)))

    run(main())
    assert [c[3].tenant.scope for c in backend.queries()] == ["a", "b"]
