"""RouteAnswer (`proxy/pipeline/hybrid/fetch.py`): a fetch answered by the backend(s) of the
route it carries: one backend, the parts of a route split in time (concatenated), or several
backends that each hold the same times (merged). A backend that does not answer costs its
part, with a warning, only when the request spans several backends (`Router.partial_ok`).
A fake asker answers per backend; no socket."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.context import RequestContext
from proxy.pipeline.hybrid.fetch import RouteAnswer
from proxy.pipeline.hybrid.router import Router
from proxy.pipeline.units import Fetch
from proxy.result import QueryResult
from shardplanner.holdings import BackendHolding
from shardplanner.plan import Span
from shardplanner.routing import Route, TimePart

MIN = 60_000
T0 = 1_700_000_000_000 // 3_600_000 * 3_600_000
URLS = {"local": "http://127.0.0.1:1", "amp": "http://127.0.0.1:2"}
HOLDINGS = (BackendHolding("local", (".*",), primary=True), BackendHolding("amp", (".*",)))


@dataclass
class FakeBackend:
    name: str


class Ask:
    """Answers for each backend a series `up` with value 1 (local) or 2 (amp) at every step of
    the asked range; a backend in `down` fails as unreachable."""

    def __init__(self, down: tuple[str, ...] = ()) -> None:
        self.down = down
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(self, backend: Any, path: str, form: Any, timeout_s: float, ctx: Any) -> QueryResult:
        f = dict(form)
        self.asked.append((backend.name, f.get("start", ""), f.get("end", "")))
        if backend.name in self.down:
            raise PromError("unavailable", f"backend {backend.name!r} is unreachable (ConnectError)")
        lo, hi = int(float(f["start"]) * 1000), int(float(f["end"]) * 1000)
        ts = list(range(lo, hi + 1, MIN))
        return QueryResult.from_series("matrix", [({"__name__": "up"}, ts, [1.0 if backend.name == "local" else 2.0] * len(ts))])


def answer(route: Route, ask: Ask, partial_ok: bool = True, span: Span = Span.range(T0, T0 + 9 * MIN, MIN)) -> QueryResult:
    cfg = load_config(None, backends=[URLS["local"]])
    backends = [FakeBackend("local"), FakeBackend("amp")]
    router = Router(HOLDINGS, "up", 0, URLS, partial_ok=partial_ok)
    f = Fetch("up", None, -1, span, (), router.id(route), routed=route)
    form = [("query", "up"), ("start", str(span.start_ms / 1000)), ("end", str(span.end_ms / 1000)), ("step", "60")]
    return asyncio.run(RouteAnswer(cfg, backends, ask).answer(f, "/api/v1/query_range", form, 5, router,  # type: ignore[arg-type]
                                                              RequestContext()))


def test_the_route_is_read_from_the_fetch() -> None:
    """The router has no table of routes: the fetch carries its own, and it is obeyed (amp is
    not the primary)."""
    ask = Ask()
    result = answer(Route.single("amp"), ask)
    assert [a[0] for a in ask.asked] == ["amp"] and result.to_pylist()[0][2] == [2.0] * 10


def test_a_split_route_asks_each_part_and_concatenates_them() -> None:
    ask = Ask()
    parts = (TimePart(T0, T0 + 4 * MIN, ("local",)), TimePart(T0 + 5 * MIN, T0 + 9 * MIN, ("amp",)))
    result = answer(Route.split_time(parts), ask)
    assert sorted(a[0] for a in ask.asked) == ["amp", "local"]
    [(labels, ts, values)] = result.to_pylist()
    assert ts == list(range(T0, T0 + 10 * MIN, MIN)) and values == [1.0] * 5 + [2.0] * 5
    assert result.warnings == []


def test_a_part_whose_backend_is_down_is_missing_with_a_warning() -> None:
    parts = (TimePart(T0, T0 + 4 * MIN, ("local",)), TimePart(T0 + 5 * MIN, T0 + 9 * MIN, ("amp",)))
    result = answer(Route.split_time(parts), Ask(down=("amp",)))
    [(_, ts, values)] = result.to_pylist()
    assert ts == list(range(T0, T0 + 5 * MIN, MIN)) and values == [1.0] * 5
    assert result.warnings == [f"promaccel: backend 'amp' did not answer (unavailable); the data from "
                               f"{(T0 + 5 * MIN) // 1000} to {(T0 + 9 * MIN) // 1000} is missing"]


def test_a_single_backend_down_is_missing_only_when_the_request_spans_several() -> None:
    result = answer(Route.single("amp"), Ask(down=("amp",)))
    assert result.n_samples == 0 and len(result.warnings) == 1 and "'amp' did not answer" in result.warnings[0]
    with pytest.raises(PromError) as err:
        answer(Route.single("amp"), Ask(down=("amp",)), partial_ok=False)
    assert err.value.kind == "unavailable"


def test_an_overlap_merges_and_leaves_out_a_backend_that_is_down() -> None:
    ask = Ask()
    result = answer(Route.overlap(("local", "amp")), ask)
    assert sorted(a[0] for a in ask.asked) == ["amp", "local"]
    assert result.to_pylist()[0][2] == [1.0] * 10 and result.warnings == []  # the preferred backend's values
    result = answer(Route.overlap(("local", "amp")), Ask(down=("local",)))
    assert result.to_pylist()[0][2] == [2.0] * 10
    assert result.warnings == ["promaccel: backend 'local' did not answer (unavailable); this answer holds only "
                               "the data of the other backends for the times both hold"]

