"""proxy/result/overlap.py: the migration-overlap merge (preference, union, gap filling, edges)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec.json_encode import encode_prometheus_json
from proxy.result import QueryResult
from proxy.result.merge import MergeConflict, concat
from proxy.result.overlap import merge_overlap

S = 60_000  # step
T0 = 1_793_480_400_000
A = {"__name__": "x", "instance": "a"}
B = {"__name__": "x", "instance": "b"}
C = {"__name__": "x", "instance": "c"}


def grid(a: int, b: int) -> list[int]:
    """Steps a..b (inclusive) of the grid T0 + k*S."""
    return [T0 + k * S for k in range(a, b + 1)]


def m(*series: tuple[dict[str, str], list[int], list[float]], warnings: tuple[str, ...] = ()) -> QueryResult:
    return QueryResult.from_series("matrix", list(series), warnings=warnings)


def as_dict(r: QueryResult) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    return {tuple(sorted(d.items())): list(zip(t, v)) for d, t, v in r.to_pylist()}


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_identical_answers_dedupe() -> None:
    ts = grid(0, 9)
    vals = [float(i) for i in range(10)]
    one = m((A, ts, vals), (B, ts, [v * 2 for v in vals]))
    two = m((B, ts, [v * 2 for v in vals]), (A, ts, vals))
    out = merge_overlap([one, two], edge_ms=300_000)
    assert out.to_pylist() == one.to_pylist()
    assert encode_prometheus_json(out) == encode_prometheus_json(one)


def test_preference_where_both_have_a_value() -> None:
    ts = grid(0, 4)
    primary = m((A, ts, [1.0] * 5))
    other = m((A, ts, [2.0] * 5))
    assert merge_overlap([primary, other], edge_ms=0).to_pylist() == [(A, ts, [1.0] * 5)]
    assert merge_overlap([other, primary], edge_ms=0).to_pylist() == [(A, ts, [2.0] * 5)]


def test_gap_is_filled_and_edges_replaced_on_both_sides() -> None:
    # primary misses steps 10..19 (an outage); its values within edge of the gap are stale.
    ts = grid(0, 39)
    truth = [float(i) for i in range(40)]
    primary_ts = [t for i, t in enumerate(ts) if not 10 <= i <= 19]
    primary_v = [-1.0 if 5 <= i <= 9 or 20 <= i <= 24 else float(i) for i in range(40) if not 10 <= i <= 19]
    edge = 4 * S  # values at steps 5..9 (>= step 9 - 4) and 20..24 (<= step 20 + 4) are suspect
    out = merge_overlap([m((A, primary_ts, primary_v)), m((A, ts, [v + 1000 for v in truth]))], edge_ms=edge)
    ((labels, t, v),) = out.to_pylist()
    assert labels == A and t == ts
    want = [truth[i] + 1000 if 5 <= i <= 24 else truth[i] for i in range(40)]
    assert v == want


def test_edge_zone_is_exact() -> None:
    ts = grid(0, 30)
    p_ts = [t for i, t in enumerate(ts) if i != 15]
    out = merge_overlap([m((A, p_ts, [1.0] * 30)), m((A, ts, [2.0] * 31))], edge_ms=3 * S)
    v = out.to_pylist()[0][2]
    # last present step before the gap: 14, so 11..14 are replaced; first after: 16, so 16..19
    assert [i for i, x in enumerate(v) if x == 2.0] == [11, 12, 13, 14, 15, 16, 17, 18, 19]
    out0 = merge_overlap([m((A, p_ts, [1.0] * 30)), m((A, ts, [2.0] * 31))], edge_ms=0)
    assert [i for i, x in enumerate(out0.to_pylist()[0][2]) if x == 2.0] == [14, 15, 16]


def test_tainted_everywhere_keeps_preferred_value() -> None:
    # both backends have gaps next to step 10; where both are tainted the primary wins.
    ts = grid(0, 20)
    p_ts = [t for i, t in enumerate(ts) if i != 8]
    o_ts = [t for i, t in enumerate(ts) if i != 12]
    out = merge_overlap([m((A, p_ts, [1.0] * 20)), m((A, o_ts, [2.0] * 20))], edge_ms=2 * S)
    v = out.to_pylist()[0][2]
    # primary tainted at 5..7 and 9..11, other at 9..11 and 13..15
    expect = [1.0] * 21
    for i in (5, 6, 7, 8):  # 9..11: both tainted, the primary stands
        expect[i] = 2.0
    assert v == expect


def test_leading_and_trailing_gaps_count() -> None:
    ts = grid(0, 19)
    primary = m((A, ts[5:15], [1.0] * 10))
    other = m((A, ts, [2.0] * 20))
    v = merge_overlap([primary, other], edge_ms=2 * S).to_pylist()[0][2]
    # leading gap 0..4: replaced up to 5+2; trailing gap 15..19: replaced from 14-2
    assert v == [2.0] * 8 + [1.0] * 4 + [2.0] * 8


def test_backend_outage_drops_its_stale_extra_points() -> None:
    # `x > 60`: the primary's stale values near its outage (steps 5..) pass the filter where
    # the complete data does not; the other backend, clear of any outage, knows better.
    ts = grid(0, 9)
    primary = m((A, ts[:5], [1.0] * 5))  # answered nothing at all from step 5 on
    other = m((A, ts[:3], [2.0] * 3), (B, ts, [3.0] * 10))
    out = merge_overlap([primary, other], edge_ms=2 * S)
    assert out.to_pylist() == [(A, ts[:3], [1.0, 1.0, 2.0]), (B, ts, [3.0] * 10)]


def test_sparse_answer_of_the_complete_backend_is_believed() -> None:
    # `x > 80 or ...`: the other backend's outage starts at step 6; its stale points at 4, 5
    # pass the filter. The primary answered nothing at 4, 5 (nothing passes there): that is
    # not an outage of the primary, because the only evidence is the suspect backend's.
    ts = grid(0, 9)
    primary = m((A, ts[:4] + ts[6:], [1.0] * 8))
    other = m((A, ts[:4], [1.0] * 4), (B, ts[4:6], [5.0, 5.0]))
    out = merge_overlap([primary, other], edge_ms=S)
    assert out.to_pylist() == [(A, ts[:4] + ts[6:], [1.0] * 8)]
    # the same with the preference the other way round
    out2 = merge_overlap([other, primary], edge_ms=S)
    assert out2.to_pylist() == [(A, ts[:4] + ts[6:], [1.0] * 8)]


def test_backend_outage_taints_series_without_a_gap_of_their_own() -> None:
    # A ended at step 6 in both, but the primary lost A's last samples in its outage (7..12):
    # A has no gap of its own, the backend has one.
    ts = grid(0, 12)
    primary = m((A, ts[:7], [1.0] * 7))
    other = m((A, ts[:7], [2.0] * 7), (C, ts, [3.0] * 13))
    out = merge_overlap([primary, other], edge_ms=2 * S)
    assert out.to_pylist() == [(A, ts[:7], [1.0] * 4 + [2.0] * 3), (C, ts, [3.0] * 13)]
    # both in an outage zone at a step: nothing is dropped, the primary stands
    p2 = m((A, ts[:7], [1.0] * 7))
    o2 = m((A, ts[4:], [2.0] * 9))
    v = merge_overlap([p2, o2], edge_ms=2 * S).to_pylist()[0][2]
    # primary zone: 4..6 (p = 6), other zone: 4..6 (q = 4): both untrusted there
    assert v == [1.0] * 7 + [2.0] * 6


def test_series_only_in_one_backend() -> None:
    ts = grid(0, 9)
    primary = m((A, ts, [1.0] * 10))
    other = m((B, ts, [2.0] * 10), (C, ts[:3], [3.0] * 3))
    out = merge_overlap([primary, other], edge_ms=10 * S)
    assert out.to_pylist() == [(A, ts, [1.0] * 10), (B, ts, [2.0] * 10), (C, ts[:3], [3.0] * 3)]


def test_nan_is_a_value() -> None:
    ts = grid(0, 4)
    primary = m((A, ts, [1.0, math.nan, 3.0, math.nan, 5.0]))
    other = m((A, ts, [9.0] * 5))
    v = merge_overlap([primary, other], edge_ms=S).to_pylist()[0][2]
    assert all(same(a, b) for a, b in zip(v, [1.0, math.nan, 3.0, math.nan, 5.0]))
    # and a NaN in the other backend fills a gap (and replaces the step next to it)
    v2 = merge_overlap([m((A, ts[:2], [1.0, 1.0])), m((A, ts, [math.nan] * 5))], edge_ms=0).to_pylist()[0][2]
    assert v2[0] == 1.0 and all(math.isnan(x) for x in v2[1:])


def test_instant_vectors_preference_and_union() -> None:
    t = T0
    p = QueryResult.from_series("vector", [(B, [t], [1.0]), (A, [t], [math.inf])])
    o = QueryResult.from_series("vector", [(A, [t], [5.0]), (C, [t], [7.0])], warnings=["w2"])
    out = merge_overlap([p, o], edge_ms=300_000)
    assert out.result_type == "vector"
    assert out.to_pylist() == [(A, [t], [math.inf]), (B, [t], [1.0]), (C, [t], [7.0])]
    assert out.warnings == ["w2"]


def test_scalar_and_string_take_the_preferred() -> None:
    out = merge_overlap([QueryResult.scalar(T0, 1.0, warnings=["a"]), QueryResult.scalar(T0, 2.0, warnings=["b"])],
                        edge_ms=0)
    assert out.result_type == "scalar" and out.value.tolist() == [1.0] and out.warnings == ["a", "b"]
    s = merge_overlap([QueryResult.string(T0, "x"), QueryResult.string(T0, "y")], edge_ms=0)
    assert s.string_value == "x"


def test_warnings_union_in_order() -> None:
    ts = grid(0, 1)
    out = merge_overlap([m((A, ts, [1.0, 1.0]), warnings=("w1", "w2")), m((A, ts, [1.0, 1.0]), warnings=("w2", "w3"))],
                        edge_ms=0)
    assert out.warnings == ["w1", "w2", "w3"]


def test_empty_and_mixed_types() -> None:
    assert merge_overlap([QueryResult.empty(), QueryResult.empty()], edge_ms=0).n_series == 0
    one = m((A, grid(0, 0), [1.0]))
    out = merge_overlap([QueryResult.empty(), one], edge_ms=0)
    assert out.to_pylist() == one.to_pylist()
    with pytest.raises(MergeConflict):
        merge_overlap([one, QueryResult.from_series("vector", [(A, [T0], [1.0])])], edge_ms=0)
    with pytest.raises(MergeConflict):
        merge_overlap([], edge_ms=0)


def test_output_order_matches_concat() -> None:
    labels = [{"__name__": "x", "a": s} for s in ("b", "a", "ab", "B", "", "a\\b", "ü")] + [{"a": "z"}, {}]
    ts = grid(0, 2)
    p = m(*[(d, ts, [1.0] * 3) for d in labels[::2]])
    o = m(*[(d, ts, [2.0] * 3) for d in labels[1::2]])
    out = merge_overlap([p, o], edge_ms=0)
    ref = concat([p, o])
    assert [d for d, _, _ in out.to_pylist()] == [d for d, _, _ in ref.to_pylist()]
    assert encode_prometheus_json(out) == encode_prometheus_json(ref)


def test_a_big_answer_is_merged_whole() -> None:
    """4,000 series x 240 steps, each backend with a gap the other fills (its speed is the
    bench's to show, not a test's)."""
    n_series, n_steps = 4000, 240
    ts = np.asarray(grid(0, n_steps - 1), dtype=np.int64)
    labels = [{"__name__": "x", "i": str(i)} for i in range(n_series)]

    def build(drop: slice) -> QueryResult:
        keep = np.ones(n_steps, dtype=bool)
        keep[drop] = False
        t = np.tile(ts[keep], n_series)
        v = np.arange(len(t), dtype=np.float64)
        offsets = np.arange(n_series + 1, dtype=np.int64) * int(keep.sum())
        return QueryResult("matrix", labels, offsets, t, v)

    p, o = build(slice(40, 80)), build(slice(150, 190))
    out = merge_overlap([p, o], edge_ms=10 * S)
    assert out.n_series == n_series and out.n_samples == n_series * n_steps
    assert np.array_equal(out.t_ms, np.tile(ts, n_series))


# --- property: the numpy merge equals a per-sample Python oracle ---------------------------


def _taint(have: set[int], steps: list[int], t: int, edge_ms: int, gaps: set[int] | None = None) -> bool:
    """t (present in `have`) lies within edge of a gap (default: a step not in `have`),
    measured from the present steps next to the gap."""
    gaps = set(steps) - have if gaps is None else gaps
    i = steps.index(t)
    j = next((j for j in range(i, len(steps)) if steps[j] in gaps), None)
    if j is not None:
        p = max(k for k in range(j) if steps[k] in have)
        if t >= steps[p] - edge_ms:
            return True
    k = next((k for k in range(i, -1, -1) if steps[k] in gaps), None)
    if k is not None:
        q = min(j for j in range(k, len(steps)) if steps[j] in have)
        if t <= steps[q] + edge_ms:
            return True
    return False


def oracle(answers: list[QueryResult], edge_ms: int) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    """The module docstring's rules, one sample at a time."""
    per = [as_dict(r) for r in answers]
    nb = len(per)
    has = [{t for rows in p.values() for t, _ in rows} for p in per]
    all_steps = sorted(set().union(*has))
    clear = [set(all_steps) for _ in range(nb)]
    for _ in range(4):
        new = []
        for b in range(nb):
            silent = {t for t in all_steps if t not in has[b]
                      and any(t in has[c] and t in clear[c] for c in range(nb) if c != b)}
            near = {t for t in has[b] if _taint(has[b], all_steps, t, edge_ms, silent)}
            new.append(set(all_steps) - silent - near)
        if new == clear:
            break
        clear = new
    out: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for key in sorted(set().union(*per)):
        series = [dict(p.get(key, [])) for p in per]
        steps = sorted(set().union(*series))
        rows = []
        for t in steps:
            holders = [b for b in range(nb) if t in series[b]]
            if any(t in c for c in clear):
                holders = [b for b in holders if t in clear[b]]
            if not holders:
                continue
            clean = [b for b in holders if not _taint(set(series[b]), steps, t, edge_ms)]
            b = (clean or holders)[0]
            rows.append((t, series[b][t]))
        if rows:
            out[key] = rows
    return out


