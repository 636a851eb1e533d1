"""Through HTTP, against a real Prometheus and Redis: what the cache keys separate (extra
parameters; tenants are in tests/backends/test_tenancy.py), a slow Redis (not a stopped one), the
metadata fan-out with a backend that fails, and the unsharded rerun a topk tie triggers."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from loadtests.compare import diff_answers, instant_order
from tests.servers import Promaccel, free_port

pytestmark = pytest.mark.prom

H = 3600


def _metric(proxy: Promaccel, name: str, *labels: str) -> float:
    text = httpx.get(proxy.url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(lb in line for lb in labels))


def _backend_query_calls(proxy: Promaccel) -> float:
    return (_metric(proxy, "promaccel_backend_requests_total", 'endpoint="/api/v1/query"')
            + _metric(proxy, "promaccel_backend_requests_total", 'endpoint="/api/v1/query_range"'))


def _same(prom: Any, path: str, form: dict[str, str], r: httpx.Response) -> None:
    direct = httpx.post(prom.url + path, data=form, timeout=60)
    assert r.status_code == direct.status_code == 200, r.text[:300]
    d = orjson.loads(direct.content)
    assert d["data"]["result"], "the reference answer is empty: nothing compared"
    order = instant_order(form["query"]) if path.endswith("/query") else None
    assert diff_answers(d, orjson.loads(r.content), order=order) == []


def _start(work: Path, config: dict[str, Any], *args: str) -> Promaccel:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.yaml"
    path.write_text(orjson.dumps(config).decode())
    return Promaccel.start(None, args, work, config=path)


# --- extra parameters key the cache -----------------------------------------------------------


def test_extra_parameters_get_their_own_cache_entries(prom: Any, tmp_path: Path) -> None:
    """A parameter promaccel does not plan with is passed to the backend and is part of the
    key: the same query with another extra parameter is a MISS (a backend call of its own);
    the same one again is a HIT; `timeout`, which never changes an answer, shares the entry."""
    proxy = _start(tmp_path / "p", {"backends": [{"name": "local", "url": prom.url}]},
                   "--split-interval", "1h", "--shards", "2")
    try:
        form = {"query": "sum by (namespace) (DCGM_FI_DEV_POWER_USAGE)", "start": str(prom.end_s - 4 * H),
                "end": str(prom.end_s - 2 * H), "step": "60"}
        path = "/api/v1/query_range"

        def ask(extra: dict[str, str]) -> tuple[httpx.Response, float]:
            before = _backend_query_calls(proxy)
            r = httpx.post(proxy.url + path, data={**form, **extra}, timeout=60)
            return r, _backend_query_calls(proxy) - before

        plain, calls = ask({})
        assert plain.headers["X-Cache"] == "MISS" and calls > 0
        _same(prom, path, form, plain)
        time.sleep(0.2)  # background puts
        again, calls = ask({})
        assert again.headers["X-Cache"] == "HIT" and calls == 0
        for extra in ({"dedup": "true"}, {"partial_response": "false"}):
            first, calls = ask(extra)
            assert first.headers["X-Cache"] == "MISS" and calls > 0, extra
            _same(prom, path, {**form, **extra}, first)
            time.sleep(0.2)
            second, calls = ask(extra)
            assert second.headers["X-Cache"] == "HIT" and calls == 0, extra
        shared, calls = ask({"timeout": "30s"})
        assert shared.headers["X-Cache"] == "HIT" and calls == 0
        assert shared.content == again.content
    finally:
        proxy.stop()


# --- a slow Redis -------------------------------------------------------------------------------


class DelayingProxy:
    """A TCP relay on 127.0.0.1 in front of Redis whose replies wait `delay` seconds each
    (requests pass at once): a Redis that is up but slow."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.sock = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delayed: bool) -> None:
        try:
            while data := src.recv(65536):
                if delayed and self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def slow_redis(redis_server: Any) -> Iterator[DelayingProxy]:
    relay = DelayingProxy(redis_server.port)
    try:
        yield relay
    finally:
        relay.close()


