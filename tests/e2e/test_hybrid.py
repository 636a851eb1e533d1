"""Hybrid equivalence: promaccel over two backends that each hold a slice of the CI fleet
(tests/hybrid.py: `by_time`, `by_metric`, `overlap`, the "amp" one behind the SigV4-verifying
AMP endpoint) answers exactly what one Prometheus holding everything (`prom`) answers.

1. Fixture sanity (independent of promaccel): each slice backend holds exactly its slice,
   sample for sample per metric and window; the AMP endpoints front the amp slices; the
   promaccel configs resolve to the intended holdings.
2. The equivalence corpus (tests/corpus.py), range and instant, per scenario, at times that
   cross T and T+30m (`by_time`) and the two outages (`overlap`). Where the routing rules
   (shardplanner/routing.py) find no backend that holds everything a timestamp reads (a read
   window straddling the two backends of `by_time`, a join across the stores of
   `by_metric`), promaccel evaluates the query itself and answers right, except for the cases
   listed in KNOWN_LIMITS (each a limit the README documents), which must answer 422; a
   listed case answered otherwise fails until the list is updated.
3. Joins across the stores of `by_metric` (DCGM_* in amp against node_*/kube_* in local): equal.
4. Faults: amp down -> a Prometheus warning naming it, and nothing partial cached (a second
   query after the restart gets full data); amp throttling 30% of calls -> answers still right.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest
from botocore.credentials import Credentials

from loadtests.amp_endpoint import TEST_ACCESS_KEY, TEST_SECRET_KEY
from loadtests.compare import DATA, diff_answers, values_close
from proxy.backends.sigv4 import CredentialSource, SigV4Signer
from proxy.config import build_config
from shardplanner.routing import route_piece
from tests.corpus import QUERIES
from tests.equivalence import TALLY, compare_case
from tests.hybrid import (
    AMP_OUTAGE,
    BY_TIME_AMP_UNTIL,
    END,
    HOUR,
    LOCAL_OUTAGE,
    MIN,
    OVERLAP_SINCE,
    REGION,
    SCENARIOS,
    SLICES,
    START,
    Scenario,
    SliceServer,
    SliceSpec,
    T,
)

pytestmark = pytest.mark.prom

TIMEOUT = 180

# The README's documented limits of cross-store evaluation ("Hybrid fleets": what cannot be
# answered exactly gets a 422 naming the metrics, the backends and the operator).
STRADDLE = "a range window that starts in one store and ends in another"
NO_BACKEND = "a metric no backend names"

# The only cases where promaccel answers 422 and Prometheus answers: (scenario, case, "range" or
# "instant") -> the documented limit. At every window the routing rules find unroutable such
# a case must answer that 422 (strict: once promaccel answers it, the test fails until the
# entry is removed); everywhere else, and for every case not listed, Prometheus's answer.
KNOWN_LIMITS: dict[tuple[str, str, str], str] = {
}

# Range windows: the long one crosses both outages (overlap) and the whole fleet (by_metric);
# the short one (odd step) crosses by_time's three parts: amp only, both, local only.
LONG = {"start": str(START + HOUR + 17), "end": str(END - 30 * MIN), "step": "60"}
NEAR_T = {"start": str(T - 50 * MIN + 7), "end": str(T + 70 * MIN), "step": "45"}
RANGES: dict[str, list[dict[str, str]]] = {
    "by_time": [NEAR_T],  # crosses T and T+30m at an odd step
    "by_metric": [LONG],
    "overlap": [LONG],  # LONG crosses both outages
    "both": [NEAR_T],
}
INSTANTS: dict[str, list[int]] = {
    # both (T+5m..T+30m); local only (amp only: the range's first part)
    "by_time": [T + 10 * MIN + 11, BY_TIME_AMP_UNTIL + 15 * MIN + 3],
    "by_metric": [T + 11],  # routing by metric does not depend on time
    # inside local's outage; inside amp's outage
    "overlap": [(LOCAL_OUTAGE[0] + LOCAL_OUTAGE[1]) // 2 + 11, (AMP_OUTAGE[0] + AMP_OUTAGE[1]) // 2 + 11],
    "both": [T + 10 * MIN + 11, BY_TIME_AMP_UNTIL + 15 * MIN + 3],
}

_reference: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, bytes]] = {}


def reference(prom_url: str, path: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """Prometheus's own answer (one call per distinct request per session)."""
    key = (path, tuple(sorted(params.items())))
    if key not in _reference:
        r = httpx.post(prom_url + path, data=params, timeout=TIMEOUT)
        _reference[key] = (r.status_code, r.content)
    status, body = _reference[key]
    return status, orjson.loads(body)


