"""The engine's function table (proxy/engine/kernels.py) against the planner's rows
(shardplanner/functions.py): every Prometheus 2.42 function has a kernel or a reason to be
evaluated elsewhere, every kernel has a row, and what the kernels derive from the rows
(range-function parameters, window codes) is consistent."""

from __future__ import annotations

from proxy.engine import window_codes
from proxy.engine.functions import INSTANT_FUNCTIONS, KERNELS
from proxy.engine.kernels import ELSEWHERE, TABLE
from proxy.engine.windows import PARAMS, RANGE_FUNCTIONS
from shardplanner.functions import FUNCTIONS


def test_every_242_function_has_a_kernel_or_a_reason() -> None:
    missing = sorted(set(FUNCTIONS) - set(TABLE) - set(ELSEWHERE))
    assert missing == [], f"2.42 functions with no kernel and no reason in ELSEWHERE: {missing}"
    assert not set(TABLE) & set(ELSEWHERE), "a function both has a kernel and is evaluated elsewhere"
    assert all(reason.strip() for reason in ELSEWHERE.values())


def test_every_kernel_has_a_row() -> None:
    assert sorted(set(TABLE) - set(FUNCTIONS)) == []
    assert sorted(set(ELSEWHERE) - set(FUNCTIONS)) == []
    for name, entry in TABLE.items():
        assert entry.row is FUNCTIONS[name] and entry.name == name


def test_kernel_kind_follows_the_row() -> None:
    """A row reading a range vector has a window kernel, any other an instant kernel."""
    for name, entry in TABLE.items():
        assert (entry.window is not None) == entry.row.is_range, name
        assert (entry.instant is not None) != entry.row.is_range, name
    assert INSTANT_FUNCTIONS == {n for n, e in TABLE.items() if e.instant is not None} == set(KERNELS)
    assert RANGE_FUNCTIONS == {n for n, e in TABLE.items() if e.window is not None}


def test_range_parameters_come_from_the_argument_types() -> None:
    for name in RANGE_FUNCTIONS:
        args = FUNCTIONS[name].args
        assert args.count("matrix") == 1
        assert PARAMS[name] == len(args) - 1 == args.count("scalar"), name
    # functions.go's signatures: quantile_over_time(s, m), predict_linear(m, s), holt_winters(m, s, s)
    assert {n: p for n, p in PARAMS.items() if p} == {"quantile_over_time": 1, "predict_linear": 1, "holt_winters": 2}


def test_window_codes_are_one_numbering() -> None:
    codes = window_codes.CODES
    assert sorted(codes.values()) == list(range(len(codes)))
    assert tuple(codes) == window_codes.WINDOW_FUNCTIONS
    for name, code in codes.items():
        assert getattr(window_codes, name.upper()) == code
    assert window_codes.SERIAL <= set(codes.values())
    # The kernels' range tests rely on this order (window_codes' comment).
    assert max(codes[n] for n in ("rate", "increase", "delta")) == window_codes.DELTA
    assert max(codes[n] for n in ("irate", "idelta")) == window_codes.IDELTA
    assert min(codes[n] for n in ("deriv", "predict_linear", "holt_winters")) == window_codes.DERIV
