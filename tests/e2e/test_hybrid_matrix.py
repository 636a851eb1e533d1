"""Exact hybrid evaluation across the planner's settings: the fleet split three ways
(tests/hybrid.py: `by_time`, in time with an overlap; `by_metric`, DCGM_* in AMP and the rest
local; `both`, DCGM_* moved to AMP, which holds it until T+30m, while the local Prometheus
holds node_*, kube_*, up always and DCGM_* since T), AMP throttling 20% of its calls, and
promaccel at shards {1, 8} x time split {none, 1h}. The whole corpus (tests/corpus.py), over
each scenario's range and instants (tests/e2e/test_hybrid.py: across T and T+30m at an odd
step; the whole fleet for by_metric), cold and then warm (cache in play), must equal one
Prometheus holding everything (`prom`). One test per scenario and setting (conftest splits the
file per test across workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.corpus import QUERIES
from tests.e2e.test_hybrid import INSTANTS, RANGES, reference
from tests.equivalence import compare_case
from tests.hybrid import AmpProcess, SliceServer, aws_env, promaccel_config
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

TIMEOUT = 180
SETTINGS = {  # name -> promaccel flags
    "shards1-nosplit": ("--split-interval", "none", "--shards", "1"),
    "shards1-split1h": ("--split-interval", "1h", "--shards", "1"),
    "shards8-nosplit": ("--split-interval", "none", "--shards", "8"),
    "shards8-split1h": ("--split-interval", "1h", "--shards", "8"),
}


SCENARIOS = ("by_time", "by_metric", "both")


@pytest.fixture(scope="module")
def matrix(request: pytest.FixtureRequest, prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AmpProcess, dict[str, Promaccel]]]:
    scenario = request.param
    work = tmp_path_factory.mktemp(f"hybrid-matrix-{scenario}")
    local, amp_slice = hybrid_slices[(scenario, "local")], hybrid_slices[(scenario, "amp")]
    amp = AmpProcess.start(amp_slice.url, work, "--throttle-ratio", "0.2", "--retry-after", "0", "--seed", "11")
    proxies: dict[str, Promaccel] = {}
    try:
        cfg = promaccel_config(scenario, local.url, amp.workspace)
        path = work / f"{scenario}.yaml"
        path.write_text(orjson.dumps(cfg).decode())  # JSON is YAML
        for name, flags in SETTINGS.items():
            proxies[name] = Promaccel.start(None, flags, work / name, config=path, env=aws_env())
        yield amp, proxies
    finally:
        for p in proxies.values():
            p.stop()
        amp.stop()


def _requests(scenario: str, query: str) -> list[tuple[str, dict[str, str]]]:
    out = [("/api/v1/query_range", {"query": query, **w}) for w in RANGES[scenario]]
    out += [("/api/v1/query", {"query": query, "time": str(t)}) for t in INSTANTS[scenario]]
    return out


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("matrix", SCENARIOS, indirect=True)
def test_corpus_matches_at_every_setting_cold_and_warm(prom: Any, matrix: tuple[AmpProcess, dict[str, Promaccel]],
                                                       setting: str, request: pytest.FixtureRequest) -> None:
    scenario = request.node.callspec.params["matrix"]
    amp, proxies = matrix
    proxy = proxies[setting]
    problems: list[Any] = []
    warm_hits = 0
    with httpx.Client(timeout=TIMEOUT) as client:
        for rnd in ("cold", "warm"):
            for name, query in sorted(QUERIES.items()):
                for path, params in _requests(scenario, query):
                    status, direct = reference(prom.url, path, params)
                    r = client.post(proxy.url + path, data=params)
                    got = compare_case("hybrid_matrix", name, query, path, status, direct, r.status_code,
                                       orjson.loads(r.content))
                    if got or orjson.loads(r.content).get("warnings"):
                        problems.append((rnd, name, path, params, got[:3], r.text[:200]))
                    warm_hits += rnd == "warm" and r.headers.get("X-Cache") == "HIT"
    assert problems == [], problems[:5]
    assert warm_hits >= len(QUERIES) // 2, warm_hits  # the warm round was answered from the cache
    stats = amp.stats()
    assert stats["throttled"] >= 0.1 * stats["requests"] > 0, stats  # the throttling was real
