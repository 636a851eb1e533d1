"""A lazy cut by time (proxy/result/pieces.py's `TimeCut`, `slice_time(..., lazy=True)`, issue
28): the same answer as the eager cut in every field, its samples copied only when read, its
series' first and last timestamps known before, and a cell read back packed cut without
reading its samples when it lies inside the window. Eager cuts and splits:
tests/pipeline/test_pieces.py."""

from __future__ import annotations

import gc
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec import arrow
from proxy.codec.json_encode import encode_prometheus_json
from proxy.codec.json_splice import splice_prometheus_json
from proxy.result import QueryResult
from proxy.result.concat import Concatenation, concat
from proxy.result.pieces import TimeCut, slice_time

from .test_concat import STEP, T0, fleet


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return a.tobytes() == b.tobytes()  # NaN, -0.0 and infinities bit for bit


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 59), st.integers(0, 59))
def test_a_lazy_cut_is_the_eager_cut(seed: int, a: int, b: int) -> None:
    whole = fleet(random.Random(seed), 1 + seed % 25, 60)
    whole.warnings, whole.infos = ["w"], ["i"]
    lo, hi = T0 + min(a, b) * STEP, T0 + max(a, b) * STEP
    eager = slice_time(whole, lo, hi)
    lazy = slice_time(whole, lo, hi, lazy=True)
    if eager is whole:  # nothing outside the window: neither cuts
        assert lazy is whole
        return
    assert isinstance(lazy, TimeCut) and not lazy.loaded
    assert lazy.n_series == eager.n_series and lazy.n_samples == eager.n_samples
    assert np.array_equal(lazy.offsets, eager.offsets)
    assert lazy.canonical_keys() == eager.canonical_keys() and lazy.labels == eager.labels
    assert (lazy.warnings, lazy.infos) == (["w"], ["i"])
    firsts, lasts = lazy.series_bounds()  # type: ignore[misc]
    if eager.n_series:
        assert np.array_equal(firsts, eager.t_ms[eager.offsets[:-1]])
        assert np.array_equal(lasts, eager.t_ms[eager.offsets[1:] - 1])
    assert lazy.origin is not None and eager.origin is not None
    assert lazy.origin[0]() is whole and np.array_equal(lazy.origin[1], eager.origin[1])
    assert not lazy.loaded  # nothing above read its samples
    assert np.array_equal(lazy.t_ms, eager.t_ms) and same_values(lazy.value, eager.value)
    assert lazy.loaded


def test_read_once_the_cut_lets_its_cell_go_and_a_window_of_cuts_splices_their_cells_bytes() -> None:
    rng = random.Random(4)
    cells = [fleet(rng, 12, 60), fleet(rng, 12, 60)]
    for k, c in enumerate(cells):  # two adjacent cells, as a window's edge cells are
        c.t_ms += k * 60 * STEP
        c.keeps_json = True
    lo, hi = T0 + 30 * STEP, T0 + 89 * STEP
    answer = concat([slice_time(c, lo, hi, lazy=True) for c in cells], lazy=True)
    want = encode_prometheus_json(concat([slice_time(c, lo, hi) for c in cells]))
    assert isinstance(answer, Concatenation)
    assert splice_prometheus_json(answer) == want
    pieces = answer.parts[0]  # type: ignore[index]
    assert all(isinstance(p, TimeCut) and not p.loaded for p in pieces)  # spliced, never read
    assert encode_prometheus_json(answer) == want  # gathered from the cuts: read now
    assert all(p.loaded for p in pieces)
    ref = pieces[0].origin[0]
    del cells, answer
    gc.collect()
    assert ref() is None  # the cut held its cell only until it was read


def test_a_packed_cell_inside_the_window_is_not_read_and_one_out_of_order_is_cut_eagerly() -> None:
    cell = fleet(random.Random(9), 10, 60)
    packed = arrow.PackedPiece.of(cell, arrow.to_ipc_bytes(cell))
    assert slice_time(packed, T0, T0 + 59 * STEP, lazy=True) is packed
    assert packed.packed_samples() is not None  # its samples were not read to tell
    cut = slice_time(packed, T0 + 5 * STEP, T0 + 20 * STEP, lazy=True)
    assert encode_prometheus_json(cut) == encode_prometheus_json(slice_time(cell, T0 + 5 * STEP, T0 + 20 * STEP))
    shuffled = QueryResult.from_series("matrix", [({"a": "1"}, [T0 + 2 * STEP, T0, T0 + STEP], [1.0, 2.0, math.nan])])
    out = slice_time(shuffled, T0, T0 + STEP, lazy=True)
    assert not isinstance(out, TimeCut) and out.t_ms.tolist() == [T0, T0 + STEP]


def test_a_vector_is_not_cut() -> None:
    with pytest.raises(ValueError, match="only a matrix"):
        slice_time(QueryResult.from_series("vector", [({"a": "b"}, [T0], [1.0])]), T0, T0, lazy=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 59), st.integers(0, 59))
def test_a_lazy_cut_of_a_packed_cell_is_the_eager_cut(seed: int, a: int, b: int) -> None:
    """A cell read back packed is in time order (checked when decoded): its lazy cut searches
    without checking again, and is the same cut."""
    whole = fleet(random.Random(seed), 1 + seed % 25, 60)
    packed = arrow.PackedPiece.of(whole, arrow.to_ipc_bytes(whole))
    lo, hi = T0 + min(a, b) * STEP, T0 + max(a, b) * STEP
    lazy, eager = slice_time(packed, lo, hi, lazy=True), slice_time(whole, lo, hi)
    assert np.array_equal(lazy.offsets, eager.offsets) and lazy.canonical_keys() == eager.canonical_keys()
    assert np.array_equal(lazy.t_ms, eager.t_ms) and same_values(lazy.value, eager.value)
