"""Parameter parsing exactly as Prometheus's HTTP API does it (web/api/v1/api.go).

Times are RFC3339 or Unix float seconds; durations are Prometheus durations ("1m30s") or
float seconds. Inside promaccel everything is integer milliseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from ..config.durations import format_duration_ms, parse_prom_duration_ms
from ..errors import PromError, bad_data, invalid_param
from ..result.golang import go_parse_float

MAX_POINTS_PER_SERIES = 11_000

# Prometheus's minTime / maxTime, formatted as Go does; clients (Grafana, promtool) send them.
_MIN_TIME_MS = -9223372036854775808 // 1_000_000 // 2  # approximately; only used as bounds
_MIN_TIME_STR = "-292273086-05-16T16:47:06Z"
_MAX_TIME_STR = "292277025-08-18T07:12:54.999999999Z"
_MIN_TIME_SECONDS = -9223309901257974  # math.MinInt64/2 + 62135596801 seconds, as Prometheus
_MAX_TIME_SECONDS = 9223309901257974

_RFC3339_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


_I64_MIN = -(2**63)
_UNIX_TO_INTERNAL = 62135596800  # Go's seconds from year 1 to 1970


def _wrap64(x: int) -> int:
    """Go's int64 arithmetic: wrap around."""
    return (x + 2**63) % 2**64 - 2**63


def _go_int64(f: float) -> int:
    """int64(f) as amd64 computes it: truncation; NaN and out-of-range give math.MinInt64."""
    if math.isnan(f) or not (-(2.0**63) <= f < 2.0**63):
        return _I64_MIN
    return int(f)


def _go_round(x: float) -> float:
    """math.Round: half away from zero."""
    r = float(math.trunc(x))
    return r + math.copysign(1.0, x) if abs(x - r) >= 0.5 else r


