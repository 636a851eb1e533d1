"""proxy.result.merge against straightforward per-timestamp reference implementations.

The reference evaluates the *unsplit* query the way Prometheus 2.42's aggregation() does
(series in label order, one dict per timestamp); the shard pieces are the same reference run
on each shard's series. The merged answer must equal the unsplit one.
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec.json_encode import encode_prometheus_json
from proxy.result import QueryResult
from proxy.result import merge as merge_mod
from proxy.result.merge import MergeConflict, aggregate, concat, merge
from shardplanner.plan import MergeRecipe

Series = tuple[dict[str, str], dict[int, float]]  # labels, {t_ms: value}


def key(d: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(d.items()))


def to_qr(rtype: str, series: list[Series]) -> QueryResult:
    rows = [(d, sorted(pts), [pts[t] for t in sorted(pts)]) for d, pts in series if pts]
    return QueryResult.from_series(rtype, rows)  # type: ignore[arg-type]


def from_qr(r: QueryResult) -> dict[Any, dict[int, float]]:
    out: dict[Any, dict[int, float]] = {}
    for d, ts, vs in r.to_pylist():
        assert key(d) not in out, "a series appears twice"
        assert ts == sorted(set(ts)), "samples not strictly increasing"
        out[key(d)] = dict(zip(ts, vs))
    return out


def same_value(a: float, b: float, rel: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return math.copysign(1, a) == math.copysign(1, b) if a == 0 and rel == 0 else True
    return rel > 0 and math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def assert_same(got: QueryResult, want: dict[Any, dict[int, float]], rel: float = 0.0) -> None:
    g = from_qr(got)
    assert set(g) == set(want)
    for k, pts in want.items():
        assert set(g[k]) == set(pts), k
        for t, v in pts.items():
            assert same_value(g[k][t], v, rel), (k, t, g[k][t], v)
    if got.result_type == "matrix":
        assert [key(d) for d in got.labels] == sorted(key(d) for d in got.labels)


# --------------------------------------------------------------------------------------
# Reference aggregation (Prometheus 2.42, promql/engine.go aggregation())
# --------------------------------------------------------------------------------------


def group_labels(d: dict[str, str], grouping: tuple[str, ...], without: bool) -> dict[str, str]:
    if without:
        return {k: v for k, v in d.items() if k not in grouping and k != "__name__"}
    return {k: d[k] for k in grouping if k in d}


def ref_aggregate(
    series: list[Series], op: str, grouping: tuple[str, ...] = (), without: bool = False, k: float = 0
) -> list[Series]:
    series = sorted(series, key=lambda s: key(s[0]))  # a selector's output order
    times = sorted({t for _, pts in series for t in pts})
    out: dict[Any, tuple[dict[str, str], dict[int, float]]] = {}
    for t in times:
        groups: dict[Any, list[tuple[dict[str, str], float]]] = {}
        for d, pts in series:
            if t in pts:
                gl = group_labels(d, grouping, without)
                groups.setdefault(key(gl), []).append((d, pts[t]))
        for gk, members in groups.items():
            vals = [v for _, v in members]
            if op in ("topk", "bottomk"):
                if int(k) < 1:
                    continue
                sign = -1 if op == "topk" else 1
                ranked = sorted(members, key=lambda m: (math.isnan(m[1]), sign * m[1] if not math.isnan(m[1]) else 0, key(m[0])))
                for d, v in ranked[: int(k)]:
                    out.setdefault(key(d), (d, {}))[1][t] = v
                continue
            if op == "sum":
                acc = vals[0]
                for v in vals[1:]:
                    acc += v
            elif op == "count":
                acc = float(len(vals))
            elif op == "group":
                acc = 1.0
            elif op == "min":
                acc = vals[0]
                for v in vals[1:]:
                    if acc > v or math.isnan(acc):
                        acc = v
            elif op == "max":
                acc = vals[0]
                for v in vals[1:]:
                    if acc < v or math.isnan(acc):
                        acc = v
            elif op == "avg":  # 2.42's incremental mean
                mean, n = vals[0], 1
                for v in vals[1:]:
                    n += 1
                    if math.isinf(mean):
                        if math.isinf(v) and (mean > 0) == (v > 0):
                            continue
                        if not math.isinf(v) and not math.isnan(v):
                            continue
                    mean += v / n - mean / n
                acc = mean
            else:
                raise AssertionError(op)
            gl = dict(gk)
            out.setdefault(gk, (gl, {}))[1][t] = acc
    return list(out.values())


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------

VALUES = [0.0, 1.0, 2.5, -3.0, 7.0, 100.0, 0.5, -0.5, math.nan, math.inf, -math.inf]


def make_series(rng: random.Random, n_series: int, n_steps: int, special: bool = True, step: int = 15_000) -> list[Series]:
    out = []
    seen = set()
    for _ in range(n_series):
        d = {
            "__name__": rng.choice(["gpu_util", "gpu_temp"]),
            "Hostname": f"node-{rng.randrange(6)}",
            "gpu": str(rng.randrange(4)),
        }
        if rng.random() < 0.3:
            d["namespace"] = rng.choice(["a", "b", "Z"])
        if key(d) in seen:
            continue
        seen.add(key(d))
        start = rng.randrange(n_steps)
        end = rng.randrange(start, n_steps) + 1
        pts = {}
        for i in range(start, end):
            if rng.random() < 0.15:
                continue  # gaps
            v = rng.choice(VALUES) if special and rng.random() < 0.2 else float(rng.randrange(-50, 50)) / 2
            pts[1_700_000_000_000 + i * step] = v
        if pts:
            out.append((d, pts))
    return out


def shard(series: list[Series], n: int) -> list[list[Series]]:
    hosts = sorted({d["Hostname"] for d, _ in series})
    parts: list[list[Series]] = [[] for _ in range(n)]
    for d, pts in series:
        parts[hosts.index(d["Hostname"]) % n].append((d, pts))
    return parts


def instant(series: list[Series], t: int) -> list[Series]:
    return [(d, {t: pts[t]}) for d, pts in series if t in pts]


OPS = ["sum", "count", "min", "max", "group", "avg", "topk", "bottomk"]
GROUPINGS = [((), False), (("Hostname",), False), (("gpu", "namespace"), False), (("gpu",), True), (("__name__",), False)]


def shard_pieces(parts: list[list[Series]], rtype: str, op: str, grouping: tuple[str, ...], without: bool, k: float) -> list[tuple[str | None, QueryResult]]:
    pieces: list[tuple[str | None, QueryResult]] = []
    for part in parts:
        if op == "avg":
            pieces.append(("sum", to_qr(rtype, ref_aggregate(part, "sum", grouping, without))))
            pieces.append(("count", to_qr(rtype, ref_aggregate(part, "count", grouping, without))))
        else:
            pieces.append((None, to_qr(rtype, ref_aggregate(part, op, grouping, without, k))))
    return pieces


# --------------------------------------------------------------------------------------
# aggregate
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("grouping,without", GROUPINGS)
@pytest.mark.parametrize("n_shards", [1, 2, 3, 8])
def test_aggregate_matches_unsplit_range(op: str, grouping: tuple[str, ...], without: bool, n_shards: int) -> None:
    rng = random.Random(zlib.crc32(repr((op, grouping, without, n_shards)).encode()))
    series = make_series(rng, 40, 30, special=op not in ("topk", "bottomk"))
    k = 3.0
    recipe = MergeRecipe(kind="aggregate", op=op, grouping=grouping, without=without, param=k)  # type: ignore[arg-type]
    pieces = shard_pieces(shard(series, n_shards), "matrix", op, grouping, without, k)
    got = aggregate(pieces, recipe)
    assert got.result_type == "matrix"
    want = {key(d): pts for d, pts in ref_aggregate(series, op, grouping, without, k) if pts}
    assert_same(got, want, rel=1e-12 if op == "avg" else 0.0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("grouping,without", GROUPINGS[:3])
def test_aggregate_matches_unsplit_instant(op: str, grouping: tuple[str, ...], without: bool) -> None:
    rng = random.Random(7)
    t = 1_700_000_000_000 + 10 * 15_000
    series = instant(make_series(rng, 60, 20), t)
    recipe = MergeRecipe(kind="aggregate", op=op, grouping=grouping, without=without, param=2.0)  # type: ignore[arg-type]
    pieces = shard_pieces(shard(series, 4), "vector", op, grouping, without, 2.0)
    got = aggregate(pieces, recipe)
    assert got.result_type == "vector"
    want = {key(d): pts for d, pts in ref_aggregate(series, op, grouping, without, 2.0) if pts}
    assert_same(got, want, rel=1e-12 if op == "avg" else 0.0)
    if op in ("topk", "bottomk"):
        # Prometheus's order inside a group: best first, NaN last.
        vals = got.value.tolist()
        groups = [key(group_labels(d, grouping, without)) for d in got.labels]
        for a in range(len(vals) - 1):
            if groups[a] == groups[a + 1] and not math.isnan(vals[a + 1]):
                assert not math.isnan(vals[a])
                assert vals[a] >= vals[a + 1] if op == "topk" else vals[a] <= vals[a + 1]
    else:
        assert [key(d) for d in got.labels] == sorted(key(d) for d in got.labels)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(OPS), st.sampled_from(GROUPINGS), st.integers(1, 6), st.integers(0, 4))
def test_aggregate_property(seed: int, op: str, gw: Any, n_shards: int, k: int) -> None:
    rng = random.Random(seed)
    grouping, without = gw
    series = make_series(rng, rng.randrange(0, 25), rng.randrange(1, 12))
    recipe = MergeRecipe(kind="aggregate", op=op, grouping=grouping, without=without, param=float(k))  # type: ignore[arg-type]
    pieces = shard_pieces(shard(series, n_shards), "matrix", op, grouping, without, float(k))
    got = aggregate(pieces, recipe)
    want = {key(d): pts for d, pts in ref_aggregate(series, op, grouping, without, float(k)) if pts}
    assert_same(got, want, rel=1e-12 if op == "avg" else 0.0)


def test_sum_of_real_floats_is_close_and_deterministic() -> None:
    rng = np.random.default_rng(5)
    series = [({"Hostname": f"n{i}", "gpu": str(i % 4)}, {1000 * t: float(rng.normal() * 1e3) for t in range(50)}) for i in range(64)]
    recipe = MergeRecipe(kind="aggregate", op="sum", grouping=("gpu",))
    pieces = shard_pieces(shard(series, 8), "matrix", "sum", ("gpu",), False, 0)
    a = aggregate(pieces, recipe)
    b = aggregate(pieces, recipe)
    assert encode_prometheus_json(a) == encode_prometheus_json(b)
    want = {key(d): pts for d, pts in ref_aggregate(series, "sum", ("gpu",))}
    scale = {kk: {t: sum(abs(p[t]) for d, p in series if key({"gpu": d["gpu"]}) == kk) for t in pts} for kk, pts in want.items()}
    got = from_qr(a)
    for kk, pts in want.items():
        for t, v in pts.items():
            assert abs(got[kk][t] - v) <= 1e-12 * scale[kk][t]


def test_dense_and_compact_cells_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(11)
    series = make_series(rng, 40, 25)
    for op in ("sum", "min", "avg", "count"):
        recipe = MergeRecipe(kind="aggregate", op=op, grouping=("gpu",), without=True)  # type: ignore[arg-type]
        pieces = shard_pieces(shard(series, 3), "matrix", op, ("gpu",), True, 0)
        dense = encode_prometheus_json(aggregate(pieces, recipe))
        monkeypatch.setattr(merge_mod, "DENSE_CELLS_LIMIT", 0)
        compact = encode_prometheus_json(aggregate(pieces, recipe))
        monkeypatch.undo()
        assert dense == compact


def test_irregular_timestamps() -> None:
    # Timestamps off any common grid (instant pieces, odd steps) still line up exactly.
    a = to_qr("matrix", [({"g": "1", "h": "a"}, {1: 1.0, 7: 2.0, 10**12: 3.0})])
    b = to_qr("matrix", [({"g": "1", "h": "b"}, {7: 5.0, 10**12 + 3: 4.0})])
    got = aggregate([(None, a), (None, b)], MergeRecipe(kind="aggregate", op="sum", grouping=("g",)))
    assert got.to_pylist() == [({"g": "1"}, [1, 7, 10**12, 10**12 + 3], [1.0, 7.0, 3.0, 4.0])]


def test_topk_edge_params() -> None:
    a = to_qr("matrix", [({"h": "a"}, {1000: 1.0}), ({"h": "b"}, {1000: 2.0})])
    for param in (0.0, -1.0, 0.5, math.nan, None):
        r = aggregate([(None, a)], MergeRecipe(kind="aggregate", op="topk", param=param))
        assert r.n_series == 0 and r.result_type == "matrix"
    r = aggregate([(None, a)], MergeRecipe(kind="aggregate", op="topk", param=1.9))
    assert r.to_pylist() == [({"h": "b"}, [1000], [2.0])]
    r = aggregate([(None, a)], MergeRecipe(kind="aggregate", op="bottomk", param=10))
    assert [d["h"] for d in r.labels] == ["a", "b"]


def prometheus_topk(series: list[tuple[dict[str, str], float]], op: str, k: int) -> list[tuple[dict[str, str], float]]:
    """Prometheus 2.42's instant topk/bottomk of one group (promql/engine.go aggregation()),
    Go's container/heap included: the first sample seeds the heap, the next k-1 are pushed,
    each later one replaces the root when strictly better (a non-NaN beats a NaN root), and
    the answer is the heap sorted in reverse (sort.Sort: equal values in no promised order).
    `series` in Prometheus's input order (a selector's: by label set)."""
    def less(a: float, b: float) -> bool:  # vectorByValueHeap / vectorByReverseValueHeap.Less
        if math.isnan(a):
            return True
        return a < b if op == "topk" else a > b

    h: list[tuple[dict[str, str], float]] = []

    def up(j: int) -> None:
        while True:
            i = (j - 1) // 2
            if j <= 0 or not less(h[j][1], h[i][1]):
                break
            h[i], h[j] = h[j], h[i]
            j = i

    def down(i0: int) -> bool:
        i = i0
        while True:
            j1 = 2 * i + 1
            if j1 >= len(h):
                break
            j = j1
            if j1 + 1 < len(h) and less(h[j1 + 1][1], h[j1][1]):
                j = j1 + 1
            if not less(h[j][1], h[i][1]):
                break
            h[i], h[j] = h[j], h[i]
            i = j
        return i > i0

    k = min(k, len(series))
    if k < 1:
        return []
    for n, (labels, v) in enumerate(series):
        if n == 0:
            h.append((labels, v))
        elif len(h) < k:
            h.append((labels, v))
            up(len(h) - 1)
        else:
            root = h[0][1]
            better = root < v if op == "topk" else root > v
            if better or (math.isnan(root) and not math.isnan(v)):
                h[0] = (labels, v)
                if k > 1 and not down(0):
                    up(0)
    return sorted(h, key=lambda s: (math.isnan(s[1]), -s[1] if op == "topk" else s[1]))


def test_prometheus_topk_port_matches_known_answers() -> None:
    # Prometheus 2.42: topk(2) of a=1, b=1, c=2, d=2 in label order is c, d (the root, a,
    # is replaced by c, then the new root b by d); with a tie at the cut, the first come stay.
    s = [({"h": "a"}, 1.0), ({"h": "b"}, 1.0), ({"h": "c"}, 2.0), ({"h": "d"}, 2.0)]
    assert {d["h"] for d, _ in prometheus_topk(s, "topk", 2)} == {"c", "d"}
    assert {d["h"] for d, _ in prometheus_topk(s, "bottomk", 2)} == {"a", "b"}
    # NaN last for both; a NaN in the heap is the first to go
    assert math.isnan(prometheus_topk([({"h": "x"}, math.nan), *s], "topk", 5)[-1][1])
    assert math.isnan(prometheus_topk([({"h": "x"}, math.nan), *s], "bottomk", 5)[-1][1])
    assert {d["h"] for d, _ in prometheus_topk([({"h": "x"}, math.nan), *s], "topk", 4)} == {"a", "b", "c", "d"}


def _value_order(rows: list[tuple[dict[str, str], float]]) -> list[float]:
    return [(-1.0 if math.isnan(v) else v) for _, v in rows]


@pytest.mark.parametrize("op", ["topk", "bottomk"])
def test_topk_merge_is_prometheus_topk_unless_a_tie_forces_the_rerun(op: str) -> None:
    """Sharded topk/bottomk pieces merged: where no tie crosses the k-th place (ties.py), the
    same series as Prometheus's heap picks over the whole input, in its value order (equal
    values in any order); where one does, topk_ambiguous says so and the pipeline reruns the
    query unsharded (tests/api/test_http_edges.py checks that through HTTP). Merging is
    deterministic: any piece order gives the same answer."""
    from proxy.result.ties import topk_ambiguous

    rng = random.Random(18)
    ambiguous = exact = 0
    for case in range(400):
        n, k, shards = rng.randint(1, 12), rng.randint(1, 5), rng.randint(1, 4)
        pool = [0.0, 1.0, 2.0, math.nan] if case % 2 else [rng.uniform(0, 100) for _ in range(4)] + [math.nan]
        series = [({"h": f"n{i:02d}"}, rng.choice(pool) if rng.random() < 0.7 else rng.uniform(0, 100))
                  for i in range(n)]
        shard_of = [rng.randrange(shards) for _ in series]
        # each shard answers Prometheus's topk over its own series (the sharded query)
        pieces = []
        for sh in range(shards):
            mine = [s for s, o in zip(series, shard_of) if o == sh]
            if mine:
                pieces.append((sh, to_qr("vector", [(d, {0: v}) for d, v in prometheus_topk(mine, op, k)])))
        recipe = MergeRecipe(kind="aggregate", op=op, param=k)
        merged = aggregate([(None, qr) for _, qr in pieces], recipe)
        again = aggregate([(None, qr) for _, qr in pieces[::-1]], recipe)
        assert repr(merged.to_pylist()) == repr(again.to_pylist()), case
        if topk_ambiguous(pieces, recipe):
            ambiguous += 1
            continue
        exact += 1
        want = prometheus_topk(series, op, k)
        got = [(d, vs[0]) for d, _, vs in merged.to_pylist()]
        assert sorted(key(d) for d, _ in got) == sorted(key(d) for d, _ in want), (case, series, k)
        assert _value_order(got) == _value_order(want), (case, got, want)
    assert ambiguous >= 50 and exact >= 150, (ambiguous, exact)


def test_topk_tie_at_the_cut_is_ambiguous() -> None:
    # all four equal: which two Prometheus keeps depends on its heap over the whole input
    pieces = [
        (0, to_qr("vector", [({"h": "c"}, {0: 1.0}), ({"h": "a"}, {0: 1.0})])),
        (1, to_qr("vector", [({"h": "b"}, {0: 1.0}), ({"h": "d"}, {0: math.nan})])),
    ]
    from proxy.result.ties import topk_ambiguous

    assert topk_ambiguous(pieces, MergeRecipe(kind="aggregate", op="topk", param=2))
    # bottomk 4 of 4: no cut, so no tie crosses it; Prometheus's order: 1, 1, 1, NaN
    recipe = MergeRecipe(kind="aggregate", op="bottomk", param=4)
    assert not topk_ambiguous(pieces, recipe)
    r = aggregate([(None, qr) for _, qr in pieces], recipe)
    assert sorted(d["h"] for d in r.labels) == ["a", "b", "c", "d"] and r.labels[-1]["h"] == "d"


def test_topk_range_series_only_where_they_won() -> None:
    a = to_qr("matrix", [({"h": "a"}, {1: 5.0, 2: 1.0}), ({"h": "b"}, {1: 1.0, 2: 5.0})])
    r = aggregate([(None, a)], MergeRecipe(kind="aggregate", op="topk", param=1))
    assert r.to_pylist() == [({"h": "a"}, [1], [5.0]), ({"h": "b"}, [2], [5.0])]


def test_avg_needs_both_halves() -> None:
    s = to_qr("matrix", [({"g": "1"}, {1: 10.0, 2: 4.0})])
    c = to_qr("matrix", [({"g": "1"}, {1: 4.0})])
    r = aggregate([("sum", s), ("count", c)], MergeRecipe(kind="aggregate", op="avg", grouping=("g",)))
    assert r.to_pylist() == [({"g": "1"}, [1], [2.5])]
    with pytest.raises(MergeConflict):
        aggregate([(None, s)], MergeRecipe(kind="aggregate", op="avg"))


def test_combine_time() -> None:
    t = 1_700_000_000_000
    p1 = to_qr("vector", [({"h": "a"}, {t - 86_400_000: 3.0}), ({"h": "b"}, {t - 86_400_000: math.nan})])
    p2 = to_qr("vector", [({"h": "a"}, {t: 2.0}), ({"h": "b"}, {t: 1.0})])
    recipe = MergeRecipe(kind="aggregate", op="max", without=True, combine_time=True)
    r = aggregate([(None, p1), (None, p2)], recipe, time_ms=t)
    assert r.to_pylist() == [({"h": "a"}, [t], [3.0]), ({"h": "b"}, [t], [1.0])]
    with pytest.raises(MergeConflict):
        aggregate([(None, p1)], recipe)


def test_combine_time_sums_and_counts() -> None:
    # Sub-window answers of `sum by (ns) (sum_over_time(x[3h]))` at t, evaluated at t-2h,
    # t-1h and t: one series per group and sub-window, summed in piece order at t.
    t = 1_700_000_000_000
    h = 3_600_000
    pieces = [
        to_qr("vector", [({"ns": "a"}, {t - 2 * h: 1.5}), ({"ns": "b"}, {t - 2 * h: 2.0})]),
        to_qr("vector", [({"ns": "a"}, {t - h: 0.25})]),  # b has no samples in this one
        to_qr("vector", [({"ns": "a"}, {t: 4.0}), ({"ns": "b"}, {t: math.inf}), ({"ns": "c"}, {t: math.nan})]),
    ]
    recipe = MergeRecipe(kind="aggregate", op="sum", grouping=("ns",), combine_time=True)
    r = merge([(None, x) for x in pieces], recipe, time_ms=t)
    got = r.to_pylist()
    assert [(d, ts) for d, ts, _ in got] == [({"ns": "a"}, [t]), ({"ns": "b"}, [t]), ({"ns": "c"}, [t])]
    assert got[0][2] == [5.75] and got[1][2] == [math.inf] and math.isnan(got[2][2][0])
    assert encode_prometheus_json(r) == encode_prometheus_json(merge([(None, x) for x in pieces], recipe, time_ms=t))
    # Bare count_over_time (op "sum", without ()): series by their full label set, sum of counts.
    bare = MergeRecipe(kind="aggregate", op="sum", without=True, combine_time=True)
    c1 = to_qr("vector", [({"Hostname": "a", "gpu": "0"}, {t - h: 120.0}), ({"Hostname": "a", "gpu": "1"}, {t - h: 3.0})])
    c2 = to_qr("vector", [({"Hostname": "a", "gpu": "0"}, {t: 119.0})])
    assert merge([(None, c1), (None, c2)], bare, time_ms=t).to_pylist() == [
        ({"Hostname": "a", "gpu": "0"}, [t], [239.0]),
        ({"Hostname": "a", "gpu": "1"}, [t], [3.0]),
    ]
    # Only instant vectors are combined across time.
    m = to_qr("matrix", [({"ns": "a"}, {t: 1.0})])
    with pytest.raises(MergeConflict):
        merge([(None, m)], recipe, time_ms=t)


def test_warnings_are_merged() -> None:
    a = to_qr("vector", [({"h": "a"}, {1: 1.0})])
    a.warnings = ["w1", "w2"]
    b = to_qr("vector", [({"h": "b"}, {1: 1.0})])
    b.warnings, b.infos = ["w2", "w3"], ["i"]
    for r in (concat([a, b]), aggregate([(None, a), (None, b)], MergeRecipe(kind="aggregate", op="sum"))):
        assert r.warnings == ["w1", "w2", "w3"] and r.infos == ["i"]


def test_mixed_result_types_refused() -> None:
    with pytest.raises(MergeConflict):
        concat([to_qr("vector", []), to_qr("matrix", [])])


# --------------------------------------------------------------------------------------
# concat
# --------------------------------------------------------------------------------------


def split_time(series: list[Series], cuts: list[int]) -> list[list[Series]]:
    bounds = [-(10**18), *sorted(cuts), 10**18]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        out.append([(d, {t: v for t, v in pts.items() if lo <= t < hi}) for d, pts in series])
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 4))
def test_concat_reassembles_time_and_series_pieces(seed: int, n_time: int, n_shards: int) -> None:
    rng = random.Random(seed)
    series = make_series(rng, rng.randrange(0, 30), 40)
    cuts = [1_700_000_000_000 + rng.randrange(40) * 15_000 for _ in range(n_time - 1)]
    pieces = [to_qr("matrix", part) for tp in split_time(series, cuts) for part in shard(tp, n_shards)]
    rng.shuffle(pieces)
    got = concat(pieces)
    assert_same(got, {key(d): pts for d, pts in series})
    assert encode_prometheus_json(got) == encode_prometheus_json(concat(pieces))
    assert encode_prometheus_json(got) == encode_prometheus_json(merge([(None, p) for p in pieces], MergeRecipe(kind="concat")))


def test_concat_vectors_sorted() -> None:
    a = to_qr("vector", [({"h": "b"}, {5: 1.0})])
    b = to_qr("vector", [({"h": "a"}, {5: 2.0}), ({"h": "c"}, {5: 3.0})])
    assert [d["h"] for d in concat([a, b]).labels] == ["a", "b", "c"]


def test_concat_duplicate_sample_is_a_conflict() -> None:
    a = to_qr("matrix", [({"h": "a"}, {1: 1.0, 2: 2.0, 3: 3.0})])
    b = to_qr("matrix", [({"h": "a"}, {3: 30.0, 4: 4.0})])
    with pytest.raises(MergeConflict) as exc:
        concat([a, b])
    assert exc.value.kind == "internal"
    r = concat([b, a], keep_first=True)
    assert r.to_pylist() == [({"h": "a"}, [1, 2, 3, 4], [1.0, 2.0, 30.0, 4.0])]


def test_concat_interleaved_pieces_are_sorted() -> None:
    a = to_qr("matrix", [({"h": "a"}, {1: 1.0, 5: 5.0})])
    b = to_qr("matrix", [({"h": "a"}, {3: 3.0, 7: 7.0})])
    assert concat([a, b]).to_pylist() == [({"h": "a"}, [1, 3, 5, 7], [1.0, 3.0, 5.0, 7.0])]


def test_concat_label_order_is_labels_compare() -> None:
    sets = [{"a": "x"}, {"a": "y"}, {"b": "x"}, {"a": "x", "b": "y"}, {"Z": "1"}, {"__name__": "m", "a": "x"}, {}]
    pieces = [to_qr("matrix", [(d, {1: float(i)})]) for i, d in enumerate(sets)]
    got = [d for d in concat(pieces[::-1]).labels]
    assert got == [{}, {"Z": "1"}, {"__name__": "m", "a": "x"}, {"a": "x"}, {"a": "x", "b": "y"}, {"a": "y"}, {"b": "x"}]


def test_passthrough_and_scalars() -> None:
    s = QueryResult.scalar(1000, 1.5)
    assert merge([(None, s)], MergeRecipe(kind="passthrough")) is s
    assert concat([s]) is s
    with pytest.raises(MergeConflict):
        concat([s, s])
    with pytest.raises(MergeConflict):
        merge([(None, s), (None, s)], MergeRecipe(kind="passthrough"))


# Label text that stresses the bytewise sort key: bytes below '"' (space, '!', control
# characters that JSON escapes), quotes, backslashes, NUL, prefixes of one another.
_order_text = st.text(alphabet=st.sampled_from([" ", "!", '"', "#", "\\", "\x00", "\x01", "a", "b", "é", "<"]),
                      max_size=4)
_order_sets = st.dictionaries(st.sampled_from(["a", "ab", "b", "Z", "__name__", "a_"]), _order_text, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(_order_sets, max_size=12, unique_by=key), st.booleans(), st.sampled_from([1, 3, 2048]),
       st.sampled_from(["as drawn", "in order", "in order but one"]))
def test_label_order_matches_labels_compare(sets: list[dict[str, str]], plain_only: bool, chunk: int,
                                            arrival: str) -> None:
    if plain_only:  # nothing JSON escapes: the compiled sort-key path on its own
        sets = [{k: v.replace("\\", "/").replace('"', "'") for k, v in d.items()
                 if not any(c in v for c in "\x00\x01<")} for d in sets]
        sets = list({key(d): d for d in sets}.values())
    if arrival != "as drawn":  # in order: checked chunk by chunk, no key kept
        sets = sorted(sets, key=key)
        if arrival == "in order but one" and len(sets) > 1:
            sets.append(sets.pop(0))
    r = QueryResult.from_series("matrix", [(d, [1], [1.0]) for d in sets])
    from unittest import mock

    from proxy.result import concat as concat_mod

    with mock.patch.object(concat_mod, "SORT_KEY_CHUNK", chunk):  # keys made a chunk at a time
        order = merge_mod.order_by_labels(r.canonical_keys())
    assert [key(r.labels[i]) for i in order] == sorted(key(d) for d in sets)


def test_concat_pieces_sharing_their_key_list() -> None:
    # Time pieces of one series list (same keys object, or equal keys): one key map.
    sets = [{"h": f"n{i}", "m": "x y"} for i in range(5)]
    a = to_qr("matrix", [(d, {1: 1.0}) for d in sets])
    b = to_qr("matrix", [(d, {2: 2.0}) for d in sets])
    b.set_canonical_keys(list(a.canonical_keys()))
    c = to_qr("matrix", [(d, {3: 3.0}) for d in sets[1:]])
    got = concat([a, b, c]).to_pylist()
    assert got == [(d, [1, 2, 3] if i else [1, 2], [1.0, 2.0, 3.0] if i else [1.0, 2.0]) for i, d in enumerate(sets)]


def test_concat_series_repeated_inside_a_piece() -> None:
    a = QueryResult.from_series("matrix", [({"h": "b"}, [1], [1.0]), ({"h": "a"}, [1], [2.0]), ({"h": "b"}, [2], [3.0])])
    b = to_qr("matrix", [({"h": "c"}, {1: 4.0})])
    got = concat([a, b]).to_pylist()
    assert got == [({"h": "a"}, [1], [2.0]), ({"h": "b"}, [1, 2], [1.0, 3.0]), ({"h": "c"}, [1], [4.0])]
