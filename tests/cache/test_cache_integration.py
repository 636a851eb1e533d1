"""The results cache end to end: real Prometheus, real Redis, promaccel over HTTP.

- every corpus query cold then warm: equal to Prometheus both times, and the warm answer is
  served without a single backend call (X-Cache: HIT);
- a sliding window asks the backend only for what is newer than the last cached boundary;
- faults: Redis stopped mid-run, corrupt and colliding values planted under real keys;
- request coalescing: 20 concurrent identical cold requests cost one request's calls;
- late data: a second Prometheus with backfilled samples swapped in behind the same URL is
  served right after POST /api/v1/admin/cache/invalidate, and by itself after a
  revalidation pass;
- the in-process default cache (no Redis) and instant queries.

Backend calls are counted from promaccel's own /metrics (promaccel_backend_requests_total,
query endpoints only) and their time ranges read from its `promaccel.fetch` log lines (DEBUG).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from loadtests.compare import diff_answers
from proxy.cache import CacheKey, encode_value
from proxy.config import ConfigError, build_config
from shardplanner.plan import Span
from tests.corpus import QUERIES
from tests.equivalence import compare_case
from tests.servers import Promaccel, RedisServer, free_port

pytestmark = [pytest.mark.prom, pytest.mark.redis]

H = 3600
QUERY_ENDPOINTS = ('endpoint="/api/v1/query"', 'endpoint="/api/v1/query_range"')
FETCH_LINE = re.compile(r"fetch (/api/v1/query(?:_range)?) start_ms=(\S+) end_ms=(\S+) step_ms=(\S+)")
ADMIN_TOKEN = "s3cret-admin-token"


# --- helpers -------------------------------------------------------------------------------

# One pooled client for the module: a new httpx client per call costs ~40 ms.
HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module", autouse=True)
def _close_client() -> Iterator[None]:
    yield
    HTTP.close()


def backend_calls(proxy: Promaccel) -> int:
    text = HTTP.get(proxy.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("promaccel_backend_requests_total{") and any(e in line for e in QUERY_ENDPOINTS):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def metric(proxy: Promaccel, name: str, label: str = "") -> float:
    text = HTTP.get(proxy.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and label in line and not line.startswith("#"))


class FetchLog:
    """The `promaccel.fetch` lines a promaccel wrote since the last call."""

    def __init__(self, proxy: Promaccel) -> None:
        self.path = proxy.log
        self.offset = self.path.stat().st_size

    def new(self) -> list[tuple[str, int | None, int | None, int | None]]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
            self.offset = f.tell()
        out = []
        for m in FETCH_LINE.finditer(text):
            path, *nums = m.groups()
            a, b, c = (None if x == "None" else int(x) for x in nums)
            out.append((path, a, b, c))
        return out


def post(url: str, path: str, params: dict[str, str], **kw: Any) -> httpx.Response:
    return HTTP.post(url + path, data=params, **kw)


def assert_same(direct: httpx.Response, proxied: httpx.Response, what: Any) -> None:
    assert proxied.status_code == direct.status_code, (what, proxied.text[:300])
    problems = diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content))
    assert problems == [], (what, problems[:5])


def db_url(server: RedisServer, db: int) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{db}"


class Launcher:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: list[Promaccel] = []

    def __call__(self, backend_url: str, *args: str, config: dict[str, Any] | None = None) -> Promaccel:
        extra: tuple[str, ...] = ()
        if config is not None:
            path = self.workdir / f"config-{len(self.running)}.yaml"
            path.write_text(yaml.safe_dump({"backends": [{"url": backend_url}], **config}))
            extra = ("--config", str(path))
        proxy = Promaccel.start(backend_url, (*extra, "--log-level", "debug", *args), self.workdir)
        self.running.append(proxy)
        return proxy

    def stop_all(self) -> None:
        for p in self.running:
            p.stop()


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("cache-integration"))
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="module")
def cached(prom: Any, redis_server: RedisServer, launch: Launcher) -> Promaccel:
    """promaccel with Redis (db 1), 1h split, no shards."""
    redis.Redis.from_url(db_url(redis_server, 1)).flushdb()
    return launch(prom.url, "--redis", db_url(redis_server, 1), "--split-interval", "1h")


@pytest.fixture(scope="module")
def cached_sharded(prom: Any, redis_server: RedisServer, launch: Launcher) -> Promaccel:
    """promaccel with Redis (db 2), 1h split, 4 node shards."""
    redis.Redis.from_url(db_url(redis_server, 2)).flushdb()
    return launch(prom.url, "--redis", db_url(redis_server, 2), "--split-interval", "1h", "--shards", "4")


# --- cold then warm: the whole corpus --------------------------------------------------------

# Queries whose warm run still calls the backend, and why.
NOT_CACHED: dict[str, str] = {}


def _window(prom: Any) -> dict[str, str]:
    # Partial cells at both edges (start and end are not on an interval's first/last point).
    end = prom.end_s
    return {"start": str(end - 5 * H + 617), "end": str(end - 1183), "step": "60"}


def _same_case(name: str, path: str, params: dict[str, str], direct: httpx.Response,
               proxied: httpx.Response, what: str) -> None:
    problems = compare_case("cache_integration", name, params["query"], path, direct.status_code,
                            orjson.loads(direct.content), proxied.status_code, orjson.loads(proxied.content))
    assert problems == [], (name, what, problems[:5])


def _cold_warm(prom: Any, proxy: Promaccel, name: str, path: str, params: dict[str, str]) -> None:
    direct = post(prom.url, path, params)
    cold = post(proxy.url, path, params)
    _same_case(name, path, params, direct, cold, "cold")
    if direct.status_code != 200 or orjson.loads(direct.content).get("warnings"):
        return  # errors and partial answers are never cached
    time.sleep(0.05)  # let the background put start; the landing zone covers the rest
    before = backend_calls(proxy)
    warm = post(proxy.url, path, params)
    calls = backend_calls(proxy) - before
    _same_case(name, path, params, direct, warm, "warm")
    if name in NOT_CACHED:
        return
    assert warm.headers.get("X-Cache") == "HIT", (name, warm.headers.get("X-Cache"))
    assert calls == 0, (name, calls)
    assert cold.content == warm.content or path.endswith("query"), name


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_corpus_range_cold_then_warm(prom: Any, cached: Promaccel, name: str) -> None:
    _cold_warm(prom, cached, name, "/api/v1/query_range", {"query": QUERIES[name], **_window(prom)})


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_corpus_instant_cold_then_warm(prom: Any, cached: Promaccel, name: str) -> None:
    params = {"query": QUERIES[name], "time": str(prom.end_s - 2 * H + 7)}
    _cold_warm(prom, cached, name, "/api/v1/query", params)


@pytest.mark.parametrize("name", ["util_by_namespace", "temp_top10", "power_total", "xid_count",
                                  "net_rx_by_instance", "fb_used_by_namespace"])
def test_sharded_cold_then_warm(prom: Any, cached_sharded: Promaccel, name: str) -> None:
    _cold_warm(prom, cached_sharded, name, "/api/v1/query_range", {"query": QUERIES[name], **_window(prom)})


def test_partial_hit_and_explain(prom: Any, cached: Promaccel) -> None:
    q = "max by (Hostname) (DCGM_FI_DEV_SM_CLOCK)"
    end = prom.end_s
    first = {"query": q, "start": str(end - 4 * H), "end": str(end - 2 * H), "step": "30"}
    post(cached.url, "/api/v1/query_range", first)
    wider = {"query": q, "start": str(end - 4 * H), "end": str(end - H), "step": "30"}
    log = FetchLog(cached)
    r = post(cached.url, "/api/v1/query_range", wider)
    assert r.headers["X-Cache"] == "PARTIAL"
    assert_same(post(prom.url, "/api/v1/query_range", wider), r, "wider")
    fetched = log.new()
    assert fetched and all(a is not None and a >= (end - 2 * H) * 1000 for _, a, _, _ in fetched), fetched
    ex = HTTP.get(cached.url + "/api/v1/explain", params=wider, timeout=30).json()["data"]
    assert ex["cache"]["hits"] == ex["piece_count"] and ex["fetches"] == 0
    assert {p["cache"] for p in ex["pieces"]} == {"hit"}


def test_fine_step_edges_are_not_extended_past_the_point_limit(prom: Any, cached: Promaccel) -> None:
    # 30 min at 0.2 s crosses an hour boundary: a whole 1h cell would be 18,000 steps, more
    # than one backend call may ask for, so the edge pieces are fetched as asked.
    mid = (prom.end_s - 2 * H) // H * H
    params = {"query": "max(DCGM_FI_DEV_GPU_TEMP)", "start": str(mid - 900), "end": str(mid + 900), "step": "0.2"}
    for _ in range(2):
        assert_same(post(prom.url, "/api/v1/query_range", params), post(cached.url, "/api/v1/query_range", params),
                    "fine step")


def test_stats_parameter_is_forwarded_not_cached(prom: Any, cached: Promaccel) -> None:
    params = {"query": "sum(DCGM_FI_DEV_GPU_TEMP)", "time": str(prom.end_s - H), "stats": "all"}
    for _ in range(2):
        r = post(cached.url, "/api/v1/query", params)
        assert r.status_code == 200 and "stats" in r.json()["data"]
        assert r.headers["X-Cache"] == "MISS"


# --- sliding window ------------------------------------------------------------------------


@pytest.mark.parametrize("step, move", [(30, 30), (60, 60), (15, 30)], ids=["step30_move30", "step60_move60",
                                                                           "step15_move30"])
def test_sliding_window_fetches_only_what_is_new(prom: Any, redis_server: RedisServer, launch: Launcher,
                                                  step: int, move: int) -> None:
    # Make "now" fall inside the data: everything newer than data end - 1h is recent.
    now = time.time()
    boundary_s = prom.end_s - H + 600
    freshness = int(now - boundary_s)
    db = {30: 3, 60: 4, 15: 5}[step]
    redis.Redis.from_url(db_url(redis_server, db)).flushdb()
    proxy = launch(prom.url, "--split-interval", "1h",
                   config={"cache": {"redis_url": db_url(redis_server, db), "max_freshness": freshness}})
    q = "sum by (namespace) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]))"
    end0 = (prom.end_s - 20 * 60) // step * step
    log = FetchLog(proxy)
    for i in range(4):
        end = end0 + i * move
        params = {"query": q, "start": str(end - 5 * H), "end": str(end), "step": str(step)}
        before = backend_calls(proxy)
        r = post(proxy.url, "/api/v1/query_range", params)
        assert_same(post(prom.url, "/api/v1/query_range", params), r, ("slide", i))
        fetched = log.new()
        calls = backend_calls(proxy) - before
        assert calls == len(fetched)
        if i == 0:
            assert r.headers["X-Cache"] == "MISS"
            continue
        # Cells that end before the freshness boundary were cached by the first refresh
        # (the head's partial cell too, fetched whole); only the cell holding the boundary
        # and later ones are asked for again.
        last_cached_boundary = ((int(now) - freshness) // H) * H * 1000
        assert r.headers["X-Cache"] == "PARTIAL", i
        assert fetched, i
        for path, a, _b, st in fetched:
            assert path == "/api/v1/query_range" and st == step * 1000
            assert a is not None and a >= last_cached_boundary, (i, a, last_cached_boundary)
        assert len(fetched) <= 2


def test_recent_ttl_caches_the_live_edge_briefly(prom: Any, redis_server: RedisServer, launch: Launcher) -> None:
    now = time.time()
    freshness = int(now - (prom.end_s - H))  # the last hour of data is "recent"
    url = db_url(redis_server, 12)
    redis.Redis.from_url(url).flushdb()
    proxy = launch(prom.url, "--split-interval", "1h",
                   config={"cache": {"redis_url": url, "max_freshness": freshness, "recent_ttl": 3}})
    end = prom.end_s - 600
    params = {"query": "sum(DCGM_FI_DEV_FB_USED)", "start": str(end - 3 * H), "end": str(end), "step": "30"}
    direct = post(prom.url, "/api/v1/query_range", params)
    assert_same(direct, post(proxy.url, "/api/v1/query_range", params), "cold")
    time.sleep(0.3)
    before = backend_calls(proxy)
    r = post(proxy.url, "/api/v1/query_range", params)  # a storm of identical refreshes
    assert r.headers["X-Cache"] == "HIT" and backend_calls(proxy) == before
    time.sleep(6)  # recent_ttl and the in-process grace have passed: the live edge is asked again
    r = post(proxy.url, "/api/v1/query_range", params)
    assert_same(direct, r, "after recent_ttl")
    assert r.headers["X-Cache"] == "PARTIAL" and backend_calls(proxy) == before + 1


def test_sliding_window_over_old_data_needs_no_backend_after_the_first(prom: Any, cached: Promaccel) -> None:
    q = "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)"
    base = prom.end_s - 30 * 60
    log = FetchLog(cached)
    for i in range(5):
        end = base + 30 * i
        params = {"query": q, "start": str(end - 5 * H), "end": str(end), "step": "30"}
        r = post(cached.url, "/api/v1/query_range", params)
        assert_same(post(prom.url, "/api/v1/query_range", params), r, ("old slide", i))
        fetched = log.new()
        if i == 0:
            # edge pieces were fetched for their whole cell: at most one extra cell each
            spans = sum(((b - a) // 30_000 + 1) for _, a, b, _ in fetched if a is not None and b is not None)
            assert spans <= (5 * H) // 30 + 1 + 2 * (H // 30)
        else:
            assert fetched == [], (i, fetched)
            assert r.headers["X-Cache"] == "HIT"


# --- faults --------------------------------------------------------------------------------


def _entry_keys(r: redis.Redis) -> list[bytes]:
    return [k for k in r.scan_iter(match="promaccel:v1:g*:*", count=1000)
            if re.fullmatch(rb"promaccel:v1:g\d+:[0-9a-f]{64}", k)]


def test_redis_stopped_mid_run(prom: Any, launch: Launcher, tmp_path: Path) -> None:
    server = RedisServer.start(tmp_path / "redis-doomed")
    try:
        proxy = launch(prom.url, "--redis", server.url, "--split-interval", "1h")
        end = prom.end_s
        params = {"query": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)", "start": str(end - 4 * H),
                  "end": str(end - H), "step": "60"}
        direct = post(prom.url, "/api/v1/query_range", params)
        assert_same(direct, post(proxy.url, "/api/v1/query_range", params), "before")
        time.sleep(0.3)
        assert post(proxy.url, "/api/v1/query_range", params).headers["X-Cache"] == "HIT"
    finally:
        server.stop()
    # Redis gone: answers still right (from the backend, or for a few seconds from pieces
    # this process fetched just now).
    for i in range(3):
        assert_same(direct, post(proxy.url, "/api/v1/query_range", params), ("redis down", i))
    other = {**params, "query": "count(DCGM_FI_DEV_GPU_TEMP > 60)"}
    assert_same(post(prom.url, "/api/v1/query_range", other), post(proxy.url, "/api/v1/query_range", other),
                "redis down, new query")
    assert metric(proxy, "promaccel_cache_errors_total") + metric(proxy, "promaccel_cache_bypassed_total") > 0


def test_corrupt_value_under_a_real_key(prom: Any, redis_server: RedisServer, launch: Launcher) -> None:
    url = db_url(redis_server, 7)
    r = redis.Redis.from_url(url)
    r.flushdb()
    proxy = launch(prom.url, "--redis", url, "--split-interval", "1h")
    end = prom.end_s
    params = {"query": "avg by (namespace) (DCGM_FI_DEV_GPU_TEMP)", "start": str(end - 3 * H),
              "end": str(end - H), "step": "60"}
    direct = post(prom.url, "/api/v1/query_range", params)
    assert_same(direct, post(proxy.url, "/api/v1/query_range", params), "cold")
    time.sleep(0.5)
    keys = _entry_keys(r)
    assert len(keys) >= 2
    corrupt, collide = keys[0], keys[1]
    good = r.get(corrupt)
    assert good is not None
    r.set(corrupt, good[:-7] + b"garbage")  # MAC mismatch
    foreign = CacheKey(query="up", span=Span.range(0, 60_000, 60_000))
    # A sound frame for another key (made with this promaccel's key: no secret is configured
    # and the Redis URL has no password, so frames are keyed by the built-in secret).
    r.set(collide, encode_value(foreign, b"not arrow at all", skey=collide.decode()))
    time.sleep(2.5)  # the landing zone has let go of the fetched pieces
    warm = post(proxy.url, "/api/v1/query_range", params)
    assert_same(direct, warm, "after planting")
    assert warm.headers["X-Cache"] == "PARTIAL"
    assert metric(proxy, "promaccel_cache_corrupt_entries_total", 'reason="mac"') >= 1
    assert metric(proxy, "promaccel_cache_corrupt_entries_total", 'reason="collision"') >= 1
    time.sleep(0.5)
    for k in (corrupt, collide):  # deleted, then stored again from the backend
        value = r.get(k)
        assert value is None or (value.startswith(b"PAXC") and b"garbage" not in value and b"not arrow" not in value)
    ex = HTTP.get(proxy.url + "/api/v1/explain", params=params).json()["data"]
    assert ex["cache"]["misses"] == 0, (ex["pieces"], r.keys())
    assert post(proxy.url, "/api/v1/query_range", params).headers["X-Cache"] == "HIT"


# --- request coalescing -----------------------------------------------------------------------


def test_concurrent_identical_cold_requests_cost_one_requests_calls(prom: Any, redis_server: RedisServer,
                                                                    launch: Launcher) -> None:
    url = db_url(redis_server, 8)
    redis.Redis.from_url(url).flushdb()
    proxy = launch(prom.url, "--redis", url, "--split-interval", "1h")
    q = "sum by (namespace, modelName) (DCGM_FI_DEV_FB_USED)"
    s0 = (prom.start_s // H + 1) * H

    def params(start: int) -> dict[str, str]:
        return {"query": q, "start": str(start), "end": str(start + 2 * H - 30), "step": "30"}

    before = backend_calls(proxy)
    post(proxy.url, "/api/v1/query_range", params(s0))
    one = backend_calls(proxy) - before
    assert one >= 1

    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=40)) as client:
            return await asyncio.gather(*(client.post(proxy.url + "/api/v1/query_range", data=params(s0 + 2 * H))
                                          for _ in range(20)))

    before = backend_calls(proxy)
    answers = asyncio.run(storm())
    twenty = backend_calls(proxy) - before
    direct = post(prom.url, "/api/v1/query_range", params(s0 + 2 * H))
    for a in answers:
        assert_same(direct, a, "storm")
    assert twenty == one, (twenty, one)
    assert len({a.content for a in answers}) == 1


# --- instant queries and the in-process default --------------------------------------------------


def test_instant_queries_cached_only_when_old(prom: Any, cached: Promaccel) -> None:
    old = {"query": "sum(DCGM_FI_DEV_FB_FREE)", "time": str(prom.end_s - H)}
    post(cached.url, "/api/v1/query", old)
    r = post(cached.url, "/api/v1/query", old)
    assert r.headers["X-Cache"] == "HIT"
    # Evaluated long ago but reading the present through a negative offset: not cached.
    future = {"query": f"sum(DCGM_FI_DEV_FB_FREE offset -{int(time.time()) - prom.end_s + 3 * H}s)",
              "time": str(prom.end_s - H)}
    for _ in range(2):
        r = post(cached.url, "/api/v1/query", future)
        assert r.status_code == 200 and r.headers["X-Cache"] == "MISS"
    now = {"query": "sum(DCGM_FI_DEV_FB_FREE)"}
    for _ in range(2):
        assert post(cached.url, "/api/v1/query", now).headers["X-Cache"] == "MISS"


def test_in_process_default_cache(prom: Any, proxies: Any) -> None:
    proxy = proxies.get()  # no flags at all: in-process cache, default 1h cache split
    end = prom.end_s
    params = {"query": "avg by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE)", "start": str(end - 5 * H + 30),
              "end": str(end - 30), "step": "60"}
    direct = post(prom.url, "/api/v1/query_range", params)
    cold = post(proxy.url, "/api/v1/query_range", params)
    assert_same(direct, cold, "cold")
    assert int(cold.headers["X-Promaccel-Pieces"]) >= 5
    before = backend_calls(proxy)
    warm = post(proxy.url, "/api/v1/query_range", params)
    assert backend_calls(proxy) - before == 0
    assert warm.headers["X-Cache"] == "HIT" and warm.content == cold.content


def test_admin_endpoints_need_a_token(prom: Any, proxies: Any, launch: Launcher,
                                      redis_server: RedisServer) -> None:
    plain = proxies.get()
    r = HTTP.post(plain.url + "/api/v1/admin/cache/generation", timeout=10)
    assert r.status_code == 403 and "admin endpoints disabled" in r.json()["error"]
    proxy = launch(prom.url, "--split-interval", "1h",
                   config={"cache": {"redis_url": db_url(redis_server, 9), "admin_token": ADMIN_TOKEN}})
    r = HTTP.post(proxy.url + "/api/v1/admin/cache/generation", timeout=10)
    assert r.status_code == 401 and r.json()["status"] == "error"
    r = HTTP.post(proxy.url + "/api/v1/admin/cache/generation", headers={"Authorization": "Bearer nope"},
                   timeout=10)
    assert r.status_code == 403
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    g1 = HTTP.post(proxy.url + "/api/v1/admin/cache/generation", headers=auth, timeout=10).json()
    g2 = HTTP.post(proxy.url + "/api/v1/admin/cache/generation", headers=auth, timeout=10).json()
    assert g2["data"]["generation"] == g1["data"]["generation"] + 1
    bad = HTTP.post(proxy.url + "/api/v1/admin/cache/invalidate", headers=auth,
                     data={"match[]": "sum(x)"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["errorType"] == "bad_data"
    none = HTTP.post(proxy.url + "/api/v1/admin/cache/invalidate", headers=auth, timeout=10)
    assert none.status_code == 400
    stats = HTTP.get(proxy.url + "/api/v1/admin/cache/stats", headers=auth, timeout=10).json()["data"]
    assert stats["kind"] == "redis"


def test_bad_redis_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cache.redis_url"):
        build_config({"backends": [{"url": "http://x"}], "cache": {"redis_url": "http://127.0.0.1:6379"}})
    for ok in ("redis://h:1/0", "rediss://h:1", "unix:///tmp/redis.sock", "redis+cluster://a:1,b:2"):
        build_config({"backends": [{"url": "http://x"}], "cache": {"redis_url": ok}})


# --- late data -------------------------------------------------------------------------------------


class Forwarder:
    """An HTTP front whose backend can be swapped while promaccel keeps the same URL (a
    second Prometheus swapped in)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.client = httpx.Client(timeout=120)
        forwarder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("content-type", "accept", "accept-encoding")}
                resp = forwarder.client.request(self.command, forwarder.target + self.path, content=body,
                                                headers=headers)
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