def test_slow_redis_costs_a_query_little(prom: Any, slow_redis: DelayingProxy, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{slow_redis.port}/6"
    redis.Redis.from_url(url).flushdb()
    proxy = _start(tmp_path / "p", {"backends": [{"name": "local", "url": prom.url}],
                                    "cache": {"redis_url": url, "redis_timeout": "300ms", "redis_max_wait": "1s"}},
                   "--split-interval", "1h")
    try:
        path = "/api/v1/query_range"
        form = {"query": "avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "start": str(prom.end_s - 5 * H),
                "end": str(prom.end_s - 3 * H), "step": "60"}
        r = httpx.post(proxy.url + path, data=form, timeout=60)
        _same(prom, path, form, r)
        time.sleep(0.3)
        assert httpx.post(proxy.url + path, data=form, timeout=60).headers["X-Cache"] == "HIT"  # Redis in use

        slow_redis.delay = 4.0
        probe = redis.Redis.from_url(url, socket_timeout=10)
        t0 = time.monotonic()
        probe.ping()
        assert time.monotonic() - t0 >= 3.5  # the relay really is slow now
        # New windows (nothing of them in this process): each looks up Redis, gives up after
        # redis_timeout and asks Prometheus; a 4 s Redis costs each query well under a second.
        for i, shift in enumerate((1, 2)):
            form_i = {**form, "start": str(prom.end_s - (5 + shift) * H), "end": str(prom.end_s - (3 + shift) * H)}
            direct_t0 = time.monotonic()
            httpx.post(prom.url + path, data=form_i, timeout=60)
            direct_s = time.monotonic() - direct_t0
            t0 = time.monotonic()
            r = httpx.post(proxy.url + path, data=form_i, timeout=60)
            took = time.monotonic() - t0
            _same(prom, path, form_i, r)
            assert took < direct_s + 2.0, (i, took, direct_s)
    finally:
        slow_redis.delay = 0.0
        proxy.stop()


# --- metadata fan-out with a backend that fails -----------------------------------------------


def test_metadata_fan_out_survives_a_failing_backend(prom_scraped: Any, tmp_path: Path) -> None:
    prom = prom_scraped
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proxy = _start(tmp_path / "p", {"backends": [
        {"name": "local", "url": prom.url, "holds": {"metrics": ["node_.*", "kube_.*", "up"]}, "retries": 0},
        {"name": "gone", "url": dead, "holds": {"metrics": ["DCGM_.*"]}, "retries": 0},
    ]})
    try:
        window = {"start": str(prom.end_s - 2 * H), "end": str(prom.end_s)}
        # Only the live backend holds `up`: asked alone, no warning, Prometheus's answer.
        d = httpx.get(prom.url + "/api/v1/series", params={"match[]": "up", **window}, timeout=60).json()
        p = httpx.get(proxy.url + "/api/v1/series", params={"match[]": "up", **window}, timeout=60)
        assert p.status_code == 200 and not p.json().get("warnings")
        assert d["data"] and sorted(map(str, p.json()["data"])) == sorted(map(str, d["data"]))
        # Both asked: the live one's data (everything, here) and a warning naming the other.
        for path, params in (("/api/v1/labels", window), ("/api/v1/label/job/values", window),
                             ("/api/v1/metadata", {}), ("/api/v1/metadata", {"limit": "3"})):
            direct = httpx.get(prom.url + path, params=params, timeout=60).json()
            r = httpx.get(proxy.url + path, params=params, timeout=60)
            assert r.status_code == 200, (path, r.text[:300])
            body = r.json()
            assert any("gone" in w for w in body.get("warnings") or []), (path, body.get("warnings"))
            assert direct["data"], path
            if "limit" in params:
                assert len(body["data"]) == len(direct["data"]) == 3
            else:
                assert body["data"] == direct["data"], path
        # Only the failed backend asked: its failure is the answer, naming it.
        r = httpx.get(proxy.url + "/api/v1/series", params={"match[]": "DCGM_FI_DEV_GPU_UTIL", **window}, timeout=60)
        assert r.status_code >= 500 and r.json()["status"] == "error" and "gone" in r.json()["error"], r.text[:300]
    finally:
        proxy.stop()


# --- a topk tie reruns unsharded ----------------------------------------------------------------


RERUN = ('mode="unsharded_rerun"', 'reason="topk_tie"')


@pytest.mark.parametrize("path", ["/api/v1/query", "/api/v1/query_range"])
def test_topk_tie_reruns_unsharded_and_answers_as_prometheus(prom: Any, proxies: Any, path: str) -> None:
    """DCGM_FI_DEV_XID_ERRORS is 0 on every GPU near the end of the data: the k-th place is a
    tie across shards, so promaccel reruns the query whole (counted) and gives exactly the
    series Prometheus picks. With no cut at all (k above the series count), no rerun."""
    proxy = proxies.get("--split-interval", "1h", "--shards", "4")
    t = prom.end_s - 60
    window = {"time": str(t)} if path.endswith("/query") else {"start": str(t - 1800), "end": str(t), "step": "60"}
    tie = {"query": "topk(3, DCGM_FI_DEV_XID_ERRORS)", **window}
    values = httpx.post(prom.url + "/api/v1/query", data={"query": "count(DCGM_FI_DEV_XID_ERRORS != 0) or vector(0)",
                                                          "time": str(t)}, timeout=60).json()["data"]["result"]
    assert values[0]["value"][1] == "0", "the data must have no XID there"
    explained = httpx.get(proxy.url + "/api/v1/explain", params=tie, timeout=60).json()["data"]
    assert explained["sharded"], explained
    before = _metric(proxy, "promaccel_queries_planned_total", *RERUN)
    r = httpx.post(proxy.url + path, data=tie, timeout=60)
    assert _metric(proxy, "promaccel_queries_planned_total", *RERUN) >= before + 1
    _same(prom, path, tie, r)
    direct = httpx.post(prom.url + path, data=tie, timeout=60).json()
    assert diff_answers(direct, r.json(), ordered=path.endswith("/query")) == []  # the very same series

    no_tie = {**tie, "query": "topk(1000, DCGM_FI_DEV_XID_ERRORS)"}
    before = _metric(proxy, "promaccel_queries_planned_total", *RERUN)
    r = httpx.post(proxy.url + path, data=no_tie, timeout=60)
    _same(prom, path, no_tie, r)
    assert _metric(proxy, "promaccel_queries_planned_total", *RERUN) == before
    assert re.search(r"promaccel_queries_planned_total\{", httpx.get(proxy.url + "/metrics", timeout=30).text)
