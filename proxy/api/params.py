"""Parameter parsing exactly as Prometheus's HTTP API does it (web/api/v1/api.go).

Times are RFC3339 or Unix float seconds; durations are Prometheus durations ("1m30s") or
float seconds. Inside promaccel everything is integer milliseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import PromError, bad_data, invalid_param

MAX_POINTS_PER_SERIES = 11_000

# Prometheus's minTime / maxTime, formatted as Go does; clients (Grafana, promtool) send them.
_MIN_TIME_MS = -9223372036854775808 // 1_000_000 // 2  # approximately; only used as bounds
_MIN_TIME_STR = "-292273086-05-16T16:47:06Z"
_MAX_TIME_STR = "292277025-08-18T07:12:54.999999999Z"
_MIN_TIME_SECONDS = -9223309901257974  # math.MinInt64/2 + 62135596801 seconds, as Prometheus
_MAX_TIME_SECONDS = 9223309901257974

_DURATION_RE = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1_000, 1)
_RFC3339_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_prom_duration_ms(text: str) -> int:
    """Prometheus's model.ParseDuration: units y w d h m s ms, each at most once, in order."""
    if text == "0":
        return 0
    m = _DURATION_RE.match(text)
    if not text or m is None or not any(m.groups()):
        raise ValueError(f"not a valid duration string: {text!r}")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _UNIT_MS) if g)


def _parse_float(text: str) -> float | None:
    # Go's strconv.ParseFloat accepts what Python float() accepts, minus a few spellings
    # (underscores need a base prefix; "infinity" is accepted by both).
    if "_" in text or text.strip() != text or not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_time_ms(text: str) -> int:
    """A timestamp parameter -> milliseconds. Raises ValueError with Prometheus's message."""
    f = _parse_float(text)
    if f is not None:
        if math.isnan(f) or math.isinf(f):
            raise ValueError(f'cannot parse "{text}" to a valid timestamp')
        whole = math.trunc(f)
        frac = round((f - whole) * 1000) / 1000
        return int(whole) * 1000 + int(round(frac * 1000))
    if text == _MIN_TIME_STR:
        return _MIN_TIME_SECONDS * 1000
    if text == _MAX_TIME_STR:
        return _MAX_TIME_SECONDS * 1000
    m = _RFC3339_RE.match(text)
    if m is None:
        raise ValueError(f'cannot parse "{text}" to a valid timestamp')
    try:
        iso = text[:19].replace("t", "T") + (m.group(8).upper().replace("Z", "+00:00"))
        dt = datetime.fromisoformat(iso)
    except ValueError as exc:
        raise ValueError(f'cannot parse "{text}" to a valid timestamp') from exc
    frac_ms = 0
    if m.group(7):
        digits = (m.group(7)[1:] + "000")[:3]
        frac_ms = int(digits)
    return int(dt.astimezone(timezone.utc).timestamp()) * 1000 + frac_ms


def parse_duration_param_ms(text: str) -> int:
    """A duration parameter (step, timeout): float seconds or a Prometheus duration."""
    f = _parse_float(text)
    if f is not None:
        if math.isnan(f):
            raise ValueError(f'cannot parse "{text}" to a valid duration')
        ns = f * 1e9
        if ns > 9.223372036854775807e18 or ns < -9.223372036854775808e18:
            raise ValueError(f'cannot parse "{text}" to a valid duration. It overflows int64')
        # Go truncates to nanoseconds; promaccel works in ms and rejects sub-ms steps below.
        return int(ns) // 1_000_000 if ns >= 0 else -((-int(ns)) // 1_000_000)
    try:
        return parse_prom_duration_ms(text)
    except ValueError as exc:
        raise ValueError(f'cannot parse "{text}" to a valid duration') from exc


def format_duration_ms(ms: int) -> str:
    """Prometheus-style duration string, largest units first ("1h30m", "90ms")."""
    if ms == 0:
        return "0s"
    out = []
    for unit, name in zip(_UNIT_MS, ("y", "w", "d", "h", "m", "s", "ms")):
        if ms >= unit:
            out.append(f"{ms // unit}{name}")
            ms %= unit
    return "".join(out)