@st.composite
def overlap_case(draw: st.DrawFn) -> tuple[list[QueryResult], int]:
    n_backends = draw(st.integers(1, 3))
    n_steps = draw(st.integers(1, 25))
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=4, unique=True))
    values = st.one_of(st.integers(0, 3).map(float), st.just(math.nan), st.just(math.inf))
    answers = []
    for b in range(n_backends):
        series = []
        for name in names:
            if not draw(st.booleans()) and b:
                continue
            mask = draw(st.lists(st.booleans(), min_size=n_steps, max_size=n_steps))
            ts = [T0 + k * S for k in range(n_steps) if mask[k]]
            if not ts:
                continue
            vs = [draw(values) for _ in ts]
            series.append(({"__name__": "x", "n": name}, ts, vs))
        answers.append(QueryResult.from_series("matrix", series, warnings=[f"w{b}"]))
    edge = draw(st.integers(0, 6)) * S // draw(st.sampled_from([1, 2]))
    return answers, edge


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overlap_case())
def test_matches_oracle(case: tuple[list[QueryResult], int]) -> None:
    answers, edge = case
    out = merge_overlap(answers, edge_ms=edge)
    got = as_dict(out)
    want = oracle(answers, edge)
    assert got.keys() == want.keys()
    for k in want:
        assert [t for t, _ in got[k]] == [t for t, _ in want[k]]
        assert all(same(a, b) for (_, a), (_, b) in zip(got[k], want[k])), (k, got[k], want[k])
    keys = [tuple(sorted(d.items())) for d in out.labels]
    assert keys == sorted(keys)
    assert all(np.all(np.diff(out.t_ms[out.offsets[i]:out.offsets[i + 1]]) > 0) for i in range(out.n_series))
    assert out.warnings == [f"w{b}" for b in range(len(answers))]


