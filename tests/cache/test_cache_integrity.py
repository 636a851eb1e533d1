"""Cache integrity against someone who can write to Redis (issue 26, item 9).

The finding: entries were only CRC-checked, so a forged piece was served as a HIT; a 26 KB
zstd Arrow value declaring 40 M rows took RSS to 11.2 GB and 83 s of CPU before it was
refused; a lease key without a TTL stalled queries for half their deadline and stayed.

- frames are authenticated (HMAC-SHA256 keyed by the shared cache secret): a forged value
  planted under a real key of a running promaccel -- a CRC-sound version 1 frame, a version 2
  frame under the built-in key, one under another secret -- is a miss, never served, and the
  answer is Prometheus's;
- payloads are bounded before they are decoded: the 26 KB / 40 M row value, even with a
  valid MAC, is refused at once with flat memory, by the store and by a running promaccel;
  a label list of a million `{}` in a one-row payload is refused before it is split;
- leases without a TTL (or with a longer one than `cache.fetch_lease`) are ignored and
  deleted; a wait on a lease never lasts past ~2x `cache.fetch_lease`.

Real parts: redis-server, promaccel processes, the real Prometheus fixture.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import resource
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest
import redis
import yaml
from pydantic import SecretStr

from loadtests.compare import diff_answers
from proxy.cache import CacheItem, CacheKey, MemoryStore, PieceMeta, RedisStore, make_store
from proxy.cache.bound import PayloadLimits, check_payload
from proxy.cache.frame import DEFAULT_SECRET, CorruptValue, encode_value, frame_key
from proxy.cache.leases import lease_key
from proxy.codec import arrow
from proxy.codec.errors import MalformedAnswer
from proxy.config import CacheConfig, ConfigError, build_config
from proxy.observe.metrics import METRICS
from proxy.pipeline.cache_read import CacheReader
from proxy.pipeline.landing import Landing
from proxy.pipeline.leases import Claim, Leases
from proxy.pipeline.slots import SlotMaker
from proxy.pipeline.units import Unit
from proxy.result import QueryResult
from shardplanner.plan import Span
from tests.servers import Promaccel, RedisServer, free_port

pytestmark = [pytest.mark.redis]

H = 3600
SECRET = b"integrity-test-secret-0123456789"
LIMITS = PayloadLimits(max_rows=16_000_000, max_label_bytes=64 << 20)
RANGE_KEY = CacheKey(query="sum by (Hostname) (DCGM_FI_DEV_FB_USED)",
                     span=Span.range(1_700_000_000_000, 1_700_003_570_000, 30_000), route=("prometheus",))
HTTP = httpx.Client(timeout=60)


def counter(name: str, *labels: str) -> float:
    return getattr(METRICS, name).labels(*labels)._value.get()  # type: ignore[no-any-return]


def forged_payload(rows: int, labels: bytes = b"[{}]") -> bytes:
    """A zstd Arrow IPC payload of `rows` zero rows in one batch: ~26 KB for 40 M rows (the
    zero columns are never touched in memory: numpy's zeros are untouched pages)."""
    meta = {b"promaccel.version": b"1", b"promaccel.result_type": b"matrix", b"promaccel.labels_canonical": b"1",
            b"promaccel.warnings": b"[]", b"promaccel.infos": b"[]", b"promaccel.labels": labels}
    schema = pa.schema([("series", pa.int32()), ("t_ms", pa.int64()), ("value", pa.float64())], metadata=meta)
    table = pa.Table.from_arrays([pa.array(np.zeros(rows, np.int32)), pa.array(np.zeros(rows, np.int64)),
                                  pa.array(np.zeros(rows))], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table, max_chunksize=max(rows, 1))
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def big() -> bytes:
    payload = forged_payload(40_000_000)
    assert len(payload) < 64 * 1024
    return payload


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- the payload bound, in process ---------------------------------------------------------------


def test_the_bound_reads_every_payload_promaccel_writes() -> None:
    series = [({"Hostname": f"node-{i}", "gpu": str(i % 8)}, list(range(0, 3_600_000, 30_000)), [1.5] * 120)
              for i in range(300)]
    shapes = [QueryResult.empty("matrix"), QueryResult.from_series("matrix", series),
              QueryResult.from_series("vector", [({"a": str(i)}, [1000], [1.0]) for i in range(3000)]),
              QueryResult.from_series("matrix", [({}, [0, 30_000], [1.0, 2.0])])]
    key = dataclasses.replace(RANGE_KEY, span=Span.range(0, 3_570_000, 30_000))
    for r in shapes:
        for compression in ("zstd", "lz4", None):
            payload = arrow.to_ipc_bytes(r, compression)
            assert check_payload(key, payload, LIMITS) == r.n_samples
            instant = dataclasses.replace(key, span=Span.instant(3_600_000))
            assert check_payload(instant, payload, LIMITS) == r.n_samples


def test_a_small_value_declaring_40m_rows_is_refused_before_anything_is_inflated(big: bytes) -> None:
    before = peak_rss_mb()
    t0 = time.perf_counter()
    for key in (RANGE_KEY, dataclasses.replace(RANGE_KEY, span=Span.instant(1_700_000_000_000))):
        with pytest.raises(CorruptValue) as info:
            check_payload(key, big, LIMITS)
        assert info.value.reason == "too_large"
    assert time.perf_counter() - t0 < 0.1
    assert peak_rss_mb() - before < 20


def test_the_bound_of_a_range_key_is_its_grid_times_its_series() -> None:
    one = dataclasses.replace(RANGE_KEY, span=Span.range(0, 3_570_000, 30_000))  # 120 points
    assert check_payload(one, forged_payload(120), LIMITS) == 120
    with pytest.raises(CorruptValue, match="too_large"):
        check_payload(one, forged_payload(121), LIMITS)  # one series: at most 120 samples
    assert check_payload(one, forged_payload(240, b"[{},{}]"), LIMITS) == 240
    # Label bytes and rows over the configured caps; a stream that is not a payload.
    with pytest.raises(CorruptValue, match="too_large"):
        check_payload(one, forged_payload(1, b"[{}" + b",{}" * 400 + b"]"), PayloadLimits(10**6, 1024))
    with pytest.raises(CorruptValue, match="too_large"):
        check_payload(dataclasses.replace(one, span=Span.instant(0)), forged_payload(1001), PayloadLimits(1000, 1 << 20))
    for junk in (b"", b"\xff\xff\xff\xff", b"not arrow at all", forged_payload(10)[:-9]):
        with pytest.raises(CorruptValue, match="payload"):
            check_payload(one, junk, LIMITS)


def test_a_label_list_of_a_million_series_in_a_one_row_payload_is_refused_before_it_is_split() -> None:
    payload = forged_payload(1, b"[{}" + b",{}" * 1_000_000 + b"]")
    before = peak_rss_mb()
    t0 = time.perf_counter()
    with pytest.raises(MalformedAnswer, match="more label sets"):
        arrow.from_ipc_bytes(payload)
    assert time.perf_counter() - t0 < 0.5
    assert peak_rss_mb() - before < 40


# --- frames and bounds in the stores, against a real Redis -----------------------------------------


@pytest.fixture()
def rurl(redis_server: RedisServer) -> str:
    url = redis_server.url.rsplit("/", 1)[0] + "/14"
    redis.Redis.from_url(url).flushdb()
    return url


def meta() -> PieceMeta:
    return PieceMeta(("DCGM_FI_DEV_FB_USED",), 0, H * 1000, int(time.time() * 1000))


def cell() -> bytes:
    return arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"Hostname": "node-1"}, [1_700_000_000_000], [7.0])]))


