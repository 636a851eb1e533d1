"""Backend facts (proxy/pipeline/backend_facts.py): buildinfo's Go version and the config's
evaluation interval, read once per backend with one shared call, bounded (the call names its
body limit), the documented defaults when the backend does not say or cannot be asked; and
the Planner planning in the primary's dialect."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.backends.protocol import BackendReply
from proxy.config import load_config
from proxy.pipeline.backend_facts import (
    CONFIG_BODY_MAX,
    DEFAULT_DIALECT,
    DEFAULT_EVALUATION_INTERVAL_MS,
    FACT_BODY_MAX,
    RETRY_AFTER_FAILURE_S,
    BackendFacts,
    BuildInfo,
    build_info,
)
from proxy.pipeline.eval_interval import EvaluationIntervals
from proxy.pipeline.planning import Planner
from shardplanner.plan import QueryRequest
from shardplanner.promql import GO_1_19, Dialect

BUILDINFO = "/api/v1/status/buildinfo"
CONFIG = "/api/v1/status/config"


def buildinfo(go: object = "go1.22.0", version: object = "2.51.0") -> bytes:
    return orjson.dumps({"status": "success", "data": {"version": version, "revision": "x", "branch": "HEAD",
                                                       "buildUser": "u", "buildDate": "d", "goVersion": go}})


def config(interval: str) -> bytes:
    yaml = f"global:\n  scrape_interval: 15s\n  evaluation_interval: {interval}\nscrape_configs: []\n"
    return orjson.dumps({"status": "success", "data": {"yaml": yaml}})


class FactsBackend:
    """Answers buildinfo and status/config from `answers` (path -> (status, body)); records
    each call's path and body limit; `delay_s` keeps calls in flight together."""

    name = "prom"

    def __init__(self, answers: dict[str, tuple[int, bytes]], delay_s: float = 0.0) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.calls: list[tuple[str, int | None]] = []
        self.cfg = load_config(None, backends=["http://127.0.0.1:1"]).backends[0]

    async def request(self, method: str, path: str, **kw: Any) -> BackendReply:
        self.calls.append((path, kw.get("max_body_bytes")))
        await asyncio.sleep(self.delay_s)
        if path.startswith("/api/v1/query"):
            return BackendReply(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}',
                                "application/json")
        status, body = self.answers.get(path, (404, b"404 page not found"))
        return BackendReply(status, body, "application/json")

    def asked(self, path: str) -> int:
        return sum(1 for p, _ in self.calls if p == path)


def test_build_info_reads_the_go_version() -> None:
    assert build_info(buildinfo()) == BuildInfo("2.51.0", "go1.22.0", Dialect((1, 22)))
    assert build_info(buildinfo("go1.19.5", "2.42.0")).dialect == GO_1_19


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[]", b'{"status":"error"}', b'{"status":"success","data":[]}', buildinfo(go=None),
    buildinfo(go=122), buildinfo(go="unknown"), buildinfo(go="x" * 100 + "go1.22.0"),
])
def test_an_answer_that_does_not_say_is_the_default(body: bytes) -> None:
    info = build_info(body)
    assert info.dialect == DEFAULT_DIALECT == GO_1_19
    assert len(info.go_version) <= 64 and info.go_version.isprintable()


def test_what_a_buildinfo_says_is_kept_short_and_printable() -> None:
    info = build_info(buildinfo(go="go1.22.1\x00\x1b[31m" + "y" * 10_000, version="\n" * 100 + "2.51.0"))
    assert info.go_version == "go1.22.1[31m" + "y" * 50 and info.version == ""
    assert info.dialect == Dialect((1, 22))


def test_facts_are_read_once_per_backend_with_one_shared_bounded_call() -> None:
    async def main() -> None:
        b = FactsBackend({BUILDINFO: (200, buildinfo()), CONFIG: (200, config("30s"))}, delay_s=0.05)
        other = FactsBackend({BUILDINFO: (200, buildinfo("go1.19.5"))})
        facts = BackendFacts()
        got = await asyncio.gather(*(facts.dialect(b) for _ in range(5)), facts.dialect(other))  # type: ignore[arg-type]
        assert got == [Dialect((1, 22))] * 5 + [GO_1_19]
        assert await facts.evaluation_interval_ms(b) == 30_000  # type: ignore[arg-type]
        assert await EvaluationIntervals(facts).of(b) == 30_000  # type: ignore[arg-type]
        assert await facts.dialect(b) == Dialect((1, 22))  # type: ignore[arg-type]
        assert b.calls == [(BUILDINFO, FACT_BODY_MAX), (CONFIG, CONFIG_BODY_MAX)]
        assert other.calls == [(BUILDINFO, FACT_BODY_MAX)]

    asyncio.run(main())


