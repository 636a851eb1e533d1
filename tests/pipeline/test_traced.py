"""The stage wrapper of proxy/pipeline/traced.py: with tracing off a stage is left as it is (no
wrapper, no span); on, each call is a span named after the stage, with what explains its time
taken from the value handed down and the answer handed up. The whole span tree of a query over
a real Prometheus: tests/pipeline/test_tracing.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.backends import BackendReply
from proxy.observe import tracing
from proxy.pipeline.lookup import Calls, Work
from proxy.pipeline.traced import Traced, traced
from proxy.pipeline.units import Fetch, Slot, bare_unit
from proxy.pipeline.values import Answer, Query
from shardplanner.plan import PlannerSettings, QueryRequest
from shardplanner.planner import plan

H = 3_600_000
T0 = 1_700_000_000_000 // H * H


class Plan:
    """A stage named Plan: hands back what it is given (an Answer for a Query)."""

    def __init__(self, answer: Answer | None = None, error: Exception | None = None) -> None:
        self.answer = answer or Answer(headers={"X-Cache": "MISS", "X-Promaccel-Pieces": "3"})
        self.error = error
        self.got: list[Any] = []

    async def __call__(self, value: Any) -> Any:
        self.got.append(value)
        if self.error is not None:
            raise self.error
        return self.answer


def query(planned: bool = True) -> Query:
    req = QueryRequest.range("sum(DCGM_FI_DEV_GPU_UTIL)", T0, T0 + 3 * H - 60_000, 60_000)
    p = plan(req, PlannerSettings(split_interval_ms=H), {}) if planned else None
    return Query(req=req, pairs=[], path="/api/v1/query_range", timeout_s=5, plan=p)


@pytest.fixture()
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    assert tracing.configure(None, "test", 1.0, exporter=exp)
    try:
        yield exp
    finally:
        tracing.shutdown()


def test_off_the_stage_is_itself_and_records_nothing() -> None:
    tracing.shutdown()
    assert not tracing.enabled()
    stage = Plan()
    assert traced(stage) is stage  # no wrapper in the path: not even a call's cost


def test_on_a_call_is_a_span_named_after_the_stage(exporter: InMemorySpanExporter) -> None:
    stage = Plan()
    wrapped = traced(stage)
    assert isinstance(wrapped, Traced) and wrapped.name == "Plan" and wrapped.stage is stage
    q = query()
    assert q.plan is not None and len(q.plan.pieces) > 1
    assert asyncio.run(wrapped(q)) is stage.answer and stage.got == [q]  # handed down and up as is
    (span,) = exporter.get_finished_spans()
    assert span.name == "Plan"
    attrs = dict(span.attributes or {})
    assert attrs["promaccel.path"] == "/api/v1/query_range" and attrs["promaccel.range"] is True
    assert attrs["promaccel.pieces"] == len(q.plan.pieces) and attrs["promaccel.cached"] is False
    assert attrs["promaccel.cache"] == "MISS" and attrs["promaccel.answer_pieces"] == "3"
    assert "promaccel.relayed_status" not in attrs  # None is not an attribute


def test_what_is_not_known_yet_is_left_out(exporter: InMemorySpanExporter) -> None:
    reply = BackendReply(503, b'{"status":"error"}', "application/json")
    asyncio.run(traced(Plan(Answer(reply=reply)))(query(planned=False)))
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    # Before the Plan stage there is no plan: neither its pieces nor whether it is cached.
    assert "promaccel.pieces" not in attrs and "promaccel.cached" not in attrs
    assert attrs["promaccel.relayed_status"] == 503 and "promaccel.cache" not in attrs


def test_the_cache_stages_values_give_hits_and_calls(exporter: InMemorySpanExporter) -> None:
    q = query()
    assert q.plan is not None
    pieces = q.plan.pieces
    slots = [Slot(p, bare_unit(p), status="hit" if i == 0 else "miss") for i, p in enumerate(pieces)]

    async def go() -> None:
        await traced(Plan())(Work(q, slots))
        waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await traced(Plan())(Calls(q, [Fetch(p.query, None, -1, p.span) for p in pieces[1:]], [waiting]))
        waiting.cancel()

    asyncio.run(go())
    work, calls = (dict(s.attributes or {}) for s in exporter.get_finished_spans())
    assert work["promaccel.pieces"] == len(slots) and work["promaccel.cache_hits"] == 1
    assert calls["promaccel.backend_calls"] == len(pieces) - 1 and calls["promaccel.coalesced"] == 1


def test_a_failing_stage_raises_through_its_span_marked_as_an_error(exporter: InMemorySpanExporter) -> None:
    from opentelemetry.trace import StatusCode

    with pytest.raises(TimeoutError):
        asyncio.run(traced(Plan(error=TimeoutError()))(query()))
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "TimeoutError"


def test_a_stage_inside_another_is_its_child_span(exporter: InMemorySpanExporter) -> None:
    class Outer:
        def __init__(self, next: Any) -> None:
            self.next = next

        async def __call__(self, value: Any) -> Any:
            return await self.next(value)

    inner = traced(Plan())
    asyncio.run(traced(Outer(inner))(query()))
    child, parent = exporter.get_finished_spans()  # the inner one ends first
    assert (child.name, parent.name) == ("Plan", "Outer")
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