def test_the_store_serves_only_frames_made_with_its_secret(rurl: str) -> None:
    async def main() -> None:
        store = RedisStore(rurl, timeout_ms=200, mac_key=frame_key(SECRET), limits=LIMITS)
        other = RedisStore(rurl, timeout_ms=200, mac_key=frame_key(b"another secret, another fleet"), limits=LIMITS)
        try:
            await store.put_many([CacheItem(RANGE_KEY, cell(), 600_000, meta())])
            assert await store.get_many([RANGE_KEY]) == [cell()]
            assert await other.get_many([RANGE_KEY]) == [None]  # and deleted
            r = redis.Redis.from_url(rurl)
            skey = store.storage_key(RANGE_KEY)
            assert not r.exists(skey)
            forged = QueryResult.from_series("matrix", [({"Hostname": "forged"}, [1_700_000_000_000], [1e9])])
            before = counter("cache_corrupt", "redis", "mac")
            for value in (encode_value(RANGE_KEY, arrow.to_ipc_bytes(forged), skey=skey),  # the built-in key
                          encode_value(RANGE_KEY, arrow.to_ipc_bytes(forged), mac_key=frame_key(SECRET)),  # no skey
                          v1_frame(RANGE_KEY, arrow.to_ipc_bytes(forged))):
                r.set(skey, value)
                assert await store.get_many([RANGE_KEY]) == [None]
                assert not r.exists(skey)
            assert counter("cache_corrupt", "redis", "mac") - before == 2
        finally:
            await store.aclose()
            await other.aclose()

    asyncio.run(main())


