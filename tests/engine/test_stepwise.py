"""proxy/engine/stepwise.py: the plumbing functions.py and aggregate.py share -- answers as
samples on the step grid, scalar arguments per step (a missing step is NaN: Prometheus's
scalars have a value at every step), label-set interning, rangeEval's duplicate-labelset
check, and answers built as Prometheus v2.42.0's engine builds them (an instant vector in
evaluation order; a range matrix sorted by labels.Compare, each series' points by time)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proxy.engine.errors import DuplicateLabelset
from proxy.engine.stepwise import (
    Interner,
    Samples,
    as_grid,
    build,
    check_unique,
    notes,
    per_step_answer,
    scalar_steps,
    step_index,
    without_name,
)
from proxy.result import QueryResult

T0 = 1_700_000_000_000
GRID = np.array([T0, T0 + 60_000, T0 + 120_000], dtype=np.int64)


def test_as_grid() -> None:
    assert as_grid([T0]).tolist() == [T0]
    assert as_grid(np.array([[T0, T0 + 1]])).tolist() == [T0, T0 + 1]  # flattened
    for bad in ([], [T0, T0], [T0 + 1, T0]):
        with pytest.raises(ValueError):
            as_grid(bad)


def test_step_index() -> None:
    assert step_index(GRID, np.array([T0 + 120_000, T0], dtype=np.int64)).tolist() == [2, 0]
    assert step_index(GRID, np.zeros(0, dtype=np.int64)).tolist() == []
    for off in (T0 + 1, T0 - 60_000, T0 + 180_000):
        with pytest.raises(ValueError, match="not on the query's step grid"):
            step_index(GRID, np.array([off], dtype=np.int64))


def test_samples_are_series_major() -> None:
    r = QueryResult.from_series("matrix", [({"s": "a"}, [T0, T0 + 120_000], [1.0, 3.0]),
                                           ({"s": "b"}, [], []),
                                           ({"s": "c"}, [T0 + 60_000], [5.0])])
    s = Samples.of(r, GRID, True)
    assert s.ser.tolist() == [0, 0, 2] and s.step.tolist() == [0, 2, 1] and s.value.tolist() == [1.0, 3.0, 5.0]
    with pytest.raises(ValueError, match="must be a 'vector'"):
        Samples.of(r, GRID, False)
    with pytest.raises(TypeError):
        Samples.of(1.0, GRID, True)  # type: ignore[arg-type]


def test_scalar_steps() -> None:
    assert scalar_steps(2.5, GRID).tolist() == [2.5] * 3
    assert scalar_steps(3, GRID).tolist() == [3.0] * 3
    assert scalar_steps(QueryResult.scalar(T0, 7.0), GRID).tolist() == [7.0] * 3
    assert np.isnan(scalar_steps(QueryResult.empty("scalar"), GRID)).all()
    gaps = scalar_steps(QueryResult.from_series("matrix", [({}, [T0 + 60_000], [4.0])]), GRID).tolist()
    assert math.isnan(gaps[0]) and gaps[1] == 4.0 and math.isnan(gaps[2])
    assert np.isnan(scalar_steps(QueryResult.empty("matrix"), GRID)).all()
    with pytest.raises(TypeError):
        scalar_steps(True, GRID)  # type: ignore[arg-type]  # a bool is not a number literal here
    with pytest.raises(ValueError):
        scalar_steps(QueryResult.from_series("matrix", [({"a": "1"}, [T0], [1.0]), ({"a": "2"}, [T0], [1.0])]), GRID)
    with pytest.raises(ValueError):
        scalar_steps(QueryResult.from_series("vector", [({}, [T0], [1.0])]), GRID)


def test_notes_merge_without_repeats_in_order() -> None:
    a = QueryResult.empty("vector", warnings=["w1", "w2"], infos=["i1"])
    b = QueryResult.empty("vector", warnings=["w2", "w3"], infos=["i1", "i2"])
    assert notes([a, 1.0, "text", None, b]) == (["w1", "w2", "w3"], ["i1", "i2"])
    assert notes([]) == ([], [])


def test_interner_ids_by_label_set() -> None:
    it = Interner()
    assert it.add({"b": "1", "a": "2"}) == 0
    assert it.add({"a": "2", "b": "1"}) == 0  # the same set in another order
    assert it.add({"a": "2"}) == 1 and it.add({}) == 2
    assert it.keys == [(("a", "2"), ("b", "1")), (("a", "2"),), ()]
    assert it.labels[0] == {"b": "1", "a": "2"}  # the first spelling is kept


def test_without_name() -> None:
    d = {"__name__": "m", "a": "1"}
    assert without_name(d) == {"a": "1"} and d == {"__name__": "m", "a": "1"}
    plain = {"a": "1"}
    assert without_name(plain) is plain


def test_check_unique() -> None:
    check_unique(np.array([0, 0, 1]), np.array([0, 1, 0]), 2)  # one id at two steps, two ids at one
    check_unique(np.array([3]), np.array([0]), 1)
    with pytest.raises(DuplicateLabelset):
        check_unique(np.array([1, 0, 1]), np.array([2, 2, 2]), 3)


def test_build_instant_keeps_evaluation_order() -> None:
    it = Interner()
    ids = [it.add({"k": k}) for k in ("z", "a", "m")]
    out = build("vector", GRID[:1], it, np.array([ids[0], ids[2], ids[1]]), np.zeros(3, dtype=np.int64),
                np.array([1.0, 2.0, 3.0]), ["w"], [])
    assert out.result_type == "vector" and [d["k"] for d in out.labels] == ["z", "m", "a"]
    assert out.value.tolist() == [1.0, 2.0, 3.0] and out.t_ms.tolist() == [T0] * 3 and out.warnings == ["w"]


def test_build_range_sorts_by_labels_then_time() -> None:
    it = Interner()
    b, a2, a = it.add({"k": "b"}), it.add({"k": "a", "x": "2"}), it.add({"k": "a"})
    sid = np.array([b, a, b, a2, a])
    step = np.array([2, 1, 0, 0, 0])
    value = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    out = build("matrix", GRID, it, sid, step, value, [], ["i"])
    # labels.Compare: {k="a"} < {k="a", x="2"} (a prefix first) < {k="b"}
    assert out.to_pylist() == [({"k": "a"}, [T0, T0 + 60_000], [5.0, 2.0]),
                               ({"k": "a", "x": "2"}, [T0], [4.0]),
                               ({"k": "b"}, [T0, T0 + 120_000], [3.0, 1.0])]
    assert out.infos == ["i"]
    empty = build("matrix", GRID, it, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), ["w"], [])
    assert empty.result_type == "matrix" and empty.n_series == 0 and empty.warnings == ["w"]


def test_per_step_answer() -> None:
    values = np.array([1.0, 2.0, 3.0])
    s = per_step_answer(True, False, GRID[:1], values, [], [])
    assert s.result_type == "scalar" and s.value.tolist() == [1.0]
    v = per_step_answer(False, False, GRID[:1], values, [], [])
    assert v.result_type == "vector" and v.to_pylist() == [({}, [T0], [1.0])]
    for scalar in (True, False):  # a range query: one series {} either way
        m = per_step_answer(scalar, True, GRID, values, ["w"], [])
        assert m.result_type == "matrix" and m.to_pylist() == [({}, GRID.tolist(), [1.0, 2.0, 3.0])]
