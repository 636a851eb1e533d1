"""SingleFlight: one call per key among concurrent callers."""

from __future__ import annotations

import asyncio

import pytest

from proxy.primitives.singleflight import SingleFlight

SHARED: dict[str, int] = {}


def counting(name: str) -> SingleFlight[str, int]:
    """A flight that counts its shared waits (the pipeline passes its metric's inc)."""
    return SingleFlight(name, on_shared=lambda: SHARED.__setitem__(name, SHARED.get(name, 0) + 1))


def coalesced(name: str) -> float:
    return SHARED.get(name, 0)


def test_concurrent_callers_share_one_call() -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = counting("t-share")
        calls = 0
        gate = asyncio.Event()

        async def fn() -> int:
            nonlocal calls
            calls += 1
            await gate.wait()
            return 42

        before = coalesced("t-share")
        waiters = [asyncio.create_task(flight.do("k", fn)) for _ in range(50)]
        await asyncio.sleep(0)
        assert len(flight) == 1
        gate.set()
        assert await asyncio.gather(*waiters) == [42] * 50
        assert calls == 1
        assert coalesced("t-share") - before == 49
        assert len(flight) == 0

        # Finished calls are forgotten: the next caller makes a new call.
        assert await flight.do("k", fn) == 42
        assert calls == 2

    asyncio.run(main())


def test_different_keys_do_not_share() -> None:
    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight("t-keys")
        seen: list[str] = []

        async def make(k: str) -> str:
            seen.append(k)
            await asyncio.sleep(0.01)
            return k.upper()

        out = await asyncio.gather(*(flight.do(k, lambda k=k: make(k)) for k in ["a", "b", "a", "c", "b"]))
        assert out == ["A", "B", "A", "C", "B"]
        assert sorted(seen) == ["a", "b", "c"]

    asyncio.run(main())


def test_exception_reaches_every_waiter() -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight("t-err")
        calls = 0

        async def fn() -> int:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.01)
            raise RuntimeError("backend down")

        results = await asyncio.gather(*(flight.do("k", fn) for _ in range(5)), return_exceptions=True)
        assert calls == 1
        assert all(isinstance(r, RuntimeError) and str(r) == "backend down" for r in results)
        assert len(flight) == 0

    asyncio.run(main())


def test_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight("t-cancel")
        calls = 0
        gate = asyncio.Event()
        finished = asyncio.Event()

        async def fn() -> int:
            nonlocal calls
            calls += 1
            await gate.wait()
            finished.set()
            return 7

        first = asyncio.create_task(flight.do("k", fn))
        others = [asyncio.create_task(flight.do("k", fn)) for _ in range(3)]
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        assert await asyncio.gather(*others) == [7, 7, 7]
        assert calls == 1
        assert finished.is_set()

    asyncio.run(main())


def test_call_outlives_all_waiters_and_is_joined_by_a_later_caller() -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight("t-orphan")
        calls = 0
        gate = asyncio.Event()

        async def fn() -> int:
            nonlocal calls
            calls += 1
            await gate.wait()
            return 9

        lone = asyncio.create_task(flight.do("k", fn))
        await asyncio.sleep(0)
        lone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lone
        assert len(flight) == 1  # still running
        later = asyncio.create_task(flight.do("k", fn))
        await asyncio.sleep(0)
        gate.set()
        assert await later == 9
        assert calls == 1

    asyncio.run(main())


def test_orphaned_failure_is_not_reported_as_unretrieved(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight("t-orphan-err")

        async def fn() -> int:
            await asyncio.sleep(0.01)
            raise ValueError("nobody listens")

        lone = asyncio.create_task(flight.do("k", fn))
        await asyncio.sleep(0)
        lone.cancel()
        await asyncio.sleep(0.05)
        assert len(flight) == 0

    asyncio.run(main())
    assert "exception was never retrieved" not in caplog.text


def test_cancel_all_stops_calls_in_flight() -> None:
    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight("t-cancel-all")

        async def fn() -> int:
            await asyncio.sleep(10)
            return 1

        waiter = asyncio.create_task(flight.do("k", fn))
        await asyncio.sleep(0)
        flight.cancel_all()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)
        assert len(flight) == 0

    asyncio.run(main())