def test_a_valid_frame_of_40m_rows_is_a_miss_with_flat_memory(rurl: str, big: bytes) -> None:
    async def main() -> None:
        store = RedisStore(rurl, timeout_ms=500, mac_key=frame_key(SECRET), limits=LIMITS)
        try:
            await store.get_many([RANGE_KEY])  # the generation
            skey = store.storage_key(RANGE_KEY)
            r = redis.Redis.from_url(rurl)
            r.set(skey, encode_value(RANGE_KEY, big, mac_key=frame_key(SECRET), skey=skey))
            before_rss, before = peak_rss_mb(), counter("cache_corrupt", "redis", "too_large")
            t0 = time.perf_counter()
            assert await store.get_many([RANGE_KEY]) == [None]
            assert time.perf_counter() - t0 < 0.5
            assert peak_rss_mb() - before_rss < 20
            assert counter("cache_corrupt", "redis", "too_large") - before == 1
            assert not r.exists(skey)
            # Nor is such a piece stored (its readers would refuse it), by either store.
            await store.put_many([CacheItem(RANGE_KEY, big, 600_000, meta())])
            assert not r.exists(skey) and store.stats()["too_large"] == 1
            mem = MemoryStore(1 << 30, limits=LIMITS)
            await mem.put_many([CacheItem(RANGE_KEY, big, 600_000, meta())])
            assert mem.stats()["too_large"] == 1 and mem.stats()["entries"] == 0
        finally:
            await store.aclose()

    asyncio.run(main())


class Canonical:
    """A stand-in for the CacheKey of a real entry: its canonical text, read from the entry."""

    def __init__(self, value: bytes) -> None:
        clen = struct.unpack_from(">I", value, 5)[0]
        self.canonical_bytes = value[41:41 + clen]
        self.fields = orjson.loads(self.canonical_bytes)


def v1_frame(key: Any, payload: bytes) -> bytes:
    """The version 1 frame: magic, version, len(canonical), crc32(canonical + payload)."""
    canonical = key.canonical_bytes
    crc = zlib.crc32(payload, zlib.crc32(canonical))
    return struct.pack(">4sBII", b"PAXC", 1, len(canonical), crc) + canonical + payload


# --- the secret ------------------------------------------------------------------------------------


