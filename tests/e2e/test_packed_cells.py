"""Cells kept packed (`cache.pack_min_samples`, issue 15) against real Prometheus and real
Redis: with every cell packed -- fetched cells as they go to the cache, cached cells as they
are read -- every corpus query answers as Prometheus does, cold and warm, sharded or not, and
the cells were indeed packed (the counter says how many, fetched and read)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.pipeline.landing import LANDING_GRACE_S
from tests.corpus import QUERIES
from tests.equivalence import response_problems
from tests.servers import Promaccel

pytestmark = pytest.mark.prom


def _packed(url: str, how: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf'^promaccel_cells_packed_total\{{how="{how}"\}} ([0-9.e+]+)$', text, re.M))


@pytest.fixture(scope="module", params=[1, 4], ids=["shards1", "shards4"])
def proxy(request: Any, prom: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    shards = request.param
    workdir = tmp_path_factory.mktemp("packed")
    config = workdir / "packed.yaml"
    db = 4 + shards // 4  # 4 and 5: their own databases
    config.write_text(f"cache:\n  redis_url: {redis_server.url.rsplit('/', 1)[0]}/{db}\n  pack_min_samples: 1\n")
    p = Promaccel.start(prom.url, ("--split-interval", "1h", "--shards", str(shards)), workdir, config=config)
    yield p
    p.stop()


def test_packed_cells_answer_as_prometheus_cold_and_warm(prom: Any, proxy: Promaccel) -> None:
    end = prom.end_s
    # Five hours off the hour, a step that divides neither an hour nor a day.
    form_base = {"start": str(end - 5 * 3600 + 7), "end": str(end - 60), "step": "47"}
    failures: list[str] = []
    fetched0, read0 = _packed(proxy.url, "fetched"), _packed(proxy.url, "read")
    with httpx.Client(timeout=120) as client:
        direct = {name: client.post(prom.url + "/api/v1/query_range", data={"query": q, **form_base})
                  for name, q in sorted(QUERIES.items())}
        # Cold, warm (from the landing zone, where fetched cells wait for their put), and warm
        # again once they have left it (read from Redis).
        for round_ in ("cold", "warm", "stored"):
            if round_ == "stored":
                time.sleep(LANDING_GRACE_S + 0.5)
            for name, query in sorted(QUERIES.items()):
                proxied = client.post(proxy.url + "/api/v1/query_range", data={"query": query, **form_base})
                problems = response_problems(direct[name], proxied)
                if problems:
                    failures.append(f"{name} {round_}: {problems[:2]}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])
    # Cells were packed on the way to the cache and read back packed.
    assert _packed(proxy.url, "fetched") > fetched0
    assert _packed(proxy.url, "read") > read0