def holdings(scenario: Scenario) -> list[Any]:
    cfg = build_config(scenario.config)
    now_ms = int(time.time() * 1000)
    return [h for b in cfg.backends for h in b.holdings(now_ms)]


def route_kind(scenario: Scenario, query: str, params: dict[str, str]) -> str:
    hs = holdings(scenario)
    if "time" in params:
        t = int(float(params["time"]) * 1000)
        return route_piece(query, t, t, hs).kind
    start, end = int(float(params["start"]) * 1000), int(float(params["end"]) * 1000)
    return route_piece(query, start, end, hs, step_ms=int(float(params["step"]) * 1000)).kind


def check(prom: Any, scenario: Scenario, path: str, params: dict[str, str], name: str,
          *, allow_unroutable: bool = True) -> bool:
    """promaccel's answer is Prometheus's, or (a KNOWN_LIMITS case at an unroutable window) the
    documented 422. True when it was that 422."""
    status, direct = reference(prom.url, path, params)
    r = httpx.post(scenario.proxy.url + path, data=params, timeout=TIMEOUT)
    kind = route_kind(scenario, params["query"], params)
    where = (scenario.name, name, path, params, f"route={kind}")
    limit = KNOWN_LIMITS.get((scenario.name, name, "instant" if path.endswith("/query") else "range"))
    if allow_unroutable and limit is not None and kind == "unroutable":
        assert r.status_code == 422, (*where, f"listed in KNOWN_LIMITS ({limit}) but answered now: "
                                      "update KNOWN_LIMITS", r.status_code, r.text[:300])
        body = r.json()
        assert body.get("status") == "error" and body.get("errorType"), (*where, r.text[:500])
        assert "amp" in body.get("error", "") or "local" in body.get("error", ""), (*where, r.text[:500])
        TALLY[("hybrid", "known_limit_422")] += 1
        return True
    proxied = orjson.loads(r.content)
    problems = compare_case("hybrid", name, params["query"], path, status, direct, r.status_code, proxied)
    assert problems == [], (*where, problems[:5], r.text[:300] if problems else "")
    assert not proxied.get("warnings"), (*where, proxied.get("warnings"))
    return False


def _check_windows(prom: Any, scenario: Scenario, path: str, params: list[dict[str, str]], name: str) -> None:
    limited = [check(prom, scenario, path, p, name) for p in params]
    key = (scenario.name, name, "instant" if path.endswith("/query") else "range")
    if key in KNOWN_LIMITS:
        assert any(limited), (key, "listed in KNOWN_LIMITS but never unroutable or refused: update KNOWN_LIMITS")


# --- 1. fixture sanity: runs now, without routing in promaccel -----------------------------


def _count(url: str, metric: str, a: int, b: int) -> int:
    """Samples of `metric` with integer timestamps in [a, b): evaluated at b - 0.5 s over
    (b - a) s, the window [a - 0.5, b - 0.5] holds exactly those."""
    params = {"query": f"sum(count_over_time({metric}[{b - a}s]))", "time": f"{b - 1}.5"}
    r = httpx.post(url + "/api/v1/query", data=params, timeout=60)
    assert r.status_code == 200, r.text
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _names(url: str) -> list[str]:
    # over the fleet's window, and not its own series: the reference Prometheus also scrapes
    # itself (job "prometheus", at the wall clock), and without a matcher the names of its
    # head block can come back whatever the window (seen once on a fresh CI machine)
    r = httpx.get(url + "/api/v1/label/__name__/values",
                  params={"start": str(START - HOUR), "end": str(END + HOUR),
                          "match[]": '{__name__=~".+", job!="prometheus"}'}, timeout=30)
    assert r.status_code == 200
    return list(r.json()["data"])


