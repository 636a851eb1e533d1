"""proxy/pipeline/revalidate.py: cached pieces heal by themselves. A digest of the data a
piece reads is recorded when it is stored; each pass re-digests the recent records and, where a
digest changed, drops every entry of those metrics over that window. Failures keep the record
for the next pass; records are bounded in number and age; each tenant's record is checked as
that tenant. A fake backend (its data changed by the test) and a fake invalidation."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from proxy.backends.protocol import BackendReply
from proxy.backends.tenancy import NO_TENANT, Caller, Tenant
from proxy.errors import PromError
from proxy.pipeline.revalidate import DIGEST_PARALLEL, Revalidator, normalise

T = 1_700_000_000_000
Q = 'count_over_time({__name__="up"}[1h]) or sum_over_time({__name__="up"}[1h])'


def answer(rows: Sequence[tuple[dict[str, str], str]], t: float = T / 1000, **extra: Any) -> bytes:
    return orjson.dumps({"status": "success", **extra,
                         "data": {"resultType": "vector", "result": [{"metric": m, "value": [t, v]} for m, v in rows]}})


@dataclass
class FakeBackend:
    """Answers digest queries from `data[(scope, query)]`; records what it was asked."""

    data: dict[tuple[str, str], list[tuple[dict[str, str], str]]] = field(default_factory=dict)
    down: bool = False
    status: int = 200
    delay_s: float = 0.0
    asked: list[tuple[str, str, str]] = field(default_factory=list)  # (scope, query, time)
    running: int = 0
    most: int = 0

    async def request(self, method: str, path: str, *, form: Any, caller: Caller = Caller(), **kw: Any) -> BackendReply:
        assert (method, path) == ("POST", "/api/v1/query")
        f = dict(form)
        self.asked.append((caller.tenant.scope, f["query"], f["time"]))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.running -= 1
        if self.down:
            raise PromError("unavailable", "backend unreachable")
        if self.status != 200:
            return BackendReply(self.status, b'{"status":"error","errorType":"internal","error":"x"}', "application/json")
        return BackendReply(200, answer(self.data.get((caller.tenant.scope, f["query"]), [])), "application/json")


@dataclass
class Invalidations:
    calls: list[tuple[tuple[str, ...] | None, int, int]] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, metrics: Sequence[str] | None, start_ms: int, end_ms: int) -> int:
        self.calls.append((tuple(metrics) if metrics is not None else None, start_ms, end_ms))
        if self.fail:
            raise PromError("unavailable", "cache unreachable")
        return 3


def revalidator(backend: FakeBackend, inval: Invalidations, *, max_age_ms: int = 3_600_000, max_entries: int = 100,
                backends: dict[str, FakeBackend] | None = None, interval_ms: int = 60_000) -> Revalidator:
    return Revalidator(backend, inval, interval_ms=interval_ms, max_age_ms=max_age_ms,  # type: ignore[arg-type]
                       max_entries=max_entries, backends=backends)  # type: ignore[arg-type]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


UP = [({"__name__": "up", "job": "node"}, "120"), ({"__name__": "up", "job": "dcgm"}, "118")]


# --- normalise ---------------------------------------------------------------------------------


def test_normalise_ignores_the_order_of_series_and_of_labels() -> None:
    a = answer([({"job": "node", "__name__": "up"}, "1"), ({"__name__": "up", "job": "dcgm"}, "2")])
    b = answer([({"__name__": "up", "job": "dcgm"}, "2"), ({"__name__": "up", "job": "node"}, "1")], t=T / 1000 + 60)
    assert normalise(a) == normalise(b) is not None


@pytest.mark.parametrize(
    "other",
    [answer([({"job": "node"}, "1"), ({"job": "dcgm"}, "3")]),  # a value changed
     answer([({"job": "node"}, "1")]),  # a series gone
     answer([({"job": "node"}, "1"), ({"job": "dcgm"}, "2"), ({"job": "x"}, "0")]),  # a series more
     answer([({"job": "node2"}, "1"), ({"job": "dcgm"}, "2")])],  # a label changed
)
def test_normalise_tells_changed_data_apart(other: bytes) -> None:
    assert normalise(answer([({"job": "node"}, "1"), ({"job": "dcgm"}, "2")])) != normalise(other)


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b'"success"', b'{"status":"error","errorType":"timeout","error":"x"}',
     answer(UP, warnings=["partial data: a store did not answer"]), bytearray(b"{")],
)
def test_normalise_of_anything_but_a_clean_success_is_none(body: bytes) -> None:
    assert normalise(body) is None


# --- digests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("time_ms", "sent"), [(T, "1700000000"), (T + 123, "1700000000.123"),
                                               (T + 5, "1700000000.005"), (-1_500, "-1.500")])
def test_a_digest_is_an_instant_query_at_the_exact_time(time_ms: int, sent: str) -> None:
    backend = FakeBackend({("", Q): UP})
    got = run(revalidator(backend, Invalidations()).digest(Q, time_ms))
    assert got == normalise(answer(UP))
    assert backend.asked == [("", Q, sent)]


def test_a_failed_digest_is_none() -> None:
    for backend in (FakeBackend(down=True), FakeBackend(status=503)):
        assert run(revalidator(backend, Invalidations()).digest(Q, T)) is None


def test_a_digest_is_taken_on_the_backend_that_answered_the_piece() -> None:
    primary, amp = FakeBackend({("", Q): UP}), FakeBackend({("", Q): UP[:1]})
    r = revalidator(primary, Invalidations(), backends={"amp": amp})
    assert run(r.digest(Q, T, backend="amp")) == normalise(answer(UP[:1]))
    assert run(r.digest(Q, T, backend="")) == normalise(answer(UP))
    assert len(amp.asked) == 1 and len(primary.asked) == 1


def test_baselines_ask_each_pair_once_and_leave_failures_out() -> None:
    backend = FakeBackend({("", Q): UP})
    got = run(revalidator(backend, Invalidations()).baselines([(Q, T), (Q, T), (Q, T + 60_000)], 5.0))
    assert set(got) == {(Q, T), (Q, T + 60_000)} and len(backend.asked) == 2
    down = FakeBackend(down=True)
    assert run(revalidator(down, Invalidations()).baselines([(Q, T)], 5.0)) == {}


# --- passes ------------------------------------------------------------------------------------


def record(r: Revalidator, backend: FakeBackend, query: str = Q, time_ms: int = T, metrics: tuple[str, ...] = ("up",),
           tenant: Tenant = NO_TENANT, start_ms: int = T - 3_600_000) -> None:
    baseline = normalise(answer(backend.data.get((tenant.scope, query), [])))
    assert baseline is not None
    r.record(query, time_ms, baseline, metrics, start_ms, time_ms, tenant=tenant)


def test_unchanged_data_drops_nothing_and_keeps_the_record() -> None:
    backend, inval = FakeBackend({("", Q): UP}), Invalidations()

    async def main() -> int:
        r = revalidator(backend, inval)
        record(r, backend)
        changed = await r.run_pass() + await r.run_pass()
        assert len(r) == 1 and r.stats["checked"] == 2
        return changed

    assert run(main()) == 0 and inval.calls == []


def test_changed_data_drops_every_entry_of_its_metrics_over_its_window_once() -> None:
    backend, inval = FakeBackend({("", Q): UP}), Invalidations()

    async def main() -> tuple[int, int, int]:
        r = revalidator(backend, inval)
        record(r, backend, metrics=("up", "node_load1"))
        backend.data[("", Q)] = [UP[0], (UP[1][0], "119")]  # a late sample arrived
        first = await r.run_pass()
        second = await r.run_pass()  # the record is gone: the next fetch records a new baseline
        return first, second, len(r)

    assert run(main()) == (1, 0, 0)
    assert inval.calls == [(("up", "node_load1"), T - 3_600_000, T)]


def test_a_piece_of_unknown_metrics_drops_entries_of_every_metric() -> None:
    backend, inval = FakeBackend({("", Q): UP}), Invalidations()

    async def main() -> None:
        r = revalidator(backend, inval)
        record(r, backend, metrics=())
        backend.data[("", Q)] = []
        await r.run_pass()

    run(main())
    assert inval.calls == [(None, T - 3_600_000, T)]


def test_a_failed_digest_or_invalidation_keeps_the_record_for_the_next_pass() -> None:
    backend, inval = FakeBackend({("", Q): UP}), Invalidations(fail=True)

    async def main() -> None:
        r = revalidator(backend, inval)
        record(r, backend)
        backend.down = True
        assert await r.run_pass() == 0 and len(r) == 1 and r.stats["failed"] == 1
        backend.down = False
        backend.data[("", Q)] = UP[:1]
        assert await r.run_pass() == 1 and len(r) == 1  # the store could not be reached: kept
        inval.fail = False
        assert await r.run_pass() == 1 and len(r) == 0
        assert len(inval.calls) == 2

    run(main())


def test_records_are_bounded_in_age_and_number() -> None:
    backend, inval = FakeBackend({("", f"q{i}"): UP for i in range(10)}), Invalidations()

    async def main() -> None:
        r = revalidator(backend, inval, max_entries=3)
        for i in range(10):
            record(r, backend, query=f"q{i}")
        assert len(r) == 3  # the newest three
        await r.run_pass()
        assert sorted(q for _, q, _ in backend.asked) == ["q7", "q8", "q9"]
        old = revalidator(backend, inval, max_age_ms=50)
        record(old, backend, query="q1")
        await asyncio.sleep(0.1)
        backend.asked.clear()
        await old.run_pass()
        assert len(old) == 0 and backend.asked == []  # too old to check: forgotten, not digested

    run(main())


def test_the_same_data_recorded_again_with_another_digest_drops_the_old_entries() -> None:
    backend, inval = FakeBackend({("", Q): UP}), Invalidations()

    async def main() -> None:
        r = revalidator(backend, inval)
        record(r, backend)
        record(r, backend)  # the same baseline: nothing to drop
        await asyncio.sleep(0)
        assert inval.calls == []
        backend.data[("", Q)] = UP[:1]
        record(r, backend)  # another process stored it after the data changed
        await asyncio.sleep(0.01)
        assert len(inval.calls) == 1 and len(r) == 1

    run(main())


def test_each_tenants_record_is_checked_as_that_tenant() -> None:
    a, b = Tenant((("x-scope-orgid", "a"),), "a"), Tenant((("x-scope-orgid", "b"),), "b")
    backend = FakeBackend({("a", Q): UP, ("b", Q): UP[:1]})
    inval = Invalidations()

    async def main() -> None:
        r = revalidator(backend, inval)
        record(r, backend, tenant=a)
        record(r, backend, tenant=b)
        assert len(r) == 2  # the same query and time, kept apart
        assert await r.run_pass() == 0  # each compared with its own view
        assert sorted(s for s, _, _ in backend.asked) == ["a", "b"]
        backend.data[("b", Q)] = UP  # only tenant b's data changed
        assert await r.run_pass() == 1

    run(main())


def test_digests_run_at_most_digest_parallel_at_once() -> None:
    backend = FakeBackend({("", f"q{i}"): UP for i in range(10)}, delay_s=0.02)

    async def main() -> None:
        r = revalidator(backend, Invalidations())
        for i in range(10):
            record(r, backend, query=f"q{i}")
        await r.run_pass()

    run(main())
    assert len(backend.asked) == 10 and backend.most == DIGEST_PARALLEL


def test_passes_run_every_interval_until_closed() -> None:
    backend = FakeBackend({("", Q): UP})

    async def main() -> tuple[int, int]:
        r = revalidator(backend, Invalidations(), interval_ms=20)
        record(r, backend)
        r.start()
        r.start()  # once
        await asyncio.sleep(0.25)
        await r.aclose()
        passes = r.stats["passes"]
        await asyncio.sleep(0.1)
        assert r.stats["passes"] == passes  # stopped
        off = revalidator(backend, Invalidations(), interval_ms=0)
        off.start()
        await asyncio.sleep(0.05)
        await off.aclose()
        return passes, off.stats["passes"]

    passes, off = run(main())
    assert 3 <= passes <= 13 and off == 0
