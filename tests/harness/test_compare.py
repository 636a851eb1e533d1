"""loadtests.compare, the comparison every equivalence suite uses: what it tells apart."""

from __future__ import annotations

from typing import Any

from loadtests.compare import (
    DATA,
    EMPTY,
    Expect,
    Order,
    answer_kind,
    check_reference,
    diff_answers,
    error,
    instant_order,
)
from tests.corpus import EXPECT, QUERIES
from tests.equivalence import TALLY, compare_case, report


def vec(*series: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": m, "value": [1.5, v]} for m, v in series]}}


def err(error_type: str, text: str) -> dict[str, Any]:
    return {"status": "error", "errorType": error_type, "error": text}


def test_answer_kinds() -> None:
    assert answer_kind(vec()) == "empty"
    assert answer_kind(vec(({"a": "1"}, "2"))) == "data"
    assert answer_kind({"status": "success", "data": {"resultType": "matrix", "result": []}}) == "empty"
    assert answer_kind({"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}) == "data"
    assert answer_kind(err("bad_data", "x")) == "error"


def test_a_case_expecting_data_fails_on_an_empty_or_error_reference() -> None:
    assert check_reference(vec(({"a": "1"}, "2")), DATA) == []
    assert "empty" in check_reference(vec(), DATA)[0]
    assert "error" in check_reference(err("execution", "boom"), DATA)[0]
    assert check_reference(vec(), EMPTY) == []
    assert check_reference(vec(({"a": "1"}, "2")), EMPTY) != []
    want = error("execution", "multiple matches")
    assert check_reference(err("execution", "multiple matches for labels"), want) == []
    assert check_reference(err("bad_data", "multiple matches for labels"), want) != []
    assert check_reference(err("execution", "found duplicate series"), want) != []


def test_errors_compare_by_type_and_text() -> None:
    a = err("execution", "multiple matches for labels: grouping labels must ensure unique matches")
    assert diff_answers(a, dict(a)) == []
    assert diff_answers(a, {**a, "error": "something else"}) != []
    assert diff_answers(a, {**a, "errorType": "internal"}) != []


def test_instant_order_per_group_with_equal_values_permuted() -> None:
    assert instant_order("sort_desc(sum by (a) (x))") == Order()
    assert instant_order("(topk by (g) (2, x))") == Order(("g",))
    assert instant_order("bottomk without (i) (1, x)") == Order(("i",), True)
    assert instant_order("sum(topk(2, x))") is None and instant_order("x{") is None
    order = Order(("g",))
    a1, a2, b1 = ({"g": "a", "i": "1"}, "5"), ({"g": "a", "i": "2"}, "3"), ({"g": "b", "i": "1"}, "9")
    direct = vec(a1, a2, b1)
    assert diff_answers(direct, vec(b1, a1, a2), order=order) == []  # groups in another order
    assert diff_answers(direct, vec(a2, a1, b1), order=order) != []  # a group's values reversed
    ties = vec(({"g": "a", "i": "1"}, "5"), ({"g": "a", "i": "2"}, "5"))
    assert diff_answers(ties, vec(*reversed([(s["metric"], s["value"][1]) for s in ties["data"]["result"]])),
                        order=order) == []
    # without (i): the group is every other label but the name
    w = Order(("i",), True)
    assert w.group({"__name__": "x", "g": "a", "i": "1"}) == w.group({"g": "a", "i": "2"})


def test_compare_case_checks_status_expectation_and_tallies() -> None:
    before = dict(TALLY)
    good = vec(({"a": "1"}, "2"))
    assert compare_case("unit", "sum_all", "sum(x)", "/api/v1/query", 200, good, 200, good) == []
    assert compare_case("unit", "sum_all", "sum(x)", "/api/v1/query", 200, good, 503, good) != []
    assert compare_case("unit", "sum_all", "sum(x)", "/api/v1/query", 200, vec(), 200, vec()) != []
    assert compare_case("unit", "absent_present", "absent(x)", "/api/v1/query", 200, vec(), 200, vec()) == []
    assert TALLY[("unit", "data")] - before.get(("unit", "data"), 0) == 2
    assert TALLY[("unit", "violation")] - before.get(("unit", "violation"), 0) == 1
    lines = report(TALLY)
    assert lines[0].split()[:4] == ["suite", "data", "empty", "error"] and any(line.startswith("unit") for line in lines)
    for k in [k for k in TALLY if k[0] == "unit"]:
        del TALLY[k]


def test_every_expectation_names_a_corpus_case() -> None:
    assert set(EXPECT) <= set(QUERIES)
    assert all(isinstance(e, Expect) or set(e) == {"instant", "range"} for e in EXPECT.values())
