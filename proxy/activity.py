"""What this process is doing and did lately, for the operator page (`/ui`, proxy/api/ui.py).

In process and bounded: the queries in flight (the first 200 listed, all counted), the last `recent` finished ones, one tally
per minute for the last hour (queries, errors, cache piece hits and misses, backend calls
and their latency), and each backend's last call. Fed by the access log middleware (a
query's start and end), `CacheReader.count` (a query's piece hits and misses) and
`Backend._once` (every backend call). A query's record is found through the context
variable `CURRENT`, which the middleware sets for the query's task and the tasks it starts.

Only fields from a fixed list are kept (never headers beyond Grafana's dashboard and panel
ids, never credentials); query texts and error messages are cut to `MAX_TEXT` characters.
With `--workers N` each worker process keeps its own (the page shows the one that served it).
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 2_000
MINUTES = 60
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
        self.backends: dict[str, BackendSeen] = {}
        self._seq = itertools.count(1)

    def resize(self, recent: int) -> None:
        self.recent = deque(self.recent, maxlen=max(1, recent))

    def _minute(self) -> Minute:
        m = int(self.clock() // 60)
        slot = self.minutes[m % MINUTES]
        if slot.minute != m:
            slot.__init__()  # type: ignore[misc]  # a stale minute: start it afresh
            slot.minute = m
        return slot

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
        m = self._minute()
        m.queries += 1
        m.errors += status >= 400

    # --- fed by the pipeline and the backends -------------------------------------------------

    def pieces_looked_up(self, hits: int, misses: int) -> None:
        m = self._minute()
        m.piece_hits += hits
        m.piece_misses += misses
        rec = CURRENT.get()
        if rec is not None and rec.duration_ms is None:
            rec.piece_hits += hits
            rec.piece_misses += misses

    def backend_call(self, backend: str, endpoint: str, seconds: float, status: int | None,
                     error: str | None = None) -> None:
        """One call to a backend: its HTTP status, or `error` (an exception's type name)."""
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
        m = self._minute()
        m.backend_calls += 1
        m.backend_errors += failed
        m.backend_seconds += seconds
        m.backend_max_seconds = max(m.backend_max_seconds, seconds)
        rec = CURRENT.get()
        if rec is not None and rec.duration_ms is None:
            ms = seconds * 1000
            rec.backend_ms += ms
            rec.backend_max_ms = max(rec.backend_max_ms, ms)
            rec.backend_errors += failed

    # --- read by the page ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now, perf = self.clock(), self.perf()
        current = int(now // 60)
        hour = []
        for m in range(current - MINUTES + 1, current + 1):
            slot = self.minutes[m % MINUTES]
            hour.append(slot.view() if slot.minute == m else Minute(minute=m).view())
        return {
            "now": round(now, 3), "started": round(self.started, 3), "pid": os.getpid(),
            "running": self.running,
            "in_flight": [r.view(perf) for r in sorted(self.in_flight.values(), key=lambda r: r.seq)],
            "recent": [r.view(perf) for r in reversed(self.recent)],
            "minutes": hour,
            "backends": {name: seen.view() for name, seen in self.backends.items()},
        }


ACTIVITY = Activity()
CURRENT: ContextVar[QueryRecord | None] = ContextVar("promaccel_query_record", default=None)