@dataclass(frozen=True)
class GoTime:
    """A time.Time as Prometheus's parseTime makes it: time.Unix(sec, nsec)'s normalised
    fields, with Go's int64 wrap-around (a NaN, infinite or huge Unix time is a real, if odd,
    time in Go: Prometheus evaluates queries there)."""

    sec: int  # Unix seconds (int64)
    nsec: int  # [0, 1e9)

    @classmethod
    def unix(cls, sec: int, nsec: int) -> GoTime:
        if nsec < 0 or nsec >= 1_000_000_000:
            n = -((-nsec) // 1_000_000_000) if nsec < 0 else nsec // 1_000_000_000  # Go's / truncates
            sec = _wrap64(sec + n)
            nsec -= n * 1_000_000_000
            if nsec < 0:
                nsec += 1_000_000_000
                sec = _wrap64(sec - 1)
        return cls(sec, nsec)

    @classmethod
    def from_float(cls, f: float) -> GoTime:
        # s, ns := math.Modf(t); ns = math.Round(ns*1000) / 1000; time.Unix(int64(s), int64(ns*1e9))
        whole = float(math.trunc(f)) if math.isfinite(f) else f
        frac = f - whole if math.isfinite(f) else math.nan
        frac = _go_round(frac * 1000) / 1000 if math.isfinite(frac) else frac
        return cls.unix(_go_int64(whole), _go_int64(frac * 1e9))

    def _internal(self) -> tuple[int, int]:
        return _wrap64(self.sec + _UNIX_TO_INTERNAL), self.nsec

    def before(self, other: GoTime) -> bool:
        return self._internal() < other._internal()

    def sub_ns(self, other: GoTime) -> int:
        """t.Sub(u): nanoseconds, saturated at the int64 bounds."""
        (ts, tn), (us, un) = self._internal(), other._internal()
        d = (ts - us) * 1_000_000_000 + (tn - un)
        if -(2**63) <= d < 2**63:
            return d
        return _I64_MIN if self.before(other) else 2**63 - 1

    @property
    def ms(self) -> int:
        """timestamp.FromTime: t.Unix()*1000 + t.Nanosecond()/1e6, wrapping as Go does."""
        return _wrap64(_wrap64(self.sec * 1000) + self.nsec // 1_000_000)


def _parse_float(text: str) -> float | None:
    """strconv.ParseFloat, or None where Go returns an error (promaccel.result.golang)."""
    return go_parse_float(text) if text else None


def parse_go_time(text: str) -> GoTime:
    """A timestamp parameter as Prometheus's parseTime reads it. Raises ValueError with
    Prometheus's message."""
    f = _parse_float(text)
    if f is not None:
        return GoTime.from_float(f)
    if text == _MIN_TIME_STR:
        return GoTime(_MIN_TIME_SECONDS, 0)
    if text == _MAX_TIME_STR:
        return GoTime(_MAX_TIME_SECONDS, 999_999_999)
    m = _RFC3339_RE.match(text)
    if m is None:
        raise ValueError(f'cannot parse "{text}" to a valid timestamp')
    try:
        iso = text[:19].replace("t", "T") + (m.group(8).upper().replace("Z", "+00:00"))
        dt = datetime.fromisoformat(iso)
    except ValueError as exc:
        raise ValueError(f'cannot parse "{text}" to a valid timestamp') from exc
    nsec = int((m.group(7)[1:] + "000000000")[:9]) if m.group(7) else 0
    return GoTime(int(dt.astimezone(timezone.utc).timestamp()), nsec)


def parse_time_ms(text: str) -> int:
    """A timestamp parameter -> the milliseconds Prometheus evaluates at. Raises ValueError
    with Prometheus's message."""
    return parse_go_time(text).ms


def parse_duration_param_ns(text: str) -> int:
    """A duration parameter (step, timeout) as Prometheus's parseDuration: float seconds or a
    Prometheus duration, in nanoseconds (a NaN is Go's time.Duration(NaN): math.MinInt64)."""
    f = _parse_float(text)
    if f is not None:
        ns = f * 1e9
        if ns > 9.223372036854775807e18 or ns < -9.223372036854775808e18:
            raise ValueError(f'cannot parse "{text}" to a valid duration. It overflows int64')
        return _go_int64(ns)
    try:
        return parse_prom_duration_ms(text) * 1_000_000
    except ValueError as exc:
        raise ValueError(f'cannot parse "{text}" to a valid duration') from exc


def parse_duration_param_ms(text: str) -> int:
    """A duration parameter in milliseconds, truncated as Go's durationMilliseconds does."""
    ns = parse_duration_param_ns(text)
    return ns // 1_000_000 if ns >= 0 else -((-ns) // 1_000_000)


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


def _param_time(form: dict[str, str], name: str) -> GoTime:
    try:
        return parse_go_time(form.get(name, ""))
    except ValueError as exc:
        raise invalid_param(name, str(exc)) from exc


def parse_range(form: dict[str, str], max_points: int = MAX_POINTS_PER_SERIES) -> RangeParams:
    """Validate /api/v1/query_range parameters in the order Prometheus does, on Go's times
    (a NaN start is before every time; spans beyond 292 years saturate)."""
    start = _param_time(form, "start")
    end = _param_time(form, "end")
    if end.before(start):
        raise invalid_param("end", "end timestamp must not be before start time")
    try:
        step_ns = parse_duration_param_ns(form.get("step", ""))
    except ValueError as exc:
        raise invalid_param("step", str(exc)) from exc
    zero_step = invalid_param(
        "step", "zero or negative query resolution step widths are not accepted. Try a positive integer")
    if step_ns <= 0:
        raise zero_step
    if end.sub_ns(start) // step_ns > max_points:
        raise bad_data(
            f"exceeded maximum resolution of {max_points:,} points per timeseries. "
            "Try decreasing the query resolution (?step=XX)"
        )
    if step_ns < 1_000_000:
        # Prometheus evaluates at a 0 ms interval (an instant vector when start = end, else
        # a division by zero); promaccel refuses a step under 1 ms as a zero step.
        raise zero_step
    timeout_ms = _timeout(form)
    query = _query(form, param_prefix=False)
    return RangeParams(query, start.ms, end.ms, step_ns // 1_000_000, timeout_ms)


def parse_instant(form: dict[str, str], now_ms: int) -> InstantParams:
    text = form.get("time", "")
    if text:
        try:
            time_ms = parse_time_ms(text)  # NaN, Inf, 1e300: Go's odd times, as Prometheus
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
        # series, labels, label values (web/api/v1/api.go, parseTimeParam) wrap the reason once
        # more, as /api/v1/query's `time` does (tests/api/test_metadata.py compares with 2.42).
        raise invalid_param(name, f"Invalid time value for '{name}': {exc}") from exc


__all__ = [
    "GoTime",
    "InstantParams",
    "PromError",
    "RangeParams",
    "format_duration_ms",
    "parse_duration_param_ms",
    "parse_duration_param_ns",
    "parse_go_time",
    "parse_instant",
    "parse_optional_time",
    "parse_prom_duration_ms",
    "parse_range",
    "parse_time_ms",
]
