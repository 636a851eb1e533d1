"""concat(lazy=True): a large merged matrix left in its pieces (`Concatenation`) is the same
answer as the gathered one: the same bytes streamed window by window, the same samples when
read, and eager wherever pieces overlap in time."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec import json_encode
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.result import QueryResult
from proxy.result import concat as concat_mod
from proxy.result.concat import Concatenation, MergeConflict, concat
from proxy.result.merge import merge
from proxy.result.pieces import split_time
from shardplanner.plan import MergeRecipe

T0 = 1_700_000_000_000
STEP = 15_000


def fleet(rng: random.Random, n_series: int, n_steps: int) -> QueryResult:
    """A matrix like a range answer: series that start and stop (churn), some values not
    integral, some NaN and infinite, labels that need escaping now and then."""
    rows = []
    for i in range(n_series):
        lo = rng.randrange(n_steps)
        hi = rng.randrange(lo, n_steps) + 1
        labels = {"__name__": "m", "node": f"n{i:04d}", "gpu": str(rng.randrange(8))}
        if rng.random() < 0.1:
            labels["pod"] = 'a"b\\c é'
        ts = [T0 + k * STEP for k in range(lo, hi)]
        vs = [rng.choice([float(rng.randrange(100)), rng.random() * 1e3, 1e-7, float("nan"), float("inf"), -0.0])
              for _ in ts]
        rows.append((labels, ts, vs))
    return QueryResult.from_series("matrix", rows)


def time_pieces(r: QueryResult, n: int, rng: random.Random) -> list[QueryResult]:
    """`r` cut into n time pieces at random steps, as the planner's pieces are."""
    last = int(r.t_ms.max()) if r.n_samples else T0
    cuts = sorted(rng.sample(range(T0 + STEP, last + 1, STEP), min(n - 1, (last - T0) // STEP)))
    bounds = [T0, *cuts, last + STEP]
    return split_time(r, [(a, b - 1) for a, b in zip(bounds, bounds[1:])])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.integers(1, 400), st.sampled_from([None, 1, 7, 64]))
def test_lazy_is_the_gathered_answer(seed: int, n_pieces: int, window: int, batch: int | None) -> None:
    rng = random.Random(seed)
    whole = fleet(rng, rng.randrange(1, 40), 60)
    pieces = time_pieces(whole, n_pieces, rng)
    rng.shuffle(pieces)
    eager = concat(pieces)
    with mock.patch.object(concat_mod, "LAZY_ABOVE_SAMPLES", 0), \
            mock.patch.object(json_encode, "_WINDOW_SAMPLES", window):
        lazy = concat(pieces, lazy=True)
        assert isinstance(lazy, Concatenation) and not lazy.gathered
        assert (lazy.n_series, lazy.n_samples) == (eager.n_series, eager.n_samples)
        assert lazy.labels == eager.labels and lazy.canonical_keys() == eager.canonical_keys()
        assert lazy.label_block()[0] == eager.label_block()[0]
        # Streamed window by window, in any batch size: the very bytes of the gathered answer.
        want = encode_prometheus_json(eager)
        assert b"".join(iter_prometheus_json(lazy, batch)) == want
        assert not lazy.gathered  # streaming never gathered it whole
        # Windows cover every series once, in order, whole.
        seen = 0
        for s0, s1, t, v in lazy.sample_windows(window):
            assert s0 == seen and s1 > s0 and len(t) == len(v) == lazy.offsets[s1] - lazy.offsets[s0]
            assert t.tobytes() == eager.t_ms[eager.offsets[s0]:eager.offsets[s1]].tobytes()
            seen = s1
        assert seen == lazy.n_series
        # Read: gathered once, the same arrays, and still the same bytes.
        assert np.array_equal(lazy.t_ms, eager.t_ms)
        assert lazy.value.tobytes() == eager.value.tobytes()
        assert lazy.gathered and lazy.offsets.tobytes() == eager.offsets.tobytes()
        assert b"".join(iter_prometheus_json(lazy, batch)) == want
        assert json_encode.encode_prometheus_json(lazy) == want


def test_small_answers_and_other_types_are_gathered_at_once() -> None:
    rng = random.Random(1)
    pieces = time_pieces(fleet(rng, 10, 20), 3, rng)
    # Under LAZY_ABOVE_SAMPLES: gathered, unless they are several cells the cache reader keeps,
    # whose encoded samples the JSON writer splices (codec/json_splice.py).
    assert type(concat(pieces, lazy=True)) is QueryResult
    for p in pieces:
        p.keeps_json = True
    assert type(concat(pieces[:1], lazy=True)) is QueryResult
    assert isinstance(concat(pieces, lazy=True), Concatenation)
    for p in pieces:
        p.keeps_json = False
    with mock.patch.object(concat_mod, "LAZY_ABOVE_SAMPLES", 0):
        assert isinstance(concat(pieces, lazy=True), Concatenation)
        assert type(concat(pieces)) is QueryResult  # not asked for
        v = [QueryResult.from_series("vector", [({"h": h}, [T0], [1.0])]) for h in "ba"]
        assert type(concat(v, lazy=True)) is QueryResult  # vectors: small, reordered by topk
        recipe = MergeRecipe(kind="concat")
        assert isinstance(merge([(None, p) for p in pieces], recipe, lazy=True), Concatenation)
        assert type(merge([(None, p) for p in pieces], recipe)) is QueryResult


def test_overlapping_pieces_are_never_lazy() -> None:
    a = QueryResult.from_series("matrix", [({"h": "a"}, [1, 2, 3], [1.0, 2.0, 3.0])])
    b = QueryResult.from_series("matrix", [({"h": "a"}, [3, 4], [30.0, 4.0])])
    c = QueryResult.from_series("matrix", [({"h": "a"}, [2, 5], [20.0, 5.0])])
    with mock.patch.object(concat_mod, "LAZY_ABOVE_SAMPLES", 0):
        with pytest.raises(MergeConflict):  # the same sample twice: a planner bug, as before
            concat([a, b], lazy=True)
        kept = concat([b, a], keep_first=True, lazy=True)
        assert type(kept) is QueryResult
        assert kept.to_pylist() == [({"h": "a"}, [1, 2, 3, 4], [1.0, 2.0, 30.0, 4.0])]
        interleaved = concat([QueryResult.from_series("matrix", [({"h": "a"}, [1, 4], [1.0, 4.0])]), c], lazy=True)
        assert type(interleaved) is QueryResult
        assert interleaved.to_pylist() == [({"h": "a"}, [1, 2, 4, 5], [1.0, 20.0, 4.0, 5.0])]


def test_pieces_are_let_go_once_gathered() -> None:
    rng = random.Random(2)
    pieces = time_pieces(fleet(rng, 20, 30), 4, rng)
    with mock.patch.object(concat_mod, "LAZY_ABOVE_SAMPLES", 0):
        lazy = concat(pieces, lazy=True)
    assert isinstance(lazy, Concatenation)
    assert lazy._parts is not None and lazy._parts[0] == pieces
    lazy.t_ms  # noqa: B018 -- reading gathers
    assert lazy._parts is None
