"""Admission (proxy/pipeline/admission.py): queries in flight, in all and per client, a bounded
first-come-first-served wait, 429 with Retry-After beyond it; the Admit stage, with a fake next
stage, reporting what the query cost from its context."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.admission import Admission, Admit
from proxy.pipeline.context import RequestContext
from proxy.pipeline.values import Answer, Query
from proxy.result import QueryResult
from tests.pipeline.stage_helpers import range_query, run


async def settle() -> None:
    """Let every ready task run (a few loop turns)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_total_limit_queues_and_admits_in_arrival_order() -> None:
    async def main() -> None:
        adm = Admission(total=1, per_client=0, max_queued=5, timeout_s=5)
        await adm.acquire("a")
        order: list[str] = []

        async def take(client: str) -> None:
            await adm.acquire(client)
            order.append(client)

        waiters = [asyncio.create_task(take(c)) for c in ("b", "c", "d")]
        await settle()
        assert order == [] and adm.running == 1  # all three wait: the one slot is taken
        for expected in (["b"], ["b", "c"], ["b", "c", "d"]):
            adm.release(order[-1] if order else "a")
            await settle()
            assert order == expected and adm.running == 1
        await asyncio.gather(*waiters)
        adm.release("d")
        assert adm.running == 0 and adm.by_client == {}

    run(main())


def test_per_client_limit_lets_other_clients_pass_on_release() -> None:
    """A waiter whose client is at its own limit does not hold up another client's query."""
    async def main() -> None:
        adm = Admission(total=0, per_client=1, max_queued=5, timeout_s=5)
        await adm.acquire("a")
        await adm.acquire("b")
        admitted: list[str] = []

        async def take(client: str) -> None:
            await adm.acquire(client)
            admitted.append(client)

        a2 = asyncio.create_task(take("a"))
        b2 = asyncio.create_task(take("b"))
        await settle()
        assert admitted == []
        adm.release("b")  # b's slot: b2 gets it although a2 came first (a is at its limit)
        await settle()
        assert admitted == ["b"] and adm.by_client == {"a": 1, "b": 1}
        adm.release("a")
        await settle()
        assert admitted == ["b", "a"]
        await asyncio.gather(a2, b2)

    run(main())


def test_per_client_limit_does_not_block_a_new_client_behind_a_full_one() -> None:
    async def main() -> None:
        adm = Admission(total=0, per_client=1, max_queued=5, timeout_s=0.2)
        await adm.acquire("heavy")
        blocked = asyncio.create_task(adm.acquire("heavy"))  # waits for heavy's own slot
        await settle()
        try:
            # Another client, with room in total and in its own limit, is admitted at once.
            await asyncio.wait_for(adm.acquire("light"), 0.1)
        finally:
            blocked.cancel()
            await asyncio.gather(blocked, return_exceptions=True)

    run(main())


def test_a_full_queue_is_refused_at_once_with_429_and_retry_after() -> None:
    async def main() -> None:
        adm = Admission(total=1, per_client=0, max_queued=1, timeout_s=5)
        await adm.acquire("a")
        waiting = asyncio.create_task(adm.acquire("b"))
        await settle()
        with pytest.raises(PromError) as err:
            await adm.acquire("c")
        assert err.value.status == 429 and err.value.headers == {"Retry-After": "1"}
        assert "queue of waiting queries is full" in err.value.message
        adm.release("a")
        await waiting  # the queued one still gets in
        assert adm.by_client == {"b": 1}

    run(main())


def test_a_wait_past_the_timeout_is_refused_and_leaves_the_queue() -> None:
    async def main() -> None:
        adm = Admission(total=1, per_client=0, max_queued=3, timeout_s=0.05)
        await adm.acquire("a")
        with pytest.raises(PromError) as err:
            await adm.acquire("b")
        assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
        assert "waited" in err.value.message and "limits.max_queries_in_flight 1" in err.value.message
        adm.release("a")
        assert adm.running == 0 and adm.by_client == {}  # b took no slot on its way out

    run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    async def main() -> None:
        adm = Admission(total=1, per_client=0, max_queued=1, timeout_s=5)
        await adm.acquire("a")
        gone = asyncio.create_task(adm.acquire("b"))
        await settle()
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        # Its place in the queue is free again: another query may wait there.
        later = asyncio.create_task(adm.acquire("c"))
        await settle()
        adm.release("a")
        await later
        assert adm.by_client == {"c": 1} and adm.running == 1

    run(main())


