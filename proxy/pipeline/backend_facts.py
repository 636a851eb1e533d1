"""Backend facts: what a backend says about itself, read once per backend and kept.

Two facts shape how promaccel evaluates PromQL the way the backend would:

- `global.evaluation_interval` (`/api/v1/status/config`): the step of a subquery written
  without one. Prometheus evaluates `expr[30m:]` on a grid of it (engine.go SubqueryExpr:
  `ev.defaultEvalInterval`; 1m by default, often 30s); promaccel uses the primary's when it
  evaluates such a subquery itself (a cross-store query). The config is scanned for the one
  key of its `global:` block, never parsed as YAML (a hostile backend's YAML could expand
  without bound). Not said (a config without the key): 1m, Prometheus's default; AMP (`kind:
  amp`) has no status/config and is not asked.
- the Go version it is built with (`/api/v1/status/buildinfo` `goVersion`; `version` is kept
  beside it): the regexp dialect of its `=~` / `!~` matchers and label_replace
  (`shardplanner.promql.Dialect`; Go 1.22 added the named group `(?<name>...)`). Not said
  (a buildinfo without `goVersion`; AMP, which has no buildinfo and is not asked): Go 1.19,
  Prometheus 2.42's, the conservative dialect -- a query whose regex it rejects is left to
  the backend.

Each fact is one small call per backend, kept by the discovery component (`discovery.py`:
concurrent askers share one call; refreshed in the background after FACTS_TTL_MS, so an
upgraded backend is noticed within it). An answer is read up to FACT_BODY_MAX (4 KB; the
config, CONFIG_BODY_MAX, 1 MiB): the call stops reading there (`Backend.request(max_body_bytes=)`)
and fails, so a hostile backend's huge answer is never read whole; an
answer that is malformed, says nothing usable or refuses (a 4xx but 429: AMP's 404) counts as
"not said" (the default, kept like a fact); a call that fails (unreachable, 429, 5xx, an
oversized body) gives the default for now and is tried again after RETRY_AFTER_FAILURE_S.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from shardplanner.holdings import parse_duration_ms
from shardplanner.promql import GO_1_19, Dialect

from ..backends import Backend
from ..errors import PromError
from .discovery import Discovered

__all__ = ["DEFAULT_DIALECT", "DEFAULT_EVALUATION_INTERVAL_MS", "BackendFacts", "BuildInfo", "build_info",
           "evaluation_interval_ms"]

DEFAULT_EVALUATION_INTERVAL_MS = 60_000
DEFAULT_DIALECT = GO_1_19
FACTS_TTL_MS = 3_600_000
RETRY_AFTER_FAILURE_S = 60.0
FACT_TIMEOUT_S = 5.0
# Prometheus's buildinfo answer is ~250 bytes.
FACT_BODY_MAX = 4096
# /api/v1/status/config carries the whole config as one JSON string; the key sits in its first
# lines (`global:` is printed first), so a long config is read only this far.
CONFIG_BODY_MAX = 1 << 20
_MAX_ENTRIES = 64  # backends
_KEY = re.compile(r"^global:\s*$(?:\n[ \t]+.*$)*?\n[ \t]+evaluation_interval:[ \t]*['\"]?([0-9a-z]+)['\"]?[ \t]*$",
                  re.MULTILINE)


def evaluation_interval_ms(config_yaml: str) -> int | None:
    """`global.evaluation_interval` of a Prometheus config (as /api/v1/status/config prints
    it), in ms; None when it is not there or not a duration."""
    m = _KEY.search(config_yaml[:CONFIG_BODY_MAX])
    if m is None:
        return None
    try:
        ms = parse_duration_ms(m.group(1))
    except Exception:  # noqa: BLE001 -- not a duration: as if absent
        return None
    return ms if ms > 0 else None


@dataclass(frozen=True)
class BuildInfo:
    """What a backend's buildinfo says: its version and Go version as printed (at most 64
    printable characters each; "" when not said) and the regexp dialect that follows."""

    version: str = ""
    go_version: str = ""
    dialect: Dialect = DEFAULT_DIALECT


def _short(value: Any) -> str:
    return "".join(c for c in value[:64] if c.isprintable()) if isinstance(value, str) else ""


def build_info(body: bytes | bytearray) -> BuildInfo:
    """The buildinfo answer `body` as facts; anything it does not say (or a body that is not
    a buildinfo answer) is the default."""
    try:
        doc = orjson.loads(body)
    except ValueError:
        return BuildInfo()
    data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
    if not isinstance(data, dict):
        return BuildInfo()
    go = _short(data.get("goVersion"))
    return BuildInfo(_short(data.get("version")), go, Dialect.of_go_version(go) or DEFAULT_DIALECT)


def _config_interval(body: bytes | bytearray) -> int:
    try:
        doc = orjson.loads(body)
    except ValueError:
        return DEFAULT_EVALUATION_INTERVAL_MS
    data = doc.get("data") if isinstance(doc, dict) else None
    yaml = data.get("yaml") if isinstance(data, dict) else None
    ms = evaluation_interval_ms(yaml) if isinstance(yaml, str) else None
    return DEFAULT_EVALUATION_INTERVAL_MS if ms is None else ms


class BackendFacts:
    """The facts of each backend (keyed by the `Backend` object), learnt on first use."""

    def __init__(self, *, ttl_ms: int = FACTS_TTL_MS, clock: Callable[[], float] = time.monotonic) -> None:
        self._intervals: Discovered[Backend, int] = Discovered(
            "backend_config", self._fetch_interval, ttl_ms, max_entries=_MAX_ENTRIES,
            retry_after_failure_s=RETRY_AFTER_FAILURE_S, clock=clock)
        self._builds: Discovered[Backend, BuildInfo] = Discovered(
            "backend_buildinfo", self._fetch_build, ttl_ms, max_entries=_MAX_ENTRIES,
            retry_after_failure_s=RETRY_AFTER_FAILURE_S, clock=clock)

    async def evaluation_interval_ms(self, backend: Backend) -> int:
        """`backend`'s `global.evaluation_interval` in ms (DEFAULT_EVALUATION_INTERVAL_MS when
        it does not say, or cannot be asked now)."""
        got = await self._intervals.get_many((backend,))
        return got.get(backend, DEFAULT_EVALUATION_INTERVAL_MS)

    async def build(self, backend: Backend) -> BuildInfo:
        """`backend`'s buildinfo (the default one when it does not say, or cannot be asked now)."""
        got = await self._builds.get_many((backend,))
        return got.get(backend) or BuildInfo()

    async def dialect(self, backend: Backend) -> Dialect:
        """The regexp dialect `backend` evaluates in (Go 1.19 unless its buildinfo says newer)."""
        return (await self.build(backend)).dialect

    async def _fetch_interval(self, backend: Backend) -> int:
        if backend.cfg.kind == "amp":
            return DEFAULT_EVALUATION_INTERVAL_MS  # AMP has no status/config: not asked (a 404 per process)
        path = "/api/v1/status/config"
        reply = await backend.request("GET", path, timeout_s=FACT_TIMEOUT_S, endpoint=path,
                                      max_body_bytes=CONFIG_BODY_MAX)
        return _config_interval(reply.body) if _answered(reply.status) else _failed(backend, path, reply.status)

    async def _fetch_build(self, backend: Backend) -> BuildInfo:
        if backend.cfg.kind == "amp":
            return BuildInfo()  # AMP has no buildinfo: the conservative dialect, not asked
        path = "/api/v1/status/buildinfo"
        reply = await backend.request("GET", path, timeout_s=FACT_TIMEOUT_S, endpoint="buildinfo",
                                      max_body_bytes=FACT_BODY_MAX)
        return build_info(reply.body) if _answered(reply.status) else _failed(backend, path, reply.status)


def _answered(status: int) -> bool:
    """Is an answer with this status the backend's word on the fact? A 200, or a refusal that
    would come again (404: AMP has no such endpoint; 401/403: not for us to read) -- the
    default, kept. 429 and 5xx are for now: the default, asked again later."""
    return 200 <= status < 300 or (400 <= status < 500 and status != 429)


def _failed(backend: Backend, path: str, status: int) -> NoReturn:
    raise PromError("unavailable", f"backend {backend.name!r} answered {path} with HTTP {status}")
