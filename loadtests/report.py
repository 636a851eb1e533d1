"""Benchmark arithmetic and reporting: percentiles, paired ratios, /metrics deltas, Markdown, PNGs.

Everything above "Rendering" is pure and unit-tested (tests/harness/test_bench.py). The bench
(`loadtests.bench`) fills one JSON-serialisable `results` dict; `write_report` turns it into
`summary.md`, `results.json` and plots in the run directory, and copies the summary to
`loadtests/results/latest.md`.

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


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def fmt_ms(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    ms = seconds * 1000
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞"
    return f"{x:.3f}x"


def fmt_bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _latency_row(name: str, direct: Sequence[float], proxied: Sequence[float],
                 pairs: Sequence[tuple[float, float]]) -> list[str]:
    d, p = summarize(direct), summarize(proxied)
    return [
        name, str(d["n"]),
        fmt_ms(d["p50"]), fmt_ms(d["p95"]), fmt_ms(d["p99"]),
        fmt_ms(p["p50"]), fmt_ms(p["p95"]), fmt_ms(p["p99"]),
        fmt_ratio(ratio_of_medians(direct, proxied)), fmt_ratio(median_of_ratios(pairs)),
    ]


_LATENCY_HEADER = ["", "n", "direct p50 ms", "p95", "p99", "promaccel p50 ms", "p95", "p99",
                   "ratio of medians", "median of ratios"]


def _mismatch_lines(s: Mapping[str, Any]) -> list[str]:
    retries = s.get("retries") or {}
    out = [f"- answers compared: {s.get('compared', 0):,}; mismatches: **{s.get('mismatches', 0)}**; "
           f"failed requests: promaccel {s.get('failures', 0)}, direct {s.get('direct_failures', 0)}"
           + (f"; resent on a stale keep-alive connection: promaccel {retries.get('promaccel', 0)}, "
              f"direct {retries.get('direct', 0)}" if any(retries.values()) else "")]
    for ex in (s.get("mismatch_examples") or [])[:5]:
        out.append(f"  - `{ex}`")
    for ex in (s.get("failure_examples") or [])[:5]:
        out.append(f"  - failure: `{ex}`")
    return out


def _render_cold(s: Mapping[str, Any]) -> list[str]:
    reps = s.get("reps", [])
    direct = [r["direct_s"] for r in reps]
    prox = [r["promaccel_s"] for r in reps]
    out = [f"Query `{s['query']}`, range {s['range']}, step {s['step']} s, {s.get('points_per_series', '?')} "
           f"points per series; answer {fmt_bytes(s.get('answer_bytes'))} of JSON. Each repetition starts a fresh "
           "promaccel (and flushes Redis) so its cache is cold; Prometheus was warmed by one untimed query "
           "first, and the order of the two calls alternates.", ""]
    out += _table(_LATENCY_HEADER, [_latency_row("cold query", direct, prox, list(zip(direct, prox)))])
    out += ["", "| rep | first | direct ms | promaccel ms | ratio | pieces | backend calls | backend bytes | "
            "promaccel CPU s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(reps):
        out.append(f"| {i} | {r['first']} | {fmt_ms(r['direct_s'])} | {fmt_ms(r['promaccel_s'])} | "
                   f"{fmt_ratio(r['promaccel_s'] / r['direct_s'] if r['direct_s'] else math.nan)} | "
                   f"{r.get('pieces', '–')} | {fmt_num(r.get('backend_calls'))} | {fmt_bytes(r.get('backend_bytes'))} | "
                   f"{fmt_num(r.get('promaccel_cpu_s'), 3)} |")
    return out


def _pieces(refresh: Mapping[str, Any]) -> float:
    values = [p for p in refresh["promaccel"].get("pieces") or [] if p is not None]
    try:
        return float(sum(int(p) for p in values)) if values else math.nan
    except ValueError:
        return math.nan


def dataset_line(ds: Mapping[str, Any]) -> str:
    """One dataset in a few words: "32 nodes × 8 GPUs × 168 h, 78,000,000 samples"."""
    hours = ds.get("hours")
    hours_text = f"{hours:g}" if isinstance(hours, (int, float)) else str(hours)
    return (f"{ds.get('nodes')} nodes × {ds.get('gpus_per_node')} GPUs × {hours_text} h, "
            f"{fmt_num(ds.get('samples'))} samples")


def _dashboard_dataset(s: Mapping[str, Any]) -> list[str]:
    which, info = s.get("dataset"), s.get("dataset_info") or {}
    if not which or not info:
        return []
    if which == "long":
        return [f"Dataset: **the long dataset**, {dataset_line(info)} (`{info.get('data_dir')}`), served by its own "
                "Prometheus with its own promaccel: the main dataset is shorter than this window. Same end time and "
                "virtual now; a smaller fleet than the main dataset, so compare its ratios, not its milliseconds, "
                "with the other windows.", ""]
    return [f"Dataset: the main dataset, {dataset_line(info)}.", ""]


def _render_dashboard(s: Mapping[str, Any]) -> list[str]:
    if s.get("skipped"):
        return []
    refreshes = s.get("refreshes", [])
    out = _dashboard_dataset(s)
    out += [f"Window **{s['window']}**, sliding {s['slide_s']:g} s per refresh, {len(refreshes)} refreshes, "
           f"{s.get('panels', '?')} requests per refresh, 1 user, at most {s.get('concurrency', 6)} requests in flight. "
           "An untimed direct refresh warms Prometheus first; refresh 0 fills promaccel's cache (cold); "
           "the warm rows use refreshes 1..n.", ""]
    if not refreshes:
        return out
    rows = []
    for label, sel in (("refresh, cold (0)", refreshes[:1]), ("refresh, warm (1..n)", refreshes[1:])):
        d = [r["direct"]["wall_s"] for r in sel]
        p = [r["promaccel"]["wall_s"] for r in sel]
        rows.append(_latency_row(label, d, p, list(zip(d, p))))
    out += _table(_LATENCY_HEADER, rows)
    warm = refreshes[1:] or refreshes
    calls = [r["promaccel"].get("backend_calls", math.nan) for r in warm]
    pbytes = [r["promaccel"].get("backend_bytes", math.nan) for r in warm]
    dbytes = [r["direct"].get("backend_bytes", math.nan) for r in warm]
    lookups: dict[str, float] = {}
    cache_errors: dict[str, float] = {}
    for r in warm:
        for k, v in (r["promaccel"].get("cache") or {}).items():
            lookups[k] = lookups.get(k, 0.0) + v
        for k, v in (r["promaccel"].get("cache_errors") or {}).items():
            cache_errors[k] = cache_errors.get(k, 0.0) + v
    out += [
        "",
        "Per warm refresh (medians):",
        "",
        "| | direct | promaccel |",
        "|---|---:|---:|",
        f"| requests reaching Prometheus | {fmt_num(median(r['direct'].get('backend_requests', math.nan) for r in warm))} | "
        f"{fmt_num(median(r['promaccel'].get('backend_requests', math.nan) for r in warm))} |",
        f"| promaccel backend calls (its /metrics) | – | {fmt_num(median(calls))} |",
        f"| pieces planned (sum of X-Promaccel-Pieces) | – | {fmt_num(median(_pieces(r) for r in warm))} |",
        f"| bytes Prometheus sent (on the wire: gzip if asked) | {fmt_bytes(median(dbytes))} | {fmt_bytes(median(pbytes))} |",
        f"| bytes the client received (decoded JSON) | {fmt_bytes(median(r['direct']['bytes'] for r in warm))} | "
        f"{fmt_bytes(median(r['promaccel']['bytes'] for r in warm))} |",
        f"| Prometheus CPU s | {fmt_num(median(r['direct'].get('prometheus_cpu_s', math.nan) for r in warm), 3)} | "
        f"{fmt_num(median(r['promaccel'].get('prometheus_cpu_s', math.nan) for r in warm), 3)} |",
        f"| promaccel CPU s | – | {fmt_num(median(r['promaccel'].get('promaccel_cpu_s', math.nan) for r in warm), 3)} |",
        "",
        f"Cache lookups over warm refreshes: {dict(sorted(lookups.items())) or 'none exposed'}; hit ratio "
        f"{fmt_ratio(hit_ratio(lookups)).rstrip('x') if lookups else '–'}"
        + (f"; cache errors (bypassed) {dict(sorted(cache_errors.items()))}" if any(cache_errors.values()) else "")
        + ". promaccel peak RSS "
        f"{fmt_bytes(s.get('promaccel_peak_rss'))}, CPU {fmt_num(s.get('promaccel_cpu_s'), 2)} s over the scenario.",
        "",
        "Per panel, warm refreshes (request latency, queueing behind the 6-request limit excluded):",
        "",
    ]
    keys = list(refreshes[0]["direct"]["panels"].keys())
    prow = []
    for k in keys:
        d = [r["direct"]["panels"].get(k) for r in warm]
        p = [r["promaccel"]["panels"].get(k) for r in warm]
        pairs = [(a, b) for a, b in zip(d, p) if a is not None and b is not None]
        prow.append(_latency_row(k, [x for x in d if x is not None], [x for x in p if x is not None], pairs))
    out += _table(["panel", *_LATENCY_HEADER[1:]], prow)
    return out


def _render_tiny(s: Mapping[str, Any]) -> list[str]:
    out = [f"{s.get('requests_per_query', '?')} sequential requests per query and mode, interleaved pairwise "
           "(order alternating); instant queries move their evaluation time by 1 s per request so no two "
           "are identical. \"added\" is the median of the per-pair differences promaccel − direct.", ""]
    rows = []
    for q in s.get("queries", []):
        d, p = q["direct_s"], q["promaccel_s"]
        diffs = paired_differences(zip(d, p))
        rows.append([f"`{q['query']}`" + (" (range)" if q.get("range") else ""), str(len(d)),
                     fmt_ms(median(d)), fmt_ms(percentile(d, 95)), fmt_ms(median(p)), fmt_ms(percentile(p, 95)),
                     fmt_ms(median(diffs)), fmt_ms(percentile(diffs, 95))])
    out += _table(["query", "n", "direct p50 ms", "p95", "promaccel p50 ms", "p95", "added p50 ms", "added p95 ms"], rows)
    return out


def _render_users(s: Mapping[str, Any]) -> list[str]:
    out = [f"{s['users']} users refresh the dashboard (window {s['window']}, slide {s['slide_s']:g} s) at the same "
           f"virtual times, each with at most 6 requests in flight; a baseline of 1 user runs the same refreshes "
           "on its own fresh promaccel; its direct answers are the reference every user's promaccel answer is "
           "compared with. Backend calls come from promaccel's /metrics.", ""]
    single = s.get("single_calls", [])
    rounds = s.get("rounds", [])
    rows = []
    for i, r in enumerate(rounds):
        base = single[i] if i < len(single) else math.nan
        calls = r.get("backend_calls", math.nan)
        errs = sum((r.get("cache_errors") or {}).values())
        rows.append([str(i), fmt_num(base), fmt_num(calls) + (f" ({fmt_num(errs)} cache errors)" if errs else ""),
                     fmt_ratio(count_ratio(base, calls)),
                     fmt_ms(median(r["direct_user_s"])), fmt_ms(percentile(r["direct_user_s"], 95)),
                     fmt_ms(median(r["promaccel_user_s"])), fmt_ms(percentile(r["promaccel_user_s"], 95)),
                     fmt_ms(r.get("direct_wall_s")), fmt_ms(r.get("promaccel_wall_s")),
                     f"{r.get('direct_failures', 0)} / {r.get('promaccel_failures', 0)}"])
    out += _table(["round", "1-user backend calls", f"{s['users']}-user backend calls", "ratio",
                   "direct user refresh p50 ms", "p95", "promaccel p50 ms", "p95", "direct round ms",
                   "promaccel round ms", "failed direct / promaccel"], rows)
    pairs = [(single[i], r.get("backend_calls", math.nan)) for i, r in enumerate(rounds) if i < len(single)]
    total = count_ratio(sum(b for b, _ in pairs), sum(c for _, c in pairs)) if pairs else math.nan
    out += ["", f"Backend calls, {s['users']} users vs 1 user over the same refreshes: **{fmt_ratio(total)}** "
            f"(target ≤ 1.1x); median of the per-round ratios {fmt_ratio(median(count_ratio(b, c) for b, c in pairs))}. "
            f"promaccel peak RSS {fmt_bytes(s.get('promaccel_peak_rss'))}."]
    return out


def _render_heavy(s: Mapping[str, Any]) -> list[str]:
    q = s.get("queries", [])
    base, peak, largest = s.get("base_rss", math.nan), s.get("peak_rss", math.nan), s.get("largest_answer", math.nan)
    out = [f"{len(q)} distinct heavy range queries (range {s.get('range')}, step {s.get('step')} s) sent at once "
           "through a fresh promaccel (cold cache); the reference answers come from Prometheus one query at a "
           f"time. RSS is sampled every {s.get('sample_ms', 50)} ms over promaccel's process tree.", ""]
    target = base + 2 * largest if not math.isnan(base) and not math.isnan(largest) else math.nan
    out += [
        "| | value |", "|---|---:|",
        f"| promaccel RSS before | {fmt_bytes(base)} |",
        f"| promaccel peak RSS | {fmt_bytes(peak)} |",
        f"| peak − before | {fmt_bytes(peak - base)} ({(peak - base) / largest:.1f} × the largest answer) |",
        f"| largest single answer (JSON) | {fmt_bytes(largest)} |",
        f"| sum of all answers (JSON) | {fmt_bytes(s.get('total_answer_bytes'))} |",
        f"| target: before + 2 × largest | {fmt_bytes(target)} ({'met' if peak <= target else 'NOT met'}) |",
        f"| promaccel, all at once: wall ms | {fmt_ms(s.get('promaccel_wall_s'))} |",
        f"| direct, one at a time: total ms | {fmt_ms(s.get('direct_sequential_s'))} |",
    ]
    if "direct_wall_s" in s:
        out.append(f"| direct, all at once: wall ms (failed) | {fmt_ms(s['direct_wall_s'])} "
                   f"({s.get('direct_at_once_failures', 0)}) |")
    out += [f"| failed: promaccel / direct reference | {s.get('failures', 0)} / {s.get('direct_failures', 0)} |", ""]
    rows = [[f"`{x['query']}`", fmt_ms(x["direct_s"]), fmt_ms(x["promaccel_s"]), fmt_bytes(x["bytes"]),
             str(x.get("status_promaccel", ""))] for x in q]
    out += _table(["query", "direct alone ms", "promaccel (all at once) ms", "answer", "promaccel status"], rows)
    return out


def layout_name(run: Mapping[str, Any]) -> str:
    """"1 process", "2 workers" (uvicorn workers of one promaccel), "2 processes" (separate)."""
    w, n = int(run.get("workers", 1)), int(run.get("processes", 1))
    if n > 1:
        return f"{n} processes"
    return "1 process" if w == 1 else f"{w} workers"


def workers_summary(s: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per layout (`layout_name`): median wall of the warm rounds (all but round 0), round 0's
    wall, backend requests in round 0 and in the warm rounds, CPU and peak RSS."""
    out: dict[str, dict[str, float]] = {}
    for run in s.get("runs", []):
        rounds = run.get("rounds", [])
        warm = rounds[1:]
        out[layout_name(run)] = {
            "cold_wall_s": rounds[0]["wall_s"] if rounds else math.nan,
            "warm_wall_s": median(r["wall_s"] for r in warm) if warm else math.nan,
            "warm_user_p50_s": median(x for r in warm for x in r["user_s"]) if warm else math.nan,
            "cold_backend_requests": rounds[0]["backend_requests"] if rounds else math.nan,
            "warm_backend_requests": sum(r["backend_requests"] for r in warm) if warm else math.nan,
            "warm_cpu_s": median(r["promaccel_cpu_s"] for r in warm) if warm else math.nan,
            "peak_rss": run.get("peak_rss", math.nan),
            "failures": sum(r.get("failures", 0) for r in rounds),
        }
    return out


