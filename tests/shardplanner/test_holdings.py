"""Which backend holds what, and when (shardplanner/holdings.py): a holding's validation and
metric patterns, the `holds:` window specs of the config resolved to absolute ms, durations,
and the text explain and config errors show."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from shardplanner.holdings import BackendHolding, fmt_time, holding_from_spec, parse_duration_ms, resolve_window
from tests.shardplanner.times import MIGRATION, NOW, D, H, M, S


def test_holding_validation() -> None:
    with pytest.raises(ValueError):
        BackendHolding("a", ("DCGM_(",))
    with pytest.raises(ValueError):
        BackendHolding("a", ("*",), since_ms=2, until_ms=1)
    with pytest.raises(ValueError):
        BackendHolding("a", ())
    with pytest.raises(ValueError):
        BackendHolding("a", "DCGM_.*")  # type: ignore[arg-type]
    h = BackendHolding("a", ["DCGM_.*"])  # type: ignore[arg-type]
    assert h.metrics == ("DCGM_.*",)
    assert h.holds_metric("DCGM_FI_DEV_GPU_UTIL") and not h.holds_metric("xDCGM_")
    assert not h.holds_metric(None) and BackendHolding("b").holds_metric(None)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, (None, None)),
        ({}, (None, None)),
        ({"last": "15d"}, (NOW - 15 * D, None)),
        ({"last": 3600}, (NOW - H, None)),
        ({"last": "1h30m", "since": None}, (NOW - 90 * M, None)),
        ({"since": "2026-10-01T00:00:00Z"}, (MIGRATION, None)),
        ({"since": "2026-10-01T02:00:00+02:00"}, (MIGRATION, None)),
        ({"since": "2026-10-01"}, (MIGRATION, None)),
        ({"since": datetime(2026, 10, 1, tzinfo=timezone.utc)}, (MIGRATION, None)),
        ({"since": date(2026, 10, 1)}, (MIGRATION, None)),
        ({"since": 1_790_812_800}, (MIGRATION, None)),
        ({"until": "now-6h"}, (None, NOW - 6 * H)),
        ({"since": "2026-10-01T00:00:00Z", "until": "now"}, (MIGRATION, NOW)),
        ({"metrics": ["*"], "last": None}, (None, None)),
    ],
)
def test_resolve_window(
    spec: dict[str, object] | None, expected: tuple[int | None, int | None]
) -> None:
    assert resolve_window(spec, NOW) == expected


@pytest.mark.parametrize(
    "spec",
    [
        {"last": "15d", "since": "2026-10-01T00:00:00Z"},
        {"last": "15 days"},
        {"since": "2026-10-01T00:00:00"},  # no zone
        {"since": datetime(2026, 10, 1)},
        {"since": "yesterday"},
        {"since": "now", "until": "now-1h"},
        {"last": True},
    ],
)
def test_resolve_window_rejects(spec: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        resolve_window(spec, NOW)


def test_parse_duration() -> None:
    assert parse_duration_ms("1y2w3d4h5m6s7ms") == (
        365 * D + 14 * D + 3 * D + 4 * H + 5 * M + 6 * S + 7
    )
    assert parse_duration_ms(1.5) == 1500
    for bad in ("", "5", "h", "-5m", -1):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)


def test_holdings_from_config_blocks() -> None:
    # No `holds:` block: the backend holds every metric at all times (the single-backend case).
    assert holding_from_spec("local", None, NOW) == BackendHolding("local", ("*",))
    # One pattern given as a string is one pattern, not a list of characters.
    amp = holding_from_spec("amp", {"metrics": "DCGM_.*", "since": "2026-10-01"}, NOW, priority=2)
    assert amp == BackendHolding("amp", ("DCGM_.*",), since_ms=MIGRATION, priority=2)
    assert holding_from_spec("l", {"last": "1d"}, NOW, primary=True).since_ms == NOW - D


def test_patterns_are_anchored_and_a_star_holds_even_nameless_selectors() -> None:
    h = BackendHolding("a", ("DCGM_.*", "up"))
    assert h.holds_metric("up") and not h.holds_metric("upx") and not h.holds_metric("sup")
    assert h.holds_metric("DCGM_") and not h.holds_metric("node_DCGM_x")


@pytest.mark.parametrize(("ms", "text"), [
    (MIGRATION, "2026-10-01T00:00:00Z"),
    (MIGRATION + 5, "2026-10-01T00:00:00.005Z"),  # milliseconds only when there are any
    (-1, "1969-12-31T23:59:59.999Z"),
    (float("inf"), "+inf"),
    (float("-inf"), "-inf"),
    (10**20, "100000000000000000000ms"),  # beyond datetime: the number itself, not a crash
])
def test_fmt_time(ms: float, text: str) -> None:
    assert fmt_time(ms) == text


def test_describe_names_patterns_and_window() -> None:
    assert BackendHolding("amp", ("DCGM_.*", "kube_.*"), since_ms=MIGRATION).describe() == (
        "amp holds DCGM_.*, kube_.* since 2026-10-01T00:00:00Z")
    assert BackendHolding("l", until_ms=MIGRATION).describe() == "l holds * until 2026-10-01T00:00:00Z"
    assert BackendHolding("l", since_ms=0, until_ms=MIGRATION).describe() == (
        "l holds * from 1970-01-01T00:00:00Z until 2026-10-01T00:00:00Z")
    assert BackendHolding("l").describe() == "l holds * at all times"
