"""proxy/codec/deflate.py: `gzip_bytes` writes one standard gzip member (in two halves at once
from PARALLEL_ABOVE bytes up); `gzip_spliced` writes a spliced warm answer as one gzip member
from deflate fragments kept for the runs it read before, and the bytes between them deflated
now -- and every body decodes, with Python's gzip, zlib, ISA-L and httpx, to exactly the
spliced answer (which tests/result/test_splice.py holds equal to the encoder's).

Every body is checked by decompressing it with a reader that is not the module's writer."""

from __future__ import annotations

import asyncio
import gc
import gzip
import random
import struct
import weakref
import zlib

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from isal import isal_zlib  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.api.compress import MINIMUM_SIZE, FastGZipMiddleware
from proxy.api.responses import json_response
from proxy.codec import deflate
from proxy.codec.deflate import PARALLEL_ABOVE, gzip_bytes, gzip_spliced
from proxy.codec.json_encode import encode_prometheus_json
from proxy.codec.json_splice import spliced_runs
from proxy.result import QueryResult
from proxy.result.concat import concat

from ..result.test_concat import STEP, T0, fleet
from ..result.test_splice import cells_of, window


def json_like(n: int, seed: int = 1) -> bytes:
    """`n` bytes shaped like a matrix answer (compressible, but not trivially)."""
    rng = random.Random(seed)
    out = bytearray(b'{"status":"success","data":{"resultType":"matrix","result":[')
    while len(out) < n:
        out += b'[%d,"%.3f"],' % (1_793_404_800 + rng.randrange(10_000) * 30, rng.random() * 100)
    return bytes(out[:n])