def _render_workers(s: Mapping[str, Any]) -> list[str]:
    out = [f"{s['users']} users refresh the dashboard (window {s['window']}, slide {s['slide_s']:g} s; round 0 cold, "
           "then warm) through one promaccel process, one with N uvicorn worker processes, and N separate promaccel "
           "processes (users spread round-robin), all sharing one Redis, each on a fresh promaccel with Redis "
           "flushed. Backend calls are counted by Prometheus; CPU and RSS are summed over promaccel's processes.", ""]
    summ = workers_summary(s)
    rows = [[name, fmt_ms(v["cold_wall_s"]), fmt_ms(v["warm_wall_s"]), fmt_ms(v["warm_user_p50_s"]),
             fmt_num(v["cold_backend_requests"]), fmt_num(v["warm_backend_requests"]), fmt_num(v["warm_cpu_s"], 2),
             fmt_bytes(v["peak_rss"]), str(v["failures"])] for name, v in summ.items()]
    out += _table(["layout", "cold round ms", "warm round ms (median)", "warm user refresh p50 ms",
                   "backend calls, cold round", "backend calls, warm rounds", "promaccel CPU s per warm round",
                   "peak RSS", "failed"], rows)
    one = summ.get("1 process")
    if one is not None:
        for name, many in summ.items():
            if name == "1 process":
                continue
            out += ["", f"{name} vs 1 process: warm round **{fmt_ratio(count_ratio(one['warm_wall_s'], many['warm_wall_s']))}** "
                    f"of the wall time; cold round backend calls {fmt_num(many['cold_backend_requests'])} vs "
                    f"{fmt_num(one['cold_backend_requests'])} "
                    f"(**{fmt_ratio(count_ratio(one['cold_backend_requests'], many['cold_backend_requests']))}**)."]
    return out


