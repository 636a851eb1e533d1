"""What a backend holds: metric-name patterns over a time window, resolved from config. Pure.

    holding_from_spec("amp", {"metrics": ["DCGM_.*"], "since": "2026-10-01"}, now_ms)
      -> BackendHolding("amp", ("DCGM_.*",), since_ms=..., until_ms=None)

A holding is a closed window `[since_ms, until_ms]` (None: unbounded) of the metrics whose
names fully match one of its patterns (RE2); `"*"` holds every metric. Window specs take
RFC 3339 times, dates, unix seconds and `now-6h`, or `last: 15d`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from shardplanner.regex import RegexError, matcher

__all__ = ["ALL_METRICS", "BackendHolding", "fmt_time", "holding_from_spec", "parse_duration_ms", "resolve_window"]

ALL_METRICS = "*"
_INF = float("inf")


# --- holdings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendHolding:
    """Backend `name` holds the metrics matching `metrics` over `[since_ms, until_ms]`.

    `metrics`: anchored regexes (`"DCGM_.*"` matches `DCGM_FI_DEV_GPU_UTIL`, not
    `xDCGM_...`) or `"*"` for every metric. Times are absolute ms (see `resolve_window`),
    None for unbounded. Preference among backends that hold the same data (the order of
    `Route.backends`, the primary answer in an overlap merge): `primary` first, then higher
    `priority`, then the order of the holdings list. A backend may appear in several
    holdings (e.g. DCGM since one date, everything for the last 15 d); they are unioned.
    """

    name: str
    metrics: tuple[str, ...] = (ALL_METRICS,)
    since_ms: int | None = None
    until_ms: int | None = None
    primary: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a backend holding needs a name")
        if isinstance(self.metrics, str):
            raise ValueError(f"metrics must be a list of patterns, not the string {self.metrics!r}")
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if not self.metrics:
            raise ValueError(f"backend {self.name!r} holds no metric patterns")
        for p in self.metrics:
            if p != ALL_METRICS:
                try:
                    matcher(p)
                except RegexError as exc:
                    raise ValueError(
                        f"backend {self.name!r}: bad metric pattern {p!r}: {exc}"
                    ) from None
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.since_ms > self.until_ms
        ):
            raise ValueError(
                f"backend {self.name!r}: window since {fmt_time(self.since_ms)} is after "
                f"until {fmt_time(self.until_ms)}"
            )

    def holds_metric(self, metric: str | None) -> bool:
        """Whether the patterns name `metric` (None: a selector without a fixed name)."""
        if ALL_METRICS in self.metrics:
            return True
        if metric is None:
            return False
        return any(matcher(p).fullmatch(metric) is not None for p in self.metrics)

    def describe(self) -> str:
        """`amp holds DCGM_.*, kube_.* since 2026-10-01T00:00:00Z`."""
        window = _window_text(self.since_ms, self.until_ms)
        return f"{self.name} holds {', '.join(self.metrics)} {window}"


# --- window specs (config -> absolute ms) --------------------------------------------------

_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_UNITS_MS = (
    365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1_000, 1,
)
_RELATIVE = re.compile(r"^now\s*(?:-\s*(\S+))?$")


def parse_duration_ms(value: str | int | float) -> int:
    """A Prometheus duration (`"15d"`, `"1h30m"`) or a number of seconds -> ms."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 15d, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return int(round(value * 1000))
    m = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if m is None or not value.strip():
        raise ValueError(f"expected a duration like 15d or 1h30m, got {value!r}")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS_MS) if g)


