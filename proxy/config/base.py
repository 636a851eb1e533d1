"""What every configuration section shares: the error type, durations, strict models."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from .durations import parse_prom_duration_ms

__all__ = ["ConfigError", "DurationMs", "OptDurationMs", "StrictModel", "to_ms"]


class ConfigError(Exception):
    """A configuration problem, with a message that names the offending key."""


def to_ms(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s or 1h, got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("duration must not be negative")
        return int(round(value * 1000))
    if isinstance(value, str):
        try:
            return parse_prom_duration_ms(value.strip())
        except ValueError:
            raise ValueError(f"expected a duration like 30s or 1h30m, got {value!r}") from None
    raise ValueError(f"expected a duration like 30s or 1h, got {type(value).__name__}")


DurationMs = Annotated[int, BeforeValidator(to_ms)]
OptDurationMs = Annotated[int | None, BeforeValidator(to_ms)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
