"""Routing pieces to the backends that hold what they read (shardplanner/routing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplanner.holdings import BackendHolding, holding_from_spec
from shardplanner.plan import Piece, Span
from shardplanner.promql import parse
from shardplanner.read_windows import reads
from shardplanner.routing import Route, TimePart, route, route_piece
from tests.shardplanner.times import MIGRATION, NOW, D, H, M, S

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"

# Stage 2: AMP holds DCGM_* and kube_* since the migration date; local everything, 15 d.
AMP = BackendHolding("amp", ("DCGM_.*", "kube_.*"), since_ms=MIGRATION)
LOCAL = BackendHolding("local", ("*",), since_ms=NOW - 15 * D, primary=True)
STAGE2 = (AMP, LOCAL)
# By time: AMP holds DCGM history until 6 h ago; local everything for the last 15 d.
AMP_OLD = BackendHolding("amp", ("DCGM_.*",), until_ms=NOW - 6 * H, primary=True)
STAGE_TIME = (AMP_OLD, LOCAL)


def shape(route: Route) -> tuple[object, ...]:
    """What the executor acts on (notes are for explain only)."""
    return (route.kind, route.backends, route.parts)


def single(name: str) -> Route:
    return Route("single", (name,))


def overlap(*names: str) -> Route:
    return Route("overlap", names)


# --- golden routes -------------------------------------------------------------------------

GOLDEN = [
    # (name, query, start, end, step, holdings, expected route)
    ("recent DCGM: migration overlap, primary first",
     "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", NOW - 6 * H, NOW, M, STAGE2,
     overlap("local", "amp")),
    ("recent node: only local",
     "sum by (instance) (rate(node_network_receive_bytes_total[5m]))", NOW - 6 * H, NOW, M,
     STAGE2, single("local")),
    ("old DCGM: only AMP", "avg(DCGM_FI_DEV_GPU_UTIL)", NOW - 40 * D, NOW - 30 * D, H, STAGE2,
     single("amp")),
    ("node past local retention: like Prometheus, local (nobody has older data)",
     "avg(node_load1)", NOW - 30 * D, NOW, H, STAGE2, single("local")),
    ("before everything: one backend, not a pointless overlap",
     "avg(DCGM_FI_DEV_GPU_UTIL)", NOW - 400 * D, NOW - 300 * D, D, STAGE2, single("local")),
    ("instant recent", "count(DCGM_FI_DEV_XID_ERRORS > 0)", NOW, NOW, None, STAGE2,
     overlap("local", "amp")),
    ("instant over 30d: only AMP holds the whole window",
     "max_over_time(DCGM_FI_DEV_GPU_TEMP[30d])", NOW, NOW, None, STAGE2, single("amp")),
    ("@ pins an old read to AMP", "DCGM_FI_DEV_GPU_UTIL @ 1793000000", NOW - H, NOW, M,
     STAGE2, single("amp")),
    ("offset 20d moves a recent panel to AMP", "DCGM_FI_DEV_GPU_UTIL offset 20d",
     NOW - H, NOW, M, STAGE2, single("amp")),
    ("join inside local's 15d", "avg(DCGM_FI_DEV_GPU_UTIL) / sum(node_load1)",
     NOW - 6 * H, NOW, M, STAGE2, single("local")),
    ("no selectors", "vector(1)", NOW - H, NOW, M, STAGE2, single("local")),
    ("regex name: only a '*' holder", '{__name__=~"DCGM_.*"}', NOW - H, NOW, M, STAGE2,
     single("local")),
    ("recent by-time split: local only", "rate(DCGM_FI_DEV_GPU_UTIL[5m])", NOW - H, NOW, M,
     STAGE_TIME, single("local")),
    ("middle: both hold it", "rate(DCGM_FI_DEV_GPU_UTIL[5m])", NOW - 2 * D, NOW - D, M,
     STAGE_TIME, overlap("amp", "local")),
    ("old: only amp", "rate(DCGM_FI_DEV_GPU_UTIL[5m])", NOW - 40 * D, NOW - 30 * D, H,
     STAGE_TIME, single("amp")),
    ("priority orders an overlap",
     "up", NOW - H, NOW, M,
     (BackendHolding("a", ("*",)), BackendHolding("b", ("*",), priority=5)),
     overlap("b", "a")),
]


@pytest.mark.parametrize(
    ("name", "query", "start", "end", "step", "holdings", "expected"), GOLDEN,
    ids=[g[0] for g in GOLDEN],
)
def test_golden_routes(
    name: str, query: str, start: int, end: int, step: int | None,
    holdings: tuple[BackendHolding, ...], expected: Route,
) -> None:
    assert shape(route_piece(query, start, end, holdings, step_ms=step)) == shape(expected)


def test_split_time_across_retention_edges() -> None:
    # 30 d of DCGM at 1 m, AMP until now-6h, local last 15 d: AMP alone, then both, then
    # local alone; every cut on the grid, each part's reads inside its backends' windows.
    start = NOW - 30 * D
    route = route_piece("rate(DCGM_FI_DEV_GPU_UTIL[5m])", start, NOW, STAGE_TIME, step_ms=M)
    assert route.kind == "split_time"
    assert route.backends == ("amp", "local")
    assert route.parts == (
        TimePart(start, NOW - 15 * D + 4 * M, ("amp",)),  # read window starts at the edge
        TimePart(NOW - 15 * D + 5 * M, NOW - 6 * H, ("amp", "local")),
        TimePart(NOW - 6 * H + M, NOW, ("local",)),
    )
    assert route.key().startswith("split:amp@")


def test_split_keeps_the_piece_grid() -> None:
    # A 7-minute grid with an offset start: cuts land on the grid.
    start = NOW - 2 * D + 13 * S
    route = route_piece("DCGM_FI_DEV_GPU_UTIL", start, NOW, STAGE_TIME, step_ms=7 * M)
    assert route.kind == "split_time"
    for part in route.parts:
        assert (part.start_ms - start) % (7 * M) == 0
        assert (part.end_ms - start) % (7 * M) == 0
    assert route.parts[-1].end_ms == start + ((NOW - start) // (7 * M)) * 7 * M


def test_same_timestamp_same_backends_whatever_the_piece() -> None:
    # The route of a timestamp does not depend on how the planner cut the range.
    q = "rate(DCGM_FI_DEV_GPU_UTIL[5m])"
    whole = route_piece(q, NOW - 30 * D, NOW, STAGE_TIME, step_ms=H)
    for t in range(NOW - 30 * D, NOW + 1, 7 * H):
        alone = route_piece(q, t, t, STAGE_TIME)
        part = next(p for p in whole.parts if p.start_ms <= t <= p.end_ms)
        assert alone.backends == part.backends


def test_route_a_planner_piece() -> None:
    q = "avg(DCGM_FI_DEV_GPU_UTIL)"
    rng = Piece(q, Span.range(NOW - H, NOW, M))
    assert route(rng, STAGE2) == route_piece(q, NOW - H, NOW, STAGE2, step_ms=M)
    assert route(Piece(q, Span.instant(NOW - 40 * D)), STAGE2).backends == ("amp",)
    # A parsed expression routes like its text (the planner parses once).
    assert route_piece(parse(q), NOW - H, NOW, STAGE2, step_ms=M) == route(rng, STAGE2)


def test_stage2_join_at_local_retention_edge_is_unroutable() -> None:
    # DCGM (AMP since the migration, local 15 d) joined with node_* (local only): steps in
    # the first 5 m of local's window need DCGM samples from before it (AMP) and node_*
    # from local. Exact evaluation needs both stores: 422, naming them. Steps away from the
    # edge route: AMP before (node_* exists nowhere there), local after.
    q = "avg(DCGM_FI_DEV_GPU_UTIL) / sum(node_load1)"
    edge = NOW - 15 * D
    hit = route_piece(q, edge - D, edge + D, STAGE2, step_ms=H)
    assert hit.kind == "unroutable"
    assert "evaluation time 2026-11-14T00:00:00Z" in hit.reason
    assert "DCGM_FI_DEV_GPU_UTIL in amp" in hit.reason
    assert "node_load1 in local" in hit.reason
    miss = route_piece(q, edge - D + 7 * M, edge + D, STAGE2, step_ms=H)
    assert miss.kind == "split_time"
    assert [p.backends for p in miss.parts] == [("amp",), ("local",)]


def test_route_once_then_restrict_to_each_piece() -> None:
    from shardplanner.timesplit import split_range

    q = "rate(DCGM_FI_DEV_GPU_UTIL[5m])"
    start, end, step = NOW - 30 * D + 30 * S, NOW, 5 * M
    whole = route_piece(q, start, end, STAGE_TIME, step_ms=step)
    for a, b in split_range(start, end, step, D):
        assert whole.restrict(a, b) == route_piece(q, a, b, STAGE_TIME, step_ms=step)
    assert single("amp").restrict(0, 1) == single("amp")
    with pytest.raises(ValueError):
        whole.restrict(end + step, end + 2 * step)


def test_constructors() -> None:
    assert Route.single("amp") == single("amp")
    assert Route.overlap(["local", "amp"]) == overlap("local", "amp")
    parts = [TimePart(0, 60, ("amp",)), TimePart(120, 180, ("amp", "local"))]
    assert Route.split_time(parts).backends == ("amp", "local")
    assert Route.unroutable("why").reason == "why"
    assert Route.single("amp").key() == "single:amp"
    assert Route.split_time(parts).key() == "split:amp@0-60,amp+local@120-180"


def test_several_holdings_of_one_backend_are_unioned() -> None:
    hs = (
        BackendHolding("amp", ("DCGM_.*",), since_ms=MIGRATION, until_ms=NOW - 10 * D),
        BackendHolding("amp", ("DCGM_.*",), since_ms=NOW - 10 * D + 1),
        BackendHolding("local", ("node_.*",)),
    )
    assert route_piece("rate(DCGM_x[1h])", NOW - 20 * D, NOW, hs, step_ms=H) == single("amp")


# --- unroutable ----------------------------------------------------------------------------


def test_join_across_stores_names_metrics_backends_operator_and_times() -> None:
    hs = (
        BackendHolding("amp", ("DCGM_.*",), primary=True),
        BackendHolding("local", ("node_.*",), since_ms=NOW - 15 * D),
    )
    q = ("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) / on(Hostname) "
         "sum by (Hostname) (rate(node_network_receive_bytes_total[5m]))")
    route = route_piece(q, NOW - 6 * H, NOW, hs, step_ms=M)
    assert route.kind == "unroutable"
    assert route.operator == 'operator "/"'
    assert [(p.metrics, p.backends) for p in route.placements] == [
        (("DCGM_FI_DEV_GPU_UTIL",), ("amp",)),
        (("node_network_receive_bytes_total",), ("local",)),
    ]
    msg = route.reason
    for needle in ("DCGM_FI_DEV_GPU_UTIL in amp", "node_network_receive_bytes_total in local",
                   'operator "/"', "2026-11-28T18:00:00Z", "avg by (Hostname)"):
        assert needle in msg, (needle, msg)
    with pytest.raises(ValueError):
        _ = route.backend


def test_join_is_found_below_routable_context() -> None:
    hs = (BackendHolding("amp", ("DCGM_.*",)), BackendHolding("local", ("node_.*",)))
    q = "sum(rate(DCGM_x[5m]) * on(h) group_left node_y) > 3"
    route = route_piece(q, NOW, NOW, hs)
    assert route.operator == 'operator "*"'
    assert [p.backends for p in route.placements] == [("amp",), ("local",)]


def test_unheld_metric_is_a_config_gap_not_an_empty_answer() -> None:
    hs = (BackendHolding("amp", ("DCGM_.*", "kube_.*")), BackendHolding("local", ("node_.*",)))
    route = route_piece("sum(up) + sum(DCGM_x)", NOW - H, NOW, hs, step_ms=M)
    assert route.kind == "unroutable"
    assert "no backend holds metric up" in route.reason
    assert "amp holds DCGM_.*, kube_.*" in route.reason and "local holds node_.*" in route.reason
    nameless = route_piece('{__name__=~"DCGM_.*"}', NOW - H, NOW, hs, step_ms=M)
    assert nameless.kind == "unroutable" and '"*"' in nameless.reason


def test_disjoint_windows_leave_boundary_steps_unroutable() -> None:
    hs = (
        BackendHolding("amp", ("*",), until_ms=NOW - 6 * H),
        BackendHolding("local", ("*",), since_ms=NOW - 6 * H + 1),
    )
    route = route_piece("rate(x[5m])", NOW - D, NOW, hs, step_ms=M)
    assert route.kind == "unroutable"
    assert "2026-11-28T18:01:00Z..2026-11-28T18:05:00Z" in route.reason  # the straddling steps
    assert "amp holds * until 2026-11-28T18:00:00Z" in route.reason
    assert "local holds * since 2026-11-28T18:00:00.001Z" in route.reason
    # Away from the boundary each side routes.
    assert route_piece("rate(x[5m])", NOW - D, NOW - 7 * H, hs, step_ms=M) == single("amp")
    assert route_piece("rate(x[5m])", NOW - 5 * H, NOW, hs, step_ms=M) == single("local")


def test_unparsable_query_needs_a_star_holder() -> None:
    route = route_piece('up{a="\\x80"}', NOW - H, NOW, STAGE2, step_ms=M)
    assert route.kind == "single" and route.backends == ("local",)
    assert route.notes and "not parsed" in route.notes[0]
    only_amp = (BackendHolding("amp", ("DCGM_.*",)),)
    assert route_piece("sum(", NOW, NOW, only_amp).kind == "unroutable"


def test_route_piece_argument_checks() -> None:
    with pytest.raises(ValueError):
        route_piece("x", 0, H, STAGE2)  # range piece without a step
    with pytest.raises(ValueError):
        route_piece("x", H, 0, STAGE2, step_ms=M)
    with pytest.raises(ValueError):
        route_piece("x", 0, H, (), step_ms=M)


# --- config examples -----------------------------------------------------------------------

STAGES = sorted(EXAMPLES.glob("stage*.yaml"))


def _holdings(path: Path) -> tuple[BackendHolding, ...]:
    data = yaml.safe_load(path.read_text())
    return tuple(
        holding_from_spec(b["name"], b.get("holds"), NOW, primary=bool(b.get("primary")))
        for b in data["backends"]
    )


def test_three_stages_exist() -> None:
    assert [p.name for p in STAGES] == [
        "stage1-local-only.yaml", "stage2-dcgm-to-amp.yaml", "stage3-amp-primary.yaml",
    ]


@pytest.mark.parametrize("path", STAGES, ids=lambda p: p.name)
def test_example_backends_follow_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    names = set()
    for b in data["backends"]:
        assert set(b) <= {"name", "kind", "url", "region", "holds", "primary", "max_parallel"}
        assert b["kind"] in ("prometheus", "amp")
        assert set(b.get("holds") or {}) <= {"metrics", "since", "until", "last"}
        names.add(b["name"])
    assert len(names) == len(data["backends"])
    assert sum(bool(b.get("primary")) for b in data["backends"]) == 1
    _holdings(path)  # every window resolves


@pytest.mark.parametrize(
    ("stage", "query", "days_ago", "expected"),
    [
        ("stage1-local-only.yaml", "avg(DCGM_FI_DEV_GPU_UTIL)", 1, single("local")),
        ("stage1-local-only.yaml", "avg(DCGM_FI_DEV_GPU_UTIL)", 40, single("local")),
        ("stage2-dcgm-to-amp.yaml", "avg(DCGM_FI_DEV_GPU_UTIL)", 1, overlap("local", "amp")),
        ("stage2-dcgm-to-amp.yaml", "avg(DCGM_FI_DEV_GPU_UTIL)", 40, single("amp")),
        ("stage2-dcgm-to-amp.yaml", "sum(kube_pod_status_phase)", 40, single("amp")),
        ("stage2-dcgm-to-amp.yaml", "sum(rate(node_cpu_seconds_total[5m]))", 1, single("local")),
        ("stage3-amp-primary.yaml", "avg(DCGM_FI_DEV_GPU_UTIL)", 1, single("amp")),
        ("stage3-amp-primary.yaml", "sum(rate(node_cpu_seconds_total[5m]))", 1,
         overlap("amp", "local")),
        ("stage3-amp-primary.yaml", "sum(rate(node_cpu_seconds_total[5m]))", 40, single("amp")),
    ],
)
def test_stage_routes(stage: str, query: str, days_ago: int, expected: Route) -> None:
    hs = _holdings(EXAMPLES / stage)
    t = NOW - days_ago * D
    assert shape(route_piece(query, t - H, t, hs, step_ms=M)) == shape(expected)


# --- properties ----------------------------------------------------------------------------

QUERIES = [
    "a_x",
    "rate(a_x[10m])",
    "a_x offset 20m",
    "a_x offset -7m",
    "max_over_time(a_x[30m:1m])",
    "a_x / on(h) b_y",
    "sum(rate(b_y[3m])) + a_x @ 5400",
    '{__name__=~"a_.*"}',
    "vector(1)",
]
PATTERNS = [("*",), ("a_.*",), ("b_.*",), ("a_.*", "b_.*")]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[BackendHolding, ...]:
    n = draw(st.integers(1, 3))
    out = []
    for i in range(n):
        since = draw(st.none() | st.integers(0, 12 * H))
        until = draw(st.none() | st.integers(since or 0, 14 * H))
        out.append(BackendHolding(
            f"b{i}", draw(st.sampled_from(PATTERNS)), since, until,
            primary=draw(st.booleans()), priority=draw(st.integers(0, 2)),
        ))
    return tuple(out)


def _ref_clip(
    m: str | None, lo: int, hi: int, hs: tuple[BackendHolding, ...]
) -> tuple[int, int] | None:
    """The part of [lo, hi] where anybody holds `m` (its hull), or None."""
    spans = [
        (max(lo, h.since_ms if h.since_ms is not None else lo),
         min(hi, h.until_ms if h.until_ms is not None else hi))
        for h in hs if h.holds_metric(m) or m is None
    ]
    spans = [(a, b) for a, b in spans if a <= b]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None


def _ref_serving(query: str, t: int, hs: tuple[BackendHolding, ...]) -> set[str]:
    """Per-timestamp serving set, straight from the definition."""
    needed = [(m, _ref_clip(m, lo, hi, hs)) for m, lo, hi in reads(query, t, t)]
    if all(clip is None for _, clip in needed):
        return {"<any one>"}
    return {
        h.name for h in hs
        if all(
            clip is None or (
                h.holds_metric(m)
                and (h.since_ms is None or h.since_ms <= clip[0])
                and (h.until_ms is None or clip[1] <= h.until_ms)
            )
            for m, clip in needed
        )
    }


def _any_vacuous(query: str, p: TimePart, step: int, hs: tuple[BackendHolding, ...]) -> bool:
    return any(
        all(_ref_clip(m, lo, hi, hs) is None for m, lo, hi in reads(query, t, t))
        for t in range(p.start_ms, p.end_ms + 1, step)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hs=fleets(),
    query=st.sampled_from(QUERIES),
    start=st.integers(0, 14 * H),
    step=st.sampled_from([M, 5 * M, 7 * M, 13 * M + 7]),
    n=st.integers(0, 120),
    tail=st.integers(0, 60_000),
)
def test_routes_match_the_per_timestamp_definition(
    hs: tuple[BackendHolding, ...], query: str, start: int, step: int, n: int, tail: int,
) -> None:
    end = start + n * step + min(tail, step - 1)
    route = route_piece(query, start, end, hs, step_ms=step)
    grid = list(range(start, start + n * step + 1, step))
    unheld = any(
        not any(h.holds_metric(m) for h in hs) for m, _, _ in reads(query, start, end)
    )
    if route.kind == "unroutable":
        assert route.reason.startswith("cannot route")
        assert unheld or any(not _ref_serving(query, t, hs) for t in grid)
        return
    assert not unheld
    parts = route.parts or (TimePart(start, grid[-1], route.backends),)
    # The parts cover the grid exactly once, in order, on the grid.
    covered = [t for p in parts for t in range(p.start_ms, p.end_ms + 1, step)]
    assert covered == grid
    assert all(a.end_ms + step == b.start_ms for a, b in zip(parts, parts[1:]))
    assert all(a.backends != b.backends for a, b in zip(parts, parts[1:]))
    by_name = {h.name: h for h in hs}
    for p in parts:
        # The read window of each of the part's evaluation times (where anybody holds the
        # data at all) lies inside each of the part's backends' windows. (Checked per grid
        # point: the continuum between two steps is never read.)
        for name in p.backends:
            h = by_name[name]
            for t in range(p.start_ms, p.end_ms + 1, step):
                clips = [_ref_clip(m, lo, hi, hs) for m, lo, hi in reads(query, t, t)]
                if all(c is None for c in clips):
                    continue  # nobody holds anything it reads: any one backend will do
                for (m, _, _), clip in zip(reads(query, t, t), clips):
                    if clip is not None:
                        assert h.holds_metric(m)
                        assert h.since_ms is None or h.since_ms <= clip[0]
                        assert h.until_ms is None or clip[1] <= h.until_ms
        # With steps no longer than the shortest read span the per-step windows touch, so
        # the part's whole read window (its hull, where anybody holds data) fits too.
        # (A part holding a step that reads nothing anybody holds is exempt.)
        if step <= 3 * M and not _any_vacuous(query, p, step, hs):
            for name in p.backends:
                h = by_name[name]
                for m, lo, hi in reads(query, p.start_ms, p.end_ms):
                    clip = _ref_clip(m, lo, hi, hs)
                    if clip is not None:
                        assert h.holds_metric(m)
                        assert h.since_ms is None or h.since_ms <= clip[0]
                        assert h.until_ms is None or clip[1] <= h.until_ms
        # Every grid point of the part has exactly the part's backends.
        for t in range(p.start_ms, p.end_ms + 1, step):
            ref = _ref_serving(query, t, hs)
            if ref == {"<any one>"}:
                assert len(p.backends) == 1
            else:
                assert set(p.backends) == ref
