"""One comparison for every equivalence suite: the reference answer is what the case
expects (tests/corpus.py EXPECT: data unless said otherwise), the HTTP status codes are
equal, the answers are equal (errors by type and text, instant topk/bottomk/sort by value
order), and each comparison is tallied by what the reference answered, for the report that
`pytest_terminal_summary` (tests/conftest.py) prints at the end of a run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from loadtests.compare import DATA, REL_TOL, Expect, answer_kind, check_reference, diff_answers, instant_order
from tests.corpus import EXPECT

# (suite, kind of the reference answer) -> comparisons; (suite, "violation") -> cases whose
# reference answer was not what they expect (each of them also failed its test);
# ("hybrid", "known_limit_422") -> the documented 422s of tests/e2e/test_hybrid.py KNOWN_LIMITS.
TALLY: Counter[tuple[str, str]] = Counter()


def expected(name: str, path: str) -> Expect:
    e = EXPECT.get(name, DATA)
    return e if isinstance(e, Expect) else e["instant" if path.endswith("/query") else "range"]


def compare_case(suite: str, name: str, query: str, path: str, direct_status: int, direct: dict[str, Any],
                 proxied_status: int, proxied: dict[str, Any], *, expect: Expect | None = None,
                 rel: float = REL_TOL, ordered: bool = False) -> list[str]:
    """Problems comparing promaccel's answer with Prometheus's for one case (empty: equal)."""
    problems = check_reference(direct, expect or expected(name, path))
    TALLY[(suite, answer_kind(direct))] += 1
    if problems:
        TALLY[(suite, "violation")] += 1
    if direct_status != proxied_status:
        problems.append(f"HTTP status {direct_status} != {proxied_status}")
    order = instant_order(query) if path.endswith("/query") else None
    problems += diff_answers(direct, proxied, ordered=ordered, order=order, rel=rel)
    return problems


def response_problems(direct: Any, proxied: Any) -> list[str]:
    """Two HTTP answers (httpx responses) to the same query: their status codes, then their
    JSON answers compared (empty: equal)."""
    if direct.status_code != proxied.status_code:
        return [f"HTTP {direct.status_code} != {proxied.status_code}: {proxied.text[:300]}"]
    return diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content))


def report(tally: Counter[tuple[str, str]]) -> list[str]:
    """The lines of the equivalence report: per suite, comparisons by kind of reference answer."""
    suites = sorted({s for s, _ in tally})
    if not suites:
        return []
    cols = ("data", "empty", "error", "violation", "known_limit_422")
    lines = [f"{'suite':<26} {'data':>6} {'empty':>6} {'error':>6} {'violations':>10} {'known 422':>10}"]
    total = Counter[str]()
    for (_, k), n in tally.items():
        total[k] += n
    for name, get in [*((s, lambda k, s=s: tally[(s, k)]) for s in suites), ("total", lambda k: total[k])]:
        data, empty, err, bad, limit = (get(k) for k in cols)
        lines.append(f"{name:<26} {data:>6} {empty:>6} {err:>6} {bad:>10} {limit:>10}")
    return lines


def metadata_problems(params: Any, direct: dict[str, Any], proxied: dict[str, Any],
                      full: dict[str, list[dict[str, str]]]) -> list[str]:
    """/api/v1/metadata through promaccel against Prometheus. Prometheus picks *which* metrics
    fill a `limit` (and which entries a `limit_per_metric`) in Go map order, so with a limit
    the counts must agree and every entry must be one of Prometheus's full answer (`full`);
    without, the answers are equal. Both must hold metadata: an empty answer compares nothing."""
    p = dict(params) if not isinstance(params, dict) else params
    d_data, p_data = direct["data"], proxied["data"]
    if not d_data:
        return ["the reference metadata is empty"]
    if "limit" not in p and "limit_per_metric" not in p:
        return [] if d_data == p_data else [f"metadata differs: {sorted(set(d_data) ^ set(p_data))[:5]}"]
    problems = []
    if len(p_data) != len(d_data):
        problems.append(f"{len(p_data)} metrics != {len(d_data)}")
    per_metric = int(p.get("limit_per_metric", 0)) or None
    for name, entries in p_data.items():
        if name not in full or any(e not in full[name] for e in entries):
            problems.append(f"{name}: {entries} not in Prometheus's metadata")
        elif len(entries) != len(full[name][:per_metric]):
            problems.append(f"{name}: {len(entries)} entries, Prometheus {len(full[name][:per_metric])}")
    return problems
