"""The bench's report: Markdown, plots and results.json of a run, from its typed results.

`loadtests.bench` collects one result per scenario (the dataclasses of loadtests/scenarios/)
into a `results` dict; `write_report` turns it into `summary.md`, `results.json` and plots in
the run directory, and copies the summary to `loadtests/results/latest.md`.
`python -m loadtests.report RUN/results.json` re-renders a run (after a report change).
The arithmetic is in loadtests/stats.py.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .scenarios import load_result
from .scenarios.codec import CodecResult
from .scenarios.cold import ColdResult
from .scenarios.dashboard import DashboardResult, Refresh
from .scenarios.heavy import HeavyResult
from .scenarios.result import ScenarioResult
from .scenarios.sizes import SIZE_CLASSES, PanelSize
from .scenarios.tiny import TinyResult
from .scenarios.users import UsersResult
from .scenarios.workers import WorkersResult
from .stats import (
    count_ratio,
    hit_ratio,
    median,
    median_of_ratios,
    paired_differences,
    percentile,
    ratio_of_medians,
    summarize,
)

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


def _mismatch_lines(s: ScenarioResult) -> list[str]:
    t = s.tally
    retries = t.retries or {}
    out = [f"- answers compared: {t.compared:,}; mismatches: **{t.mismatches}**; "
           f"failed requests: promaccel {t.failures}, direct {t.direct_failures}"
           + (f"; resent on a stale keep-alive connection: promaccel {retries.get('promaccel', 0)}, "
              f"direct {retries.get('direct', 0)}" if any(retries.values()) else "")]
    for ex in t.mismatch_examples[:5]:
        out.append(f"  - `{ex}`")
    for ex in t.failure_examples[:5]:
        out.append(f"  - failure: `{ex}`")
    return out


def _render_cold(s: ColdResult) -> list[str]:
    direct = [r.direct_s for r in s.reps]
    prox = [r.promaccel_s for r in s.reps]
    out = [f"Query `{s.query}`, range {s.range}, step {s.step:g} s, {s.points_per_series} "
           f"points per series; answer {fmt_bytes(s.answer_bytes)} of JSON. Each repetition starts a fresh "
           "promaccel (and flushes Redis) so its cache is cold; Prometheus was warmed by one untimed query "
           "first, and the order of the two calls alternates.", ""]
    out += _table(_LATENCY_HEADER, [_latency_row("cold query", direct, prox, list(zip(direct, prox)))])
    out += ["", "| rep | first | direct ms | promaccel ms | ratio | pieces | backend calls | backend bytes | "
            "promaccel CPU s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(s.reps):
        out.append(f"| {i} | {r.first} | {fmt_ms(r.direct_s)} | {fmt_ms(r.promaccel_s)} | "
                   f"{fmt_ratio(r.promaccel_s / r.direct_s if r.direct_s else math.nan)} | "
                   f"{r.pieces or '–'} | {fmt_num(r.meters.backend_calls)} | {fmt_bytes(r.meters.backend_bytes)} | "
                   f"{fmt_num(r.meters.promaccel_cpu_s, 3)} |")
    return out


def _pieces(refresh: Refresh) -> float:
    values = [p for p in refresh.promaccel.pieces or [] if p is not None]
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


def _dashboard_dataset(s: DashboardResult) -> list[str]:
    which, info = s.dataset, s.dataset_info
    if not which or not info:
        return []
    if which == "long":
        return [f"Dataset: **the long dataset**, {dataset_line(info)} (`{info.get('data_dir')}`), served by its own "
                "Prometheus with its own promaccel: the main dataset is shorter than this window. Same end time and "
                "virtual now; a smaller fleet than the main dataset, so compare its ratios, not its milliseconds, "
                "with the other windows.", ""]
    return [f"Dataset: the main dataset, {dataset_line(info)}.", ""]


def _sum_counts(maps: Iterable[Mapping[str, float] | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in maps:
        for k, v in (m or {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _render_dashboard(s: DashboardResult) -> list[str]:
    if s.skipped:
        return []
    refreshes = s.refreshes
    out = _dashboard_dataset(s)
    out += [f"Window **{s.window}**, sliding {s.slide_s:g} s per refresh, {len(refreshes)} refreshes, "
            f"{s.panels if s.panels is not None else '?'} requests per refresh, 1 user, at most {s.concurrency} "
            "requests in flight. An untimed direct refresh warms Prometheus first; refresh 0 fills promaccel's "
            "cache (cold); the warm rows use refreshes 1..n.", ""]
    if not refreshes:
        return out
    rows = []
    for label, sel in (("refresh, cold (0)", refreshes[:1]), ("refresh, warm (1..n)", refreshes[1:])):
        d = [r.direct.wall_s for r in sel]
        p = [r.promaccel.wall_s for r in sel]
        rows.append(_latency_row(label, d, p, list(zip(d, p))))
    out += _table(_LATENCY_HEADER, rows)
    warm = refreshes[1:] or refreshes
    lookups = _sum_counts(r.promaccel.meters.cache for r in warm)
    cache_errors = _sum_counts(r.promaccel.meters.cache_errors for r in warm)
    out += [
        "",
        "Per warm refresh (medians):",
        "",
        "| | direct | promaccel |",
        "|---|---:|---:|",
        f"| requests reaching Prometheus | {fmt_num(median(r.direct.meters.backend_requests for r in warm))} | "
        f"{fmt_num(median(r.promaccel.meters.backend_requests for r in warm))} |",
        f"| promaccel backend calls (its /metrics) | – | "
        f"{fmt_num(median(_nan(r.promaccel.meters.backend_calls) for r in warm))} |",
        f"| pieces planned (sum of X-Promaccel-Pieces) | – | {fmt_num(median(_pieces(r) for r in warm))} |",
        f"| bytes Prometheus sent (on the wire: gzip if asked) | "
        f"{fmt_bytes(median(r.direct.meters.backend_bytes for r in warm))} | "
        f"{fmt_bytes(median(r.promaccel.meters.backend_bytes for r in warm))} |",
        f"| bytes the client received (decoded JSON) | {fmt_bytes(median(r.direct.bytes for r in warm))} | "
        f"{fmt_bytes(median(r.promaccel.bytes for r in warm))} |",
        f"| Prometheus CPU s | {fmt_num(median(r.direct.meters.prometheus_cpu_s for r in warm), 3)} | "
        f"{fmt_num(median(r.promaccel.meters.prometheus_cpu_s for r in warm), 3)} |",
        f"| promaccel CPU s | – | {fmt_num(median(_nan(r.promaccel.meters.promaccel_cpu_s) for r in warm), 3)} |",
        "",
        f"Cache lookups over warm refreshes: {dict(sorted(lookups.items())) or 'none exposed'}; hit ratio "
        f"{fmt_ratio(hit_ratio(lookups)).rstrip('x') if lookups else '–'}"
        + (f"; cache errors (bypassed) {dict(sorted(cache_errors.items()))}" if any(cache_errors.values()) else "")
        + ". promaccel peak RSS "
        f"{fmt_bytes(s.promaccel_peak_rss)}, CPU {fmt_num(s.promaccel_cpu_s, 2)} s over the refreshes.",
        "",
        "Per panel, warm refreshes (request latency, queueing behind the 6-request limit excluded):",
        "",
    ]
    prow = []
    for k in refreshes[0].direct.panels:
        dk = [r.direct.panels.get(k) for r in warm]
        pk = [r.promaccel.panels.get(k) for r in warm]
        pairs = [(a, b) for a, b in zip(dk, pk) if a is not None and b is not None]
        prow.append(_latency_row(k, [x for x in dk if x is not None], [x for x in pk if x is not None], pairs))
    out += _table(["panel", *_LATENCY_HEADER[1:]], prow)
    if s.sizes:
        out += ["", *size_lines(s.sizes)]
    return out


def _render_tiny(s: TinyResult) -> list[str]:
    out = [f"{s.requests_per_query} sequential requests per query and mode, interleaved pairwise "
           "(order alternating); instant queries move their evaluation time by 1 s per request so no two "
           "are identical. \"added\" is the median of the per-pair differences promaccel − direct.", ""]
    rows = []
    for q in s.queries:
        d, p = q.direct_s, q.promaccel_s
        diffs = paired_differences(zip(d, p))
        rows.append([f"`{q.query}`" + (" (range)" if q.range else ""), str(len(d)),
                     fmt_ms(median(d)), fmt_ms(percentile(d, 95)), fmt_ms(median(p)), fmt_ms(percentile(p, 95)),
                     fmt_ms(median(diffs)), fmt_ms(percentile(diffs, 95))])
    out += _table(["query", "n", "direct p50 ms", "p95", "promaccel p50 ms", "p95", "added p50 ms", "added p95 ms"], rows)
    if s.sizes:
        out += ["", *size_lines(s.sizes)]
    return out



def _mb_per_s(nbytes: float, seconds: float) -> str:
    if not nbytes or not seconds or math.isnan(nbytes) or math.isnan(seconds):
        return "–"
    return f"{nbytes / seconds / 1e6:,.1f}"


def size_lines(sizes: Sequence[PanelSize]) -> list[str]:
    """The warm answers by panel size, with and without gzip (issue 28 item 5): per size class,
    the median warm time and the decoded JSON bytes per second promaccel served; then per panel."""
    out = ["Warm answers by size: each panel asked again one request at a time, alternately with "
           "`Accept-Encoding: gzip` (as Grafana asks) and without; time to the last byte; MB/s = the answer's "
           "JSON bytes (decoded) per second of that time. Medians over the panels of a class (of each panel's "
           "median).", ""]
    by_class: dict[str, list[PanelSize]] = {}
    for z in sizes:
        by_class.setdefault(z.size_class, []).append(z)
    rows = []
    for _, label in SIZE_CLASSES:
        group = by_class.get(label)
        if not group:
            continue
        answer = median(z.answer_bytes for z in group)
        wire = median(z.gzip_bytes for z in group)
        gz = median(median(z.gzip_s) for z in group)
        plain = median(median(z.identity_s) for z in group)
        rows.append([label, str(len(group)), fmt_bytes(answer), fmt_bytes(wire), fmt_ms(gz), _mb_per_s(answer, gz),
                     fmt_ms(plain), _mb_per_s(answer, plain)])
    header = ["panel size", "panels", "answer (JSON)", "gzip on the wire", "gzip: warm ms p50", "MB/s",
              "no gzip: warm ms p50", "MB/s"]
    out += _table(header, rows)
    out += ["", "<details><summary>per panel</summary>", ""]
    prow = [[z.panel, str(len(z.gzip_s)), fmt_bytes(z.answer_bytes), fmt_bytes(z.gzip_bytes),
             fmt_ms(median(z.gzip_s)), _mb_per_s(z.answer_bytes, median(z.gzip_s)),
             fmt_ms(median(z.identity_s)), _mb_per_s(z.answer_bytes, median(z.identity_s))]
            for z in sorted(sizes, key=lambda z: z.answer_bytes)]
    out += _table(["panel", "n", *header[2:]], prow)
    out += ["", "</details>"]
    failed = sum(z.failures for z in sizes)
    differs = [z.panel for z in sizes if z.differs]
    if failed:
        out += ["", f"Failed requests while measuring sizes: {failed}."]
    if differs:
        out += ["", f"**The gzip and the identity answers differ** for {', '.join(differs[:5])}."]
    return out


def _render_users(s: UsersResult) -> list[str]:
    out = [f"{s.users} users refresh the dashboard (window {s.window}, slide {s.slide_s:g} s) at the same "
           f"virtual times, each with at most 6 requests in flight; a baseline of 1 user runs the same refreshes "
           "on its own fresh promaccel; its direct answers are the reference every user's promaccel answer is "
           "compared with. Backend calls come from promaccel's /metrics.", ""]
    single = s.single_calls
    rows = []
    calls_of = [_nan(r.promaccel.meters.backend_calls) for r in s.rounds]
    for i, r in enumerate(s.rounds):
        base = single[i] if i < len(single) else math.nan
        calls = calls_of[i]
        errs = sum((r.promaccel.meters.cache_errors or {}).values())
        d, p = r.direct.user_s, r.promaccel.user_s
        rows.append([str(i), fmt_num(base), fmt_num(calls) + (f" ({fmt_num(errs)} cache errors)" if errs else ""),
                     fmt_ratio(count_ratio(base, calls)),
                     fmt_ms(median(d)), fmt_ms(percentile(d, 95)), fmt_ms(median(p)), fmt_ms(percentile(p, 95)),
                     fmt_ms(r.direct.wall_s), fmt_ms(r.promaccel.wall_s),
                     f"{r.direct.failures} / {r.promaccel.failures}"])
    out += _table(["round", "1-user backend calls", f"{s.users}-user backend calls", "ratio",
                   "direct user refresh p50 ms", "p95", "promaccel p50 ms", "p95", "direct round ms",
                   "promaccel round ms", "failed direct / promaccel"], rows)
    pairs = [(single[i], calls_of[i]) for i in range(len(s.rounds)) if i < len(single)]
    total = count_ratio(sum(b for b, _ in pairs), sum(c for _, c in pairs)) if pairs else math.nan
    out += ["", f"Backend calls, {s.users} users vs 1 user over the same refreshes: **{fmt_ratio(total)}** "
            f"(target ≤ 1.1x); median of the per-round ratios {fmt_ratio(median(count_ratio(b, c) for b, c in pairs))}. "
            f"promaccel peak RSS {fmt_bytes(s.promaccel_peak_rss)}."]
    return out


def _render_heavy(s: HeavyResult) -> list[str]:
    base, peak, largest = s.base_rss, s.peak_rss, s.largest_answer
    out = [f"{len(s.queries)} distinct heavy range queries (range {s.range}, step {s.step:g} s) sent at once "
           "through a fresh promaccel (cold cache); the reference answers come from Prometheus one query at a "
           f"time. RSS is sampled every {s.sample_ms} ms over promaccel's process tree.", ""]
    target = base + 2 * largest if not math.isnan(base) and not math.isnan(largest) else math.nan
    out += [
        "| | value |", "|---|---:|",
        f"| promaccel RSS before | {fmt_bytes(base)} |",
        f"| promaccel peak RSS | {fmt_bytes(peak)} |",
        f"| peak − before | {fmt_bytes(peak - base)} ({(peak - base) / largest:.1f} × the largest answer) |",
        f"| largest single answer (JSON) | {fmt_bytes(largest)} |",
        f"| sum of all answers (JSON) | {fmt_bytes(s.total_answer_bytes)} |",
        f"| target: before + 2 × largest | {fmt_bytes(target)} ({'met' if peak <= target else 'NOT met'}) |",
        f"| promaccel, all at once: wall ms | {fmt_ms(s.promaccel_wall_s)} |",
        f"| direct, one at a time: total ms | {fmt_ms(s.direct_sequential_s)} |",
    ]
    if s.direct_wall_s is not None:
        out.append(f"| direct, all at once: wall ms (failed) | {fmt_ms(s.direct_wall_s)} "
                   f"({s.direct_at_once_failures or 0}) |")
    out += [f"| failed: promaccel / direct reference | {s.failures} / {s.direct_failures} |", ""]
    rows = [[f"`{x.query}`", fmt_ms(x.direct_s), fmt_ms(x.promaccel_s), fmt_bytes(x.bytes), str(x.status_promaccel)]
            for x in s.queries]
    out += _table(["query", "direct alone ms", "promaccel (all at once) ms", "answer", "promaccel status"], rows)
    return out


def workers_summary(s: WorkersResult) -> dict[str, dict[str, float]]:
    """Per layout (`LayoutRun.label`): median wall of the warm rounds (all but round 0), round
    0's wall, backend requests in round 0 and in the warm rounds, CPU and peak RSS."""
    out: dict[str, dict[str, float]] = {}
    for run in s.runs:
        rounds = run.rounds
        warm = rounds[1:]
        out[run.label] = {
            "cold_wall_s": rounds[0].wall_s if rounds else math.nan,
            "warm_wall_s": median(r.wall_s for r in warm) if warm else math.nan,
            "warm_user_p50_s": median(x for r in warm for x in r.user_s) if warm else math.nan,
            "cold_backend_requests": rounds[0].backend_requests if rounds else math.nan,
            "warm_backend_requests": sum(r.backend_requests for r in warm) if warm else math.nan,
            "warm_cpu_s": median(r.promaccel_cpu_s for r in warm) if warm else math.nan,
            "peak_rss": run.peak_rss,
            "failures": sum(r.failures for r in rounds),
        }
    return out


