"""Comparing Prometheus answers, shared by the bench and the equivalence tests: exact for
pass-through, tolerant (1e-9 relative) where sums are reordered.

- `diff_answers`: two parsed answers; errors by errorType *and* text (promaccel relays the
  backend's error); instant vectors whose outermost call is topk/bottomk/sort/sort_desc by
  value order (`order=instant_order(query)`).
- `answer_kind` / `Expect` / `check_reference`: what a case expects of the reference answer
  (data, empty, or a given error), so that a case meant to compare data cannot silently
  compare two empty answers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

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


Kind = Literal["data", "empty", "error"]


def answer_kind(answer: dict[str, Any]) -> Kind:
    """"error" (status error), "empty" (a vector or matrix with no series) or "data"."""
    if answer.get("status") != "success":
        return "error"
    data = answer.get("data") or {}
    if data.get("resultType") in ("vector", "matrix") and not data.get("result"):
        return "empty"
    return "data"


@dataclass(frozen=True)
class Expect:
    """What a case's reference (direct Prometheus) answer must be: data, empty, or an error
    of `error_type` whose text contains `error_text`."""

    kind: Kind = "data"
    error_type: str | None = None
    error_text: str | None = None
    also: tuple[Kind, ...] = ()  # other kinds accepted in some windows (said where declared)


DATA = Expect("data")
EMPTY = Expect("empty")


def error(error_type: str, text: str) -> Expect:
    return Expect("error", error_type, text)


def check_reference(direct: dict[str, Any], expect: Expect) -> list[str]:
    """Problems with the reference answer itself: a case that expects data fails when
    Prometheus answers empty or an error (it would compare nothing)."""
    kind = answer_kind(direct)
    if kind != expect.kind and kind not in expect.also:
        why = f": {direct.get('errorType')}: {str(direct.get('error'))[:200]}" if kind == "error" else ""
        return [f"the reference answer is {kind}{why}, the case expects {expect.kind}"]
    if kind == "error":
        if expect.error_type is not None and direct.get("errorType") != expect.error_type:
            return [f"reference errorType {direct.get('errorType')} != expected {expect.error_type}"]
        if expect.error_text is not None and expect.error_text not in str(direct.get("error")):
            return [f"reference error {direct.get('error')!r} lacks {expect.error_text!r}"]
    return []


@dataclass(frozen=True)
class Order:
    """Prometheus's order of an instant vector whose outermost call is sort/sort_desc (one
    group) or topk/bottomk (per group of `grouping`, or of all labels but `grouping` and the
    name with `without`): within a group, values in Prometheus's order; series of equal
    value may be permuted, the order of the groups themselves is not compared."""

    grouping: tuple[str, ...] = ()
    without: bool = False

    def group(self, metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
        if self.without:
            drop = {*self.grouping, "__name__"}
            return tuple(sorted((k, v) for k, v in metric.items() if k not in drop))
        return tuple((k, metric.get(k, "")) for k in self.grouping)


def instant_order(query: str) -> Order | None:
    """The value order an instant answer to `query` has in Prometheus, or None (unordered)."""
    from shardplanner.ast import Agg, Call, Paren
    from shardplanner.promql import CannotParse, parse

    try:
        expr: Any = parse(query)
    except (CannotParse, ValueError):
        return None
    while isinstance(expr, Paren):
        expr = expr.expr
    if isinstance(expr, Call) and expr.func in ("sort", "sort_desc"):
        return Order()
    if isinstance(expr, Agg) and expr.op in ("topk", "bottomk"):
        return Order(tuple(expr.grouping or ()), expr.without)
    return None


def _order_problems(dres: list[dict[str, Any]], pres: list[dict[str, Any]], order: Order,
                    rel: float) -> list[str]:
    def by_group(res: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], list[str]]:
        out: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for s in res:
            out.setdefault(order.group(s["metric"]), []).append(s["value"][1])
        return out

    dg, pg = by_group(dres), by_group(pres)
    for g in sorted(dg.keys() & pg.keys()):
        dv, pv = dg[g], pg[g]
        if len(dv) != len(pv) or not all(values_close(a, b, rel) for a, b in zip(dv, pv)):
            return [f"value order differs in group {dict(g)}: {dv[:6]} != {pv[:6]}"]
    return []


def diff_answers(direct: dict[str, Any], proxied: dict[str, Any], *, ordered: bool = False,
                 order: Order | None = None, rel: float = REL_TOL) -> list[str]:
    """Differences between two parsed answers (empty list: equivalent). `ordered`: the
    series in exactly the same order; `order`: the values of an instant vector in
    Prometheus's order (see Order)."""
    problems: list[str] = []
    if direct.get("status") != proxied.get("status"):
        return [f"status {direct.get('status')} != {proxied.get('status')}: {proxied.get('error')}"]
    if direct.get("status") != "success":
        if direct.get("errorType") != proxied.get("errorType"):
            problems.append(f"errorType {direct.get('errorType')} != {proxied.get('errorType')}")
        if direct.get("error") != proxied.get("error"):
            problems.append(f"error {direct.get('error')!r} != {proxied.get('error')!r}")
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
    if order is not None and rt == "vector":
        problems += _order_problems(dres, pres, order, rel)
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
