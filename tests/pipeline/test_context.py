"""RequestContext (proxy/pipeline/context.py): what a query carries down the path -- its
deadline from `timeout` capped by limits.query_timeout, its Budget of backend calls and new
cache entries, its SampleTally."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from proxy.backends.tenancy import Caller, Tenant
from proxy.config import load_config
from proxy.errors import PromError
from proxy.pipeline.context import Budget, RequestContext, SampleTally


def limits(**values: object) -> object:
    return load_config(None, backends=["http://x:1"], overrides={"limits": values}).limits


@pytest.mark.parametrize(("timeout_ms", "expected_s"), [
    (None, 30.0),  # no `timeout`: limits.query_timeout
    (0, 30.0),  # "0" is no timeout given
    (5_000, 5.0),  # shorter: the client's
    (90_000, 30.0),  # longer: capped
    (0.4, 0.001),  # under a millisecond: one
])
def test_start_caps_the_timeout_by_the_limit(timeout_ms: int | None, expected_s: float) -> None:
    lim = limits(query_timeout="30s")  # type: ignore[arg-type]
    before = time.monotonic()
    ctx = RequestContext.start(Caller(), lim, timeout_ms)  # type: ignore[arg-type]
    after = time.monotonic()
    assert ctx.timeout_s == pytest.approx(expected_s)
    assert before + expected_s <= ctx.deadline <= after + expected_s
    assert 0 < ctx.left() <= expected_s


def test_start_gives_each_query_its_own_allowances() -> None:
    lim = limits(max_backend_calls=7, max_new_cache_keys=3)
    caller = Caller(Tenant((("x-scope-orgid", "team-a"),), "team-a"))
    a = RequestContext.start(caller, lim)  # type: ignore[arg-type]
    b = RequestContext.start(caller, lim)  # type: ignore[arg-type]
    assert (a.budget.max_calls, a.budget.max_keys) == (7, 3)
    assert a.caller is caller and a.scope == "team-a"
    assert a.held is None and a.refused is None and a.explain is None
    a.budget.charge()
    a.samples.add(10)
    assert b.budget.calls == 0 and b.samples.samples == 0  # not shared between queries
    # A derived context (a stage adding to it) shares the query's budget and tally.
    derived = replace(a, explain=None)
    derived.budget.charge()
    derived.samples.add(5)
    assert a.budget.calls == 2 and a.samples.samples == 15


def test_an_empty_context_has_no_deadline_and_no_scope() -> None:
    ctx = RequestContext()
    assert ctx.left() == float("inf") and ctx.scope == ""
    assert ctx.budget.affords(10**9) and ctx.budget.new_key()


def test_budget_check_names_the_limit_and_charges_nothing() -> None:
    b = Budget(max_calls=3)
    b.check(3)
    assert b.calls == 0
    with pytest.raises(PromError) as err:
        b.check(4)
    assert err.value.status == 422 and "more than 3 backend calls" in err.value.message
    assert "limits.max_backend_calls" in err.value.message and b.calls == 0


def test_budget_charge_counts_up_to_the_limit_then_refuses() -> None:
    b = Budget(max_calls=2)
    b.charge()
    b.charge()
    assert b.calls == 2 and not b.affords(1) and b.affords(0)
    with pytest.raises(PromError, match="2 made, 1 more planned"):
        b.charge()
    assert b.calls == 2  # the refused call is not counted


def test_budget_try_charge_is_a_hedge_never_an_error() -> None:
    b = Budget(max_calls=2)
    b.charge()
    assert b.try_charge() and b.calls == 2
    assert not b.try_charge() and b.calls == 2


def test_budget_affords_what_is_left() -> None:
    b = Budget(max_calls=5)
    b.charge()
    b.charge()
    assert b.affords(3) and not b.affords(4)


def test_budget_zero_is_no_limit() -> None:
    b = Budget(0, 0)
    for _ in range(1000):
        b.charge()
        assert b.new_key()
    b.check(10**6)
    assert b.calls == 1000 and b.keys == 1000 and b.try_charge()


def test_budget_new_key_allows_max_keys_then_none() -> None:
    b = Budget(max_keys=2)
    assert [b.new_key() for _ in range(4)] == [True, True, False, False]
    assert b.keys == 2
    b.charge()  # calls are counted apart
    assert b.calls == 1 and b.keys == 2


def test_sample_tally_adds_up() -> None:
    t = SampleTally()
    assert t.samples == 0
    for n in (3, 0, 1_000_000):
        t.add(n)
    assert t.samples == 1_000_003
