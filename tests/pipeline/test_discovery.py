"""discovery.Discovered: the one TTL + single-flight component behind shard-label values,
metric names and series counts -- and its two older users, now thin (ShardValues, MetricNames)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.backends.protocol import BackendReply
from proxy.errors import PromError
from proxy.observe.metrics import METRICS
from proxy.pipeline.discovery import Discovered
from proxy.pipeline.names import MISS_REFRESH_S, MetricNames
from proxy.pipeline.planning import ShardValues


class Source:
    """A fetch that counts its calls, can be held at a gate, and fails on demand."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: set[str] = set()
        self.version = 0

    async def __call__(self, key: str) -> str:
        self.calls.append(key)
        await self.gate.wait()
        if key in self.fail:
            raise PromError("unavailable", f"{key} failed")
        return f"{key}{self.version}"


def make(ttl_ms: int = 10_000, retry_s: float = 30.0, max_entries: int = 100
         ) -> tuple[Discovered[str, str], Source, list[float]]:
    now = [1000.0]
    src = Source()
    return Discovered("t-discovery", src, ttl_ms, max_entries=max_entries, retry_after_failure_s=retry_s,
                      clock=lambda: now[0]), src, now


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_concurrent_askers_share_one_fetch() -> None:
    async def main() -> None:
        d, src, _ = make()
        src.gate.clear()
        before = METRICS.coalesced.labels("t-discovery")._value.get()
        waiting = [asyncio.create_task(d.get("a")) for _ in range(10)]
        many = asyncio.create_task(d.get_many(["a", "b", "a"]))
        await settle()
        src.gate.set()
        assert await asyncio.gather(*waiting) == ["a0"] * 10
        assert await many == {"a": "a0", "b": "b0"}
        assert sorted(src.calls) == ["a", "b"]
        assert METRICS.coalesced.labels("t-discovery")._value.get() - before == 10

    asyncio.run(main())


def test_a_stale_value_is_answered_and_refreshed_in_the_background() -> None:
    async def main() -> None:
        d, src, now = make(ttl_ms=10_000)
        assert await d.get("a") == "a0"
        now[0] += 5
        assert await d.get("a") == "a0" and src.calls == ["a"]  # fresh: no call
        now[0] += 6
        src.version = 1
        src.gate.clear()
        assert await d.get("a") == "a0"  # stale: answered at once...
        assert await d.get_many(["a"]) == {"a": "a0"}  # ...and one refresh, not two
        await settle()
        assert src.calls == ["a", "a"]
        src.gate.set()
        await settle()
        assert await d.get("a") == "a1"

    asyncio.run(main())


def test_max_age_asks_afresh_when_older() -> None:
    async def main() -> None:
        d, src, now = make()
        await d.get("a")
        now[0] += 2
        src.version = 1
        assert await d.get("a", max_age_s=5) == "a0"
        now[0] += 4
        assert await d.get("a", max_age_s=5) == "a1"
        assert len(src.calls) == 2

    asyncio.run(main())


def test_a_failure_is_left_out_and_not_retried_for_a_while_a_stale_value_kept() -> None:
    async def main() -> None:
        d, src, now = make(ttl_ms=10_000, retry_s=30)
        src.fail = {"b"}
        assert await d.get_many(["a", "b"]) == {"a": "a0"}
        assert await d.get_many(["a", "b"]) == {"a": "a0"}
        assert src.calls == ["a", "b"]  # b rests after its failure
        with pytest.raises(PromError):
            await d.get("b")  # asked for explicitly: tried, and its error raised
        now[0] += 31
        src.fail = set()
        assert await d.get_many(["b"]) == {"b": "b0"}
        # a stale value survives a failed refresh, and the refresh is not retried at once
        now[0] += 20
        src.fail = {"a"}
        assert await d.get_many(["a"]) == {"a": "a0"}
        await settle()
        calls = len(src.calls)
        assert await d.get_many(["a"]) == {"a": "a0"}
        await settle()
        assert len(src.calls) == calls
        assert d.peek("a") == "a0"

    asyncio.run(main())


def test_entries_are_bounded() -> None:
    async def main() -> None:
        d, _, _ = make(max_entries=3)
        await d.get_many([f"k{i}" for i in range(10)])
        assert len(d) == 3 and d.peek("k9") == "k90" and d.peek("k0") is None

    asyncio.run(main())


def test_a_callers_fetch_is_used_for_its_keys() -> None:
    async def main() -> None:
        d, src, _ = make()

        async def other(key: str) -> str:
            return key + "!"

        assert await d.get_many(["x"], other) == {"x": "x!"}
        assert src.calls == [] and await d.get("x") == "x!"

    asyncio.run(main())


# --- the users -------------------------------------------------------------------------------


class LabelBackend:
    name = "b"

    def __init__(self, answers: dict[str, list[Any]] | None = None, status: int = 200) -> None:
        self.answers = answers or {}
        self.status = status
        self.paths: list[str] = []

    async def request(self, method: str, path: str, **kw: Any) -> BackendReply:
        self.paths.append(path)
        label = path.split("/")[4]
        import orjson

        return BackendReply(self.status, orjson.dumps({"status": "success", "data": self.answers.get(label, [])}),
                            "application/json")


def test_shard_values_are_a_thin_user() -> None:
    async def main() -> None:
        backend = LabelBackend({"Hostname": ["n2", "n1"], "instance": ["i1"]})
        sv = ShardValues(backend, 60_000)  # type: ignore[arg-type]
        got = await asyncio.gather(sv.get(["Hostname", "instance"]), sv.get(["Hostname"]))
        assert got == [{"Hostname": ("n1", "n2"), "instance": ("i1",)}, {"Hostname": ("n1", "n2")}]
        assert sorted(backend.paths) == ["/api/v1/label/Hostname/values", "/api/v1/label/instance/values"]
        down = ShardValues(LabelBackend(status=503), 60_000)  # type: ignore[arg-type]
        assert await down.get(["Hostname"]) == {}  # not sharded by it, and not asked again at once
        assert await down.get(["Hostname"]) == {} and len(down.backend.paths) == 1  # type: ignore[attr-defined]

    asyncio.run(main())


def test_metric_names_are_a_thin_user() -> None:
    async def main() -> None:
        a, b = LabelBackend({"__name__": ["up", "x"]}), LabelBackend({"__name__": ["y"]})
        names = MetricNames([a, b], 60_000)  # type: ignore[list-item]
        assert await names.known() == frozenset({"up", "x", "y"})
        assert await names.known(missed=True) == frozenset({"up", "x", "y"})
        assert len(a.paths) == 1  # younger than MISS_REFRESH_S: not asked again
        assert MISS_REFRESH_S > 0
        failing = MetricNames([LabelBackend(status=500)], 60_000)  # type: ignore[list-item]
        with pytest.raises(PromError, match="could not list the metric names"):
            await failing.known()

    asyncio.run(main())
