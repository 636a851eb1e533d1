"""Shared by the stage tests (tests/pipeline/test_<stage module>.py): queries, configs, a fake
next stage that records what it got, and fake backends that record their calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from proxy.backends import Backend, BackendReply
from proxy.backends.tenancy import NOBODY, Caller
from proxy.config import BackendConfig, load_config
from proxy.pipeline.values import Answer, Query
from proxy.result import QueryResult
from shardplanner.plan import QueryRequest, Span

H = 3_600_000
T0 = 1_700_000_000_000 // H * H  # hour-aligned
JSON = "application/json"
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def config(**planner: Any) -> Any:
    return load_config(None, backends=["http://127.0.0.1:1"], overrides={"planner": planner,
                                                                          "cache": {"enabled": False}})


def range_query(query: str, hours: int = 3, step: int = 60_000) -> Query:
    """`hours` hour cells of points, T0 to T0 + hours - step."""
    end = T0 + hours * H - step
    req = QueryRequest(query=query, span=Span.range(T0, end, step))
    pairs = [("query", query), ("start", str(T0 / 1000)), ("end", str(end / 1000)), ("step", str(step / 1000))]
    return Query(req=req, pairs=pairs, path="/api/v1/query_range", timeout_s=5)


class Recorder:
    """A fake next stage: records what it got, answers with `answer` (or raises it)."""

    def __init__(self, answer: Any = None) -> None:
        self.got: list[Any] = []
        self.answer = answer if answer is not None else Answer(result=QueryResult.empty())

    async def __call__(self, value: Any) -> Any:
        self.got.append(value)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer(value) if callable(self.answer) else self.answer


class FakeBackend:
    def __init__(self, name: str = "default") -> None:
        self.name = name
        self.calls: list[tuple[str, str]] = []
        self.cfg = load_config(None, backends=["http://127.0.0.1:1"]).backends[0]

    async def request(self, method: str, path: str, **kw: Any) -> BackendReply:
        self.calls.append((method, path))
        return BackendReply(200, EMPTY_VECTOR, JSON)


def series(values: dict[int, float], **labels: str) -> tuple[dict[str, str], list[int], list[float]]:
    return (labels, sorted(values), [values[t] for t in sorted(values)])


async def values_of(v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return v


# A backend call as a `RecordingBackend` saw it.
Call = tuple[str, str, list[tuple[str, str]], Caller]
Handler = Callable[[str, str, list[tuple[str, str]], Caller], BackendReply]


def matrix_reply(form: list[tuple[str, str]]) -> BackendReply:
    """A range query's answer: one series `{job="a"}` with a point at every step."""
    f = dict(form)
    start, end, step = (round(float(f[k]) * 1000) for k in ("start", "end", "step"))
    values = [[t / 1000, "1"] for t in range(start, end + 1, step)]
    return BackendReply(200, orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"job": "a"}, "values": values}]}}), JSON)


def default_handler(method: str, path: str, form: list[tuple[str, str]], caller: Caller) -> BackendReply:
    if path == "/api/v1/query_range":
        return matrix_reply(form)
    return BackendReply(200, EMPTY_VECTOR, JSON)


class RecordingBackend(Backend):
    """A real `Backend` (its config, breaker, name) whose calls never leave the process:
    each is recorded (method, path, params or form, caller) and answered by `handler`."""

    def __init__(self, name: str = "default", handler: Handler = default_handler, **cfg: Any) -> None:
        super().__init__(BackendConfig.model_validate({"name": name, "url": "http://127.0.0.1:1", **cfg}))
        self.handler = handler
        self.calls: list[Call] = []

    async def request(self, method: str, path: str, *, params: Any = None, form: Any = None,
                      caller: Caller = NOBODY, **kw: Any) -> BackendReply:
        pairs = list(form or params or [])
        self.calls.append((method, path, pairs, caller))
        reply = self.handler(method, path, pairs, caller)
        check = kw.get("check")
        if check is not None and reply.ok:  # as Backend.request does: a 200 is checked (and decoded)
            assert check(reply) is None, "a fake backend's answer must be sound"
        return reply

    def queries(self) -> list[Call]:
        """The query calls made (not discovery: no label values, no series counts)."""
        return [c for c in self.calls if c[1] in ("/api/v1/query", "/api/v1/query_range")
                and not dict(c[2]).get("query", "").startswith("count({__name__=")]
