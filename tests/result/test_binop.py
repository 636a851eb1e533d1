"""proxy.engine.binop in-process: hand-built answers for each rule of Prometheus's binary operators,
Go's float functions, the error texts, and a randomised comparison of the vectorised join
with the one-step transcription of VectorBinop it defers to."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from proxy.engine.binop import evaluate_binary, is_scalar_expr
from proxy.engine.errors import EvalError
from proxy.engine.matching import Matching, binop_step
from proxy.result import QueryResult
from proxy.result.golang import go_atan2, go_pow, go_quote
from shardplanner.ast import Binary, Call, Number, Paren, Selector, Unary, unparen
from shardplanner.promql import parse

T0 = 1_700_000_000_000
STEP = 60_000
NAN, INF = math.nan, math.inf


def node(text: str) -> Binary:
    n = unparen(parse(text))
    assert isinstance(n, Binary), text
    return n


def vec(*series: tuple[dict[str, str], float]) -> QueryResult:
    return QueryResult.from_series("vector", [(lab, [T0], [v]) for lab, v in series])


def mat(*series: tuple[dict[str, str], dict[int, float]]) -> QueryResult:
    """Series as {step index: value}."""
    return QueryResult.from_series(
        "matrix", [(lab, [T0 + i * STEP for i in sorted(pts)], [pts[i] for i in sorted(pts)]) for lab, pts in series])


def rows(r: QueryResult) -> list[tuple[dict[str, str], list[float]]]:
    return [(lab, v) for lab, _, v in r.to_pylist()]


def as_dict(r: QueryResult) -> dict[tuple[tuple[str, str], ...], Any]:
    out = {}
    for lab, t, v in r.to_pylist():
        k = tuple(sorted(lab.items()))
        assert k not in out
        out[k] = dict(zip([(x - T0) // STEP for x in t], v)) if r.result_type == "matrix" else v[0]
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def err(text: str, lhs: Any, rhs: Any) -> str:
    with pytest.raises(EvalError) as ei:
        evaluate_binary(node(text), lhs, rhs)
    assert ei.value.kind == "execution" and ei.value.status == 422
    return ei.value.message


A = {"__name__": "a", "h": "n1", "g": "0"}
A1 = {"__name__": "a", "h": "n1", "g": "1"}
A2 = {"__name__": "a", "h": "n2", "g": "0"}
B = {"__name__": "b", "h": "n1", "g": "0"}
B1 = {"__name__": "b", "h": "n1", "g": "1"}
B2 = {"__name__": "b", "h": "n2", "g": "0"}


# --- arithmetic and Go's float semantics -------------------------------------------------


@pytest.mark.parametrize(
    "op,x,y,want",
    [
        ("+", 1.5, 2.25, 3.75), ("-", 1.0, 3.0, -2.0), ("*", -2.0, 0.0, -0.0),
        ("/", 1.0, 0.0, INF), ("/", -1.0, 0.0, -INF), ("/", 0.0, 0.0, NAN), ("/", 1.0, -0.0, -INF),
        ("+", INF, -INF, NAN), ("*", INF, 0.0, NAN), ("-", NAN, 1.0, NAN),
        # math.Mod: the sign of the dividend, NaN for a zero divisor or an infinite dividend.
        ("%", 7.5, 2.0, 1.5), ("%", -7.5, 2.0, -1.5), ("%", 7.5, -2.0, 1.5), ("%", 5.0, 0.0, NAN),
        ("%", INF, 3.0, NAN), ("%", 3.0, INF, 3.0), ("%", -0.0, 3.0, -0.0), ("%", 1e300, 3.0, math.fmod(1e300, 3.0)),
        ("^", 2.0, 10.0, 1024.0), ("^", -2.0, 3.0, -8.0), ("^", -8.0, 1 / 3, NAN), ("^", 4.0, 0.5, 2.0),
        ("^", 4.0, -0.5, 0.5), ("^", 2.0, -2.0, 0.25), ("^", NAN, 0.0, 1.0), ("^", 1.0, NAN, 1.0),
        ("^", 0.0, -1.0, INF), ("^", -0.0, -1.0, -INF), ("^", -0.0, -2.0, INF), ("^", -0.0, 3.0, -0.0),
        ("^", 0.0, 2.5, 0.0), ("^", -1.0, INF, 1.0), ("^", 0.5, INF, 0.0), ("^", 0.5, -INF, INF),
        ("^", 2.0, INF, INF), ("^", INF, -1.0, 0.0), ("^", -INF, 3.0, -INF), ("^", -INF, 2.0, INF),
        ("^", -INF, -3.0, -0.0), ("^", 10.0, 400.0, INF), ("^", 10.0, -400.0, 0.0), ("^", 2.0, 2.0**64, INF),
        ("atan2", 1.0, 1.0, math.pi / 4), ("atan2", 0.0, -1.0, math.pi), ("atan2", -0.0, -1.0, -math.pi),
        ("atan2", 0.0, 0.0, 0.0), ("atan2", 1.0, 0.0, math.pi / 2), ("atan2", INF, -INF, 3 * math.pi / 4),
        ("atan2", NAN, 1.0, NAN), ("atan2", -3.0, -INF, -math.pi),
    ],
)
def test_arithmetic_values(op: str, x: float, y: float, want: float) -> None:
    out = evaluate_binary(node(f"a {op} b"), vec((A, x)), vec((B, y)))
    assert isinstance(out, QueryResult)
    [(lab, [v])] = rows(out)
    assert lab == ({"h": "n1", "g": "0"} if op != "atan2" else A)  # atan2 keeps __name__
    assert same(v, want), (op, x, y, v, want)
    # The same through scalar/scalar and vector/scalar.
    s = evaluate_binary(node(f"1 {op} 2"), x, y)
    assert isinstance(s, float) and same(s, want)
    [(_, [v2])] = rows(evaluate_binary(node(f"a {op} 2"), vec((A, x)), y))  # type: ignore[arg-type]
    assert same(v2, want)


def test_go_pow_integer_exponents_are_exact_repeated_squaring() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-50, 50, 2000)
    y = rng.integers(-12, 13, 2000).astype(float)
    got = go_pow(x, y)

    def go(xv: float, yv: float) -> float:  # the algorithm, one value at a time, in Python floats
        if yv == 0 or xv == 1:
            return 1.0
        if yv == 1:
            return xv
        if xv == 0:
            return go_pow(xv, yv)[0]
        yi = abs(yv)
        a1, ae = 1.0, 0
        x1, xe = math.frexp(xv)
        i = int(yi)
        while i:
            if i & 1:
                a1 *= x1
                ae += xe
            x1 *= x1
            xe <<= 1
            if x1 < 0.5:
                x1 += x1
                xe -= 1
            i >>= 1
        if yv < 0:
            a1, ae = 1 / a1, -ae
        return math.ldexp(a1, ae)

    want = np.array([go(a, b) for a, b in zip(x.tolist(), y.tolist())])
    assert np.array_equal(got, want)
    # ... and within an ulp or two of the correctly rounded C pow.
    assert np.allclose(got, np.power(x, y), rtol=1e-15, atol=0)


def test_go_atan2_matches_c_within_an_ulp_and_quadrants() -> None:
    rng = np.random.default_rng(5)
    y = rng.uniform(-1e3, 1e3, 5000)
    x = rng.uniform(-1e3, 1e3, 5000)
    got = go_atan2(y, x)
    assert np.allclose(got, np.arctan2(y, x), rtol=4e-16, atol=0)
    assert go_atan2(1.0, 1e-300)[()] == pytest.approx(math.pi / 2)
    assert go_atan2(-1.0, -1.0)[()] == pytest.approx(-3 * math.pi / 4)


# --- labels, names and values ---------------------------------------------------------------


def test_comparison_filter_keeps_lhs_value_and_name_bool_drops_it() -> None:
    lhs = vec((A, 5.0), (A1, 1.0), (A2, NAN))
    rhs = vec((B, 3.0), (B1, 3.0), (B2, NAN))
    assert rows(evaluate_binary(node("a > b"), lhs, rhs)) == [(A, [5.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a != b"), lhs, rhs))[-1][0] == A2  # type: ignore[arg-type]
    out = rows(evaluate_binary(node("a > bool b"), lhs, rhs))  # type: ignore[arg-type]
    assert out == [({"h": "n1", "g": "0"}, [1.0]), ({"h": "n1", "g": "1"}, [0.0]), ({"h": "n2", "g": "0"}, [0.0])]


def test_scalar_comparisons_keep_the_vector_value() -> None:
    v = vec((A, 5.0), (A1, 1.0))
    assert rows(evaluate_binary(node("3 < a"), 3.0, v)) == [(A, [5.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a < 3"), v, 3.0)) == [(A1, [1.0])]  # type: ignore[arg-type]
    out = rows(evaluate_binary(node("3 < bool a"), 3.0, v))  # type: ignore[arg-type]
    assert out == [({"h": "n1", "g": "0"}, [1.0]), ({"h": "n1", "g": "1"}, [0.0])]
    # Arithmetic with the scalar on the left: the scalar is the left operand.
    assert rows(evaluate_binary(node("10 - a"), 10.0, v))[0][1] == [5.0]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("2 ^ a"), 2.0, v))[0][1] == [32.0]  # type: ignore[arg-type]


def test_on_keeps_only_the_on_labels_ignoring_drops_them() -> None:
    lhs = vec(({**A, "x": "1"}, 6.0))
    rhs = vec(({**B, "x": "2"}, 2.0))
    assert rows(evaluate_binary(node("a / on(h, g) b"), lhs, rhs)) == [({"h": "n1", "g": "0"}, [3.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a / ignoring(x) b"), lhs, rhs)) == [({"h": "n1", "g": "0"}, [3.0])]  # type: ignore[arg-type]
    # A filter keeps __name__ unless on() leaves it out.
    assert rows(evaluate_binary(node("a > ignoring(x) b"), lhs, rhs)) == [(A, [6.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a > on(h) b"), lhs, rhs)) == [({"h": "n1"}, [6.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a > on(__name__, h) b"), lhs, vec(({**A, "g": "9"}, 1.0)))) == [  # type: ignore[arg-type]
        ({"__name__": "a", "h": "n1"}, [6.0])]
    # No match -> nothing; absent labels match absent labels.
    assert evaluate_binary(node("a + on(h) b"), vec((A, 1.0)), vec((B2, 1.0))).n_series == 0  # type: ignore[union-attr]
    assert rows(evaluate_binary(node("a + on(zz) b"), vec((A, 1.0)), vec((B2, 2.0)))) == [({}, [3.0])]  # type: ignore[arg-type]


def test_group_left_copies_include_labels_from_the_one_side() -> None:
    many = vec(({**A, "job": "dcgm"}, 10.0), ({**A1, "job": "dcgm"}, 20.0), ({**A2, "job": "dcgm"}, 30.0))
    one = vec(({"__name__": "node", "h": "n1", "job": "node", "model": "H100"}, 2.0))
    out = rows(evaluate_binary(node("a * on(h) group_left(job, model, nosuch) node"), many, one))  # type: ignore[arg-type]
    assert out == [
        ({"h": "n1", "g": "0", "job": "node", "model": "H100"}, [20.0]),
        ({"h": "n1", "g": "1", "job": "node", "model": "H100"}, [40.0]),
    ]
    # An include label absent on the one side is removed from the result.
    out = rows(evaluate_binary(node("a * on(h) group_left(g) node"), vec((A, 1.0)), one))  # type: ignore[arg-type]
    assert out == [({"h": "n1"}, [2.0])]


def test_group_right_filter_takes_the_left_value_and_the_right_labels() -> None:
    one = vec(({"__name__": "avg", "h": "n1"}, 5.0))
    many = vec((B, 7.0), (B1, 3.0), (B2, 9.0))
    out = rows(evaluate_binary(node("avg < on(h) group_right b"), one, many))  # type: ignore[arg-type]
    assert out == [(B, [5.0])]  # the "one" side's value, as Prometheus 2.42 answers
    out = rows(evaluate_binary(node("avg - on(h) group_right b"), one, many))  # type: ignore[arg-type]
    assert out == [({"h": "n1", "g": "0"}, [-2.0]), ({"h": "n1", "g": "1"}, [2.0])]
    out = rows(evaluate_binary(node("avg < bool on(h) group_right b"), one, many))  # type: ignore[arg-type]
    assert out == [({"h": "n1", "g": "0"}, [1.0]), ({"h": "n1", "g": "1"}, [0.0])]


def test_instant_vector_keeps_evaluation_order() -> None:
    lhs = vec((A2, 1.0), (A, 2.0), (A1, 3.0))
    rhs = vec((B, 1.0), (B1, 1.0), (B2, 1.0))
    assert [lab["h"] + lab["g"] for lab, _ in rows(evaluate_binary(node("a + b"), lhs, rhs))] == ["n20", "n10", "n11"]  # type: ignore[arg-type]
    # group_right iterates the right (many) side.
    one = vec(({"h": "n1"}, 1.0), ({"h": "n2"}, 1.0))
    many = vec((B2, 1.0), (B1, 1.0), (B, 1.0))
    got = rows(evaluate_binary(node("x + on(h) group_right b"), one, many))  # type: ignore[arg-type]
    assert [lab["h"] + lab["g"] for lab, _ in got] == ["n20", "n11", "n10"]


# --- set operators -----------------------------------------------------------------------------


def test_and_or_unless_instant() -> None:
    lhs = vec((A, 1.0), (A1, 2.0), (A2, 3.0))
    rhs = vec((B, 10.0), ({"__name__": "b", "h": "n3", "g": "0"}, 30.0))
    assert rows(evaluate_binary(node("a and b"), lhs, rhs)) == [(A, [1.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a unless b"), lhs, rhs)) == [(A1, [2.0]), (A2, [3.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a or b"), lhs, rhs)) == [  # type: ignore[arg-type]
        (A, [1.0]), (A1, [2.0]), (A2, [3.0]), ({"__name__": "b", "h": "n3", "g": "0"}, [30.0])]
    assert rows(evaluate_binary(node("a and on(h) b"), lhs, rhs)) == [(A, [1.0]), (A1, [2.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a and ignoring(g) b"), lhs, rhs)) == [(A, [1.0]), (A1, [2.0])]  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a and on() b"), lhs, rhs)) == rows(lhs)  # type: ignore[arg-type]
    assert evaluate_binary(node("a and on() b"), lhs, vec()).n_series == 0  # type: ignore[union-attr]
    assert rows(evaluate_binary(node("a unless on() b"), lhs, vec())) == rows(lhs)  # type: ignore[arg-type]
    assert rows(evaluate_binary(node("a or b"), vec(), rhs)) == rows(rhs)  # type: ignore[arg-type]


def test_set_operators_decide_per_step() -> None:
    lhs = mat((A, {0: 1.0, 2: 1.0}), (A1, {1: 5.0}))
    rhs = mat((B, {1: 10.0, 2: 20.0, 3: 30.0}), (B2, {0: 7.0}))
    assert as_dict(evaluate_binary(node("a and b"), lhs, rhs)) == {  # type: ignore[arg-type]
        tuple(sorted(A.items())): {2: 1.0}}
    assert as_dict(evaluate_binary(node("a unless b"), lhs, rhs)) == {  # type: ignore[arg-type]
        tuple(sorted(A.items())): {0: 1.0}, tuple(sorted(A1.items())): {1: 5.0}}
    # or: the rhs series fills the steps where lhs has no series with its signature.
    assert as_dict(evaluate_binary(node("a or b"), lhs, rhs)) == {  # type: ignore[arg-type]
        tuple(sorted(A.items())): {0: 1.0, 2: 1.0}, tuple(sorted(A1.items())): {1: 5.0},
        tuple(sorted(B.items())): {1: 10.0, 3: 30.0}, tuple(sorted(B2.items())): {0: 7.0}}
    # Identical label sets from both sides become one series.
    same_labels = mat((A, {0: 1.0}))
    out = evaluate_binary(node("a or b"), same_labels, mat((A, {0: 9.0, 1: 2.0})))
    assert rows(out) == [(A, [1.0, 2.0])]  # type: ignore[arg-type]
    # on(): all or nothing per step.
    out = evaluate_binary(node("a and on() b"), lhs, mat(({}, {1: 0.0})))
    assert as_dict(out) == {tuple(sorted(A1.items())): {1: 5.0}}  # type: ignore[arg-type]


# --- range answers ---------------------------------------------------------------------------


def test_matrix_joins_per_step_sorts_and_drops_empty_series() -> None:
    lhs = mat((A2, {0: 1.0, 1: 2.0, 2: 3.0}), (A, {0: 10.0, 2: 30.0}), (A1, {3: 1.0}))
    rhs = mat((B, {0: 1.0, 1: 1.0, 2: 2.0}), (B2, {1: 100.0, 3: 5.0}))
    out = evaluate_binary(node("a / b"), lhs, rhs)
    assert isinstance(out, QueryResult) and out.result_type == "matrix"
    assert out.to_pylist() == [
        ({"h": "n1", "g": "0"}, [T0, T0 + 2 * STEP], [10.0, 15.0]),
        ({"h": "n2", "g": "0"}, [T0 + STEP], [0.02]),
    ]
    # A filter that never passes leaves no series at all.
    assert evaluate_binary(node("a > 1000"), lhs, 1000.0).n_series == 0  # type: ignore[union-attr]
    # A series whose output label set changes between steps (group_left partner changes).
    many = mat(({"h": "n1", "g": "0"}, {0: 1.0, 1: 1.0}))
    one = mat(({"h": "n1", "m": "x"}, {0: 2.0}), ({"h": "n1", "m": "y"}, {1: 3.0}))
    out = evaluate_binary(node("a * on(h) group_left(m) b"), many, one)
    assert out.to_pylist() == [  # type: ignore[union-attr]
        ({"g": "0", "h": "n1", "m": "x"}, [T0], [2.0]), ({"g": "0", "h": "n1", "m": "y"}, [T0 + STEP], [3.0])]


def test_per_step_scalars() -> None:
    v = mat((A, {0: 1.0, 1: 2.0, 2: 3.0}))
    sc = mat(({}, {0: 10.0, 1: 20.0, 2: 30.0}))
    n = node("a * scalar(b)")
    assert is_scalar_expr(n.rhs) and not is_scalar_expr(n.lhs)
    assert rows(evaluate_binary(n, v, sc)) == [({"h": "n1", "g": "0"}, [10.0, 40.0, 90.0])]  # type: ignore[arg-type]
    out = evaluate_binary(node("time() - scalar(b)"), sc, sc)
    assert isinstance(out, QueryResult) and out.to_pylist() == [({}, [T0, T0 + STEP, T0 + 2 * STEP], [0.0] * 3)]
    out = evaluate_binary(node("time() > bool 15"), sc, 15.0)
    assert out.to_pylist()[0][2] == [0.0, 1.0, 1.0]  # type: ignore[union-attr]
    # Instant scalar answers.
    s = QueryResult.scalar(T0, 4.0)
    out = evaluate_binary(node("scalar(x) + 1"), s, 1.0)
    assert isinstance(out, QueryResult) and out.result_type == "scalar" and out.value.tolist() == [5.0]
    assert rows(evaluate_binary(node("a - scalar(x)"), vec((A, 1.0)), s)) == [({"h": "n1", "g": "0"}, [-3.0])]  # type: ignore[arg-type]
    assert evaluate_binary(node("1 + 2"), 1.0, 2.0) == 3.0
    assert evaluate_binary(node("1 >= bool 2"), 1.0, 2.0) == 0.0
    assert is_scalar_expr(Paren(Unary(Call("time")))) and is_scalar_expr(Number(1))
    assert not is_scalar_expr(Selector("x")) and not is_scalar_expr(Call("vector", (Number(1),)))


def test_operand_checks() -> None:
    with pytest.raises(ValueError):
        evaluate_binary(node("a + b"), vec((A, 1.0)), mat((B, {0: 1.0})))
    with pytest.raises(TypeError):
        evaluate_binary(node("a + b"), vec((A, 1.0)), "x")  # type: ignore[arg-type]
    with pytest.raises(EvalError, match="set operator"):  # the parser refuses it first
        evaluate_binary(Binary("and", Selector("a"), Number(1)), vec((A, 1.0)), 1.0)


# --- errors ----------------------------------------------------------------------------------


def test_duplicate_series_on_the_right() -> None:
    lhs = vec((A, 1.0))
    rhs = vec((B, 1.0), (B1, 2.0))
    msg = err("a * on(h) b", lhs, rhs)
    assert msg == (
        'found duplicate series for the match group {h="n1"} on the right hand-side of the operation: '
        '[{__name__="b", g="1", h="n1"}, {__name__="b", g="0", h="n1"}]'
        ";many-to-many matching not allowed: matching labels must be unique on one side"
    )
    assert err("a * on(h) group_left b", lhs, rhs) == msg
    # ignoring(): the match group lists the remaining labels, without __name__.
    msg = err("a * ignoring(g) b", lhs, rhs)
    assert msg.startswith('found duplicate series for the match group {h="n1"} on the right')
    # An empty left side at that step means no error (VectorBinop returns early).
    assert evaluate_binary(node("a * on(h) b"), vec(), rhs).n_series == 0  # type: ignore[union-attr]


def test_duplicate_series_on_the_left_for_group_right() -> None:
    msg = err("a * on(h) group_right b", vec((A, 1.0), (A1, 2.0)), vec((B, 1.0)))
    assert " on the left hand-side of the operation: [" in msg
    assert '[{__name__="a", g="1", h="n1"}, {__name__="a", g="0", h="n1"}]' in msg


def test_error_labels_are_go_quoted() -> None:
    odd = {"__name__": "b", "h": 'q"\\\n\t\x01é\u2028'}
    msg = err("a * on(h) b", vec(({"h": odd["h"]}, 1.0)), vec((odd, 1.0), ({**odd, "z": "1"}, 1.0)))
    assert '{h="q\\"\\\\\\n\\t\\x01é\\u2028"}' in msg
    assert go_quote("a\x7fb\U0001F600") == '"a\\x7fb\U0001F600"'


def test_one_to_one_many_matches_and_grouping_errors() -> None:
    assert err("a * on(h) b", vec((A, 1.0), (A1, 2.0)), vec((B, 1.0))) == (
        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)")
    # A filter only counts the matches that pass.
    out = evaluate_binary(node("a > on(h) b"), vec((A, 5.0), (A1, 0.0)), vec((B, 1.0)))
    assert rows(out) == [({"h": "n1"}, [5.0])]  # type: ignore[arg-type]
    assert err("a > on(h) b", vec((A, 5.0), (A1, 6.0)), vec((B, 1.0))).startswith("multiple matches for labels")
    assert err("a > bool on(h) b", vec((A, 5.0), (A1, 0.0)), vec((B, 1.0))).startswith("multiple matches")
    assert err("a * on(h) group_left(g) b", vec((A, 1.0), (A1, 2.0)), vec(({"h": "n1"}, 1.0))) == (
        "multiple matches for labels: grouping labels must ensure unique matches")


def test_same_labelset_errors() -> None:
    two_names = vec(({"__name__": "x", "h": "1"}, 1.0), ({"__name__": "y", "h": "1"}, 2.0))
    assert err("a * 2", two_names, 2.0) == "vector cannot contain metrics with the same labelset"
    assert err("2 * a", 2.0, two_names) == "vector cannot contain metrics with the same labelset"
    assert err("a > bool 2", two_names, 2.0) == "vector cannot contain metrics with the same labelset"
    # Filters keep the names, so no clash.
    assert evaluate_binary(node("a > 0"), two_names, 0.0).n_series == 2  # type: ignore[union-attr]


def test_range_error_only_at_the_failing_step_and_the_first_one_wins() -> None:
    lhs = mat((A, {0: 1.0, 1: 1.0, 2: 1.0}), (A1, {2: 1.0}))
    rhs = mat((B, {0: 1.0, 1: 1.0, 2: 1.0}), (B1, {1: 5.0, 2: 5.0}))
    # step 1: duplicate on the right (reported first), step 2: both.
    msg = err("a * on(h) b", lhs, rhs)
    assert msg.startswith("found duplicate series")
    # Duplicates at a step where the other side is empty do not count.
    lhs2 = mat((A, {0: 1.0, 2: 4.0}))
    rhs2 = mat((B, {0: 2.0, 1: 1.0, 2: 2.0}), (B1, {1: 5.0}))
    out = evaluate_binary(node("a * on(h) b"), lhs2, rhs2)
    assert out.to_pylist() == [({"h": "n1"}, [T0, T0 + 2 * STEP], [2.0, 8.0])]  # type: ignore[union-attr]
    # A many-match at step 2 only.
    lhs3 = mat((A, {0: 1.0, 1: 1.0, 2: 1.0}), (A1, {2: 1.0}))
    assert err("a * on(h) b", lhs3, mat((B, {0: 1.0, 2: 1.0}))).startswith("multiple matches for labels: many-to-one")


# --- the vectorised path against the one-step reference --------------------------------------

_OPS = ["+", "-", "*", "/", "%", "^", "atan2", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless"]
_MODS = ["", "on(h)", "ignoring(g)", "on(h) group_left", "on(h) group_left(g, m)", "ignoring(g) group_right(m)",
         "on()", "on(h, g)", "ignoring(m, g) group_left"]


def _random_side(rng: random.Random, name: str, n_steps: int) -> QueryResult:
    series = []
    seen = set()
    for _ in range(rng.randint(0, 6)):
        lab = {"__name__": rng.choice([name, name, "other"]), "h": rng.choice("12"), "g": rng.choice("ab")}
        if rng.random() < 0.4:
            lab["m"] = rng.choice("xy")
        k = tuple(sorted(lab.items()))
        if k in seen:
            continue
        seen.add(k)
        pts = {i: rng.choice([0.0, 1.0, 2.0, -3.0, 2.5, NAN, INF]) for i in range(n_steps) if rng.random() < 0.6}
        if pts:
            series.append((lab, pts))
    series.sort(key=lambda s: tuple(sorted(s[0].items())))
    return mat(*series)


def _reference(n: Binary, lhs: QueryResult, rhs: QueryResult, n_steps: int) -> dict[Any, Any] | str:
    m = Matching.of(n)
    out: dict[Any, Any] = {}
    for st in range(n_steps):
        t = T0 + st * STEP
        lv = [(lab, v[ts.index(t)]) for lab, ts, v in lhs.to_pylist() if t in ts]
        rv = [(lab, v[ts.index(t)]) for lab, ts, v in rhs.to_pylist() if t in ts]
        if n.op in ("and", "or", "unless"):
            lsig = {m.signature(lab) for lab, _ in lv}
            rsig = {m.signature(lab) for lab, _ in rv}
            if n.op == "and":
                res = [(lab, v) for lab, v in lv if m.signature(lab) in rsig]
            elif n.op == "unless":
                res = [(lab, v) for lab, v in lv if m.signature(lab) not in rsig]
            else:
                res = lv + [(lab, v) for lab, v in rv if m.signature(lab) not in lsig]
        else:
            try:
                res = binop_step(n.op, n.return_bool, m, lv, rv)
            except EvalError as exc:
                return exc.message
        for lab, v in res:
            out.setdefault(tuple(sorted(lab.items())), {})[st] = v
    return out


def test_vectorised_path_equals_the_one_step_reference() -> None:
    rng = random.Random(20240601)
    checked = errors = 0
    for _ in range(1500):
        op = rng.choice(_OPS)
        mod = rng.choice(_MODS)
        if op in ("and", "or", "unless") and "group" in mod:
            mod = mod.split(" group")[0]
        bool_ = " bool" if op in ("==", "!=", ">", "<", ">=", "<=") and rng.random() < 0.4 else ""
        text = f"a {op}{bool_} {mod} b"
        n = node(text)
        n_steps = rng.randint(1, 4)
        lhs, rhs = _random_side(rng, "a", n_steps), _random_side(rng, "b", n_steps)
        want = _reference(n, lhs, rhs, n_steps)
        try:
            got: dict[Any, Any] | str = as_dict(evaluate_binary(n, lhs, rhs))  # type: ignore[arg-type]
        except EvalError as exc:
            got = exc.message
        if isinstance(want, str):
            errors += 1
            assert got == want, (text, lhs.to_pylist(), rhs.to_pylist())
            continue
        assert isinstance(got, dict) and got.keys() == want.keys(), (text, got, want)
        for k in want:
            assert got[k].keys() == want[k].keys(), (text, k)
            assert all(same(got[k][s], want[k][s]) for s in want[k]), (text, k, got[k], want[k])
        checked += 1
    assert checked > 500 and errors > 100  # both outcomes exercised


def test_instant_and_range_operands_do_not_mix() -> None:
    with pytest.raises(ValueError):
        evaluate_binary(node("a * scalar(b)"), vec((A, 1.0)), mat(({}, {0: 1.0, 1: 2.0})))
    with pytest.raises(ValueError):
        evaluate_binary(node("a * scalar(b)"), mat((A, {0: 1.0})), QueryResult.scalar(T0, 2.0))
