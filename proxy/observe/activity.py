"""What this process is doing and did lately, for the operator page (`/ui`, proxy/api/ui.py).

In process and bounded: the queries in flight (the first 200 listed, all counted), the last `recent` finished ones, one tally
per minute for the last hour (queries, errors, cache piece hits and misses, backend calls
and their latency), and each backend's last call. Fed by the access log middleware (a
query's start and end), `CacheReader.count` (a query's piece hits and misses) and
`Backend._once` (every backend call). A query's record is made by the middleware
(`begin`, kept in the request's state) and handed down explicitly: the query path carries it
on its `RequestContext`, a backend call is given it (`Caller.record`).

Only fields from a fixed list are kept (never headers beyond Grafana's dashboard and panel
ids, never credentials); query texts and error messages are cut to `MAX_TEXT` characters.
With `--workers N` each worker process keeps its own (the page shows the one that served it).

With auth on, a query's record carries the tenant it authenticated as (set by the route
wrapper, proxy/api/tenants.py) and the minutes are also tallied per tenant: `snapshot(tenant)`
is what that tenant may see -- its own queries (in flight and recent, with their error texts)
and its own minutes, nothing of another tenant's. A request refused before it authenticated
has no tenant: only the full snapshot (the admin's, or auth off) lists it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 2_000
MINUTES = 60
MAX_TENANTS = 1_024  # per-tenant minute tallies kept (tenants come from the config)
# Access-log fields the page shows (everything else a request carries is dropped).
SHOWN_FIELDS = (
    "query", "range", "plan_pieces", "sharded", "time_split", "plan_reason", "pieces", "cache",
    "backend_calls", "samples_processed", "bytes", "dashboard_uid", "panel_id",
)


def cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


@dataclass
class QueryRecord:
    """One query's record: filled while it runs, frozen once it finished."""

    seq: int
    query_id: str
    method: str
    path: str
    started: float  # wall clock (s)
    t0: float  # perf_counter at start
    fields: dict[str, object] = field(default_factory=dict)
    piece_hits: int = 0
    piece_misses: int = 0
    backend_ms: float = 0.0  # sum of this query's own backend calls (not ones it joined)
    backend_max_ms: float = 0.0
    backend_errors: int = 0
    status: int | None = None
    duration_ms: float | None = None
    error: str | None = None
    tenant: str | None = None  # with auth on, once authenticated

    def note(self, **fields: object) -> None:
        """Fields known while it runs (the query text once read)."""
        for k, v in fields.items():
            if k in SHOWN_FIELDS:
                self.fields[k] = cut(v) if isinstance(v, str) else v

    def view(self, now_perf: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq, "query_id": self.query_id, "method": self.method, "path": self.path,
            "started": round(self.started, 3), **self.fields,
            "piece_hits": self.piece_hits, "piece_misses": self.piece_misses,
            "backend_ms": round(self.backend_ms, 1), "backend_max_ms": round(self.backend_max_ms, 1),
            "backend_errors": self.backend_errors, "status": self.status, "error": self.error,
        }
        if self.tenant is not None:
            out["tenant"] = self.tenant
        if self.duration_ms is None:
            out["running_ms"] = round((now_perf - self.t0) * 1000, 1)
        else:
            out["duration_ms"] = self.duration_ms
        return out


@dataclass
class Minute:
    minute: int = -1  # wall-clock minute (epoch seconds // 60) this tally is for
    queries: int = 0
    errors: int = 0
    piece_hits: int = 0
    piece_misses: int = 0
    backend_calls: int = 0
    backend_errors: int = 0
    backend_seconds: float = 0.0
    backend_max_seconds: float = 0.0

    def view(self) -> dict[str, Any]:
        looked = self.piece_hits + self.piece_misses
        return {
            "t": self.minute * 60, "queries": self.queries, "errors": self.errors,
            "piece_hits": self.piece_hits, "piece_misses": self.piece_misses,
            "hit_ratio": round(self.piece_hits / looked, 4) if looked else None,
            "backend_calls": self.backend_calls, "backend_errors": self.backend_errors,
            "backend_avg_ms": round(self.backend_seconds / self.backend_calls * 1000, 1) if self.backend_calls else None,
            "backend_max_ms": round(self.backend_max_seconds * 1000, 1) if self.backend_calls else None,
        }


@dataclass
class BackendSeen:
    calls: int = 0
    errors: int = 0
    last_call: float | None = None  # wall clock
    last_ms: float | None = None
    last_status: int | None = None
    last_error: str | None = None
    last_error_at: float | None = None

    def view(self) -> dict[str, Any]:
        return {"calls": self.calls, "errors": self.errors, "last_call": self.last_call,
                "last_ms": self.last_ms, "last_status": self.last_status,
                "last_error": self.last_error, "last_error_at": self.last_error_at}


