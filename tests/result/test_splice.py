"""Spliced answers (codec/json_splice.py, issue 28): an answer made of cached cells, written
from their kept encoded samples, is byte for byte the answer the encoder writes -- for
random cells, cut at random edges (`slice_time`, as the lookup cuts a window's edge cells),
concatenated (`Concatenation`) -- and gzipped once by the response, it decodes to the same
bytes with Python's gzip, zlib and httpx."""

from __future__ import annotations

import asyncio
import gc
import gzip
import random
import zlib

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.api.compress import FastGZipMiddleware
from proxy.api.responses import json_response
from proxy.codec import arrow, json_splice
from proxy.codec.json_encode import encode_prometheus_json
from proxy.codec.json_splice import memo_bytes, splice_prometheus_json, spliced_runs
from proxy.result import QueryResult
from proxy.result.concat import Concatenation, concat
from proxy.result.pieces import slice_time, split_time

from .test_concat import STEP, T0, fleet


def cells_of(whole: QueryResult, n: int, rng: random.Random) -> list[QueryResult]:
    """`whole` cut into n cells of equal length in time (as cache cells are)."""
    last = int(whole.t_ms.max()) if whole.n_samples else T0
    size = max(1, (last - T0) // STEP // n + 1) * STEP
    bounds = [(T0 + k * size, T0 + (k + 1) * size - 1) for k in range(n)]
    cells = split_time(whole, bounds)
    for c in cells:
        c.keeps_json = True  # as the cache reader marks the cells it keeps decoded
    return cells


def window(cells: list[QueryResult], lo: int, hi: int, lazy: bool = False) -> list[QueryResult]:
    """The cells a window [lo, hi] reads, the edge ones cut (`lazy`: as the lookup cuts them)."""
    return [slice_time(c, lo, hi, lazy=lazy) for c in cells]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(0, 59), st.integers(0, 59))
def test_spliced_equals_encoded(seed: int, n_cells: int, a: int, b: int) -> None:
    rng = random.Random(seed)
    whole = fleet(rng, rng.randrange(1, 30), 60)
    cells = cells_of(whole, n_cells, rng)
    lo, hi = T0 + min(a, b) * STEP, T0 + max(a, b) * STEP
    for lazy in (False, True, True):  # the last time from the kept bytes
        answer = concat(window(cells, lo, hi, lazy), lazy=True)
        want = encode_prometheus_json(concat(window(cells, lo, hi)))
        if answer.n_series == 0:  # nothing to splice: the encoder writes `[]`
            assert splice_prometheus_json(answer) is None
        elif isinstance(answer, Concatenation):
            assert splice_prometheus_json(answer) == want
            with spliced_runs(answer) as sp:
                assert sp is not None and sp.body.tobytes() == want
        else:  # one cell: its own samples, spliced once they are kept
            got = splice_prometheus_json(answer)
            assert got is None or got == want
    if isinstance(answer, Concatenation) and answer.n_samples:
        assert any(c.sample_json is not None for c in cells)  # kept for the next answer


def test_edge_cells_reuse_their_cells_bytes() -> None:
    rng = random.Random(7)
    whole = fleet(rng, 20, 60)
    cells = cells_of(whole, 4, rng)
    answer = concat(window(cells, T0 + 7 * STEP, T0 + 50 * STEP), lazy=True)
    assert isinstance(answer, Concatenation)
    assert splice_prometheus_json(answer) == encode_prometheus_json(concat(window(cells, T0 + 7 * STEP, T0 + 50 * STEP)))
    kept = {id(c): c.sample_json for c in cells}
    assert all(m is not None for m in kept.values())  # the edge cells were written whole
    # The next window (slid by one step) splices the same kept bytes: nothing written again.
    answer = concat(window(cells, T0 + 8 * STEP, T0 + 51 * STEP), lazy=True)
    with pytestmock_encode() as calls:
        assert splice_prometheus_json(answer) == encode_prometheus_json(concat(window(cells, T0 + 8 * STEP, T0 + 51 * STEP)))
    assert calls == []
    assert all(c.sample_json is kept[id(c)] for c in cells)


class pytestmock_encode:
    """Records calls of json_splice's encode_samples."""

    def __enter__(self) -> list[int]:
        self.calls: list[int] = []
        self.orig = json_splice.encode_samples

        def spy(t, v):  # type: ignore[no-untyped-def]
            self.calls.append(len(t))
            return self.orig(t, v)

        json_splice.encode_samples = spy  # type: ignore[assignment]
        return self.calls

    def __exit__(self, *exc: object) -> None:
        json_splice.encode_samples = self.orig  # type: ignore[assignment]


def test_kept_bytes_are_bounded_and_go_with_their_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    wholes = [fleet(rng, 30, 60) for _ in range(12)]
    cellsets = [cells_of(w, 3, rng) for w in wholes]
    largest = max(json_splice.SampleJSON(*json_splice.encode_samples(c.t_ms, c.value)).nbytes
                  for cells in cellsets for c in cells)
    memos = json_splice._Memos(4 * largest)  # room for 4 to 12 cells' bytes of 36
    monkeypatch.setattr(json_splice, "_MEMOS", memos)
    for cells in cellsets:
        splice_prometheus_json(concat(cells, lazy=True))
        assert memos.used <= memos.max_bytes
    assert sum(c.sample_json is not None for cells in cellsets for c in cells) < 36  # some were dropped
    del cellsets, cells
    gc.collect()
    assert memos.used == 0  # the cells went, and their bytes with them
    assert memo_bytes() >= 0