def one_member(body: bytes) -> bytes:
    """The data of `body`, which must be exactly one gzip member (nothing after it)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = d.decompress(body) + d.flush()
    assert d.eof and d.unused_data == b"", "not exactly one gzip member"
    return data


def read_everywhere(body: bytes) -> bytes:
    """`body` decoded by zlib (one member, CRC and length checked), gzip, ISA-L and httpx,
    which must agree."""
    data = one_member(body)
    assert gzip.decompress(body) == data
    assert isal_zlib.decompress(body, 16 + zlib.MAX_WBITS) == data
    assert httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=body).read() == data
    crc, isize = struct.unpack("<II", body[-8:])
    assert crc == zlib.crc32(data) and isize == len(data) & 0xFFFFFFFF
    return data


def test_isal_is_used() -> None:
    # isal is a dependency (pyproject.toml): its absence is a broken install, not a skip.
    assert deflate._deflate is isal_zlib


# --- gzip_bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MINIMUM_SIZE, PARALLEL_ABOVE - 1, PARALLEL_ABOVE, PARALLEL_ABOVE + 1,
                                  3 * PARALLEL_ABOVE + 7])
def test_gzip_bytes_is_one_member_of_the_data_on_both_sides_of_the_parallel_threshold(size: int) -> None:
    data = json_like(size)
    body = gzip_bytes(data)
    assert body[:3] == b"\x1f\x8b\x08"  # gzip magic, deflate (RFC 1952)
    assert read_everywhere(body) == data
    if size >= MINIMUM_SIZE:
        assert len(body) < size / 2  # compressed, not stored


def test_gzip_bytes_takes_memoryviews_of_any_shape() -> None:
    """The splice path hands a memoryview of a reused buffer (responses.py): a view of a
    typed buffer is compressed as its bytes."""
    data = json_like(PARALLEL_ABOVE + 4096)
    words = memoryview(bytearray(data)).cast("B").cast("I", (len(data) // 4,))
    assert one_member(gzip_bytes(words)) == data[: len(data) // 4 * 4]
    assert one_member(gzip_bytes(memoryview(data[:5000]))) == data[:5000]


def test_incompressible_data_survives_both_paths() -> None:
    rng = random.Random(7)
    for size in (5000, PARALLEL_ABOVE + 3):
        data = rng.randbytes(size)
        assert one_member(gzip_bytes(data)) == data


# --- gzip_spliced -------------------------------------------------------------------------------


def _gzip_of(answer: QueryResult) -> tuple[bytes, bytes]:
    """(the spliced answer, its gzip_spliced body)."""
    with spliced_runs(answer) as sp:
        assert sp is not None
        return sp.body.tobytes(), gzip_spliced(sp)


@pytest.fixture
def fragments(monkeypatch: pytest.MonkeyPatch) -> deflate._Fragments:
    """A fresh fragment store for the test (the module's is process-wide)."""
    store = deflate._Fragments(16 << 20)
    monkeypatch.setattr(deflate, "_FRAGMENTS", store)
    return store


class _NoWholeGzip:
    """Counts gzip_spliced's falls back to gzip_bytes (the whole body deflated now)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = deflate.gzip_bytes

        def counting(data: bytes | memoryview) -> bytes:
            self.calls += 1
            return real(data)

        monkeypatch.setattr(deflate, "gzip_bytes", counting)


def test_a_sliding_window_is_gzipped_from_fragments_once_its_pieces_were_seen(
        fragments: deflate._Fragments, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    cells = cells_of(fleet(rng, 120, 240), 8, rng)  # ~30 steps a cell, every series in most
    whole = _NoWholeGzip(monkeypatch)
    sizes = []
    for k in range(6):  # the window slides a step a time; its 6 interior cells stay
        lo, hi = T0 + (20 + k) * STEP, T0 + (215 + k) * STEP
        answer = concat(window(cells, lo, hi, lazy=True), lazy=True)
        body, gz = _gzip_of(answer)
        assert body == encode_prometheus_json(concat(window(cells, lo, hi)))
        assert read_everywhere(gz) == body
        sizes.append((len(gz), len(gzip_bytes(body))))
    # Ask 1 deflates the whole body (its interior pieces noted); ask 2 compresses those pieces'
    # runs and keeps them, and from then on the body is made from the fragments.
    assert whole.calls == 1
    assert fragments.used > 0
    for got, alone in sizes[1:]:
        assert got < 2 * alone  # compressed, not stored (runs deflated alone share no history)


def test_a_windows_edge_pieces_are_never_deflated_ahead(fragments: deflate._Fragments,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A window over two cells, both cut (the bench's 1 h panels over two hour cells), asked
    again and again: its runs are deflated with the answer every time and nothing is kept
    (a sliding window's edges differ every time; building their fragments on the second
    ask cost ~3 ms for a 2 MB answer and they were never used)."""
    rng = random.Random(4)
    cells = cells_of(fleet(rng, 150, 120), 2, rng)
    whole = _NoWholeGzip(monkeypatch)
    lo, hi = T0 + 20 * STEP, T0 + 100 * STEP
    for _ in range(3):
        answer = concat(window(cells, lo, hi, lazy=True), lazy=True)
        body, gz = _gzip_of(answer)
        assert read_everywhere(gz) == body == encode_prometheus_json(concat(window(cells, lo, hi)))
    assert whole.calls == 3 and fragments.used == 0


def test_steady_pieces_under_half_the_answer_are_not_deflated_ahead(fragments: deflate._Fragments,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Three cells, the middle one whole but a small part of the window: its fragments could
    never make up MIN_COVERED of the answer, so none are noted or made for it."""
    rng = random.Random(6)
    cells = cells_of(fleet(rng, 150, 90), 3, rng)
    lo, hi = T0 + 2 * STEP, T0 + 88 * STEP
    for _ in range(3):
        answer = concat(window(cells, lo, hi, lazy=True), lazy=True)
        with spliced_runs(answer) as sp:
            assert sp is not None and any(src.steady for src in sp.sources)
            with monkeypatch.context() as m:
                m.setattr(deflate, "MIN_COVERED", 0.9)
                gz = gzip_spliced(sp)
            assert read_everywhere(gz) == sp.body.tobytes()
    assert fragments.used == 0 and not fragments._lru


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 7), st.integers(0, 59), st.integers(0, 59), st.booleans())
def test_every_mix_of_fragments_and_stretches_reads_back(seed: int, n_cells: int, a: int, b: int,
                                                         packed_first: bool) -> None:
    """Any cells, any window, every piece eligible (no size floor): the body is one member of
    exactly the spliced answer, whichever runs had fragments and however small the stretches
    between them (even none: two fragments side by side)."""
    store = deflate._Fragments(16 << 20)
    rng = random.Random(seed)
    cells = cells_of(fleet(rng, rng.randrange(1, 40), 60), n_cells, rng)
    lo, hi = T0 + min(a, b) * STEP, T0 + max(a, b) * STEP
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deflate, "_FRAGMENTS", store)
        mp.setattr(deflate, "MIN_PIECE_BYTES", 0)
        mp.setattr(deflate, "MIN_COVERED", 0.0)
        for lazy in (packed_first, True, not packed_first):
            answer = concat(window(cells, lo, hi, lazy), lazy=True)
            if answer.n_series == 0:
                continue
            with spliced_runs(answer) as sp:
                if sp is None:  # a single cell not kept yet: the encoder's
                    continue
                body = sp.body.tobytes()
                assert read_everywhere(gzip_spliced(sp)) == body


def test_fragments_are_bounded_and_never_match_another_memo() -> None:
    rng = random.Random(5)
    cells = cells_of(fleet(rng, 60, 120), 4, rng)
    answer = concat(cells, lazy=True)
    body = encode_prometheus_json(concat(cells_of(fleet(random.Random(5), 60, 120), 4, random.Random(5))))
    with spliced_runs(answer) as sp:
        assert sp is not None and sp.body.tobytes() == body
        src = max(sp.sources, key=lambda s: int(s.n.sum()))
        store = deflate._Fragments(1 << 20)
        assert store.get(src.memo, src.a, src.n) is None  # seen once: noted only
        batch = store.get(src.memo, src.a, src.n)
        assert batch is not None and store.get(src.memo, src.a, src.n) is batch
        assert len(batch.at) == len(src.a) + 1
        # Each fragment inflates, alone, to its run's bytes.
        for j in range(len(src.a)):
            d = zlib.decompressobj(-zlib.MAX_WBITS)
            run = d.decompress(batch.buf[batch.at[j]:batch.at[j + 1]].tobytes())
            assert run == src.memo.buf[src.a[j]:src.a[j] + src.n[j]].tobytes()
        # An entry whose memo went never answers for another that took its id.
        other = deflate.SampleJSON(src.memo.buf.copy(), src.memo.at.copy())
        key = (id(other), src.a.tobytes() + src.n.tobytes())
        store._lru[key] = (weakref.ref(src.memo), batch, 0)
        assert store.get(other, src.a, src.n) is None
        # The bound: a store of a few hundred bytes keeps no batch, and counts what it keeps.
        tiny = deflate._Fragments(600)
        for _ in range(3):
            tiny.get(src.memo, src.a, src.n)
        assert tiny.used <= 600
        off = deflate._Fragments(0)
        assert off.get(src.memo, src.a, src.n) is None and off.get(src.memo, src.a, src.n) is None
        assert off.used == 0
    store.keep_at_most(0)
    assert store.used == 0 and not store._lru
    del sp, src, answer, cells
    gc.collect()


def _app(answers: list[QueryResult]) -> Starlette:
    async def answer(request: Request) -> Response:
        return json_response(answers.pop(0), {}, gzip_ok="gzip" in request.headers.get("accept-encoding", ""))

    app = Starlette(routes=[Route("/q", answer)])
    app.add_middleware(FastGZipMiddleware, minimum_size=MINIMUM_SIZE)
    return app


def test_warm_answers_through_the_response_are_the_encoders(fragments: deflate._Fragments) -> None:
    """json_response gzips spliced answers with gzip_spliced: asked again and again (the
    fragments used from the second ask), every body as sent is one gzip member of the
    encoder's answer."""
    rng = random.Random(9)
    cells = cells_of(fleet(rng, 200, 240), 8, rng)
    windows = [(T0 + (10 + k) * STEP, T0 + (225 + k) * STEP) for k in range(5)]
    answers = [concat(window(cells, lo, hi, lazy=True), lazy=True) for lo, hi in windows]

    async def run() -> list[tuple[httpx.Headers, bytes]]:
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(answers)), base_url="http://t") as c:
            for _ in windows:
                async with c.stream("GET", "/q", headers={"Accept-Encoding": "gzip"}) as r:
                    out.append((r.headers, b"".join([chunk async for chunk in r.aiter_raw()])))
        return out

    for (headers, body), (lo, hi) in zip(asyncio.run(run()), windows):
        assert headers["content-encoding"] == "gzip" and int(headers["content-length"]) == len(body)
        assert read_everywhere(body) == encode_prometheus_json(concat(window(cells, lo, hi)))
    assert fragments.used > 0
    assert np.all(np.frombuffer(body[:2], dtype=np.uint8) == [0x1F, 0x8B])