def test_the_secret_comes_from_config_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("PROMACCEL_CACHE_SECRET", raising=False)
    url = f"redis://127.0.0.1:{free_port()}/0"
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    assert make_store(CacheConfig(redis_url=url, secret_file=str(secret_file))).mac_key == frame_key(SECRET)
    assert make_store(CacheConfig(redis_url=url, secret=SecretStr(SECRET.decode()))).mac_key == frame_key(SECRET)
    monkeypatch.setenv("PROMACCEL_CACHE_SECRET", "from-the-environment-123")
    assert make_store(CacheConfig(redis_url=url)).mac_key == frame_key(b"from-the-environment-123")
    monkeypatch.delenv("PROMACCEL_CACHE_SECRET")
    # None: derived from the Redis password (a warning), else the built-in key (a louder one).
    with caplog.at_level(logging.WARNING, logger="promaccel.cache"):
        derived = make_store(CacheConfig(redis_url=f"redis://:pw-of-redis@127.0.0.1:{free_port()}/0")).mac_key
        assert derived not in (frame_key(DEFAULT_SECRET), None)
        assert make_store(CacheConfig(redis_url=url)).mac_key == frame_key(DEFAULT_SECRET)
    text = caplog.text
    assert "derived from the Redis password" in text and "built-in key" in text and "pw-of-redis" not in text
    # In process: no MAC at all (values never leave the process).
    assert make_store(CacheConfig()).mac_key is None
    base = {"backends": [{"url": "http://127.0.0.1:1"}]}
    for bad, why in (({"secret": "short"}, "at least 16 bytes"),
                     ({"secret": SECRET.decode(), "secret_file": str(secret_file)}, "at most one"),
                     ({"secret_file": str(tmp_path / "missing")}, "cannot read")):
        with pytest.raises(ConfigError, match=why):
            build_config({**base, "cache": bad})
    cfg = build_config({**base, "cache": {"secret": SECRET.decode()}})
    assert SECRET.decode() not in repr(cfg)


# --- leases --------------------------------------------------------------------------------------------


def unit(i: int) -> Unit:
    span = Span.range(i * H * 1000, (i + 1) * H * 1000 - 30_000, 30_000)
    key = CacheKey(query="sum(DCGM_FI_DEV_FB_USED)", span=span, route=("prometheus",))
    return Unit(key.query, None, -1, span, key=key, ttl_ms=600_000)


class Proc:
    def __init__(self, url: str, lease_ms: int) -> None:
        self.config = build_config({"backends": [{"url": "http://127.0.0.1:1"}],
                                    "cache": {"redis_url": url, "fetch_lease": f"{lease_ms}ms"}})
        self.store = RedisStore(url, timeout_ms=200)
        reader = CacheReader(self.config, lambda: self.store, Landing(), SlotMaker(self.config, H * 1000))
        self.leases = Leases(self.config, lambda: self.store, reader)

    async def aclose(self) -> None:
        await self.leases.aclose()
        await self.store.aclose()


def test_a_lease_without_a_ttl_or_with_too_long_a_one_is_ignored_and_deleted(rurl: str) -> None:
    async def main() -> None:
        p = Proc(rurl, lease_ms=1000)
        try:
            r = redis.Redis.from_url(rurl)
            u, v, w = unit(1), unit(2), unit(3)
            assert u.key is not None and v.key is not None and w.key is not None
            r.set(lease_key(u.key.digest), b"planted")  # no TTL
            r.set(lease_key(v.key.digest), b"planted", px=3_600_000)  # longer than fetch_lease
            r.set(lease_key(w.key.digest), b"someone", px=900)  # a lease like ours: held
            table = p.store.leases
            assert table is not None
            held, _ = await table.poll([u.key, v.key, w.key], 1000) or ([], [])
            assert held == [False, False, True]
            before = counter("cache_leases", "ignored")
            claim = await p.leases.acquire([u, v, w])
            assert claim == Claim({u.key.digest, v.key.digest}, {})
            assert counter("cache_leases", "ignored") - before == 2
            for k in (u.key, v.key):  # ours now, with our TTL
                assert r.get(lease_key(k.digest)) != b"planted" and 0 < r.pttl(lease_key(k.digest)) <= 1000
            p.leases.release([u.key.digest, v.key.digest])
        finally:
            await p.aclose()

    asyncio.run(main())