@pytest.mark.parametrize("spec", SLICES, ids=[f"{s.scenario}-{s.backend}" for s in SLICES])
def test_slice_holds_exactly_its_part(prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer],
                                      spec: SliceSpec) -> None:
    server = hybrid_slices[spec.key]
    ref_names = _names(prom.url)
    assert len(ref_names) >= 15 and "up" in ref_names and "DCGM_FI_DEV_GPU_UTIL" in ref_names
    held = {n: w for n in ref_names if (w := _held_windows(spec.select, n))}
    assert sorted(_names(server.url)) == sorted(held)
    total_ref = total_slice = 0
    for name in ref_names:
        whole = _count(server.url, name, START - HOUR, END + HOUR)
        if name not in held:
            assert whole == 0, name
            continue
        windows = held[name]
        parts = [(_count(prom.url, name, a, b), _count(server.url, name, a, b)) for a, b in windows]
        for (want, got), w in zip(parts, windows):
            assert got == want, (name, w)
        # nothing outside its windows (outages included)
        assert whole == sum(want for want, _ in parts), name
        total_ref += sum(want for want, _ in parts)
        total_slice += whole
    assert total_slice == total_ref == server.manifest["samples"] > 0


def _held_windows(select: Any, name: str) -> list[tuple[int, int]]:
    """The [from, to) windows in which a slice holds metric `name` (none: not at all)."""
    if select.union:
        return [w for u in select.union for w in _held_windows(u, name)]
    keep = select.keep()
    if keep is not None and not keep(name):
        return []
    return list(select.windows or ((START, END),))


def test_slices_partition_and_overlap_as_designed(prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer]) -> None:
    ref_total = sum(_count(prom.url, n, START - HOUR, END + HOUR) for n in _names(prom.url))
    m = {k: s.manifest["samples"] for k, s in hybrid_slices.items()}
    # by_metric: a partition of everything
    assert m[("by_metric", "amp")] + m[("by_metric", "local")] == ref_total
    # by_time: everything, with [T, T+30m] held twice
    both = sum(_count(prom.url, n, T, BY_TIME_AMP_UNTIL + 1) for n in _names(prom.url))
    assert both > 0 and m[("by_time", "amp")] + m[("by_time", "local")] == ref_total + both
    # overlap: each outage is a real hole, far from the other one
    gpu = "DCGM_FI_DEV_GPU_UTIL"
    loc, amp = hybrid_slices[("overlap", "local")].url, hybrid_slices[("overlap", "amp")].url
    assert _count(loc, gpu, *LOCAL_OUTAGE) == 0 < _count(amp, gpu, *LOCAL_OUTAGE) == _count(prom.url, gpu, *LOCAL_OUTAGE)
    assert _count(amp, gpu, *AMP_OUTAGE) == 0 < _count(loc, gpu, *AMP_OUTAGE) == _count(prom.url, gpu, *AMP_OUTAGE)
    assert AMP_OUTAGE[0] - LOCAL_OUTAGE[1] >= 75 * MIN and LOCAL_OUTAGE[0] >= OVERLAP_SINCE + 10 * MIN
    assert m[("overlap", "amp")] < ref_total
    # both: everything, with DCGM_* in [T, T+30m] held twice
    dcgm = [n for n in _names(prom.url) if n.startswith("DCGM_")]
    twice = sum(_count(prom.url, n, T, BY_TIME_AMP_UNTIL + 1) for n in dcgm)
    assert twice > 0 and m[("both", "amp")] + m[("both", "local")] == ref_total + twice


def _signed_post(url: str, params: dict[str, str]) -> httpx.Response:
    signer = SigV4Signer(REGION, "aps", CredentialSource(credentials=Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY)))
    body = str(httpx.QueryParams(params)).encode()
    signed = signer.sign("POST", url, [("host", url.split("/")[2])], body)
    return httpx.post(signed.url, content=body, timeout=60,
                      headers={**dict(signed.headers), "content-type": "application/x-www-form-urlencoded"})


@pytest.mark.parametrize("name", SCENARIOS)
def test_amp_endpoint_fronts_the_amp_slice(hybrid: dict[str, Scenario], name: str) -> None:
    scenario = hybrid[name]
    params = {"query": "count by (__name__) ({__name__=~\".+\"})", "time": str(T + 20 * MIN)}
    direct = httpx.post(scenario.amp_slice.url + "/api/v1/query", data=params, timeout=60)
    via = _signed_post(scenario.amp.workspace + "/api/v1/query", params)
    assert via.status_code == direct.status_code == 200, via.text
    assert diff_answers(direct.json(), via.json()) == []
    assert direct.json()["data"]["result"]
    unsigned = httpx.post(scenario.amp.workspace + "/api/v1/query", data=params, timeout=60)
    assert unsigned.status_code == 403


