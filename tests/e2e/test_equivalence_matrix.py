"""The equivalence matrix: every corpus query at shards {1, 2, 4, 8, 16} x split
{none, 1h, 6h}, range and instant, through promaccel and directly — equal answers
(relative tolerance 1e-9 only where re-aggregation reorders float sums).

One promaccel per configuration; direct answers are fetched once per query and reused."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import orjson
import pytest

from tests.corpus import QUERIES
from tests.equivalence import compare_case

pytestmark = pytest.mark.prom

SHARDS = (1, 2, 4, 8, 16)
SPLITS = ("none", "1h", "6h")
CONFIGS = [(s, sp) for s in SHARDS for sp in SPLITS]


@functools.cache
def _direct(url: str, path: str, form: tuple[tuple[str, str], ...]) -> tuple[int, bytes]:
    r = httpx.post(url + path, data=dict(form), timeout=120)
    return r.status_code, r.content


@pytest.mark.parametrize("shards, split", CONFIGS, ids=[f"shards{s}-split{sp}" for s, sp in CONFIGS])
def test_matrix(prom: Any, proxies: Any, shards: int, split: str) -> None:
    server = proxies.get("--split-interval", split, "--shards", str(shards))
    end = prom.end_s
    cases = [
        ("/api/v1/query_range", (("start", str(end - 5 * 3600 - 13)), ("end", str(end - 600)), ("step", "120"))),
        ("/api/v1/query", (("time", str(end - 2 * 3600 - 29)),)),
    ]
    failures: list[str] = []
    with httpx.Client(timeout=120) as client:
        for name, query in sorted(QUERIES.items()):
            for path, window in cases:
                form = (("query", query), *window)
                status, direct = _direct(prom.url, path, form)
                proxied = client.post(server.url + path, data=dict(form))
                problems = compare_case("matrix", name, query, path, status, orjson.loads(direct),
                                        proxied.status_code, orjson.loads(proxied.content))
                if problems:
                    failures.append(f"{name} {path}: {problems[:2]}")
    assert not failures, f"{len(failures)} mismatches at shards={shards} split={split}:\n" + "\n".join(failures[:20])