@st.composite
def outage_case(draw: st.DrawFn) -> tuple[list[list[float]], list[QueryResult], int]:
    """A truth per series; each backend misses one run of steps (an outage) and reports
    garbage within `edge` of it (stale data); outages far enough apart."""
    n_steps = draw(st.integers(30, 80))
    edge_steps = draw(st.integers(0, 4))
    n_series = draw(st.integers(1, 3))
    truth = [[float(draw(st.integers(0, 9))) for _ in range(n_steps)] for _ in range(n_series)]
    zone = edge_steps + 1  # the taint zone reaches one step past edge, measured from p/q
    # outage of backend 0, then of backend 1, with clean ground between their zones
    l0 = draw(st.integers(1, 6))
    s0 = draw(st.integers(0, n_steps - 1))
    s1 = draw(st.integers(0, n_steps - 1))
    l1 = draw(st.integers(1, 6))
    gaps = [(s0, min(n_steps - 1, s0 + l0 - 1)), (s1, min(n_steps - 1, s1 + l1 - 1))]
    (a0, b0), (a1, b1) = gaps
    if not (b0 + zone < a1 - zone or b1 + zone < a0 - zone):
        s1 = b0 + 2 * zone + 1 + draw(st.integers(0, 5))
        gaps[1] = (s1, s1 + l1 - 1)
        if gaps[1][1] >= n_steps:
            gaps[1] = (0, -1)  # no outage for backend 1
    answers = []
    for b, (ga, gb) in enumerate(gaps):
        series = []
        for i, tv in enumerate(truth):
            ts, vs = [], []
            for k in range(n_steps):
                if ga <= k <= gb:
                    continue
                near = ga - zone <= k < ga or gb < k <= gb + zone
                ts.append(T0 + k * S)
                vs.append(tv[k] + 100.0 * (b + 1) if near and gb >= ga else tv[k])
            series.append(({"__name__": "x", "i": str(i)}, ts, vs))
        answers.append(QueryResult.from_series("matrix", series))
    return truth, answers, edge_steps * S


@settings(max_examples=200, deadline=None)
@given(outage_case())
def test_outages_far_apart_give_the_truth(case: tuple[list[list[float]], list[QueryResult], int]) -> None:
    truth, answers, edge = case
    for ordering in (answers, answers[::-1]):
        out = merge_overlap(ordering, edge_ms=edge)
        assert out.n_series == len(truth)
        for i, (_, t, v) in enumerate(out.to_pylist()):
            assert t == grid(0, len(truth[i]) - 1)
            assert v == truth[i]
