"""QueryService (proxy/pipeline/service.py) over a backend that records its calls: explain runs
the query path (no backend call; the pieces and calls it reports are the ones the query then
makes), cache administration with the cache off, shutdown draining background writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.backends.tenancy import NOBODY
from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.context import RequestContext
from proxy.pipeline.service import QueryService
from shardplanner.plan import QueryRequest
from tests.pipeline.stage_helpers import T0, H, RecordingBackend, run


def service(cache: bool, backend: RecordingBackend) -> QueryService:
    config = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"split_interval": "1h"}, "cache": {"enabled": cache}})
    return QueryService(config, [backend])


def range_req(hours: int) -> tuple[QueryRequest, list[tuple[str, str]]]:
    end = T0 + hours * H - 60_000
    req = QueryRequest.range("rate(up[5m])", T0, end, 60_000)
    return req, [("query", req.query), ("start", str(T0 / 1000)), ("end", str(end / 1000)), ("step", "60")]


async def query(svc: QueryService, req: QueryRequest, pairs: list[tuple[str, str]]) -> Any:
    return await svc.query(req, pairs, {}, RequestContext.start(NOBODY, svc.config.limits))


@pytest.mark.parametrize("cache", [False, True])
def test_explain_runs_the_path_without_calling_the_backend(cache: bool) -> None:
    backend = RecordingBackend()
    svc = service(cache, backend)
    req, pairs = range_req(6)

    async def main() -> tuple[dict[str, Any], Any, int]:
        doc = await svc.explain(req, pairs=pairs)
        explained_calls = len(backend.queries())
        answer = await query(svc, req, pairs)
        await svc.aclose()
        return doc, answer, explained_calls

    doc, answer, explained_calls = run(main())
    assert explained_calls == 0
    # What explain reported is what the query then did.
    assert doc["piece_count"] == 6 and answer.headers["X-Promaccel-Pieces"] == "6"
    assert doc["fetches"] == len(backend.queries()) >= 1
    assert doc["cache"]["enabled"] is cache
    assert doc["cache"]["misses" if cache else "uncacheable"] == 6
    assert answer.result is not None and answer.headers["X-Cache"] == "MISS"


def test_explain_after_a_query_reports_its_cached_pieces() -> None:
    backend = RecordingBackend()
    svc = service(True, backend)
    req, pairs = range_req(4)

    async def main() -> tuple[dict[str, Any], Any]:
        await query(svc, req, pairs)
        await asyncio.gather(*svc.parts.writer.tasks)  # the puts landed
        doc = await svc.explain(req, pairs=pairs)
        calls = len(backend.queries())
        again = await query(svc, req, pairs)
        assert len(backend.queries()) == calls  # nothing fetched: as explain said
        await svc.aclose()
        return doc, again

    doc, again = run(main())
    assert doc["cache"]["hits"] == 4 and doc["fetches"] == 0
    assert again.headers["X-Cache"] == "HIT"


def test_explain_stores_nothing_and_counts_no_lookup() -> None:
    backend = RecordingBackend()
    svc = service(True, backend)
    req, pairs = range_req(3)

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        before = svc.cache_stats()
        await svc.explain(req, pairs=pairs)
        after = svc.cache_stats()
        await svc.aclose()
        return before, after

    before, after = run(main())
    # Nothing fetched, so nothing landed or written (the store's own hit/miss counters do
    # count explain's reads: it reads the cache to say what is cached).
    kept = ("stored", "bytes_written", "entries", "bytes", "pending_tasks", "landing")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept} == dict.fromkeys(kept, 0)


def test_cache_administration_with_the_cache_off() -> None:
    svc = service(False, RecordingBackend())
    for call in (lambda: svc.invalidate(["up"], None, None), svc.bump_generation):
        with pytest.raises(PromError, match=r"cache is disabled \(cache.enabled: false\)") as err:
            run(call())
        assert err.value.kind == "unavailable" and err.value.status == 503
    # Stats are no error: they say the cache is off.
    assert svc.cache_stats() == {"enabled": False}
    assert svc._store is None  # nothing made for it


def test_aclose_drains_background_writes() -> None:
    svc = service(True, RecordingBackend())

    async def main() -> None:
        await svc.start()
        svc.parts.writer.spawn(asyncio.sleep(0.05))  # lands within the 2 s bound
        svc.parts.writer.spawn(asyncio.sleep(60))  # does not: cancelled
        await svc.aclose()

    run(main())
    assert (svc.drained.cache_writes_flushed, svc.drained.cache_writes_dropped) == (1, 1)


def test_a_tenants_service_shares_the_roots_admission_store_and_drain() -> None:
    root = service(True, RecordingBackend())
    child = QueryService(root.config, [RecordingBackend()], shared=root)

    async def main() -> None:
        child.parts.writer.spawn(asyncio.sleep(0.01))
        await child.aclose()
        await root.aclose()

    assert child.parts.admission is root.parts.admission and child.parts.answers is root.parts.answers
    assert child.store() is root.store()
    run(main())
    assert root.drained.cache_writes_flushed == 1  # the child's, counted by the root
