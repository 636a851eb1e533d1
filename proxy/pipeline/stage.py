"""A stage: one job, one `async __call__(value) -> answer`, and the next stage it hands to."""

from __future__ import annotations

from typing import Protocol, TypeVar

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)


class Stage(Protocol[In, Out]):
    async def __call__(self, value: In, /) -> Out: ...