def test_a_wait_on_a_lease_is_capped_near_twice_fetch_lease(rurl: str) -> None:
    async def main() -> None:
        owner, waiter = Proc(rurl, lease_ms=300), Proc(rurl, lease_ms=300)
        try:
            u = unit(4)
            # Held and renewed for ever (a stuck owner): before, a waiter stayed half its
            # deadline (15 s here).
            assert (await owner.leases.acquire([u]) or Claim(set(), {})).won
            before = counter("cache_leases", "timeout")
            t0 = time.monotonic()
            landed, here = await asyncio.wait_for(waiter.leases.wait([u], timeout_s=30), 5)
            assert landed == {} and here == [u]
            assert 0.45 < time.monotonic() - t0 < 1.2
            assert counter("cache_leases", "timeout") - before == 1
        finally:
            await owner.aclose()
            await waiter.aclose()

    asyncio.run(main())


# --- a running promaccel ------------------------------------------------------------------------------


def entry_keys(r: redis.Redis) -> list[bytes]:
    return [k for k in r.scan_iter(match="promaccel:v1:g*:*", count=1000)
            if re.fullmatch(rb"promaccel:v1:g\d+:[0-9a-f]{64}", k)]


def post(url: str, params: dict[str, str]) -> httpx.Response:
    return HTTP.post(url + "/api/v1/query_range", data=params)


def assert_same(direct: httpx.Response, proxied: httpx.Response, what: Any) -> None:
    assert proxied.status_code == direct.status_code, (what, proxied.text[:300])
    problems = diff_answers(orjson.loads(direct.content), orjson.loads(proxied.content))
    assert problems == [], (what, problems[:5])


def metric(proxy: Promaccel, name: str, label: str = "") -> float:
    text = HTTP.get(proxy.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and label in line and not line.startswith("#"))


def vm_hwm_mb(proxy: Promaccel) -> float:
    for line in Path(f"/proc/{proxy.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def proxy(prom: Any, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Promaccel, str]]:
    work = tmp_path_factory.mktemp("integrity")
    url = redis_server.url.rsplit("/", 1)[0] + "/15"
    redis.Redis.from_url(url).flushdb()
    (work / "secret").write_bytes(SECRET)
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "backends": [{"url": prom.url}],
        "cache": {"redis_url": url, "secret_file": str(work / "secret"), "fetch_lease": "1s"},
        "limits": {"query_timeout": "20s"}}))
    p = Promaccel.start(None, ("--config", str(cfg), "--split-interval", "1h"), work)
    try:
        yield p, url
    finally:
        p.stop()


def warm_up(prom: Any, proxy: Promaccel, params: dict[str, str]) -> httpx.Response:
    direct = post(prom.url, params)
    assert_same(direct, post(proxy.url, params), "cold")
    time.sleep(2.5)  # stored, and the landing zone has let go of the fetched pieces
    assert post(proxy.url, params).headers["X-Cache"] == "HIT"
    return direct