def test_gathered_or_packed_results_are_encoded() -> None:
    rng = random.Random(5)
    cells = cells_of(fleet(rng, 10, 60), 3, rng)
    fresh = concat(cells)  # gathered: made for one answer, nothing kept to splice
    assert splice_prometheus_json(fresh) is None
    vector = QueryResult.from_series("vector", [({"a": "b"}, [T0], [1.0])])
    assert splice_prometheus_json(vector) is None


def _app(result: QueryResult) -> Starlette:
    async def answer(request: Request) -> Response:
        return json_response(result, {}, gzip_ok="gzip" in request.headers.get("accept-encoding", ""))

    app = Starlette(routes=[Route("/q", answer)])
    app.add_middleware(FastGZipMiddleware, minimum_size=1024)
    return app


@pytest.mark.parametrize("n_series", [1, 40, 400])
def test_the_gzipped_answer_decodes_everywhere(n_series: int) -> None:
    rng = random.Random(n_series)
    cells = cells_of(fleet(rng, n_series, 60), 5, rng)
    want = encode_prometheus_json(concat(cells))

    async def run() -> list[httpx.Response]:
        out = []
        for accept in ("gzip", "gzip, deflate, br", "identity"):
            app = _app(concat(cells, lazy=True))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                out.append(await c.get("/q", headers={"Accept-Encoding": accept}))
        return out

    for r in asyncio.run(run()):
        assert r.status_code == 200
        assert r.content == want  # httpx's decoder
        if r.headers.get("content-encoding") == "gzip":
            raw = r.extensions.get("raw") or None
            assert r.headers["vary"] == "Accept-Encoding"
            assert int(r.headers["content-length"]) < len(want)
            del raw
    # The body as sent: one gzip member that Python's gzip and zlib read whole.
    async def raw_body() -> tuple[httpx.Headers, bytes]:
        app = _app(concat(cells, lazy=True))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            async with c.stream("GET", "/q", headers={"Accept-Encoding": "gzip"}) as r:
                return r.headers, b"".join([chunk async for chunk in r.aiter_raw()])

    headers, body = asyncio.run(raw_body())
    if len(want) >= 1024:
        assert headers["content-encoding"] == "gzip"
        assert gzip.decompress(body) == want
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        assert d.decompress(body) + d.flush() == want and d.eof and not d.unused_data
    else:
        assert body == want
    assert np.all(np.frombuffer(want[:1], dtype=np.uint8) == ord("{"))


def test_packed_cells_are_spliced_and_stay_packed() -> None:
    rng = random.Random(11)
    whole = fleet(rng, 40, 60)
    cells = [arrow.pack(c, "lz4", 1) if c.n_samples else c for c in cells_of(whole, 3, rng)]
    for c in cells:
        c.keeps_json = True
    assert any(c.packed_samples() is not None for c in cells)
    lo, hi = T0 + 5 * STEP, T0 + 50 * STEP
    want = encode_prometheus_json(concat(window(cells_of(whole, 3, rng), lo, hi)))
    plain = cells_of(whole, 3, rng)
    # As the lookup reads them: a cell inside the window as it is, the edge ones cut.
    inside = [c.n_samples > 0 and int(c.t_ms.min()) >= lo and int(c.t_ms.max()) <= hi for c in plain]
    for _ in range(2):
        answer = concat([c if whole_cell else slice_time(c, lo, hi) for c, whole_cell in zip(cells, inside)],
                        lazy=True)
        assert splice_prometheus_json(answer) == want
    assert any(inside)
    for c, whole_cell in zip(cells, inside):
        if whole_cell:
            assert c.packed_samples() is not None  # read through a cursor, not unpacked
            assert c.sample_json is not None


def test_cells_made_for_one_answer_are_encoded() -> None:
    """A cold answer's fetched cells (not kept by the cache reader): the encoder writes it,
    nothing is kept."""
    rng = random.Random(17)
    cells = cells_of(fleet(rng, 20, 60), 3, rng)
    for c in cells:
        c.keeps_json = False
    before = memo_bytes()
    answer = concat(window(cells, T0 + 3 * STEP, T0 + 55 * STEP), lazy=True)
    assert not isinstance(answer, Concatenation) and answer.n_samples  # gathered as before
    assert splice_prometheus_json(answer) is None
    assert all(c.sample_json is None for c in cells) and memo_bytes() == before
    cells[1].keeps_json = True  # one cell kept: still not all of them
    assert splice_prometheus_json(concat(window(cells, T0 + 3 * STEP, T0 + 55 * STEP), lazy=True)) is None


def test_a_day_cell_answering_a_days_hour_pieces_is_written_once_for_all_of_them() -> None:
    """The hour pieces of a day the window holds only part of are each answered by a cut of
    the day cell (an hour of it, 1/24): together they read most of it, so the cell is written
    whole once and kept, and the next answer writes nothing."""
    rng = random.Random(11)
    day = fleet(rng, 2000, 240)  # 240 steps: 24 "hours" of 10; large enough that one hour
    assert day.n_samples > 8 * day.n_samples / 24 + json_splice.ORIGIN_SMALL  # would not write it
    day.keeps_json = True
    hours = [(T0 + 10 * h * STEP, T0 + (10 * h + 9) * STEP) for h in range(24)]
    for k in range(2):
        lo = T0 + (3 + k) * STEP  # the window slides: the first hour is cut
        cuts = [slice_time(day, max(a, lo), b, lazy=True) for a, b in hours]
        with pytestmock_encode() as calls:
            got = splice_prometheus_json(concat(cuts, lazy=True))
        assert got == encode_prometheus_json(concat([slice_time(day, max(a, lo), b) for a, b in hours]))
        assert calls == ([day.n_samples] if k == 0 else [])  # the whole cell once, then nothing
    assert day.sample_json is not None