def test_promaccel_configs_hold_what_the_slices_hold(hybrid: dict[str, Scenario]) -> None:
    s = {n: {h.name: h for h in holdings(hybrid[n])} for n in SCENARIOS}
    ms = 1000
    assert s["by_time"]["amp"].until_ms == BY_TIME_AMP_UNTIL * ms and s["by_time"]["amp"].since_ms is None
    assert s["by_time"]["local"].since_ms == T * ms and s["by_time"]["local"].until_ms is None
    assert s["by_metric"]["amp"].metrics == ("DCGM_.*",)
    assert s["by_metric"]["local"].metrics == ("node_.*", "kube_.*", "up")
    assert not s["by_metric"]["local"].holds_metric("DCGM_FI_DEV_GPU_UTIL")
    assert s["by_metric"]["local"].holds_metric("up") and not s["by_metric"]["local"].holds_metric("upx")
    assert s["overlap"]["local"].since_ms == OVERLAP_SINCE * ms and s["overlap"]["local"].primary
    assert s["overlap"]["amp"].metrics == ("*",) and s["overlap"]["amp"].since_ms is None
    for n in SCENARIOS:
        assert [b["name"] for b in hybrid[n].config["backends"]] == ["local", "amp"]
        assert hybrid[n].config["backends"][0]["primary"] is True
    # the routing rules agree: a DCGM panel in by_metric goes to amp alone, a node one to local
    assert route_kind(hybrid["by_metric"], "avg(DCGM_FI_DEV_GPU_UTIL)", {"time": str(T)}) == "single"
    assert route_kind(hybrid["by_time"], "sum(up)", {"time": str(T + 10 * MIN)}) == "overlap"
    assert route_kind(hybrid["by_time"], "sum(up)", {**LONG, "query": "sum(up)"}) == "split_time"


# --- 2. the corpus, per scenario ----------------------------------------------------------


CASES = [(s, q) for s in SCENARIOS for q in sorted(QUERIES)]
IDS = [f"{s}-{q}" for s, q in CASES]


@pytest.mark.parametrize(("scenario", "name"), CASES, ids=IDS)
def test_range(prom: Any, hybrid: dict[str, Scenario], scenario: str, name: str) -> None:
    _check_windows(prom, hybrid[scenario], "/api/v1/query_range",
                   [{"query": QUERIES[name], **window} for window in RANGES[scenario]], name)


@pytest.mark.parametrize(("scenario", "name"), CASES, ids=IDS)
def test_instant(prom: Any, hybrid: dict[str, Scenario], scenario: str, name: str) -> None:
    _check_windows(prom, hybrid[scenario], "/api/v1/query",
                   [{"query": QUERIES[name], "time": str(t)} for t in INSTANTS[scenario]], name)


# --- 3. joins across the stores (by_metric: DCGM_* in amp, node_*/kube_*/up in local) -------


JOINS = {
    "util_with_net_rx": (
        "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) * on (Hostname) group_left "
        'label_replace(sum by (instance) (rate(node_network_receive_bytes_total[5m])), '
        '"Hostname", "$1", "instance", "(.+):9100")'
    ),
    "power_per_allocatable_gpu": (
        "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE) / on (Hostname) "
        'label_replace(kube_node_status_allocatable{resource="nvidia_com_gpu"}, "Hostname", "$1", "node", "(.+)")'
    ),
    "gpus_per_running_ns": (
        'count by (namespace) (DCGM_FI_DEV_GPU_UTIL) * on (namespace) group_left '
        'count by (namespace) (kube_pod_status_phase{phase="Running"} == 1)'
    ),
    "util_and_load": (
        "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) and on (Hostname) "
        'label_replace(node_load1 > 1, "Hostname", "$1", "instance", "(.+):9100")'
    ),
    "gpus_unless_node_down": (
        "DCGM_FI_DEV_GPU_TEMP unless on (Hostname) "
        'label_replace(up{job="node-exporter"} == 0, "Hostname", "$1", "instance", "(.+):9100")'
    ),
    "ratio_of_sums": "sum(DCGM_FI_DEV_POWER_USAGE) / sum(node_load1)",
}