@dataclass(frozen=True)
class RangeParams:
    query: str
    start_ms: int
    end_ms: int
    step_ms: int
    timeout_ms: int | None


@dataclass(frozen=True)
class InstantParams:
    query: str
    time_ms: int
    timeout_ms: int | None


def _timeout(form: dict[str, str]) -> int | None:
    text = form.get("timeout", "")
    if not text:
        return None
    try:
        return parse_duration_param_ms(text)
    except ValueError as exc:
        raise invalid_param("timeout", str(exc)) from exc


def _query(form: dict[str, str], *, param_prefix: bool) -> str:
    query = form.get("query", "")
    if not query.strip():
        # Prometheus 2.42: the parser's verdict on an empty input; /query wraps it as a
        # parameter error, /query_range does not.
        message = "1:1: parse error: no expression found in input"
        raise invalid_param("query", message) if param_prefix else bad_data(message)
    return query


# A NaN or infinite Unix time: Go's int64 conversion of it (math.MinInt64 on amd64) makes a
# time before every valid one, so Prometheus answers the range checks it then fails (end before
# start, too many points). promaccel compares with this and refuses a query still holding it.
_GO_NAN_TIME_MS = -(2**63)


def _range_time_ms(form: dict[str, str], name: str) -> int:
    text = form.get(name, "")
    f = _parse_float(text)
    if f is not None and (math.isnan(f) or math.isinf(f)):
        return _GO_NAN_TIME_MS
    try:
        return parse_time_ms(text)
    except ValueError as exc:
        raise invalid_param(name, str(exc)) from exc


def parse_range(form: dict[str, str], max_points: int = MAX_POINTS_PER_SERIES) -> RangeParams:
    """Validate /api/v1/query_range parameters in the order Prometheus does."""
    start_ms = _range_time_ms(form, "start")
    end_ms = _range_time_ms(form, "end")
    if end_ms < start_ms:
        raise invalid_param("end", "end timestamp must not be before start time")
    step_text = form.get("step", "")
    try:
        # Go's conversion of a NaN step is math.MinInt64: a negative step.
        nan = _parse_float(step_text)
        step_ms = -1 if nan is not None and math.isnan(nan) else parse_duration_param_ms(step_text)
    except ValueError as exc:
        raise invalid_param("step", str(exc)) from exc
    if step_ms <= 0:
        raise invalid_param(
            "step", "zero or negative query resolution step widths are not accepted. Try a positive integer"
        )
    if (end_ms - start_ms) // step_ms > max_points:
        raise bad_data(
            f"exceeded maximum resolution of {max_points:,} points per timeseries. "
            "Try decreasing the query resolution (?step=XX)"
        )
    timeout_ms = _timeout(form)
    query = _query(form, param_prefix=False)
    for name, ms in (("start", start_ms), ("end", end_ms)):
        if ms == _GO_NAN_TIME_MS:  # both NaN: Prometheus evaluates at an overflowed time
            raise invalid_param(name, f'cannot parse "{form.get(name, "")}" to a valid timestamp')
    return RangeParams(query, start_ms, end_ms, step_ms, timeout_ms)


def parse_instant(form: dict[str, str], now_ms: int) -> InstantParams:
    text = form.get("time", "")
    if text:
        try:
            time_ms = parse_time_ms(text)
        except ValueError as exc:
            # Prometheus's parseTimeParam wraps the reason once more.
            raise invalid_param("time", f"Invalid time value for 'time': {exc}") from exc
    else:
        time_ms = now_ms
    timeout_ms = _timeout(form)
    return InstantParams(_query(form, param_prefix=True), time_ms, timeout_ms)


def parse_optional_time(form: dict[str, str], name: str) -> int | None:
    text = form.get(name, "")
    if not text:
        return None
    try:
        return parse_time_ms(text)
    except ValueError as exc:
        raise invalid_param(name, str(exc)) from exc


__all__ = [
    "InstantParams",
    "PromError",
    "RangeParams",
    "format_duration_ms",
    "parse_duration_param_ms",
    "parse_instant",
    "parse_optional_time",
    "parse_prom_duration_ms",
    "parse_range",
    "parse_time_ms",
]
