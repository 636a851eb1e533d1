"""A backend's `global.evaluation_interval`: the step of a subquery written without one.

Prometheus evaluates `expr[30m:]` on a grid of its `global.evaluation_interval` (engine.go
SubqueryExpr: `ev.defaultEvalInterval` = the config's evaluation interval; 1m by default,
often 30s). When promaccel evaluates such a subquery itself (a cross-store query), it uses the
primary backend's, read once from `/api/v1/status/config` and kept for the process's life
(a backend's config is not expected to change under a running proxy; a restart reads it
again). A backend that does not say (AMP has no status/config, an error, a config without
the key) counts as Prometheus's default, 1m; a failed read is retried after a minute.

The config is scanned for the one key of its `global:` block, never parsed as YAML (a hostile
backend's YAML could expand without bound).
"""

from __future__ import annotations

import re
import time

import orjson

from shardplanner.holdings import parse_duration_ms

from ..backends import Backend

DEFAULT_EVALUATION_INTERVAL_MS = 60_000
RETRY_S = 60.0
_KEY = re.compile(r"^global:\s*$(?:\n[ \t]+.*$)*?\n[ \t]+evaluation_interval:[ \t]*['\"]?([0-9a-z]+)['\"]?[ \t]*$",
                  re.MULTILINE)


def evaluation_interval_ms(config_yaml: str) -> int | None:
    """`global.evaluation_interval` of a Prometheus config (as /api/v1/status/config prints
    it), in ms; None when it is not there or not a duration."""
    m = _KEY.search(config_yaml[: 1 << 20])
    if m is None:
        return None
    try:
        ms = parse_duration_ms(m.group(1))
    except Exception:  # noqa: BLE001 -- not a duration: as if absent
        return None
    return ms if ms > 0 else None


class EvaluationIntervals:
    def __init__(self) -> None:
        self._known: dict[str, int] = {}
        self._failed: dict[str, float] = {}

    async def of(self, backend: Backend) -> int:
        known = self._known.get(backend.name)
        if known is not None:
            return known
        failed = self._failed.get(backend.name)
        if failed is not None and time.monotonic() - failed < RETRY_S:
            return DEFAULT_EVALUATION_INTERVAL_MS
        ms: int | None = None
        try:
            reply = await backend.request("GET", "/api/v1/status/config", timeout_s=10,
                                          endpoint="/api/v1/status/config")
            if reply.ok:
                data = orjson.loads(reply.body).get("data")
                if isinstance(data, dict) and isinstance(data.get("yaml"), str):
                    ms = evaluation_interval_ms(data["yaml"])
                if ms is None:
                    ms = DEFAULT_EVALUATION_INTERVAL_MS  # it answered: its config has no other
            elif reply.status == 404:
                ms = DEFAULT_EVALUATION_INTERVAL_MS  # no status/config (AMP): the default
        except Exception:  # noqa: BLE001 -- unreachable now: the default, asked again later
            ms = None
        if ms is None:
            self._failed[backend.name] = time.monotonic()
            return DEFAULT_EVALUATION_INTERVAL_MS
        self._known[backend.name] = ms
        return ms