@pytest.mark.parametrize("name", sorted(JOINS))
def test_join_across_stores(prom: Any, hybrid: dict[str, Scenario], name: str) -> None:
    scenario = hybrid["by_metric"]
    assert route_kind(scenario, JOINS[name], {"time": str(T)}) == "unroutable"  # needs both stores
    for window in RANGES["by_metric"]:
        check(prom, scenario, "/api/v1/query_range", {"query": JOINS[name], **window}, name, allow_unroutable=False)
    for t in INSTANTS["by_metric"]:
        check(prom, scenario, "/api/v1/query", {"query": JOINS[name], "time": str(t)}, name, allow_unroutable=False)


def test_join_reference_answers_are_not_empty(prom: Any) -> None:
    """The joins select something in the reference (a join of nothing proves nothing)."""
    for name, q in JOINS.items():
        status, body = reference(prom.url, "/api/v1/query_range", {"query": q, **LONG})
        assert status == 200 and body["data"]["result"], name


# --- 3b. windows that straddle the stores at every step ---------------------------------------

# [T+35m, T+2h]: a 3 h window ends after amp stops (T+30m) and starts before local starts (T),
# so no step of these panels is held by one store: every step is evaluated by promaccel from
# both stores' raw samples (or, for a subquery, from its inner expression on its own grid).
EVERY_STEP = {"start": str(BY_TIME_AMP_UNTIL + 5 * MIN + 7), "end": str(T + 2 * HOUR), "step": "53"}
STRADDLING = {
    "increase_3h": "sum by (Hostname) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h]))",
    "rate_3h_offset": "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\"}[3h] offset 5m)",
    "avg_over_time_3h": "avg_over_time(DCGM_FI_DEV_GPU_UTIL{gpu=\"1\"}[3h])",
    "quantile_over_time_3h": "quantile_over_time(0.9, DCGM_FI_DEV_GPU_TEMP{gpu=\"2\"}[3h])",
    "changes_resets_3h": "changes(DCGM_FI_DEV_GPU_UTIL{gpu=\"3\"}[3h]) + resets(DCGM_FI_DEV_XID_ERRORS[3h])",
    "deriv_3h": "deriv(DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"}[3h])",
    "subquery_3h": "max_over_time(avg(DCGM_FI_DEV_GPU_UTIL)[3h:2m])",
    "absent_over_time_3h": "absent_over_time(DCGM_FI_DEV_GPU_UTIL{gpu=\"9\"}[3h])",
    "join_3h": "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h])) / sum(avg_over_time(node_load1[3h]))",
}


@pytest.mark.parametrize("scenario", ["by_time", "both"])
@pytest.mark.parametrize("name", sorted(STRADDLING))
def test_windows_straddling_at_every_step(prom: Any, hybrid: dict[str, Scenario], scenario: str, name: str) -> None:
    sc = hybrid[scenario]
    query = STRADDLING[name]
    assert route_kind(sc, query, {**EVERY_STEP, "query": query}) == "unroutable"
    for params in ({"query": query, **EVERY_STEP}, {"query": query, "time": str(T + 100 * MIN + 11)}):
        path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
        status, direct = reference(prom.url, path, params)
        for _ in ("cold", "warm"):
            r = httpx.post(sc.proxy.url + path, data=params, timeout=TIMEOUT)
            problems = compare_case("hybrid", name, query, path, status, direct, r.status_code,
                                    orjson.loads(r.content), expect=DATA)
            assert problems == [], (scenario, name, path, problems[:5], r.text[:300])


# --- 4. faults ----------------------------------------------------------------------------


DOWN = {
    # across T: amp alone holds the first part, local the rest; an instant only amp holds
    "by_time": ({"start": str(T - 2 * HOUR + 13), "end": str(T + 2 * HOUR), "step": "60"}, T - HOUR + 7),
    # whole hours both hold (the cache fetches whole hours: 20:00-20:05 is amp's alone), from
    # inside local's outage (until 21:25): local answers, with a hole
    "overlap": ({"start": str(T + 13), "end": str(END - 5 * MIN), "step": "60"}, LOCAL_OUTAGE[1] + 50 * MIN + 7),
}


