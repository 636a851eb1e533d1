"""proxy/cache/deadline.py: `idle_timeout` times out a stalled wait after `idle_s` of idle
time, but does not count time the thread spent running (other requests' work on the loop)
against it; `max_wall_s` bounds it whatever happens; it cancels nothing but its own wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from proxy.cache.deadline import idle_timeout

T = TypeVar("T")


def run(aw: Awaitable[T]) -> T:
    async def main() -> T:
        return await aw

    return asyncio.run(main())


def spin(seconds: float) -> None:
    """Keep the thread running (the event loop blocked), as heavy encoding does."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


async def value_after(seconds: float, value: str = "done") -> str:
    await asyncio.sleep(seconds)
    return value


def test_an_answer_in_time_is_returned() -> None:
    async def main() -> str:
        return await idle_timeout(value_after(0.01, "v"), idle_s=1.0, max_wall_s=5.0)

    assert run(main()) == "v"


def test_an_immediate_answer_and_a_plain_future_work() -> None:
    async def immediate() -> int:
        return 42

    async def main() -> tuple[int, str]:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, "f")
        return await idle_timeout(immediate(), 0.5, 1.0), await idle_timeout(fut, 0.5, 1.0)

    assert run(main()) == (42, "f")


def test_a_stalled_wait_times_out_after_its_idle_time() -> None:
    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await idle_timeout(asyncio.sleep(30), idle_s=0.2, max_wall_s=10.0)
        return time.monotonic() - t0

    elapsed = run(main())
    # An idle loop: idle time is wall time, so ~0.2 s (slack for a loaded machine).
    assert 0.19 <= elapsed < 2.0


def reply_after_busy_work(reply: asyncio.Future[str]) -> asyncio.Task[None]:
    """Another task runs 0.6 s of CPU work (the loop blocked); the reply arrives 0.05 s later
    (after the timers due meanwhile have fired)."""

    async def busy_neighbour() -> None:
        await asyncio.sleep(0.01)  # let the wait start first
        spin(0.6)
        await asyncio.sleep(0.05)
        if not reply.cancelled():  # a wall-clock wait gave up on it
            reply.set_result("reply")

    return asyncio.create_task(busy_neighbour())


def test_time_the_loop_spends_running_other_work_is_not_counted() -> None:
    """The reply arrives after 0.6 s of the loop running other work: the idle deadline of
    0.25 s has not passed (the loop was never idle that long); a wall-clock one has."""

    async def main(wall_clock: bool) -> str:
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        neighbour = reply_after_busy_work(reply)
        try:
            if wall_clock:
                return await asyncio.wait_for(reply, 0.25)
            return await idle_timeout(reply, idle_s=0.25, max_wall_s=10.0)
        finally:
            await neighbour

    assert run(main(wall_clock=False)) == "reply"
    with pytest.raises(TimeoutError):  # the premise: a plain deadline would have expired
        run(main(wall_clock=True))


def test_the_idle_clock_keeps_running_around_busy_stretches() -> None:
    """Busy stretches pause the idle clock; idle time before and after them still adds up:
    a wait that never ends times out after ~idle_s of idle time plus the busy time."""

    async def main() -> float:
        async def busy_neighbour() -> None:
            await asyncio.sleep(0.05)
            spin(0.4)

        neighbour = asyncio.create_task(busy_neighbour())
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await idle_timeout(asyncio.sleep(30), idle_s=0.3, max_wall_s=10.0)
        await neighbour
        return time.monotonic() - t0

    elapsed = run(main())
    assert 0.3 + 0.4 - 0.05 <= elapsed < 3.0


def test_the_wall_bound_holds_even_when_the_loop_is_never_idle() -> None:
    async def main() -> float:
        stop = False

        async def always_busy() -> None:
            while not stop:
                spin(0.02)
                await asyncio.sleep(0)

        neighbour = asyncio.create_task(always_busy())
        t0 = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                await idle_timeout(asyncio.sleep(30), idle_s=30.0, max_wall_s=0.3)
        finally:
            stop = True
            await neighbour
        return time.monotonic() - t0

    elapsed = run(main())
    assert 0.29 <= elapsed < 2.0


def test_the_awaited_work_is_cancelled_on_timeout() -> None:
    async def main() -> bool:
        cancelled = False

        async def slow() -> None:
            nonlocal cancelled
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled = True
                raise

        with pytest.raises(TimeoutError):
            await idle_timeout(slow(), 0.05, 1.0)
        return cancelled

    assert run(main()) is True


def test_errors_of_the_awaited_work_pass_through() -> None:
    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionResetError("redis went away")

    async def main() -> None:
        with pytest.raises(ConnectionResetError, match="redis went away"):
            await idle_timeout(fails(), 1.0, 5.0)

    run(main())


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    """The caller's own cancellation (a client gone) must not turn into a TimeoutError, which
    the stores read as "Redis is slow" (and count against the breaker)."""

    async def main() -> None:
        task = asyncio.create_task(idle_timeout(asyncio.sleep(30), idle_s=5.0, max_wall_s=10.0))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    run(main())


def test_nested_deadlines_each_end_their_own_wait() -> None:
    """An inner deadline that expires is the inner call's TimeoutError; the outer call goes on
    and returns (the task is not left cancelled), and the outer's deadline still works."""

    async def main() -> tuple[str, bool]:
        async def inner_then_value() -> str:
            try:
                await idle_timeout(asyncio.sleep(30), 0.05, 1.0)
            except TimeoutError:
                pass
            await asyncio.sleep(0.05)  # would raise CancelledError if the task were left cancelling
            return "outer done"

        got = await idle_timeout(inner_then_value(), 2.0, 5.0)
        task = asyncio.current_task()
        assert task is not None
        return got, task.cancelling() == 0

    assert run(main()) == ("outer done", True)

    async def outer_expires() -> None:
        with pytest.raises(TimeoutError):
            await idle_timeout(idle_timeout(asyncio.sleep(30), 5.0, 10.0), 0.1, 10.0)

    t0 = time.monotonic()
    run(outer_expires())
    assert time.monotonic() - t0 < 2.0


def test_many_waits_at_once_time_out_independently() -> None:
    async def main() -> list[object]:
        quick = [idle_timeout(value_after(0.01, f"q{i}"), 1.0, 5.0) for i in range(50)]
        stalled = [idle_timeout(asyncio.sleep(30), 0.1, 5.0) for _ in range(50)]
        return await asyncio.gather(*quick, *stalled, return_exceptions=True)

    out = run(main())
    assert out[:50] == [f"q{i}" for i in range(50)]
    assert all(isinstance(x, TimeoutError) for x in out[50:])