def _render_workers(s: WorkersResult) -> list[str]:
    out = [f"{s.users} users refresh the dashboard (window {s.window}, slide {s.slide_s:g} s; round 0 cold, "
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


def _render_codec(s: CodecResult) -> list[str]:
    if not s.ran:
        return [s.note or "not run"]
    return [f"`{s.command}` (exit {s.returncode}, {s.elapsed_s:.1f} s):", "", "```", s.output.rstrip(), "```"]


_TITLES = {
    "cold": "(a) Cold heavy range query",
    "dashboard": "(b) Warm dashboard refresh",
    "tiny": "(c) Tiny queries: the proxy's own overhead",
    "users": "(d) Concurrent users on one dashboard",
    "heavy": "(e) Concurrent heavy queries: promaccel's peak RSS",
    "codec": "(f) Codec throughput",
    "workers": "(g) Worker processes sharing one Redis",
}


def _render(s: ScenarioResult) -> list[str]:
    if isinstance(s, ColdResult):
        return _render_cold(s)
    if isinstance(s, DashboardResult):
        return _render_dashboard(s)
    if isinstance(s, TinyResult):
        return _render_tiny(s)
    if isinstance(s, UsersResult):
        return _render_users(s)
    if isinstance(s, HeavyResult):
        return _render_heavy(s)
    if isinstance(s, WorkersResult):
        return _render_workers(s)
    if isinstance(s, CodecResult):
        return _render_codec(s)
    return []


def _heading(s: ScenarioResult) -> str:
    title = _TITLES.get(s.name, s.name)
    if isinstance(s, DashboardResult):
        title += f" — {s.window}" + (" (long dataset)" if s.dataset == "long" else "")
    return f"## {title}"


def render_markdown(results: Mapping[str, Any]) -> str:
    """The summary of a run; its scenarios are typed results (or their results.json dicts)."""
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
    scen = [load_result(s) for s in results.get("scenarios", [])]
    lines += [f"**Answers compared with direct Prometheus: {sum(s.compared for s in scen):,}; mismatches: "
              f"{sum(s.mismatches for s in scen)}; failed requests through promaccel: {sum(s.failures for s in scen)} "
              f"(direct: {sum(s.direct_failures for s in scen)}).**", ""]
    for note in results.get("notes", []):
        lines.append(f"> {note}")
    if results.get("notes"):
        lines.append("")
    for s in scen:
        lines += [_heading(s), ""]
        try:
            lines += _render(s)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:  # never lose the rest
            lines.append(f"(could not render: {exc!r})")
        lines.append("")
        if s.compares:
            lines += _mismatch_lines(s)
        plog = s.promaccel_log
        if plog.warnings or plog.errors:
            lines.append(f"- promaccel logged {plog.warnings} warnings and {plog.errors} errors "
                         "during this scenario, e.g.:")
            lines += [f"  - `{e}`" for e in plog.examples[:3]]
        for note in s.notes:
            lines.append(f"- note: {note}")
        for img in s.plots:
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


def _plot(plt: Any, s: ScenarioResult) -> tuple[Any, Any, str] | None:
    """The figure, axes and file name of a scenario's plot, or None when it has nothing to draw."""
    if isinstance(s, DashboardResult) and s.refreshes:
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = [r.index for r in s.refreshes]
        ax.plot(xs, [r.direct.wall_s * 1000 for r in s.refreshes], "o-", label="direct")
        ax.plot(xs, [r.promaccel.wall_s * 1000 for r in s.refreshes], "s-", label="promaccel")
        ax.set_xlabel(f"refresh (window slides {s.slide_s:g} s each)")
        ax.set_ylabel("dashboard refresh ms")
        ax.set_title(f"Dashboard refresh latency, {s.window} window")
        return fig, ax, f"dashboard-{s.window}.png"
    if isinstance(s, ColdResult) and s.reps:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = list(range(len(s.reps)))
        ax.bar([x - 0.2 for x in xs], [r.direct_s * 1000 for r in s.reps], 0.4, label="direct")
        ax.bar([x + 0.2 for x in xs], [r.promaccel_s * 1000 for r in s.reps], 0.4, label="promaccel")
        ax.set_xlabel("repetition (fresh promaccel each)")
        ax.set_ylabel("ms")
        ax.set_title("Cold heavy range query")
        return fig, ax, "cold.png"
    if isinstance(s, TinyResult) and s.queries:
        fig, ax = plt.subplots(figsize=(8, 4))
        for q in s.queries:
            (line,) = ax.plot([x * 1000 for x in q.direct_s], ".", alpha=0.5, label=f"direct {q.query[:30]}")
            ax.plot([x * 1000 for x in q.promaccel_s], "x", alpha=0.5, color=line.get_color(),
                    label=f"promaccel {q.query[:30]}")
        ax.set_yscale("log")
        ax.set_xlabel("request")
        ax.set_ylabel("ms (log)")
        ax.set_title("Tiny queries")
        return fig, ax, "tiny.png"
    if isinstance(s, UsersResult) and s.rounds:
        fig, ax = plt.subplots(figsize=(8, 4))
        for i, r in enumerate(s.rounds):
            ax.plot([i - 0.1] * len(r.direct.user_s), [x * 1000 for x in r.direct.user_s], ".",
                    color="C0", alpha=0.4, label="direct" if i == 0 else None)
            ax.plot([i + 0.1] * len(r.promaccel.user_s), [x * 1000 for x in r.promaccel.user_s], ".",
                    color="C1", alpha=0.4, label="promaccel" if i == 0 else None)
        ax.set_xlabel("round")
        ax.set_ylabel("user's dashboard refresh ms")
        ax.set_title(f"{s.users} concurrent users")
        return fig, ax, "users.png"
    if isinstance(s, HeavyResult) and s.rss_samples:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot([t for t, _ in s.rss_samples], [v / 2**20 for _, v in s.rss_samples], label="promaccel RSS")
        if s.largest_answer and s.base_rss and not math.isnan(s.largest_answer + s.base_rss):
            ax.axhline((s.base_rss + 2 * s.largest_answer) / 2**20, color="red", linestyle="--",
                       label="target: before + 2 × largest answer")
        ax.set_xlabel("s")
        ax.set_ylabel("MiB")
        ax.set_title(f"{len(s.queries)} concurrent heavy queries")
        return fig, ax, "heavy-rss.png"
    return None


def make_plots(results: dict[str, Any], out_dir: Path) -> None:
    """Adds the plot files (in out_dir) to each scenario's `plots` that has something to draw."""
    try:
        plt = _pyplot()
    except ImportError:
        results.setdefault("notes", []).append("matplotlib is not installed: no plots (pip install -e '.[bench]')")
        return
    for s in results.get("scenarios", []):
        drawn = _plot(plt, s)
        if drawn is None:
            continue
        fig, ax, fname = drawn
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=100)
        plt.close(fig)
        s.plots.append(fname)


def write_report(results: dict[str, Any], out_dir: Path, latest: Path | None = None) -> Path:
    """summary.md, results.json and the plots in out_dir; summary copied to `latest` with its
    image links pointing into the run directory. The scenarios become typed results."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    results["scenarios"] = [load_result(s) for s in results.get("scenarios", [])]
    make_plots(results, out_dir)
    as_json = {**results, "scenarios": [s.to_json() for s in results["scenarios"]]}
    (out_dir / "results.json").write_text(json.dumps(as_json, indent=1, default=str))
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