def test_a_backend_without_the_endpoints_has_the_defaults_once() -> None:
    async def main() -> None:
        amp = FactsBackend({})  # AMP: 404 for both
        facts = BackendFacts()
        for _ in range(3):
            assert await facts.dialect(amp) == GO_1_19  # type: ignore[arg-type]
            assert await EvaluationIntervals(facts).of(amp) == DEFAULT_EVALUATION_INTERVAL_MS  # type: ignore[arg-type]
        assert amp.asked(BUILDINFO) == amp.asked(CONFIG) == 1  # "does not say" is an answer, kept

    asyncio.run(main())


@pytest.mark.parametrize("status", [403, 404, 400])
def test_a_refusal_is_the_default_kept(status: int) -> None:
    async def main() -> None:
        b = FactsBackend({BUILDINFO: (status, b'{"message":"no"}'), CONFIG: (status, b"")})
        facts = BackendFacts()
        for _ in range(3):
            assert await facts.dialect(b) == GO_1_19  # type: ignore[arg-type]
            assert await facts.evaluation_interval_ms(b) == DEFAULT_EVALUATION_INTERVAL_MS  # type: ignore[arg-type]
        assert b.asked(BUILDINFO) == b.asked(CONFIG) == 1

    asyncio.run(main())


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_failed_read_is_the_default_and_asked_again_after_a_while(status: int) -> None:
    async def main() -> None:
        now = [1000.0]
        b = FactsBackend({BUILDINFO: (status, b'{"status":"error"}'), CONFIG: (status, b"")})
        facts = BackendFacts(clock=lambda: now[0])
        assert await facts.dialect(b) == GO_1_19  # type: ignore[arg-type]
        assert await facts.evaluation_interval_ms(b) == DEFAULT_EVALUATION_INTERVAL_MS  # type: ignore[arg-type]
        assert await facts.dialect(b) == GO_1_19  # type: ignore[arg-type]
        assert b.asked(BUILDINFO) == 1  # resting after a failure
        b.answers[BUILDINFO] = (200, buildinfo())
        now[0] += RETRY_AFTER_FAILURE_S + 1
        assert await facts.dialect(b) == Dialect((1, 22))  # type: ignore[arg-type]
        assert b.asked(BUILDINFO) == 2

    asyncio.run(main())


def test_the_evaluation_interval_interface_makes_its_own_facts() -> None:
    async def main() -> None:
        b = FactsBackend({CONFIG: (200, config("1m30s"))})
        assert await EvaluationIntervals().of(b) == 90_000  # type: ignore[arg-type]

    asyncio.run(main())


NAMED = 'sum by (Hostname) (label_replace(DCGM_FI_DEV_GPU_UTIL, "h", "$n", "Hostname", "(?<n>.+)"))'


@pytest.mark.parametrize(("go", "planned"), [("go1.22.0", True), ("go1.19.5", False), (None, False)])
def test_the_planner_plans_in_the_primarys_dialect(go: str | None, planned: bool) -> None:
    async def main() -> None:
        primary = FactsBackend({BUILDINFO: (200, buildinfo(go))} if go else {})
        planner = Planner(load_config(None, backends=["http://127.0.0.1:1"]), primary)  # type: ignore[arg-type]
        req = QueryRequest.range(NAMED, 0, 3_600_000, 60_000)
        got = await asyncio.gather(planner.plan(req), planner.plan(req))
        assert all((p.expr is not None) is planned for p in got)
        assert primary.asked(BUILDINFO) == 1  # the first queries waited for one shared call
        assert planner.settings.dialect == (Dialect.of_go_version(go) if go else GO_1_19)

    asyncio.run(main())


def test_a_query_no_dialect_reads_differently_asks_nothing() -> None:
    async def main() -> None:
        primary = FactsBackend({BUILDINFO: (200, buildinfo())})
        planner = Planner(load_config(None, backends=["http://127.0.0.1:1"]), primary)  # type: ignore[arg-type]
        plan = await planner.plan(QueryRequest.range('sum(x{a=~"b.*"})', 0, 3_600_000, 60_000))
        assert plan.expr is not None and primary.asked(BUILDINFO) == 0

    asyncio.run(main())


def test_an_amp_backend_is_never_asked_for_facts() -> None:
    """AMP (`kind: amp`) has neither status/config nor buildinfo: the defaults, without the
    404 a call would cost per process (and per throttled retry)."""

    async def main() -> None:
        amp = FactsBackend({BUILDINFO: (200, buildinfo()), CONFIG: (200, config("30s"))})
        amp.cfg = amp.cfg.model_copy(update={"kind": "amp"})
        facts = BackendFacts()
        assert await facts.dialect(amp) == DEFAULT_DIALECT  # type: ignore[arg-type]
        assert await facts.evaluation_interval_ms(amp) == DEFAULT_EVALUATION_INTERVAL_MS  # type: ignore[arg-type]
        assert amp.calls == []

    asyncio.run(main())
