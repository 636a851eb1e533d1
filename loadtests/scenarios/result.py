"""What every scenario's typed result shares, and their JSON form (results.json).

Each scenario module returns a dataclass deriving from `ScenarioResult`; the report reads them
by attribute. results.json keeps the flat shape earlier runs wrote (the tally's counts at the
top level of each scenario), so `python -m loadtests.report` re-renders old runs too:
`from_json` builds a result from such a dict, ignoring keys it does not know.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..client import Tally

T = TypeVar("T")


@dataclass
class LogFindings:
    """Warnings and errors a promaccel wrote while a scenario drove it."""

    warnings: int = 0
    errors: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class Meters:
    """What changed on both servers' /metrics (and CPU) around one measured call."""

    backend_requests: float = math.nan  # query requests reaching Prometheus (its /metrics)
    backend_bytes: float = math.nan  # bytes Prometheus wrote for them (gzip if asked)
    prometheus_cpu_s: float = math.nan
    # promaccel's own view; None when no promaccel was running
    backend_calls: float | None = None
    cache: dict[str, float] | None = None
    cache_errors: dict[str, float] | None = None
    promaccel_cpu_s: float | None = None


@dataclass(kw_only=True)
class ScenarioResult:
    """A scenario's outcome: its notes, its comparisons (`tally`), which promaccel source it
    ran and what that promaccel logged, the plots the report drew."""

    name: ClassVar[str] = ""
    notes: list[str] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    skipped: bool = False
    promaccel_code: list[str] = field(default_factory=list)
    promaccel_log: LogFindings = field(default_factory=LogFindings)
    plots: list[str] = field(default_factory=list)

    # The tally's counts, read as the scenario's own (the report sums them over scenarios).
    @property
    def compared(self) -> int:
        return self.tally.compared

    @property
    def mismatches(self) -> int:
        return self.tally.mismatches

    @property
    def failures(self) -> int:
        return self.tally.failures

    @property
    def direct_failures(self) -> int:
        return self.tally.direct_failures

    @property
    def compares(self) -> bool:
        """Whether the scenario compares answers (the report then lists the comparison)."""
        return not self.skipped

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, **dataclasses.asdict(self)}
        out.update(out.pop("tally"))
        return out

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        made = build(cls, data)
        tally_fields = {f.name for f in dataclasses.fields(Tally)}
        if "tally" not in data:  # the flat form of results.json
            made.tally = build(Tally, {k: v for k, v in data.items() if k in tally_fields})  # type: ignore[attr-defined]
        return made


def nest_meters(data: dict[str, Any]) -> dict[str, Any]:
    """Runs before the typed results (2026-12-04) wrote a record's meters beside its own keys:
    gathered under "meters" for `build`."""
    if "meters" in data:
        return data
    names = {f.name for f in dataclasses.fields(Meters)}
    return {**data, "meters": {k: v for k, v in data.items() if k in names}}


def build(cls: type[T], data: dict[str, Any]) -> T:
    """A dataclass from its JSON dict, nested dataclasses (also in lists, dicts and optionals)
    included; unknown keys are ignored, missing ones take their defaults. A class with an
    `upgrade(data)` static method gets older forms of its dict through it first."""
    upgrade = getattr(cls, "upgrade", None)
    if upgrade is not None:
        data = upgrade(data)
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _value(hints[f.name], data[f.name]) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
              if f.init and f.name in data}
    return cls(**kwargs)


def _value(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        return [_value(args[0], v) for v in value]
    if origin is tuple and args and args[-1] is not Ellipsis:
        return tuple(_value(a, v) for a, v in zip(args, value))
    if origin is dict:
        return {k: _value(args[1], v) for k, v in value.items()}
    return value
