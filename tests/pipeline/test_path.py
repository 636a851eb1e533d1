"""The path built in one place (proxy/pipeline/path.py): `chain` makes the stages outermost
first, each with the stage after it; `build` gives the request path in the documented order,
with every component made once and handed to whoever uses it (nothing patched afterwards)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.cache import make_store
from proxy.config import load_config
from proxy.observe import tracing
from proxy.pipeline.admission import Admission
from proxy.pipeline.answer_bytes import AnswerBytes
from proxy.pipeline.path import build, chain
from proxy.pipeline.traced import Traced
from tests.pipeline.stage_helpers import RecordingBackend, run

ORDER = ["Admit", "Recall", "Plan", "Reserve", "Route", "Forward", "Fallback", "Merge", "Lookup", "Coalesce", "FanOut"]


def bare(stage: Any) -> Any:
    """The stage inside its tracing wrapper, if any."""
    return stage.stage if isinstance(stage, Traced) else stage


def walk(stage: Any) -> Iterator[Any]:
    """Each stage down the `.next` attributes (through tracing wrappers), outermost first."""
    for _ in range(50):
        stage = bare(stage)
        yield stage
        stage = getattr(stage, "next", None)
        if stage is None:
            return
    raise AssertionError("no leaf within 50 stages")


class Step:
    def __init__(self, name: str, next: Any, log: list[str]) -> None:
        self.name, self.next, self.log = name, next, log

    async def __call__(self, value: list[str]) -> list[str]:
        self.log.append(self.name)
        return await self.next([*value, self.name])


def test_chain_makes_the_stages_outermost_first() -> None:
    log: list[str] = []

    async def leaf(value: list[str]) -> list[str]:
        log.append("leaf")
        return value

    made: list[str] = []

    def make(name: str) -> Any:
        def step(next: Any) -> Step:
            made.append(name)
            return Step(name, next, log)
        return step

    path = chain(make("a"), make("b"), make("c"), leaf=leaf)
    assert [s.name for s in walk(path) if isinstance(s, Step)] == ["a", "b", "c"]
    assert made == ["c", "b", "a"]  # each made with the one after it, so from the leaf up
    assert run(path([])) == ["a", "b", "c"] and log == ["a", "b", "c", "leaf"]


@pytest.fixture()
def traced_on() -> Iterator[None]:
    assert tracing.configure(None, "test", 1.0, exporter=InMemorySpanExporter())
    try:
        yield
    finally:
        tracing.shutdown()


def test_chain_wraps_each_stage_in_its_span_when_tracing_is_on(traced_on: None) -> None:
    async def leaf(value: Any) -> Any:
        return value

    path = chain(lambda next: Step("a", next, []), lambda next: Step("b", next, []), leaf=leaf)
    assert isinstance(path, Traced) and path.name == "Step" and isinstance(bare(path).next, Traced)


def cfg(**cache: Any) -> Any:
    return load_config(None, backends=["http://127.0.0.1:1"], overrides={"cache": cache})


def names(path: Any) -> list[str]:
    return [type(s).__name__ for s in walk(path)]


def test_build_gives_the_stages_in_the_order_a_query_flows() -> None:
    config = cfg()
    path, _ = build(config, [RecordingBackend()], lambda: make_store(config.cache))
    assert names(path) == ORDER


def test_recall_is_left_out_without_a_cache_and_for_hybrid_fleets() -> None:
    config = cfg(enabled=False)
    path, _ = build(config, [RecordingBackend()], lambda: make_store(config.cache))
    assert names(path) == [n for n in ORDER if n != "Recall"]
    two = load_config(None, backends=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    path, _ = build(two, [RecordingBackend(), RecordingBackend("b")], lambda: make_store(two.cache))
    assert "Recall" not in names(path)


def test_build_with_tracing_on_gives_the_same_order_each_in_its_span(traced_on: None) -> None:
    config = cfg()
    path, _ = build(config, [RecordingBackend()], lambda: make_store(config.cache))
    assert names(path) == ORDER
    assert isinstance(path, Traced) and path.name == "Admit"


def test_build_hands_each_component_to_its_users_once() -> None:
    config = cfg(revalidate_interval="1m")

    async def invalidate(*a: Any) -> int:
        return 0

    admission, answers = Admission(1, 1, 1, 1.0), AnswerBytes(1 << 20, 1.0)
    path, parts = build(config, [RecordingBackend()], lambda: make_store(config.cache), admission, answers,
                        invalidate=invalidate)
    stages = {type(s).__name__: s for s in walk(path)}
    # The writer's leases and revalidator are the ones the service administers.
    assert parts.revalidator is not None
    assert parts.writer.leases is parts.leases and parts.writer.revalidator is parts.revalidator
    assert parts.fetcher.writer is parts.writer and parts.fetcher.leases is parts.leases
    assert parts.fetcher.landing is parts.landing is parts.reader.landing is parts.writer.landing
    # The stages use the same components.
    assert stages["Admit"].admission is admission and parts.admission is admission
    assert stages["Reserve"].budget is answers and parts.answers is answers
    assert stages["Plan"].planner is parts.planner and stages["Merge"].planner is parts.planner
    assert stages["Lookup"].reader is parts.reader and stages["Lookup"].slots is parts.slots
    assert stages["Coalesce"].landing is parts.landing and stages["FanOut"].fetcher is parts.fetcher
    assert bare(stages["Route"].cross_store) is parts.cross_store


@pytest.mark.parametrize(("cache", "given"), [
    ({"revalidate_interval": "1m"}, False),  # no invalidate to call
    ({}, True),  # not configured
    ({"enabled": False, "revalidate_interval": "1m"}, True),  # nothing cached
])
def test_build_without_revalidation_has_no_revalidator(cache: dict[str, Any], given: bool) -> None:
    async def invalidate(*a: Any) -> int:
        return 0

    config = cfg(**cache)
    _, parts = build(config, [RecordingBackend()], lambda: make_store(config.cache),
                     invalidate=invalidate if given else None)
    assert parts.revalidator is None and parts.writer.revalidator is None
    assert parts.writer.leases is parts.leases


def test_build_makes_its_own_admission_and_answer_budget_when_none_is_shared() -> None:
    config = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "limits": {"max_queries_in_flight": 7, "max_inflight_answer_bytes": 12345}})
    path, parts = build(config, [RecordingBackend()], lambda: make_store(config.cache))
    assert parts.admission.total == 7 and parts.answers.limit == 12345
    assert bare(path).admission is parts.admission