def _instant_ms(value: Any, now_ms: int, key: str) -> int:
    """An absolute time: RFC 3339 string, YAML datetime/date, unix seconds, "now", "now-6h"."""
    if isinstance(value, bool):
        raise ValueError(f"{key}: expected a time, got {value!r}")
    if isinstance(value, int | float):
        return int(round(value * 1000))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{key}: {value.isoformat()} has no time zone; add Z or +hh:mm")
        return _datetime_ms(value)
    if isinstance(value, date):
        return _datetime_ms(datetime(value.year, value.month, value.day, tzinfo=timezone.utc))
    if isinstance(value, str):
        text = value.strip()
        rel = _RELATIVE.match(text)
        if rel:
            return now_ms - (parse_duration_ms(rel.group(1)) if rel.group(1) else 0)
        try:
            parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{key}: expected an RFC 3339 time like 2026-10-01T00:00:00Z, "
                f"or now-<duration>, got {value!r}"
            ) from None
        if parsed.tzinfo is None:
            if len(text) == 10:  # a bare date: midnight UTC
                parsed = parsed.replace(tzinfo=timezone.utc)
            else:
                raise ValueError(f"{key}: {value!r} has no time zone; add Z or +hh:mm")
        return _datetime_ms(parsed)
    raise ValueError(f"{key}: expected a time, got {type(value).__name__}")


def _datetime_ms(d: datetime) -> int:
    delta = d - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def resolve_window(spec: Mapping[str, Any] | None, now_ms: int) -> tuple[int | None, int | None]:
    """A holding's time window from config, as absolute `(since_ms, until_ms)`.

        {"last": "15d"}                        -> (now - 15d, None)
        {"since": "2026-10-01T00:00:00Z"}      -> (1790812800000, None)
        {"until": "now-6h"}                    -> (None, now - 6h)
        {"since": ..., "until": ...}, {} / None -> both bounds / unbounded

    `since`/`until`: RFC 3339 (with a zone), a date (midnight UTC), unix seconds, `now` or
    `now-<duration>`; YAML datetimes are accepted as PyYAML loads them. `last` is `since:
    now-<last>`; giving both is an error. Other keys (e.g. `metrics`) are ignored, so the
    config's whole `holds` mapping can be passed. Pure: `now_ms` is the caller's clock
    (round it, e.g. to the minute, if routes should stay stable between refreshes).
    """
    if not spec:
        return None, None
    last, since, until = spec.get("last"), spec.get("since"), spec.get("until")
    if last is not None and since is not None:
        raise ValueError("give either last or since, not both")
    since_ms = None
    if last is not None:
        since_ms = now_ms - parse_duration_ms(last)
    elif since is not None:
        since_ms = _instant_ms(since, now_ms, "since")
    until_ms = None if until is None else _instant_ms(until, now_ms, "until")
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise ValueError(f"since {fmt_time(since_ms)} is after until {fmt_time(until_ms)}")
    return since_ms, until_ms


def holding_from_spec(
    name: str,
    holds: Mapping[str, Any] | None,
    now_ms: int,
    *,
    primary: bool = False,
    priority: int = 0,
) -> BackendHolding:
    """A config backend's `holds:` block -> a `BackendHolding` (no block: everything, always).

        holding_from_spec("amp", {"metrics": ["DCGM_.*"], "since": "2026-10-01T00:00:00Z"}, now)
    """
    metrics = (holds or {}).get("metrics") or [ALL_METRICS]
    if isinstance(metrics, str):
        metrics = [metrics]
    since_ms, until_ms = resolve_window(holds, now_ms)
    return BackendHolding(name, tuple(metrics), since_ms, until_ms, primary, priority)


# --- text ----------------------------------------------------------------------------------


def fmt_time(ms: int | float) -> str:
    """RFC 3339 UTC, with milliseconds only when there are any."""
    if ms == _INF:
        return "+inf"
    if ms == -_INF:
        return "-inf"
    ms = int(ms)
    secs, frac = divmod(ms, 1000)
    try:
        d = datetime.fromtimestamp(secs, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ms}ms"
    text = d.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{frac:03d}Z" if frac else f"{text}Z"


def _window_text(since_ms: int | None, until_ms: int | None) -> str:
    if since_ms is not None and until_ms is not None:
        return f"from {fmt_time(since_ms)} until {fmt_time(until_ms)}"
    if since_ms is not None:
        return f"since {fmt_time(since_ms)}"
    if until_ms is not None:
        return f"until {fmt_time(until_ms)}"
    return "at all times"
