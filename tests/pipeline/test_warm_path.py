"""The warm path's pieces: gzip with ISA-L, cached-piece decoding, the label-list memo."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.api import compress
from proxy.api.compress import FastGZipMiddleware
from proxy.codec import arrow
from proxy.config import CacheConfig
from proxy.pipeline.cache_read import decode_payloads as _decode_payloads
from proxy.result import QueryResult

BIG = b'{"status":"success","data":[' + b'[1793404800,"245.125"],' * 40_000 + b"[0,\"1\"]]}"


def _app() -> Starlette:
    def stream(_: object) -> StreamingResponse:
        return StreamingResponse(iter([BIG[:300_000], BIG[300_000:700_000], BIG[700_000:]]),
                                 media_type="application/json")

    app = Starlette(routes=[
        Route("/whole", lambda _: Response(BIG, media_type="application/json")),
        Route("/stream", stream),
        Route("/small", lambda _: Response(b'{"status":"success"}', media_type="application/json")),
        Route("/encoded", lambda _: Response(gzip.compress(BIG), media_type="application/json",
                                             headers={"Content-Encoding": "gzip"})),
    ])
    app.add_middleware(FastGZipMiddleware, minimum_size=1024)
    return app


async def _get(path: str, accept: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as c:
        return await c.get(path, headers={"accept-encoding": accept})


@pytest.mark.parametrize("path", ["/whole", "/stream"])
def test_gzip_round_trip(path: str) -> None:
    r = asyncio.run(_get(path, "gzip"))
    assert r.headers["content-encoding"] == "gzip"
    assert "Accept-Encoding" in r.headers["vary"]
    assert r.content == BIG  # httpx decoded the gzip stream
    assert len(r.read()) == len(BIG)


def test_gzip_is_standard_gzip_and_smaller() -> None:
    c = compress.compressor()
    body = c.compress(BIG) + c.flush()
    assert body[:2] == b"\x1f\x8b"  # gzip magic: any client's gunzip reads it
    assert gzip.decompress(body) == BIG
    assert zlib.decompress(body, 16 + zlib.MAX_WBITS) == BIG
    assert len(body) < len(BIG) / 4


def test_no_gzip_when_not_asked_small_or_already_encoded() -> None:
    r = asyncio.run(_get("/whole", "identity"))
    assert "content-encoding" not in r.headers and r.content == BIG
    r = asyncio.run(_get("/small", "gzip"))
    assert "content-encoding" not in r.headers and r.content == b'{"status":"success"}'
    r = asyncio.run(_get("/encoded", "gzip"))
    assert r.headers["content-encoding"] == "gzip" and r.content == BIG  # not compressed twice


def _result(n_series: int = 5, points: int = 7) -> QueryResult:
    labels = [{"__name__": "DCGM_FI_DEV_POWER_USAGE", "Hostname": f"gpu-node-{i:04d}"} for i in range(n_series)]
    t = np.tile(1_793_404_800_000 + np.arange(points, dtype=np.int64) * 30_000, n_series)
    v = np.arange(n_series * points, dtype=np.float64) * 1.5
    return QueryResult("matrix", labels, np.arange(n_series + 1, dtype=np.int64) * points, t, v, [], [])


@pytest.mark.parametrize("compression", ["lz4", "zstd", None])
def test_cached_pieces_decode_whatever_they_were_written_with(compression: str | None) -> None:
    r = _result()
    (back,) = _decode_payloads([arrow.to_ipc_bytes(r, compression)])
    assert isinstance(back, QueryResult)
    assert back.labels == r.labels
    assert np.array_equal(back.t_ms, r.t_ms) and np.array_equal(back.value, r.value)
    assert list(back.offsets) == list(r.offsets)


def test_undecodable_payload_is_an_exception_not_a_failure() -> None:
    good = arrow.to_ipc_bytes(_result(), "lz4")
    outcomes = _decode_payloads([good[: len(good) // 2], b"not arrow", good])
    assert isinstance(outcomes[0], Exception) and isinstance(outcomes[1], Exception)
    assert isinstance(outcomes[2], QueryResult)


def test_label_list_memo_hands_out_independent_lists() -> None:
    payload = arrow.to_ipc_bytes(_result(), "lz4")
    a, b = _decode_payloads([payload, payload])
    assert isinstance(a, QueryResult) and isinstance(b, QueryResult)
    assert a.labels == b.labels
    assert a.labels is not b.labels and a.canonical_keys() is not b.canonical_keys()
    a.labels.append({"__name__": "intruder"})
    a.canonical_keys().append(b"{}")
    assert len(b.labels) == 5 and len(b.canonical_keys()) == 5
    (c,) = _decode_payloads([payload])
    assert isinstance(c, QueryResult) and len(c.labels) == 5 and len(c.canonical_keys()) == 5


def test_cache_compression_setting() -> None:
    assert CacheConfig().compression == "lz4"
    assert CacheConfig(compression="none").compression == "none"
    with pytest.raises(ValueError, match="compression"):
        CacheConfig(compression="gzip")


def test_puts_are_grouped_by_samples() -> None:
    from proxy.pipeline.cache_write import groups_by_samples as _groups_by_samples

    def e(n: int) -> tuple[None, QueryResult, None]:
        return (None, _result(n_series=1, points=n), None)

    entries = [e(5), e(5), e(20), e(3), e(1)]
    groups = _groups_by_samples(entries, 10)
    assert [[x[1].n_samples for x in g] for g in groups] == [[5, 5], [20], [3, 1]]
    assert [x for g in groups for x in g] == entries  # order kept, nothing lost
    assert _groups_by_samples([], 10) == []


def test_malloc_tuning_is_on_by_default_and_applied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    import pyarrow as pa

    import proxy
    from proxy.runtime import memory

    glibc = hasattr(ctypes.CDLL(None), "mallopt")
    before = pa.default_memory_pool()
    try:
        monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
        monkeypatch.delenv("PROMACCEL_MMAP_THRESHOLD", raising=False)
        monkeypatch.setattr(proxy, "ARROW_POOL_CHOSEN", False)
        pa.set_memory_pool(pa.mimalloc_memory_pool())
        monkeypatch.setattr(memory, "_done", False)
        assert memory.tune_malloc() is glibc  # default: a pinned 128 KiB threshold
        assert pa.default_memory_pool().backend_name == "system"  # Arrow allocates with malloc
        assert memory.tune_malloc() is False  # once per process
        monkeypatch.setattr(memory, "_done", False)
        monkeypatch.setenv("PROMACCEL_MMAP_THRESHOLD", "0")
        assert memory.tune_malloc() is False  # 0: glibc's dynamic threshold
        monkeypatch.setattr(memory, "_done", False)
        monkeypatch.setenv("PROMACCEL_MMAP_THRESHOLD", "not-bytes")
        assert memory.tune_malloc() is glibc  # a warning, and the default
        monkeypatch.setattr(memory, "_done", False)
        monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
        assert memory.tune_malloc() is False  # glibc's own setting wins
        # Arrow's own setting wins too.
        pa.set_memory_pool(pa.mimalloc_memory_pool())
        monkeypatch.setattr(proxy, "ARROW_POOL_CHOSEN", True)  # ARROW_DEFAULT_MEMORY_POOL set by the user
        monkeypatch.setattr(memory, "_done", False)
        memory.tune_malloc()
        assert pa.default_memory_pool().backend_name == "mimalloc"
    finally:
        pa.set_memory_pool(before)


def test_memory_is_given_back_after_a_large_answer_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from proxy.pipeline import answer_bytes
    from proxy.runtime import memory

    memory.give_back()  # glibc's malloc_trim and Arrow's release_unused: callable here
    started: list[str] = []

    class Thread:
        def __init__(self, target: object, name: str, daemon: bool) -> None:
            self.name = name

        def start(self) -> None:
            started.append(self.name)

    later: list[float] = []

    class Timer:
        def __init__(self, delay: float, target: Any) -> None:
            later.append(delay)
            self.target = target
            self.daemon = False

        def start(self) -> None:
            pass

    now = [100.0]
    monkeypatch.setattr(memory.threading, "Thread", Thread)
    monkeypatch.setattr(memory.threading, "Timer", Timer)
    monkeypatch.setattr(memory.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(memory, "_last_give_back", 0.0)
    monkeypatch.setattr(memory, "_trailing", None)
    monkeypatch.setattr(memory, "give_back", lambda: started.append("late"))
    memory.give_back_soon()
    now[0] += memory.GIVE_BACK_EVERY_S / 2
    memory.give_back_soon()  # within the interval: once it is over, not now
    memory.give_back_soon()  # ... and only once
    assert started == ["promaccel-give-back"] and later == [memory.GIVE_BACK_EVERY_S / 2]
    memory._trailing.target()  # the interval is over
    assert started == ["promaccel-give-back", "late"] and memory._trailing is None
    now[0] += memory.GIVE_BACK_EVERY_S
    memory.give_back_soon()
    assert started == ["promaccel-give-back", "late", "promaccel-give-back"]

    # A query's reservation: a large one gives memory back when it is let go, a small one not.
    calls: list[int] = []
    monkeypatch.setattr(answer_bytes, "give_back_soon", lambda: calls.append(1))

    async def scenario() -> None:
        budget = answer_bytes.AnswerBytes(limit=1 << 30, timeout_s=5)
        small = await budget.reserve(answer_bytes.GIVE_BACK_ABOVE - 1, 5)
        large = await budget.reserve(answer_bytes.GIVE_BACK_ABOVE, 5)
        small.release()
        assert calls == []
        large.release()
        large.release()
        assert calls == [1]

    asyncio.run(scenario())


def test_non_integral_picks_what_the_encoder_leaves_to_orjson() -> None:
    from proxy.codec.json_encode import _non_integral

    v = np.array([1.0, -0.0, 2.5, np.nan, np.inf, -np.inf, 2.0**53, 2.0**53 - 1, -3.0, 1e300, 0.1, -7.25])
    assert _non_integral(v).tolist() == [2.5, 0.0, 0.0, 0.0, 2.0**53, 1e300, 0.1, -7.25]
    assert _non_integral(np.zeros(0)).tolist() == []


@pytest.mark.parametrize("series", [[0, 1, 0, 1], [-1, 0, 1, 1], [0, 0, 1, 9]])
def test_cached_table_with_a_bad_series_column_is_refused(series: list[int]) -> None:
    import pyarrow as pa

    from proxy.codec.errors import MalformedAnswer

    good = _result(n_series=2, points=2)
    table = arrow.to_table(good)
    bad = table.set_column(table.schema.get_field_index("series"), "series",
                           pa.array(series, type=pa.int32()))
    bad = bad.replace_schema_metadata(table.schema.metadata)
    with pytest.raises(MalformedAnswer, match="out of order"):
        arrow.from_table(bad)
    back = arrow.from_table(table)
    assert list(back.offsets) == [0, 2, 4]


def test_decoded_cells_are_reused_only_for_the_same_bytes() -> None:
    from proxy.pipeline.cache_read import DecodedCells, payload_signature

    one = QueryResult.from_series("matrix", [({"a": "1"}, [1, 2], [1.0, 2.0])])
    payload = arrow.to_ipc_bytes(one, None)
    sig = payload_signature(payload)
    cells = DecodedCells(max_samples=8)
    assert cells.get("d", payload) is None and cells.keeps(payload)
    cells.put("d", sig, one)
    assert cells.get("d", bytes(payload)) is one  # equal bytes, another object: reused
    assert cells.get("d", memoryview(b"xx" + payload)[2:]) is one  # a view of the stored value too
    other = arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"a": "1"}, [1, 2], [1.0, 3.0])]), None)
    assert cells.get("d", other) is None  # the entry changed (re-stored after late data)
    # Bounded by samples, least recently used out.
    for i in range(5):
        cells.put(f"k{i}", sig, one)
    assert cells.get("k0", payload) is None and cells.get("k4", payload) is one
    big = QueryResult.from_series("matrix", [({"a": "1"}, list(range(3)), [1.0] * 3)])
    blob = arrow.to_ipc_bytes(big, None)
    cells.put("big", payload_signature(blob), big)  # over a quarter of the bound: not kept
    assert cells.get("big", blob) is None
    assert not DecodedCells(max_samples=4).keeps(b"x" * (24 + (1 << 20) + 1))  # too large to hash


def test_a_read_lets_each_payload_go_once_decoded() -> None:
    """CacheReader.decode empties the list it is given and decode_payloads drops each payload
    as soon as it is decoded: a heavy panel's compressed cells do not all wait for the last."""
    import asyncio
    import weakref

    from proxy.cache import CacheKey
    from proxy.pipeline.cache_read import CacheReader, decode_payloads
    from shardplanner.plan import Span

    cells = [QueryResult.from_series("matrix", [({"a": str(i)}, [1, 2], [1.0, float(i)])]) for i in range(3)]

    # Buffers that can be watched going away (bytes cannot be weakly referenced).
    # Compressed, as large cells are stored: the decoded arrays are fresh, not views of it.
    payloads: list[Any] = [np.frombuffer(arrow.to_ipc_bytes(c, "lz4"), dtype=np.uint8).copy() for c in cells]
    gone = [weakref.ref(p) for p in payloads]
    seen: list[list[bool]] = []
    real = arrow.from_ipc_bytes

    def watched(data: Any, pack_from: int = 0) -> QueryResult:
        seen.append([g() is None for g in gone])
        return real(data, pack_from=pack_from)

    mp = pytest.MonkeyPatch()
    mp.setattr(arrow, "from_ipc_bytes", watched)
    try:
        keys = [CacheKey(f"up{i}", Span.instant(1_000), lookback_ms=0) for i in range(3)]
        reader = CacheReader.__new__(CacheReader)
        reader.config = type("Cfg", (), {"cache": CacheConfig()})()  # type: ignore[assignment]
        reader.decoded = type("NoMemo", (), {"get": lambda *a: None, "keeps": lambda *a: False,
                                              "put": lambda *a: None})()
        found = asyncio.run(reader.decode(keys, payloads))
    finally:
        mp.undo()
    assert payloads == []
    assert [found[k.digest].to_pylist() for k in keys] == [c.to_pylist() for c in cells]
    # While the i-th was decoded, the ones before it were already let go.
    assert seen == [[False, False, False], [True, False, False], [True, True, False]]
    assert all(g() is None for g in gone)
    assert [type(x) for x in decode_payloads([None])] == [ValueError]