def test_forged_frames_under_real_keys_are_misses_and_the_answer_is_prometheuss(
        prom: Any, proxy: tuple[Promaccel, str]) -> None:
    p, url = proxy
    r = redis.Redis.from_url(url)
    end = prom.end_s
    params = {"query": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)", "start": str(end - 4 * H),
              "end": str(end - H), "step": "60"}
    before_keys = set(entry_keys(r))
    direct = warm_up(prom, p, params)
    keys = sorted(set(entry_keys(r)) - before_keys)
    assert len(keys) >= 3
    before_mac = metric(p, "promaccel_cache_corrupt_entries_total", 'reason="mac"')
    before_version = metric(p, "promaccel_cache_corrupt_entries_total", 'reason="version"')
    for skey in keys:
        good = r.get(skey)
        assert isinstance(good, bytes)
        key: Any = Canonical(good)
        t0 = key.fields[3]  # its span's start
        forged = arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"Hostname": "forged"}, [t0], [1e9])]), "lz4")
        r.set(skey, {0: v1_frame(key, forged),  # CRC-sound, as before: served before issue 26
                     1: encode_value(key, forged, skey=skey.decode()),  # the built-in key
                     2: encode_value(key, forged, mac_key=frame_key(b"not the fleet's secret!"),
                                     skey=skey.decode())}[keys.index(skey) % 3], keepttl=True)
    warm = post(p.url, params)
    assert_same(direct, warm, "forged frames planted")
    assert warm.headers["X-Cache"] != "HIT"
    assert metric(p, "promaccel_cache_corrupt_entries_total", 'reason="version"') - before_version >= 1
    assert metric(p, "promaccel_cache_corrupt_entries_total", 'reason="mac"') - before_mac >= 2
    time.sleep(2.5)
    for skey in keys:  # deleted, then stored again from the backend
        value = r.get(skey)
        assert value is None or b"forged" not in value
    again = post(p.url, params)
    assert_same(direct, again, "restored")
    assert again.headers["X-Cache"] == "HIT"


def test_a_40m_row_value_with_a_valid_mac_is_refused_at_once(prom: Any, proxy: tuple[Promaccel, str],
                                                             big: bytes) -> None:
    p, url = proxy
    r = redis.Redis.from_url(url)
    end = prom.end_s
    params = {"query": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "start": str(end - 3 * H),
              "end": str(end - H), "step": "60"}
    before_keys = set(entry_keys(r))
    direct = warm_up(prom, p, params)
    planted = set(entry_keys(r)) - before_keys
    assert planted
    hwm = vm_hwm_mb(p)
    before = metric(p, "promaccel_cache_corrupt_entries_total", 'reason="too_large"')
    for skey in planted:  # even with the secret (defence in depth): bounded before decoding
        good = r.get(skey)
        assert isinstance(good, bytes)
        key: Any = Canonical(good)
        r.set(skey, encode_value(key, big, mac_key=frame_key(SECRET), skey=skey.decode()), keepttl=True)
    t0 = time.monotonic()
    warm = post(p.url, params)
    assert time.monotonic() - t0 < 3
    assert_same(direct, warm, "40 M rows planted")
    assert metric(p, "promaccel_cache_corrupt_entries_total", 'reason="too_large"') - before >= 1
    assert vm_hwm_mb(p) - hwm < 100
    assert HTTP.get(p.url + "/-/healthy").status_code == 200


def test_a_lease_without_a_ttl_does_not_stall_a_query(prom: Any, proxy: tuple[Promaccel, str]) -> None:
    p, url = proxy
    r = redis.Redis.from_url(url)
    end = prom.end_s
    params = {"query": "min by (Hostname) (DCGM_FI_DEV_FB_USED)", "start": str(end - 5 * H),
              "end": str(end - 3 * H), "step": "60"}
    before_keys = set(entry_keys(r))
    direct = warm_up(prom, p, params)
    mine = sorted(set(entry_keys(r)) - before_keys)
    assert mine
    digests = [k.decode().rsplit(":", 1)[1] for k in mine]
    r.delete(*mine)  # the pieces are gone; their leases are planted by hand
    for i, d in enumerate(digests):
        if i % 2:
            r.set(lease_key(d), b"planted")  # no TTL: stalled queries for half their deadline
        else:
            r.set(lease_key(d), b"planted", px=3_600_000)  # far longer than fetch_lease (1 s)
    t0 = time.monotonic()
    got = post(p.url, params)
    took = time.monotonic() - t0
    assert_same(direct, got, "leases planted")
    assert took < 2.5, took  # ~2x fetch_lease at most; before: 10 s (half of query_timeout)
    time.sleep(0.5)
    for d in digests:  # cleaned up: taken over, then let go once the piece was stored
        assert r.get(lease_key(d)) != b"planted"
        assert r.pttl(lease_key(d)) in (-2, *range(0, 1001))