LATE_METRIC = "DCGM_FI_DEV_GPU_UTIL"


@pytest.fixture(scope="module")
def late_prom(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A copy of the CI TSDB plus backfilled samples of LATE_METRIC (a node that reported late)
    in [end - 4h, end - 2h]."""
    from loadtests.load import start_prometheus, stop_prometheus

    root = tmp_path_factory.mktemp("late-data")
    data = root / "tsdb"
    shutil.copytree(prom.data_dir, data, ignore=shutil.ignore_patterns("lock", "queries.active", "*.log",
                                                                      "wal", "chunks_head"))
    om = root / "late.om"
    lines = [f"# TYPE {LATE_METRIC} gauge"]
    for t in range(prom.end_s - 4 * H, prom.end_s - 2 * H, 30):
        for gpu in range(2):
            lines.append(f'{LATE_METRIC}{{Hostname="late-node-9",gpu="{gpu}",namespace="late-team",'
                         f'modelName="NVIDIA H100 80GB HBM3"}} {50 + gpu + (t % 7)} {t}')
    lines.append("# EOF")
    om.write_text("\n".join(lines) + "\n")
    promtool = shutil.which("promtool")
    assert promtool
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, capture_output=True, timeout=120)
    proc = start_prometheus(str(data), log_path=str(root / "prometheus.log"))
    try:
        yield proc
    finally:
        stop_prometheus(proc)


@pytest.fixture()
def forwarder(prom: Any) -> Iterator[Forwarder]:
    fw = Forwarder(prom.url)
    try:
        yield fw
    finally:
        fw.close()


def _late_params(prom: Any) -> dict[str, str]:
    end = prom.end_s
    return {"query": f"sum by (namespace) ({LATE_METRIC})", "start": str(end - 5 * H + 60),
            "end": str(end - 60), "step": "60"}


def test_late_data_served_after_invalidation(prom: Any, late_prom: Any, forwarder: Forwarder,
                                             redis_server: RedisServer, launch: Launcher) -> None:
    url = db_url(redis_server, 10)
    redis.Redis.from_url(url).flushdb()
    proxy = launch(forwarder.url, "--split-interval", "1h",
                   config={"cache": {"redis_url": url, "admin_token": ADMIN_TOKEN}})
    params = _late_params(prom)
    old = post(prom.url, "/api/v1/query_range", params)
    new = post(late_prom.url, "/api/v1/query_range", params)
    assert diff_answers(old.json(), new.json()) != []  # the backfill changes the answer
    assert_same(old, post(proxy.url, "/api/v1/query_range", params), "before")
    time.sleep(0.3)
    other = {**params, "query": "sum(DCGM_FI_DEV_POWER_USAGE)"}
    post(proxy.url, "/api/v1/query_range", other)
    forwarder.target = late_prom.url  # the late samples arrive
    time.sleep(2.5)
    stale = post(proxy.url, "/api/v1/query_range", params)
    assert stale.headers["X-Cache"] == "HIT"
    assert_same(old, stale, "cached, not yet invalidated")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = HTTP.post(proxy.url + "/api/v1/admin/cache/invalidate", headers=auth, timeout=30,
                   data={"match[]": f'{LATE_METRIC}{{Hostname="late-node-9"}}',
                         "start": str(prom.end_s - 4 * H), "end": str(prom.end_s - 2 * H)})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["dropped"] >= 2
    fresh = post(proxy.url, "/api/v1/query_range", params)
    assert fresh.headers["X-Cache"] == "PARTIAL"  # cells outside the range stay cached
    assert_same(new, fresh, "after invalidation")
    # Another metric's pieces were left alone.
    assert post(proxy.url, "/api/v1/query_range", other).headers["X-Cache"] == "HIT"


def test_late_data_heals_by_revalidation(prom: Any, late_prom: Any, forwarder: Forwarder,
                                         redis_server: RedisServer, launch: Launcher) -> None:
    url = db_url(redis_server, 11)
    redis.Redis.from_url(url).flushdb()
    proxy = launch(forwarder.url, "--split-interval", "1h",
                   config={"cache": {"redis_url": url, "admin_token": ADMIN_TOKEN,
                                     "revalidate_interval": 1}})
    params = _late_params(prom)
    old = post(prom.url, "/api/v1/query_range", params)
    new = post(late_prom.url, "/api/v1/query_range", params)
    assert_same(old, post(proxy.url, "/api/v1/query_range", params), "before")
    time.sleep(1.5)
    assert post(proxy.url, "/api/v1/query_range", params).headers["X-Cache"] == "HIT"
    forwarder.target = late_prom.url
    deadline = time.monotonic() + 30
    while True:
        r = post(proxy.url, "/api/v1/query_range", params)
        if not diff_answers(new.json(), r.json()):
            break
        assert time.monotonic() < deadline, "revalidation never dropped the stale pieces"
        time.sleep(0.5)
    stats = HTTP.get(proxy.url + "/api/v1/admin/cache/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                      timeout=10).json()["data"]
    assert stats["revalidation"]["changed"] >= 1
    assert metric(proxy, "promaccel_backend_requests_total", 'endpoint="digest"') > 0
    # Healed pieces are cached again (pieces fetched within the store's 5 s clock-skew
    # allowance of an invalidation are not stored) and checked against the new data.
    time.sleep(5.5)
    assert_same(new, post(proxy.url, "/api/v1/query_range", params), "refetched")
    time.sleep(1.5)
    again = post(proxy.url, "/api/v1/query_range", params)
    assert again.headers["X-Cache"] == "HIT"
    assert_same(new, again, "healed and cached")

