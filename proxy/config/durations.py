"""Prometheus durations ("1m30s", "15d") as integer milliseconds: the config's and the HTTP
API's (`step`, `timeout`, `lookback_delta`) one reading of them. It lives with the config, the
lowest layer that reads durations, so that nothing below the api imports the api."""

from __future__ import annotations

import re

__all__ = ["format_duration_ms", "parse_prom_duration_ms"]

_DURATION_RE = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1_000, 1)


def parse_prom_duration_ms(text: str) -> int:
    """Prometheus's model.ParseDuration: units y w d h m s ms, each at most once, in order."""
    if text == "0":
        return 0
    m = _DURATION_RE.match(text)
    if not text or m is None or not any(m.groups()):
        raise ValueError(f"not a valid duration string: {text!r}")
    return sum(int(g) * unit for g, unit in zip(m.groups(), _UNIT_MS) if g)


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
