"""Benchmark arithmetic (pure, unit-tested in tests/harness/test_bench.py): percentiles, paired
ratios, counter deltas between two scrapes of a /metrics page; and the run's surroundings:
machine and git facts, the progress line.

Ratios: a "ratio of medians" divides two independent medians; a "median of ratios" pairs the
two modes' measurements taken back to back (same refresh, same window) and takes the median
of the per-pair ratios, which cancels noise that hits both members of a pair (another process
on the machine, Prometheus's page cache). The issue's targets are stated as medians of ratios.
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TextIO

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default "linear" method). NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    if rank == lo or xs[hi] == xs[lo]:  # also keeps inf from turning into inf - inf = nan
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50)


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def ratio_of_medians(direct: Sequence[float], proxied: Sequence[float]) -> float:
    """median(proxied) / median(direct): below 1 means promaccel is faster."""
    d = median(direct)
    if not d or math.isnan(d):
        return math.nan
    return median(proxied) / d


def median_of_ratios(pairs: Iterable[tuple[float, float]]) -> float:
    """Median of proxied/direct over (direct, proxied) pairs measured side by side.
    Pairs with a zero, missing or NaN direct value are left out."""
    ratios = [p / d for d, p in pairs if d and not math.isnan(d) and p is not None and not math.isnan(p)]
    return median(ratios)


def count_ratio(base: float, value: float) -> float:
    """value / base for counts: 0 / 0 is 1 (both asked the backend nothing), n / 0 is inf."""
    if base is None or value is None or math.isnan(base) or math.isnan(value):
        return math.nan
    if base == 0:
        return 1.0 if value == 0 else math.inf
    return value / base


def paired_differences(pairs: Iterable[tuple[float, float]]) -> list[float]:
    """proxied - direct for each (direct, proxied) pair: the time the proxy adds."""
    return [p - d for d, p in pairs]


# ---------------------------------------------------------------------------------------------
# Prometheus text exposition: just enough to diff counters between two scrapes
# ---------------------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], value)


def parse_labels(text: str) -> Labels:
    """`{a="x",b="y\\"z"}` -> (("a", "x"), ("b", 'y"z')) sorted by name."""
    inner = text.strip()
    if inner.startswith("{"):
        inner = inner[1:-1]
    pos, out = 0, []
    while pos < len(inner):
        m = _LABEL_RE.match(inner, pos)
        if not m:
            if inner[pos:].strip(" ,"):
                raise ValueError(f"bad label set {text!r}")
            break
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


def parse_metrics(text: str) -> Samples:
    """Samples of a Prometheus text exposition, keyed by (name, sorted labels)."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        value = m.group(3)
        try:
            v = float(value.replace("+Inf", "inf").replace("-Inf", "-inf"))
        except ValueError:
            continue
        out[(m.group(1), parse_labels(m.group(2) or ""))] = v
    return out


LabelFilter = Callable[[Mapping[str, str]], bool]


def metric_sum(samples: Samples, name: str, where: LabelFilter | None = None) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and (where is None or where(dict(labels))))


def counter_delta(before: Samples, after: Samples, name: str, where: LabelFilter | None = None,
                  by: str | None = None) -> Any:
    """Increase of a counter between two scrapes, summed over the series `where` selects, or a
    dict by the value of label `by`. A series whose value went down was reset (the process
    restarted): its increase is its new value, as `increase()` counts it."""
    totals: dict[str, float] = {}
    for (n, labels), v in after.items():
        if n != name:
            continue
        lab = dict(labels)
        if where is not None and not where(lab):
            continue
        prev = before.get((n, labels), 0.0)
        inc = v - prev if v >= prev else v
        key = lab.get(by, "") if by else ""
        totals[key] = totals.get(key, 0.0) + inc
    if by:
        return totals
    return totals.get("", 0.0)


def is_query_endpoint(path: str) -> bool:
    return path in ("/api/v1/query", "/api/v1/query_range")


def backend_calls(before: Samples, after: Samples) -> float:
    """promaccel's calls to its backends for queries (readiness probes left out)."""
    return counter_delta(before, after, "promaccel_backend_requests_total",
                         lambda lab: is_query_endpoint(lab.get("endpoint", "")))


def cache_lookups(before: Samples, after: Samples) -> dict[str, float]:
    return counter_delta(before, after, "promaccel_cache_lookups_total", by="result")


def hit_ratio(lookups: Mapping[str, float]) -> float:
    total = sum(lookups.values())
    if not total:
        return math.nan
    return sum(v for k, v in lookups.items() if k == "hit" or k.startswith("hit")) / total


def prometheus_query_traffic(before: Samples, after: Samples) -> tuple[float, float]:
    """(query requests, response bytes) Prometheus served on its query endpoints between two
    scrapes of its own /metrics. Bytes are as written on the wire (gzip when the client asked)."""
    where: LabelFilter = lambda lab: is_query_endpoint(lab.get("handler", ""))  # noqa: E731
    requests = counter_delta(before, after, "prometheus_http_requests_total", where)
    body = counter_delta(before, after, "prometheus_http_response_size_bytes_sum", where)
    return requests, body


# ---------------------------------------------------------------------------------------------
# Machine and build
# ---------------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    info["nice"] = os.nice(0) if hasattr(os, "nice") else 0
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return info


def git_info() -> dict[str, Any]:
    """Commit and whether the tree differs from it; read-only (no index refresh, no locks)."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    out: dict[str, Any] = {}
    git = shutil.which("git")
    if git is None:
        return out
    try:
        out["commit"] = subprocess.run([git, "rev-parse", "HEAD"], cwd=ROOT, env=env, capture_output=True,
                                       text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run([git, "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=20, check=True).stdout
        out["dirty_files"] = len([line for line in status.splitlines() if line.strip()])
    except (OSError, subprocess.SubprocessError):
        pass
    return out


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------


class Progress:
    """One status line on stderr: rewritten in place on a terminal, a line every few seconds
    otherwise (logs of CI or `make bench | tee`)."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s
        self.t0 = time.monotonic()
        self._last = -math.inf
        self._width = 0

    def update(self, text: str, force: bool = False) -> None:
        line = f"[{time.monotonic() - self.t0:6.0f}s] {text}"
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
            self.stream.flush()
        elif force or time.monotonic() - self._last >= self.every_s:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last = time.monotonic()

    def done(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.update(text, force=True)
        if self.tty:
            self.stream.write("\n")
            self._width = 0