def _admitted_then_cancelled() -> tuple[int, list[str], bool]:
    """A query admitted from the queue whose client goes away before it resumes: the slots
    running after, the next stage's calls, whether its task ended cancelled."""
    limits = load_config(None, backends=["http://x:1"]).limits
    ran: list[str] = []

    async def next_stage(q: Query) -> Answer:
        ran.append(q.client)
        return Answer(result=QueryResult.empty())

    async def main() -> tuple[int, list[str], bool]:
        adm = Admission(total=1, per_client=0, max_queued=1, timeout_s=5)
        await adm.acquire("a")
        gone = asyncio.create_task(Admit(limits, next_stage, adm)(replace(range_query("up"), client="b")))
        await settle()
        adm.release("a")  # admits b: its future is set, its task not yet resumed
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        return adm.running, ran, gone.cancelled()

    return run(main())  # type: ignore[no-any-return]


def test_a_waiter_cancelled_once_admitted_gives_its_slot_back() -> None:
    running, _, _ = _admitted_then_cancelled()
    assert running == 0


def test_a_waiter_cancelled_once_admitted_runs_nothing() -> None:
    _, ran, cancelled = _admitted_then_cancelled()
    assert ran == [] and cancelled


def _limits(**limits: int) -> object:
    return load_config(None, backends=["http://x:1"], overrides={"limits": limits}).limits


def test_admit_holds_a_slot_for_the_query_and_releases_it_on_failure() -> None:
    limits = _limits(max_queries_in_flight=1, max_queries_per_client=0)
    adm = Admission(1, 0, 0, 0.05)
    seen: list[int] = []

    async def failing(q: Query) -> Answer:
        seen.append(adm.running)
        raise PromError("execution", "boom")

    q = replace(range_query("up"), client="10.0.0.1")
    with pytest.raises(PromError, match="boom"):
        run(Admit(limits, failing, adm)(q))  # type: ignore[arg-type]
    assert seen == [1] and adm.running == 0 and adm.by_client == {}

    async def main() -> None:
        release = asyncio.Event()

        async def slow(q: Query) -> Answer:
            await release.wait()
            return Answer(result=QueryResult.empty())

        stage = Admit(limits, slow, adm)  # type: ignore[arg-type]
        first = asyncio.create_task(stage(q))
        await settle()
        with pytest.raises(PromError) as err:  # max_queued 0: refused at once
            await stage(replace(q, client="10.0.0.2"))
        assert err.value.status == 429
        release.set()
        await first
        first_cancelled = asyncio.create_task(stage(q))
        await settle()
        first_cancelled.cancel()
        await asyncio.gather(first_cancelled, return_exceptions=True)
        assert adm.running == 0  # the client went away: its slot is back

    run(main())


def test_admit_reports_what_the_query_cost() -> None:
    """The context the api layer starts a query with carries its allowances; Admit reports
    the calls and AMP samples charged to it below."""
    limits = load_config(None, backends=["http://x:1"], overrides={"limits": {"max_backend_calls": 3}}).limits

    async def next_stage(q: Query) -> Answer:
        assert q.ctx.budget.max_calls == 3
        q.ctx.budget.charge()
        q.ctx.samples.add(1234)
        return Answer(result=QueryResult.empty())

    q = replace(range_query("up"), ctx=RequestContext.start(RequestContext().caller, limits))
    answer = run(Admit(limits, next_stage)(q))
    assert answer.headers["X-Promaccel-Samples-Processed"] == "1234"
    assert answer.headers["X-Promaccel-Backend-Calls"] == "1"

    async def greedy(q: Query) -> Answer:
        q.ctx.budget.check(3)  # within
        with pytest.raises(PromError, match="limits.max_backend_calls"):
            q.ctx.budget.check(4)
        return Answer(result=QueryResult.empty())

    q = replace(range_query("up"), ctx=RequestContext.start(RequestContext().caller, limits))
    headers = run(Admit(limits, greedy)(q)).headers
    assert "X-Promaccel-Samples-Processed" not in headers and headers["X-Promaccel-Backend-Calls"] == "0"
