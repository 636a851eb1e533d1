"""proxy/engine/matching.py: vector matching of binary operators as Prometheus v2.42.0's
promql/engine.go does it -- vectorElemBinop (arithmetic; comparisons keep the left value and
filter; `%` is math.Mod, `^` math.Pow, atan2 math.Atan2), signatureFunc (on: the listed labels
present; ignoring: all but those and __name__), resultMetric (shouldDropMetricName for
+ - * / % ^ only; one-to-one `on` keeps / `ignoring` drops the listed labels; group_x labels
copied from the "one" side, deleted when empty there), VectorBinop (one-to-many swaps sides
and values back; its three error texts) and labels.Labels.String(). Expected values are
worked out by hand from that code and Go's math documentation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proxy.engine.errors import EvalError
from proxy.engine.matching import (
    GROUP_DUP,
    ONE_TO_ONE_DUP,
    Matching,
    apply_op,
    binop_step,
    elem_op,
    labels_string,
    result_metric,
    scalar_values,
)
from shardplanner.ast import Binary
from shardplanner.promql import parse

NAN, INF = math.nan, math.inf


def _m(expr: str) -> Matching:
    node = parse(expr)
    assert isinstance(node, Binary)
    return Matching.of(node)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


# -- element operations --------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "want"), [
    (5.0, 3.0, 2.0), (-5.0, 3.0, -2.0), (5.0, -3.0, 2.0),  # the sign of the dividend
    (-0.0, 3.0, -0.0),
    (5.0, INF, 5.0), (5.0, -INF, 5.0),  # Mod(x, ±Inf) = x
    (INF, 3.0, NAN), (5.0, 0.0, NAN), (NAN, 3.0, NAN), (5.0, NAN, NAN),
    (7.5, 2.0, 1.5),
])
def test_mod_is_go_math_mod(a: float, b: float, want: float) -> None:
    value, keep = elem_op("%", a, b)
    assert _same(value, want) and keep


@pytest.mark.parametrize(("op", "a", "b", "want"), [
    ("/", 1.0, 0.0, INF), ("/", -1.0, 0.0, -INF), ("/", 1.0, -0.0, -INF), ("/", 0.0, 0.0, NAN),
    ("-", INF, INF, NAN), ("*", 0.0, INF, NAN), ("+", 1e308, 1e308, INF),
    ("^", 2.0, 10.0, 1024.0), ("^", NAN, 0.0, 1.0), ("^", 1.0, NAN, 1.0), ("^", -8.0, 1.0 / 3.0, NAN),
    ("^", -0.0, -1.0, -INF), ("^", 0.0, -1.0, INF), ("^", -1.0, INF, 1.0),
    ("atan2", 0.0, -1.0, math.pi), ("atan2", -0.0, -1.0, -math.pi), ("atan2", 1.0, 0.0, math.pi / 2),
])
def test_arithmetic_special_values(op: str, a: float, b: float, want: float) -> None:
    value, keep = elem_op(op, a, b)
    assert _same(value, want) and keep


def test_comparisons_keep_the_left_value_and_filter() -> None:
    a = np.array([1.0, 2.0, NAN, NAN, 3.0])
    b = np.array([1.0, 1.0, NAN, 1.0, INF])
    value, keep = apply_op("==", a, b)
    assert np.array_equal(value, a, equal_nan=True) and keep.tolist() == [True, False, False, False, False]
    assert apply_op("!=", a, b)[1].tolist() == [False, True, True, True, True]  # NaN != anything
    assert apply_op(">=", a, b)[1].tolist() == [True, True, False, False, False]
    assert apply_op("<", a, b)[1].tolist() == [False, False, False, False, True]
    # scalarBinop: a comparison between scalars gives 1 or 0 (`1 < 2` is 1, not dropped)
    assert scalar_values("<", a, b).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert scalar_values("+", np.array([1.0]), np.array([2.0])).tolist() == [3.0]


def test_set_operators_are_not_element_operations() -> None:
    with pytest.raises(EvalError, match="not allowed"):
        apply_op("and", np.array([1.0]), np.array([1.0]))


# -- labels --------------------------------------------------------------------------------


def test_labels_string_is_go_labels_string() -> None:
    assert labels_string({"b": "2", "a": 'x"y'}) == '{a="x\\"y", b="2"}'
    assert labels_string({}) == "{}"
    assert labels_string((("z", "\n"), ("a", "1"))) == '{a="1", z="\\n"}'


def test_matching_of_each_form() -> None:
    assert _m("a + b") == Matching("one-to-one", False, (), ())
    assert _m("a + on(x, y) b") == Matching("one-to-one", True, ("x", "y"), ())
    assert _m("a * on(x) group_left(y) b") == Matching("many-to-one", True, ("x",), ("y",))
    assert _m("a / ignoring(i) group_right b") == Matching("one-to-many", False, ("i",), ())
    assert _m("a and on(x) b").card == "many-to-many"
    assert _m("a unless b").card == "many-to-many"


def test_signatures() -> None:
    labels = {"__name__": "m", "x": "1", "i": "2", "j": "3"}
    # on(): only the listed labels that are present (the metric name if listed).
    assert _m("a + on(x, nosuch) b").signature(labels) == (("x", "1"),)
    assert _m("a + on(__name__) b").signature(labels) == (("__name__", "m"),)
    assert _m("a + on() b").signature(labels) == ()
    # ignoring(): all but the listed ones and the metric name.
    assert _m("a + ignoring(i) b").signature(labels) == (("j", "3"), ("x", "1"))
    assert _m("a + b").signature(labels) == (("i", "2"), ("j", "3"), ("x", "1"))
    assert _m("a + on(x) b").match_labels(labels) == {"x": "1"}
    assert _m("a + ignoring(i) b").match_labels(labels) == {"x": "1", "j": "3"}


def test_result_metric() -> None:
    many = {"__name__": "m", "x": "1", "i": "2"}
    one = {"__name__": "o", "x": "1", "extra": "e", "empty": ""}
    assert result_metric(many, one, "+", _m("a + b"), False) == {"x": "1", "i": "2"}
    assert result_metric(many, one, ">", _m("a > b"), False) == many  # comparisons keep the name
    assert result_metric(many, one, "atan2", _m("a atan2 b"), False) == many  # not in shouldDropMetricName
    assert result_metric(many, one, ">", _m("a > bool b"), True) == {"x": "1", "i": "2"}
    assert result_metric(many, one, "-", _m("a - on(x) b"), False) == {"x": "1"}
    assert result_metric(many, one, "==", _m("a == on(x) b"), False) == {"x": "1"}  # Keep drops the name too
    assert result_metric(many, one, "-", _m("a - ignoring(i) b"), False) == {"x": "1"}
    # group_left(include): from the one side; an empty or missing value deletes the label.
    m = _m("a * on(x) group_left(extra, i, empty) b")
    assert result_metric(many, one, "*", m, False) == {"x": "1", "extra": "e"}
    assert result_metric(many, one, "<", m, False) == {"__name__": "m", "x": "1", "extra": "e"}


# -- VectorBinop at one step ---------------------------------------------------------------


def test_binop_step_one_to_one() -> None:
    lhs = [({"__name__": "a", "x": "1"}, 10.0), ({"__name__": "a", "x": "2"}, 20.0), ({"__name__": "a", "x": "3"}, 1.0)]
    rhs = [({"__name__": "b", "x": "2"}, 2.0), ({"__name__": "b", "x": "1"}, 5.0), ({"__name__": "b", "x": "9"}, 5.0)]
    # Left's order; unmatched series on either side drop out.
    assert binop_step("/", False, _m("a / b"), lhs, rhs) == [({"x": "1"}, 2.0), ({"x": "2"}, 10.0)]
    assert binop_step(">", False, _m("a > b"), lhs, rhs) == [({"__name__": "a", "x": "1"}, 10.0),
                                                             ({"__name__": "a", "x": "2"}, 20.0)]
    assert binop_step(">", True, _m("a > bool b"), lhs, rhs) == [({"x": "1"}, 1.0), ({"x": "2"}, 1.0)]
    assert binop_step("+", False, _m("a + b"), [], rhs) == []
    assert binop_step("+", False, _m("a + b"), lhs, []) == []


def test_binop_step_group_left_and_right() -> None:
    many = [({"x": "1", "i": "a"}, 3.0), ({"x": "1", "i": "b"}, 4.0), ({"x": "2", "i": "c"}, 5.0)]
    one = [({"x": "1", "team": "t1"}, 10.0), ({"x": "2", "team": "t2"}, 100.0)]
    out = binop_step("*", False, _m("a * on(x) group_left(team) b"), many, one)
    assert out == [({"x": "1", "i": "a", "team": "t1"}, 30.0), ({"x": "1", "i": "b", "team": "t1"}, 40.0),
                   ({"x": "2", "i": "c", "team": "t2"}, 500.0)]
    # group_right: the right side is the many side; values keep their sides (one - many),
    # and a filtering comparison returns the LEFT value under the right side's labels.
    out = binop_step("-", False, _m("a - on(x) group_right(team) b"), one, many)
    assert out == [({"x": "1", "i": "a", "team": "t1"}, 7.0), ({"x": "1", "i": "b", "team": "t1"}, 6.0),
                   ({"x": "2", "i": "c", "team": "t2"}, 95.0)]
    out = binop_step(">", False, _m("a > on(x) group_right b"), one, many)
    assert [v for _, v in out] == [10.0, 10.0, 100.0] and [d["i"] for d, _ in out] == ["a", "b", "c"]


def test_binop_step_errors_have_prometheus_texts() -> None:
    dup = [({"__name__": "b", "x": "1", "i": "1"}, 1.0), ({"__name__": "b", "x": "1", "i": "2"}, 2.0)]
    lhs = [({"x": "1"}, 1.0)]
    with pytest.raises(EvalError) as err:
        binop_step("+", False, _m("a + on(x) b"), lhs, dup)
    # [the later series, the earlier one], match group from MatchLabels(on, x)
    assert err.value.message == (
        'found duplicate series for the match group {x="1"} on the right hand-side of the operation: '
        '[{__name__="b", i="2", x="1"}, {__name__="b", i="1", x="1"}]'
        ";many-to-many matching not allowed: matching labels must be unique on one side")
    with pytest.raises(EvalError, match="on the left hand-side"):
        binop_step("+", False, _m("a + on(x) group_right b"), dup, lhs)
    with pytest.raises(EvalError) as err:
        binop_step("+", False, _m("a + on(x) b"), dup, lhs)  # two left series, one match each
    assert err.value.message == ONE_TO_ONE_DUP
    named = [({"__name__": "a1", "x": "1"}, 1.0), ({"__name__": "a2", "x": "1"}, 2.0)]
    with pytest.raises(EvalError) as err:  # `*` drops both names: the same result metric twice
        binop_step("*", False, _m("a * on(x) group_left b"), named, lhs)
    assert err.value.message == GROUP_DUP
    # With a comparison the names stay: no clash.
    assert len(binop_step("<", False, _m("a < on(x) group_left b"), named, [({"x": "1"}, 5.0)])) == 2
