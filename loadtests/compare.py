"""Comparing Prometheus answers, shared by the bench and the equivalence tests: exact for
pass-through, tolerant (1e-9 relative) where sums are reordered."""

from __future__ import annotations

import math
from typing import Any

REL_TOL = 1e-9


def _num(s: str) -> float:
    return float(s.replace("+Inf", "inf").replace("-Inf", "-inf"))


def values_close(a: str, b: str, rel: float = REL_TOL) -> bool:
    if a == b:
        return True
    fa, fb = _num(a), _num(b)
    if math.isnan(fa) and math.isnan(fb):
        return True
    if math.isinf(fa) or math.isinf(fb):
        return fa == fb
    return math.isclose(fa, fb, rel_tol=rel, abs_tol=1e-12)


def _key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(metric.items()))


def diff_answers(direct: dict[str, Any], proxied: dict[str, Any], *, ordered: bool = False,
                 rel: float = REL_TOL) -> list[str]:
    """Differences between two parsed answers (empty list: equivalent)."""
    problems: list[str] = []
    if direct.get("status") != proxied.get("status"):
        return [f"status {direct.get('status')} != {proxied.get('status')}: {proxied.get('error')}"]
    if direct.get("status") != "success":
        if direct.get("errorType") != proxied.get("errorType"):
            problems.append(f"errorType {direct.get('errorType')} != {proxied.get('errorType')}")
        return problems
    d, p = direct["data"], proxied["data"]
    if d["resultType"] != p["resultType"]:
        return [f"resultType {d['resultType']} != {p['resultType']}"]
    rt = d["resultType"]
    if rt in ("scalar", "string"):
        if d["result"][0] != p["result"][0] or not values_close(str(d["result"][1]), str(p["result"][1]), rel):
            problems.append(f"{rt} {d['result']} != {p['result']}")
        return problems
    dres, pres = d["result"], p["result"]
    if ordered and [_key(s["metric"]) for s in dres] != [_key(s["metric"]) for s in pres]:
        problems.append("series order differs")
    dmap = {_key(s["metric"]): s for s in dres}
    pmap = {_key(s["metric"]): s for s in pres}
    if len(dmap) != len(dres) or len(pmap) != len(pres):
        problems.append("duplicate series in an answer")
    missing = dmap.keys() - pmap.keys()
    extra = pmap.keys() - dmap.keys()
    if missing:
        problems.append(f"{len(missing)} series missing, e.g. {sorted(missing)[0]}")
    if extra:
        problems.append(f"{len(extra)} extra series, e.g. {sorted(extra)[0]}")
    for k in sorted(dmap.keys() & pmap.keys()):
        if rt == "vector":
            dv, pv = dmap[k]["value"], pmap[k]["value"]
            if dv[0] != pv[0] or not values_close(dv[1], pv[1], rel):
                problems.append(f"{k}: {dv} != {pv}")
        else:
            dvals, pvals = dmap[k]["values"], pmap[k]["values"]
            if [t for t, _ in dvals] != [t for t, _ in pvals]:
                dts = {t for t, _ in dvals}
                pts = {t for t, _ in pvals}
                problems.append(
                    f"{k}: timestamps differ ({len(dvals)} vs {len(pvals)} points; "
                    f"missing {sorted(dts - pts)[:3]}, extra {sorted(pts - dts)[:3]})"
                )
                continue
            for (t, dv), (_, pv) in zip(dvals, pvals):
                if not values_close(dv, pv, rel):
                    problems.append(f"{k} @ {t}: {dv} != {pv}")
                    break
        if len(problems) > 10:
            break
    return problems