def _render_codec(s: Mapping[str, Any]) -> list[str]:
    if not s.get("ran"):
        return [s.get("note", "not run")]
    return [f"`{s['command']}` (exit {s['returncode']}, {s['elapsed_s']:.1f} s):", "", "```", s.get("output", "").rstrip(), "```"]


_RENDER = {
    "cold": ("(a) Cold heavy range query", _render_cold),
    "dashboard": ("(b) Warm dashboard refresh", _render_dashboard),
    "tiny": ("(c) Tiny queries: the proxy's own overhead", _render_tiny),
    "users": ("(d) Concurrent users on one dashboard", _render_users),
    "heavy": ("(e) Concurrent heavy queries: promaccel's peak RSS", _render_heavy),
    "codec": ("(f) Codec throughput", _render_codec),
    "workers": ("(g) Worker processes sharing one Redis", _render_workers),
}


def render_markdown(results: Mapping[str, Any]) -> str:
    m = results.get("machine", {})
    ds = results.get("dataset", {})
    lds = results.get("long_dataset") or {}
    g = results.get("git", {})
    lines = [
        f"# promaccel benchmark — {results.get('started', '')}",
        "",
        "```",
        results.get("command", ""),
        "```",
        "",
        f"- dataset: {ds.get('nodes')} nodes × {ds.get('gpus_per_node')} GPUs = {ds.get('gpus')} GPUs, "
        f"{ds.get('hours')} h ending {ds.get('end_iso')} (scrape {ds.get('scrape_interval')} s); "
        f"{fmt_num(ds.get('samples'))} samples, {fmt_num(ds.get('series'))} series (summed over 2 h slices); "
        f"data dir `{ds.get('data_dir')}`",
        *([f"- long dataset, for the dashboard window(s) the main one is too short for "
           f"({', '.join(lds.get('windows', []))}): {lds.get('nodes')} nodes × {lds.get('gpus_per_node')} GPUs = "
           f"{lds.get('gpus')} GPUs, {lds.get('hours')} h ending {lds.get('end_iso')}; {fmt_num(lds.get('samples'))} "
           f"samples, {fmt_num(lds.get('series'))} series (summed over 2 h slices); data dir `{lds.get('data_dir')}`; "
           "served by its own Prometheus (same binary and settings) with its own promaccel"] if lds else []),
        f"- machine: {m.get('nproc')} CPUs ({m.get('usable_cpus')} usable), {m.get('ram_gib')} GiB RAM, "
        f"{m.get('cpu_model', '?')}; load average at start {tuple(round(x, 2) for x in m.get('loadavg', ()))}"
        + (f"; run at niceness {m['nice']}" if m.get("nice") else ""),
        f"- git: {g.get('commit', '?')}" + (f" with {g['dirty_files']} modified tracked files" if g.get("dirty_files") else ""),
        f"- versions: {results.get('versions', {})}",
        f"- promaccel: args `{' '.join(results.get('promaccel_args', [])) or '(defaults)'}`, cache "
        f"{'Redis' if results.get('redis') else 'in-process'}; source digest {results.get('promaccel_code', '?')}",
        "- Prometheus: its defaults (2 min query timeout, 20 concurrent queries), no scrapes, blocks compacted",
        f"- virtual now: {results.get('virtual_now_iso', '?')} (the data's end minus a fixed {results.get('phase_s', 0)} s "
        "phase, so windows are not pre-aligned); refreshes run back to back, sliding in virtual time",
        f"- wall time: {results.get('elapsed_s', 0):.0f} s",
        "",
    ]
    scen = results.get("scenarios", [])
    total_mismatch = sum(s.get("mismatches", 0) for s in scen)
    total_compared = sum(s.get("compared", 0) for s in scen)
    lines += [f"**Answers compared with direct Prometheus: {total_compared:,}; mismatches: {total_mismatch}; "
              f"failed requests through promaccel: {sum(s.get('failures', 0) for s in scen)} "
              f"(direct: {sum(s.get('direct_failures', 0) for s in scen)}).**", ""]
    for note in results.get("notes", []):
        lines.append(f"> {note}")
    if results.get("notes"):
        lines.append("")
    for s in results.get("scenarios", []):
        title, fn = _RENDER.get(s["name"], (s["name"], lambda _s: []))
        lines += [f"## {title}" + (f" — {s['window']}" if s["name"] == "dashboard" else "")
                  + (" (long dataset)" if s.get("dataset") == "long" else ""), ""]
        try:
            lines += fn(s)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # never lose the rest of a report
            lines.append(f"(could not render: {exc!r})")
        lines.append("")
        if s["name"] != "codec" and not s.get("skipped"):
            lines += _mismatch_lines(s)
        plog = s.get("promaccel_log") or {}
        if plog.get("warnings") or plog.get("errors"):
            lines.append(f"- promaccel logged {plog.get('warnings', 0)} warnings and {plog.get('errors', 0)} errors "
                         "during this scenario, e.g.:")
            lines += [f"  - `{e}`" for e in plog.get("examples", [])[:3]]
        for note in s.get("notes", []):
            lines.append(f"- note: {note}")
        for img in s.get("plots", []):
            lines += ["", f"![{img}]({img})"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def make_plots(results: dict[str, Any], out_dir: Path) -> None:
    """Adds a "plots" list (file names in out_dir) to each scenario that has something to draw."""
    try:
        plt = _pyplot()
    except ImportError:
        results.setdefault("notes", []).append("matplotlib is not installed: no plots (pip install -e '.[bench]')")
        return
    for s in results.get("scenarios", []):
        name = s["name"]
        fig = None
        if name == "dashboard" and s.get("refreshes"):
            fig, ax = plt.subplots(figsize=(8, 4))
            xs = [r["index"] for r in s["refreshes"]]
            ax.plot(xs, [r["direct"]["wall_s"] * 1000 for r in s["refreshes"]], "o-", label="direct")
            ax.plot(xs, [r["promaccel"]["wall_s"] * 1000 for r in s["refreshes"]], "s-", label="promaccel")
            ax.set_xlabel(f"refresh (window slides {s['slide_s']:g} s each)")
            ax.set_ylabel("dashboard refresh ms")
            ax.set_title(f"Dashboard refresh latency, {s['window']} window")
            fname = f"dashboard-{s['window']}.png"
        elif name == "cold" and s.get("reps"):
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = list(range(len(s["reps"])))
            ax.bar([x - 0.2 for x in xs], [r["direct_s"] * 1000 for r in s["reps"]], 0.4, label="direct")
            ax.bar([x + 0.2 for x in xs], [r["promaccel_s"] * 1000 for r in s["reps"]], 0.4, label="promaccel")
            ax.set_xlabel("repetition (fresh promaccel each)")
            ax.set_ylabel("ms")
            ax.set_title("Cold heavy range query")
            fname = "cold.png"
        elif name == "tiny" and s.get("queries"):
            fig, ax = plt.subplots(figsize=(8, 4))
            for q in s["queries"]:
                (line,) = ax.plot([x * 1000 for x in q["direct_s"]], ".", alpha=0.5, label=f"direct {q['query'][:30]}")
                ax.plot([x * 1000 for x in q["promaccel_s"]], "x", alpha=0.5, color=line.get_color(),
                        label=f"promaccel {q['query'][:30]}")
            ax.set_yscale("log")
            ax.set_xlabel("request")
            ax.set_ylabel("ms (log)")
            ax.set_title("Tiny queries")
            fname = "tiny.png"
        elif name == "users" and s.get("rounds"):
            fig, ax = plt.subplots(figsize=(8, 4))
            for i, r in enumerate(s["rounds"]):
                ax.plot([i - 0.1] * len(r["direct_user_s"]), [x * 1000 for x in r["direct_user_s"]], ".",
                        color="C0", alpha=0.4, label="direct" if i == 0 else None)
                ax.plot([i + 0.1] * len(r["promaccel_user_s"]), [x * 1000 for x in r["promaccel_user_s"]], ".",
                        color="C1", alpha=0.4, label="promaccel" if i == 0 else None)
            ax.set_xlabel("round")
            ax.set_ylabel("user's dashboard refresh ms")
            ax.set_title(f"{s['users']} concurrent users")
            fname = "users.png"
        elif name == "heavy" and s.get("rss_samples"):
            fig, ax = plt.subplots(figsize=(8, 4))
            ax.plot([t for t, _ in s["rss_samples"]], [v / 2**20 for _, v in s["rss_samples"]], label="promaccel RSS")
            if s.get("largest_answer") and s.get("base_rss"):
                ax.axhline((s["base_rss"] + 2 * s["largest_answer"]) / 2**20, color="red", linestyle="--",
                           label="target: before + 2 × largest answer")
            ax.set_xlabel("s")
            ax.set_ylabel("MiB")
            ax.set_title(f"{len(s.get('queries', []))} concurrent heavy queries")
            fname = "heavy-rss.png"
        if fig is None:
            continue
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=100)
        plt.close(fig)
        s.setdefault("plots", []).append(fname)


def write_report(results: dict[str, Any], out_dir: Path, latest: Path | None = None) -> Path:
    """summary.md, results.json and the plots in out_dir; summary copied to `latest` with its
    image links pointing into the run directory."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    make_plots(results, out_dir)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    summary = render_markdown(results)
    path = out_dir / "summary.md"
    path.write_text(summary)
    if latest is not None:
        rel = os.path.relpath(out_dir, latest.parent)
        linked = re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", lambda m: f"![{m.group(1)}]({rel}/{m.group(2)})", summary)
        latest.write_text(linked)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Re-render a run's summary and plots from its results.json (after a report change)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m loadtests.report", description=main.__doc__)
    p.add_argument("results", type=Path, help="loadtests/results/<run>/results.json")
    p.add_argument("--latest", type=Path, help="also copy the summary here (e.g. loadtests/results/latest.md)")
    a = p.parse_args(argv)
    results = json.loads(a.results.read_text())
    for s in results.get("scenarios", []):
        s.pop("plots", None)
    print(write_report(results, a.results.parent, a.latest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