@pytest.mark.parametrize("amp_down", sorted(DOWN), indirect=True)
def test_amp_down_warns_and_caches_nothing_partial(prom: Any, amp_down: Scenario) -> None:
    scenario = amp_down
    window, instant = DOWN[scenario.name]
    q = "sum by (namespace) (DCGM_FI_DEV_POWER_USAGE)"
    params = {"query": q, **window}
    _, direct = reference(prom.url, "/api/v1/query_range", params)
    r = httpx.post(scenario.proxy.url + "/api/v1/query_range", data=params, timeout=TIMEOUT)
    assert r.status_code == 200, r.text[:500]
    partial = r.json()
    warnings = partial.get("warnings") or []
    assert any("amp" in w for w in warnings), warnings
    # what it returned is local's data: right where local's data is complete (not next to
    # local's own outage, whose gaps amp would have filled), and some of the reference is missing
    complete_from = LOCAL_OUTAGE[1] + 10 * MIN if scenario.name == "overlap" else T
    ref = {tuple(sorted(s["metric"].items())): dict(map(tuple, s["values"])) for s in direct["data"]["result"]}
    got = 0
    for s in partial["data"]["result"]:
        want = ref.get(tuple(sorted(s["metric"].items())))
        assert want is not None, s["metric"]
        for t, v in s["values"]:
            assert t >= complete_from or scenario.name == "overlap", (s["metric"], t)
            assert t < complete_from or (t in want and values_close(want[t], v)), (s["metric"], t, v, want.get(t))
            got += 1
    assert 0 < got < sum(map(len, ref.values()))
    inst = {"query": q, "time": str(instant)}
    ri = httpx.post(scenario.proxy.url + "/api/v1/query", data=inst, timeout=TIMEOUT)
    if scenario.name == "by_time":
        # Only amp holds that instant: nothing to answer with, so the error says who is missing.
        assert ri.status_code == 503 and "amp" in ri.json()["error"], ri.text[:500]
    else:
        assert ri.status_code == 200 and any("amp" in w for w in ri.json().get("warnings") or []), ri.text[:500]

    scenario.amp.restart()
    check(prom, scenario, "/api/v1/query_range", params, "amp_down_after_restart", allow_unroutable=False)
    check(prom, scenario, "/api/v1/query", inst, "amp_down_after_restart", allow_unroutable=False)
    # the cache is in play (so a cached partial piece would have shown above): the full
    # answer's pieces are served from it now
    for _ in range(10):
        again = httpx.post(scenario.proxy.url + "/api/v1/query_range", data=params, timeout=TIMEOUT)
        if again.headers.get("X-Cache") == "HIT":
            break
        time.sleep(0.3)
    assert again.headers.get("X-Cache") == "HIT", dict(again.headers)
    assert diff_answers(direct, again.json()) == []


THROTTLED = [
    "util_by_node", "fb_used_by_namespace", "temp_top10", "power_total", "xid_count", "nvlink_by_node",
    "energy_increase", "net_rx_by_instance", "pod_phases", "avg_by_ns_host", "raw_selector", "rate",
]


def test_throttled_amp_still_answers_right(prom: Any, hybrid_throttled: Scenario) -> None:
    scenario = hybrid_throttled
    scenario.amp.reset()
    queries = {n: QUERIES[n] for n in THROTTLED} | JOINS
    for name, q in sorted(queries.items()):
        check(prom, scenario, "/api/v1/query_range", {"query": q, **LONG}, name, allow_unroutable=name not in JOINS)
        check(prom, scenario, "/api/v1/query", {"query": q, "time": str(T + 11)}, name,
              allow_unroutable=name not in JOINS)
    stats = scenario.amp.stats()
    assert stats["rejected"] == {}
    assert stats["throttled"] >= 0.15 * stats["requests"] > 0, stats
    assert set(stats["by_status"]) <= {"200", "429"}, stats


@pytest.mark.prom
@pytest.mark.parametrize("query", ["sum(rate(DCGM_FI_DEV_GPU_UTIL[5m])", "rate(node_load1)", "up{a=~\"(\"}"])
def test_an_invalid_query_gets_prometheus_error(prom: Any, hybrid: dict[str, Scenario], query: str) -> None:
    """A query the planner cannot read gets Prometheus's own error -- 400 bad_data, its exact
    text -- in every hybrid scenario, not a 422 about routing."""
    form = {"query": query, "time": str(END - 600)}
    direct = httpx.post(prom.url + "/api/v1/query", data=form, timeout=30)
    assert direct.status_code == 400 and direct.json()["errorType"] == "bad_data"
    for scenario in hybrid.values():
        proxied = httpx.post(scenario.proxy.url + "/api/v1/query", data=form, timeout=30)
        assert (proxied.status_code, proxied.json()) == (direct.status_code, direct.json()), scenario.name