@pytest.mark.parametrize("env, pool", [(None, "system"), ("mimalloc", "mimalloc")])
def test_importing_promaccel_chooses_arrows_pool_unless_the_user_did(env: str | None, pool: str) -> None:
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env is not None:
        environ["ARROW_DEFAULT_MEMORY_POOL"] = env
    code = "import proxy.codec.arrow, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == pool


def test_memory_tuning_and_give_back_start_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ctypes.util.find_library` runs `ldconfig -p`: a fork of the whole server in the middle
    of a burst (seen as a +250 MiB spike of the process tree). Neither path may start one."""
    import subprocess

    from proxy.runtime import memory

    started: list[object] = []

    class NoProcess:
        def __init__(self, *args: object, **kw: object) -> None:
            started.append(args)
            raise AssertionError("a subprocess was started")

    monkeypatch.setattr(subprocess, "Popen", NoProcess)
    monkeypatch.setattr(memory, "_done", False)
    monkeypatch.setattr(memory, "_trim", None)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    memory.tune_malloc()
    memory.give_back()
    assert started == []


def test_a_stored_cell_is_adopted_by_the_first_read_of_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 28: a cell this process fetched and stored is not decoded again (nor its JSON
    written again) when the first warm refresh after it left the landing zone reads its key."""
    from proxy.pipeline import cache_read
    from proxy.pipeline.cache_read import DecodedCells
    from proxy.pipeline.landing import Landing

    one = QueryResult.from_series("matrix", [({"a": "1"}, [1, 2], [1.0, 2.0])])
    payload = arrow.to_ipc_bytes(one, None)
    cells = DecodedCells(max_samples=1000)
    landing = Landing()
    landing.on_unland = cells.adopt
    monkeypatch.setattr("proxy.pipeline.landing.LANDING_GRACE_S", 0.0)

    async def land_and_leave() -> None:
        landing.land("d", one, 1)
        landing.unland_later([("d", one)])
        await asyncio.sleep(0.01)

    asyncio.run(land_and_leave())
    assert landing.landed("d") is None  # gone from the landing zone ...
    assert cells.get("d", payload) is one  # ... and adopted by the first read of its key
    assert cells.get("d", bytes(payload)) is one  # then kept as any decoded cell
    other = arrow.to_ipc_bytes(QueryResult.from_series("matrix", [({"a": "1"}, [1, 2], [1.0, 3.0])]), None)
    assert cells.get("d", other) is None  # its payload changed: decoded again
    # Adopted once, for a while, small cells only.
    cells.adopt("e", one)
    now = cache_read.time.monotonic()
    monkeypatch.setattr(cache_read.time, "monotonic", lambda: now + cache_read.ADOPT_WITHIN_S + 1)
    assert cells.get("e", payload) is None
    big = QueryResult.from_series("matrix", [({"a": "1"}, list(range(300)), [1.0] * 300)])
    cells.adopt("f", big)  # over a quarter of the decoded cells' bound
    assert cells.get("f", arrow.to_ipc_bytes(big, None)) is None
    # An invalidation drops what is adopted.
    cells.adopt("g", one)
    cells.clear()
    assert cells.get("g", payload) is None
