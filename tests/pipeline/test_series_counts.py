"""Series counts learnt from the backend (proxy/pipeline/series_counts.py): one bounded
`count({__name__="m"})` per metric, a hostile answer refused, at most MAX_PER_QUERY metrics a
query, failures falling back to the planner's guess; and the Planner sizing `shards: auto`
from them."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.backends.protocol import BackendReply
from proxy.config import load_config
from proxy.pipeline.planning import Planner
from proxy.pipeline.series_counts import COUNT_BODY_MAX, MAX_PER_QUERY, SeriesCounts, count_query, parse_count
from shardplanner.plan import QueryRequest, Span

T = 1_700_000_000_000
HOUR = 3_600_000


def vector(*values: str) -> bytes:
    return orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [T / 1000, v]} for v in values]}})


def test_parse_count() -> None:
    assert parse_count(200, vector("37")) == 37
    assert parse_count(200, vector("0")) == 0


@pytest.mark.parametrize(("status", "body", "why"), [
    (503, vector("3"), "HTTP 503"),
    (200, vector(), "no series"),
    (200, vector("1", "2"), "not one sample"),
    (200, vector("NaN"), "not a series count"),
    (200, vector("+Inf"), "not a series count"),
    (200, vector("-1"), "not a series count"),
    (200, vector("1.5"), "not a series count"),
    (200, vector("1e12"), "not a series count"),
    (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "not one sample"),
    (200, b'{"status":"error","errorType":"bad_data"}', "not one sample"),
    (200, b"[1, 2]", "not one sample"),
    (200, b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1,7]}]}}', "not a sample"),
    (200, vector("3") + b" " * COUNT_BODY_MAX, "bytes to a count"),
])
def test_a_hostile_or_odd_answer_is_refused(status: int, body: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_count(status, body)


class CountingBackend:
    """Answers `count({__name__="m"})` from `series`; records the queries and times asked."""

    name = "prom"

    def __init__(self, series: dict[str, int], fail: bool = False, huge: bool = False) -> None:
        self.series = series
        self.fail = fail
        self.huge = huge
        self.asked: list[tuple[str, str]] = []
        self.cfg = load_config(None, backends=["http://127.0.0.1:1"]).backends[0]

    async def request(self, method: str, path: str, **kw: Any) -> BackendReply:
        params = dict(kw.get("params") or ())
        if path.startswith("/api/v1/label/"):
            hosts = [f"n{i}" for i in range(10)]
            return BackendReply(200, orjson.dumps({"status": "success", "data": hosts}), "application/json")
        assert path == "/api/v1/query" and kw.get("timeout_s")
        self.asked.append((params["query"], params["time"]))
        if self.fail:
            return BackendReply(503, b'{"status":"error","errorType":"unavailable","error":"down"}', "application/json")
        if self.huge:
            return BackendReply(200, b"x" * 10_000_000, "application/json")
        name = params["query"].split('"')[1]
        n = self.series.get(name)
        return BackendReply(200, vector(str(n)) if n is not None else vector(), "application/json")


def test_counts_are_asked_once_per_metric_at_the_query_time_and_cached() -> None:
    async def main() -> None:
        b = CountingBackend({"a": 3, "b": 40})
        sc = SeriesCounts(b, 60_000)  # type: ignore[arg-type]
        got = await asyncio.gather(sc.get(["a", "b"], T), sc.get(["b"], T))
        assert got == [{"a": 3, "b": 40}, {"b": 40}]
        assert sorted(b.asked) == [(count_query("a"), "1700000000.000"), (count_query("b"), "1700000000.000")]
        assert await sc.get(["a", "b", "none"], T + HOUR) == {"a": 3, "b": 40}  # none: no series
        assert len(b.asked) == 3
        assert count_query("a") == 'count({__name__="a"})'

    asyncio.run(main())


def test_bounded_per_query_and_only_metric_names_asked() -> None:
    async def main() -> None:
        b = CountingBackend({f"m{i}": i for i in range(50)})
        sc = SeriesCounts(b, 60_000)  # type: ignore[arg-type]
        got = await sc.get([f"m{i}" for i in range(50)] + ['x"}) or vector(1'], T)
        assert len(got) == MAX_PER_QUERY == len(b.asked)
        assert all(q.startswith('count({__name__="m') for q, _ in b.asked)

    asyncio.run(main())


def test_a_time_in_the_future_is_counted_now() -> None:
    async def main() -> None:
        b = CountingBackend({"a": 1})
        await SeriesCounts(b, 60_000).get(["a"], 10**15)  # type: ignore[arg-type]
        assert float(b.asked[0][1]) < 10**12

    asyncio.run(main())


@pytest.mark.parametrize("how", ["fail", "huge"])
def test_failures_fall_back_and_rest(how: str) -> None:
    async def main() -> None:
        b = CountingBackend({"a": 1}, fail=how == "fail", huge=how == "huge")
        sc = SeriesCounts(b, 60_000)  # type: ignore[arg-type]
        assert await sc.get(["a"], T) == {}
        assert await sc.get(["a"], T) == {} and len(b.asked) == 1  # not asked again at once

    asyncio.run(main())


def _planner(series: dict[str, int], **planner: Any) -> tuple[Planner, CountingBackend]:
    cfg = load_config(None, backends=["http://127.0.0.1:1"], overrides={
        "planner": {"split_interval": "1h", "shards": "auto", "max_parallel": 16,
                    "max_samples_per_piece": 1000, **planner}, "cache": {"enabled": False}})
    b = CountingBackend(series)
    return Planner(cfg, b), b  # type: ignore[arg-type]


def _count(planner: Planner, query: str) -> int:
    req = QueryRequest(query, Span.range(T, T + 3 * HOUR, 60_000))
    p = asyncio.run(planner.plan(req))
    return max((x.shard.count for x in p.pieces if x.shard), default=1)


def test_the_planner_sizes_auto_shards_from_the_real_count() -> None:
    q = "sum by (namespace) (DCGM_FI_DEV_GPU_UTIL)"
    # 60 steps per piece: the guess (10 nodes x 8) -> 4,800 samples -> 5 shards
    assert _count(_planner({})[0], q) == 5
    few, b = _planner({"DCGM_FI_DEV_GPU_UTIL": 3})
    assert _count(few, q) == 1 and [a[0] for a in b.asked] == [count_query("DCGM_FI_DEV_GPU_UTIL")]
    assert _count(_planner({"DCGM_FI_DEV_GPU_UTIL": 120})[0], q) == 8
    # a fixed shard count asks no count
    fixed, b = _planner({"DCGM_FI_DEV_GPU_UTIL": 3}, shards=4)
    assert _count(fixed, q) == 4 and b.asked == []


def test_counts_are_per_tenant_and_asked_with_its_headers() -> None:
    from proxy.backends.tenancy import Tenant

    class PerTenant(CountingBackend):
        async def request(self, method: str, path: str, **kw: Any) -> BackendReply:
            tenant = dict(kw.pop("caller").tenant.headers).get("x-scope-orgid", "")
            self.series = {"a": 5 if tenant == "t1" else 50}
            return await super().request(method, path, **kw)

    async def main() -> None:
        b = PerTenant({})
        sc = SeriesCounts(b, 60_000)  # type: ignore[arg-type]
        t1, t2 = Tenant((("x-scope-orgid", "t1"),), "t1"), Tenant((("x-scope-orgid", "t2"),), "t2")
        assert await sc.get(["a"], T, t1) == {"a": 5}
        assert await sc.get(["a"], T, t2) == {"a": 50}
        assert await sc.get(["a"], T, t1) == {"a": 5}
        assert len(b.asked) == 2

    asyncio.run(main())
