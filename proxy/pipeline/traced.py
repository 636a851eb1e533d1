"""A pipeline stage inside a tracing span (proxy/observe/tracing.py), with what explains its time.

`path.build` wraps each stage's next stage in `Traced` only when tracing is on; off, the
stages call each other directly. The span is named after the stage (`Plan`, `Lookup`, ...);
its attributes come from the value handed down and the answer handed up: the plan's pieces,
cache hits, backend calls, X-Cache, the relayed status.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ..observe import tracing
from .lookup import Calls, Pieces, Work
from .stage import Stage
from .values import Answer, Query

In = TypeVar("In")
Out = TypeVar("Out")

Attrs = dict[str, tracing.AttrValue | None]


def _in_attrs(value: object) -> Attrs:
    if isinstance(value, Query):
        return {"promaccel.path": value.path, "promaccel.range": value.req.is_range,
                "promaccel.pieces": len(value.plan.pieces) if value.plan is not None else None,
                "promaccel.cached": value.cache is not None if value.plan is not None else None}
    if isinstance(value, Work):
        return {"promaccel.pieces": len(value.slots),
                "promaccel.cache_hits": sum(1 for s in value.slots if s.status == "hit")}
    if isinstance(value, Calls):
        return {"promaccel.backend_calls": len(value.fetches), "promaccel.coalesced": len(value.waits)}
    return {}


def _out_attrs(value: object) -> Attrs:
    if isinstance(value, Answer):
        h = value.headers
        return {"promaccel.cache": h.get("X-Cache"), "promaccel.answer_pieces": h.get("X-Promaccel-Pieces"),
                "promaccel.relayed_status": value.reply.status if value.reply is not None else None}
    if isinstance(value, Pieces):
        return {"promaccel.cache": value.status}
    return {}


class Traced(Generic[In, Out]):
    """`stage`, its call inside a span named `name`."""

    def __init__(self, name: str, stage: Stage[In, Out]) -> None:
        self.name = name
        self.stage = stage

    async def __call__(self, value: In, /) -> Out:
        with tracing.span(self.name, _in_attrs(value)) as s:
            out = await self.stage(value)
            tracing.set_attrs(s, _out_attrs(out))
            return out


def traced(stage: Stage[In, Out]) -> Stage[In, Out]:
    """`stage` wrapped in its span when tracing is on; itself when off."""
    return Traced(type(stage).__name__, stage) if tracing.enabled() else stage