class Activity:
    """The recorder (one per process: `ACTIVITY`). Every method is O(1) and never raises."""

    def __init__(self, recent: int = 100, max_in_flight: int = 200,
                 clock: Any = time.time, perf: Any = time.perf_counter) -> None:
        self.clock = clock
        self.perf = perf
        self.started = clock()
        self.recent: deque[QueryRecord] = deque(maxlen=max(1, recent))
        self.in_flight: dict[int, QueryRecord] = {}  # the first max_in_flight of those running
        self.max_in_flight = max_in_flight
        self.running = 0
        self.minutes = [Minute() for _ in range(MINUTES)]
        self.tenant_minutes: dict[str, list[Minute]] = {}
        self.backends: dict[str, BackendSeen] = {}
        self._seq = itertools.count(1)

    def resize(self, recent: int) -> None:
        self.recent = deque(self.recent, maxlen=max(1, recent))

    def _minute(self, tenant: str | None = None) -> Minute:
        """This minute's tally: the process's, or with `tenant` that tenant's."""
        if tenant is None:
            minutes = self.minutes
        else:
            got = self.tenant_minutes.get(tenant)
            if got is None:
                if len(self.tenant_minutes) >= MAX_TENANTS:
                    return Minute()  # beyond the bound: counted in the process's tally only
                got = self.tenant_minutes[tenant] = [Minute() for _ in range(MINUTES)]
            minutes = got
        m = int(self.clock() // 60)
        slot = minutes[m % MINUTES]
        if slot.minute != m:
            slot.__init__()  # type: ignore[misc]  # a stale minute: start it afresh
            slot.minute = m
        return slot

    def _tallies(self, rec: QueryRecord | None) -> list[Minute]:
        """The tallies a query's counts go to: the process's, and its tenant's when it has one."""
        out = [self._minute()]
        if rec is not None and rec.tenant is not None:
            out.append(self._minute(rec.tenant))
        return out

    # --- fed by the access log middleware ---------------------------------------------------

    def begin(self, query_id: str, method: str, path: str) -> QueryRecord:
        rec = QueryRecord(next(self._seq), query_id, method, path, self.clock(), self.perf())
        self.running += 1
        if len(self.in_flight) < self.max_in_flight:  # beyond: counted, listed once done
            self.in_flight[rec.seq] = rec
        return rec

    def finish(self, rec: QueryRecord, status: int, duration_s: float, fields: dict[str, object],
               error: str | None = None) -> None:
        self.in_flight.pop(rec.seq, None)
        self.running -= 1
        # The text noted when the query was read is kept (the access log's is cut shorter).
        rec.note(**{k: v for k, v in fields.items() if k != "query" or "query" not in rec.fields})
        rec.status = status
        rec.duration_ms = round(duration_s * 1000, 1)
        rec.error = cut(error, 500) if error else None
        self.recent.append(rec)
        for m in self._tallies(rec):
            m.queries += 1
            m.errors += status >= 400

    # --- fed by the pipeline and the backends -------------------------------------------------

    def pieces_looked_up(self, hits: int, misses: int, rec: QueryRecord | None = None) -> None:
        """A lookup of a query's pieces in the cache; `rec`: the query's record, if any."""
        for m in self._tallies(rec):
            m.piece_hits += hits
            m.piece_misses += misses
        if rec is not None and rec.duration_ms is None:
            rec.piece_hits += hits
            rec.piece_misses += misses

    def backend_call(self, backend: str, endpoint: str, seconds: float, status: int | None,
                     error: str | None = None, record: QueryRecord | None = None) -> None:
        """One call to a backend: its HTTP status, or `error` (an exception's type name);
        `record`: the query it was made for, if any."""
        failed = error is not None or (status is not None and status >= 500)
        seen = self.backends.get(backend)
        if seen is None:
            seen = self.backends[backend] = BackendSeen()
        now = self.clock()
        if failed:
            seen.errors += 1
            seen.last_error = cut(f"{endpoint}: {error or f'HTTP {status}'}", 200)
            seen.last_error_at = now
        if endpoint == "ready":  # readiness probes: their failures count, the rest is not traffic
            return
        seen.calls += 1
        seen.last_call, seen.last_ms, seen.last_status = now, round(seconds * 1000, 1), status
        rec = record
        for m in self._tallies(rec):
            m.backend_calls += 1
            m.backend_errors += failed
            m.backend_seconds += seconds
            m.backend_max_seconds = max(m.backend_max_seconds, seconds)
        if rec is not None and rec.duration_ms is None:
            ms = seconds * 1000
            rec.backend_ms += ms
            rec.backend_max_ms = max(rec.backend_max_ms, ms)
            rec.backend_errors += failed

    # --- read by the page ---------------------------------------------------------------------

    def snapshot(self, tenant: str | None = None) -> dict[str, Any]:
        """Everything (auth off, or the admin); with `tenant`, only what is that tenant's: its
        queries and minutes, how many of its queries run, and no backend tallies (those count
        every tenant's calls) nor the process id."""
        now, perf = self.clock(), self.perf()
        current = int(now // 60)
        minutes = self.minutes if tenant is None else self.tenant_minutes.get(tenant, [])
        hour = []
        for m in range(current - MINUTES + 1, current + 1):
            slot = minutes[m % MINUTES] if minutes else None
            hour.append(slot.view() if slot is not None and slot.minute == m else Minute(minute=m).view())
        in_flight = sorted(self.in_flight.values(), key=lambda r: r.seq)
        recent = list(reversed(self.recent))
        if tenant is not None:
            in_flight = [r for r in in_flight if r.tenant == tenant]
            recent = [r for r in recent if r.tenant == tenant]
            return {"now": round(now, 3), "started": round(self.started, 3), "running": len(in_flight),
                    "in_flight": [r.view(perf) for r in in_flight], "recent": [r.view(perf) for r in recent],
                    "minutes": hour}
        return {
            "now": round(now, 3), "started": round(self.started, 3), "pid": os.getpid(),
            "running": self.running,
            "in_flight": [r.view(perf) for r in in_flight],
            "recent": [r.view(perf) for r in recent],
            "minutes": hour,
            "backends": {name: seen.view() for name, seen in self.backends.items()},
        }


ACTIVITY = Activity()
