"""Explain names the stores that hold nothing for a requested window (issue 30 item 5).

The case from the field: local holds node_* for its retention only, AMP holds DCGM_* only; a
node_* panel from before local's retention goes to local (the one store whose patterns name
node_*), whose answer is empty there: right, and without a warning, but explain said only
`single: local`. Over tests/hybrid.py's by_time local slice (data from T on) with a promaccel
whose config says so: explain of a window entirely before T names local as holding nothing and
says no store holds that time; the answer itself is empty and carries no warning, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from loadtests.gen import iso_utc
from loadtests.load import start_prometheus, stop_prometheus
from shardplanner.explain import unheld_reads
from shardplanner.holdings import BackendHolding
from shardplanner.promql import parse
from shardplanner.routing import route_piece
from tests.hybrid import HOUR, LOCAL_METRICS, SLICES, START, T, build_slice
from tests.servers import Promaccel, require, serving_copy

MIN_MS = 60_000


def test_unheld_reads_names_the_store_that_holds_nothing() -> None:
    """Pure: local holds node_* since T (ms), amp DCGM_* always."""
    t = 100 * 3_600_000
    holdings = [BackendHolding("local", ("node_.*",), since_ms=t, primary=True), BackendHolding("amp", ("DCGM_.*",))]
    expr = parse("sum(rate(node_load1[5m]))")
    before = route_piece(expr, t - 5 * 60 * MIN_MS, t - 60 * MIN_MS, holdings, step_ms=MIN_MS)
    assert (before.kind, before.backends) == ("single", ("local",))
    (u,) = unheld_reads(expr, before, holdings, t - 5 * 60 * MIN_MS, t - 60 * MIN_MS)
    assert (u["backend"], u["metric"], u["held_by"]) == ("local", "node_load1", [])
    assert (u["from_ms"], u["to_ms"]) == (t - 5 * 60 * MIN_MS - 5 * MIN_MS, t - 60 * MIN_MS)
    assert u["note"].startswith("no store holds node_load1 in ") and "local answers empty there" in u["note"]
    # Inside local's window: nothing to say. Straddling its start: local holds some of it.
    inside = route_piece(expr, t + 60 * MIN_MS, t + 120 * MIN_MS, holdings, step_ms=MIN_MS)
    assert unheld_reads(expr, inside, holdings, t + 60 * MIN_MS, t + 120 * MIN_MS) == []
    across = route_piece(expr, t - 60 * MIN_MS, t + 60 * MIN_MS, holdings, step_ms=MIN_MS)
    assert unheld_reads(expr, across, holdings, t - 60 * MIN_MS, t + 60 * MIN_MS) == []


@pytest.fixture(scope="module")
def retention_gap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    """promaccel over by_time's local slice (samples from T on): local holds node_*, kube_*,
    up since T; amp (never asked here) DCGM_* only."""
    require("promtool")
    require("prometheus")
    work = tmp_path_factory.mktemp("explain-unheld")
    (spec,) = [s for s in SLICES if (s.scenario, s.backend) == ("by_time", "local")]
    built, _ = build_slice(spec)
    prom = start_prometheus(str(serving_copy(built, work / "local")), log_path=str(work / "local.log"))
    url = prom.url  # type: ignore[attr-defined]
    cfg = work / "promaccel.yaml"
    cfg.write_text(f"""backends:
  - name: local
    url: {url}
    primary: true
    holds: {{metrics: {LOCAL_METRICS}, since: "{iso_utc(T)}"}}
  - name: amp
    url: {url}
    holds: {{metrics: ["DCGM_.*"]}}
""")
    proxy = None
    try:
        proxy = Promaccel.start(None, (), work, config=cfg)
        yield proxy
    finally:
        if proxy is not None:
            proxy.stop()
        stop_prometheus(prom)


@pytest.mark.prom
def test_explain_of_a_window_before_local_holds_says_no_store_holds_it(retention_gap: Promaccel) -> None:
    q = {"query": "avg(node_load1)", "start": str(START + 30 * 60), "end": str(T - HOUR), "step": "60"}
    explain = httpx.get(retention_gap.url + "/api/v1/explain", params=q, timeout=60).json()["data"]
    route = explain["route"]
    assert (route["kind"], route["backends"]) == ("single", ["local"])
    (u,) = route["unheld"]
    assert (u["backend"], u["metric"], u["held_by"]) == ("local", "node_load1", [])
    assert u["to_ms"] == (T - HOUR) * 1000
    assert any(n.startswith("no store holds node_load1 in ") and "local answers empty there" in n
               for n in route["notes"]), route["notes"]
    # The answer: empty (local has no samples there), and no warning, as before.
    answer = httpx.post(retention_gap.url + "/api/v1/query_range", data=q, timeout=60).json()
    assert answer["status"] == "success" and answer["data"]["result"] == []
    assert "warnings" not in answer
    # A window local holds: nothing unheld, and data.
    held = {**q, "start": str(T + HOUR), "end": str(T + 2 * HOUR)}
    explain = httpx.get(retention_gap.url + "/api/v1/explain", params=held, timeout=60).json()["data"]
    assert explain["route"]["unheld"] == [] and explain["route"]["backends"] == ["local"]
    answer = httpx.post(retention_gap.url + "/api/v1/query_range", data=held, timeout=60).json()
    assert answer["data"]["result"], answer


@pytest.mark.prom
def test_explain_of_an_instant_before_local_holds(retention_gap: Promaccel) -> None:
    q = {"query": "node_load1", "time": str(T - 2 * HOUR)}
    route = httpx.post(retention_gap.url + "/api/v1/explain", data=q, timeout=60).json()["data"]["route"]
    (u,) = route["unheld"]
    assert (u["backend"], u["from_ms"], u["to_ms"]) == ("local", (T - 2 * HOUR) * 1000 - 5 * MIN_MS,
                                                         (T - 2 * HOUR) * 1000)
