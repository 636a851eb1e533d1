"""Parameter parsing as Prometheus's HTTP API does it (pure, no server)."""

from __future__ import annotations

import pytest

from proxy.api.params import (
    format_duration_ms,
    parse_duration_param_ms,
    parse_instant,
    parse_prom_duration_ms,
    parse_range,
    parse_time_ms,
)
from proxy.errors import PromError


@pytest.mark.parametrize(
    "text, ms",
    [
        ("0", 0),
        ("1700000000", 1_700_000_000_000),
        ("1700000000.123", 1_700_000_000_123),
        ("1700000000.1234", 1_700_000_000_123),
        ("1e9", 1_000_000_000_000),
        ("-1.5", -1_500),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T22:13:20.5Z", 1_700_000_000_500),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
    ],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize(
    "text, ms",
    [
        # Go's int64(NaN), int64(±Inf) (amd64: math.MinInt64) through time.Unix and
        # timestamp.FromTime's wrapping arithmetic: 1677-09-21, where Prometheus evaluates.
        ("NaN", -9223372036855), ("Inf", -9223372036855), ("-Inf", -9223372036855), ("+infinity", -9223372036855),
        ("1e300", 0),  # int64(1e300) = MinInt64 seconds, x1000 wraps to 0
        ("0x1p4", 16_000),  # Go's ParseFloat reads hex floats ...
        ("1_000", 1_000_000), ("0x_1p4", 16_000),  # ... and underscores between digits
        ("-292273086-05-16T16:47:06Z", -9223309901257974000),  # Prometheus's minTime, maxTime
        ("292277025-08-18T07:12:54.999999999Z", 9223309901257974999),
    ],
)
def test_parse_time_as_go(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize("text", ["", "abc", "2023-11-14", "2023-13-01T00:00:00Z", " 1", "1e309", "1__000", "_1",
                                  "\u0661\u0662", "0x10", "+nan"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="to a valid timestamp"):
        parse_time_ms(text)


@pytest.mark.parametrize(
    "text, ms",
    [("30s", 30_000), ("1m30s", 90_000), ("15", 15_000), ("0.5", 500), ("1h", 3_600_000),
     ("2d", 172_800_000), ("1w", 604_800_000), ("100ms", 100), ("1y", 31_536_000_000)],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration_param_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1x", "m", "1m1h", "--1", "1.5m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="valid duration"):
        parse_duration_param_ms(text)


def test_duration_roundtrip() -> None:
    for ms in (1, 999, 1000, 90_000, 3_600_000, 5_400_000, 86_400_000 + 1):
        assert parse_prom_duration_ms(format_duration_ms(ms)) == ms


def _range(**kw: str) -> dict[str, str]:
    form = {"query": "up", "start": "0", "end": "3600", "step": "60"}
    form.update(kw)
    return {k: v for k, v in form.items() if v is not None}


@pytest.mark.parametrize(
    "form, message",
    [
        (_range(start="x"), 'invalid parameter "start": cannot parse "x" to a valid timestamp'),
        (_range(end="x"), 'invalid parameter "end": cannot parse "x" to a valid timestamp'),
        (_range(start="10", end="5"), 'invalid parameter "end": end timestamp must not be before start time'),
        (_range(step="0"), 'invalid parameter "step": zero or negative query resolution step'),
        (_range(step="-5"), 'invalid parameter "step": zero or negative query resolution step'),
        (_range(step="x"), 'invalid parameter "step": cannot parse "x" to a valid duration'),
        (_range(end="11001", step="1"), "exceeded maximum resolution of 11,000 points"),
        (_range(query=""), "1:1: parse error: no expression found in input"),
        (_range(timeout="soon"), 'invalid parameter "timeout"'),
    ],
)
def test_parse_range_errors(form: dict[str, str], message: str) -> None:
    with pytest.raises(PromError) as err:
        parse_range(form)
    assert err.value.status == 400 and err.value.kind == "bad_data"
    assert err.value.message.startswith(message), err.value.message


def test_parse_range_ok() -> None:
    p = parse_range(_range(step="1m", end="11000", start="0") | {"step": "1"})
    assert (p.start_ms, p.end_ms, p.step_ms) == (0, 11_000_000, 1000)


def test_parse_instant_defaults_to_now() -> None:
    p = parse_instant({"query": "up"}, now_ms=123)
    assert p.time_ms == 123
    with pytest.raises(PromError):
        parse_instant({"query": "up", "time": "yesterday"}, now_ms=0)
