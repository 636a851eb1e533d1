"""Cached cells read back packed (`arrow.PackedPiece`): the samples stay in the Arrow payload
and are read a batch at a time. A merge of packed cells is the same answer as a merge of
decoded ones -- the same bytes streamed, the same samples when read -- and streaming it never
decodes a cell whole (issue 15)."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.codec import arrow, json_encode
from proxy.codec.errors import MalformedAnswer
from proxy.codec.json_encode import encode_prometheus_json, iter_prometheus_json
from proxy.result import QueryResult
from proxy.result import concat as concat_mod
from proxy.result.concat import Concatenation, concat

from .test_concat import STEP, T0, fleet, time_pieces


def packed(r: QueryResult, batch_rows: int, compression: str = "lz4") -> QueryResult:
    with mock.patch.object(arrow, "PAYLOAD_BATCH_ROWS", batch_rows):
        payload = arrow.to_ipc_bytes(r, compression)  # type: ignore[arg-type]
    return arrow.from_ipc_bytes(payload, pack_from=1)


def sorted_fleet(rng: random.Random, n_series: int, n_steps: int) -> QueryResult:
    """`fleet` with its series in Prometheus's order, as a backend's cells are."""
    r = fleet(rng, n_series, n_steps)
    order = sorted(range(r.n_series), key=r.series_keys().__getitem__)
    rows = r.to_pylist()
    return QueryResult.from_series("matrix", [rows[i] for i in order])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.sampled_from([1, 5, 64, 10_000]), st.integers(1, 300),
       st.booleans(), st.sampled_from(["lz4", "zstd"]))
def test_a_merge_of_packed_cells_is_the_merge_of_decoded_ones(seed: int, n_pieces: int, batch_rows: int,
                                                               window: int, in_order: bool, compression: str) -> None:
    rng = random.Random(seed)
    whole = (sorted_fleet if in_order else fleet)(rng, rng.randrange(1, 40), 60)
    pieces = time_pieces(whole, n_pieces, rng)
    rng.shuffle(pieces)
    # Some cells packed, some not (small cells, a cell decoded by an earlier reader).
    mixed = [packed(p, batch_rows, compression) if rng.random() < 0.8 else p for p in pieces]
    eager = concat(pieces)
    want = encode_prometheus_json(eager)
    assert encode_prometheus_json(concat(mixed)) == want
    with mock.patch.object(concat_mod, "LAZY_ABOVE_SAMPLES", 0), \
            mock.patch.object(json_encode, "_WINDOW_SAMPLES", window):
        lazy = concat(mixed, lazy=True)
        assert isinstance(lazy, Concatenation)
        assert b"".join(iter_prometheus_json(lazy, None)) == want
        # Streaming read the packed cells through cursors: none was decoded whole.
        assert all(p.packed_samples() is not None for p in mixed if isinstance(p, arrow.PackedPiece))
        assert np.array_equal(lazy.t_ms, eager.t_ms) and lazy.value.tobytes() == eager.value.tobytes()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 3, 64]), st.integers(1, 200))
def test_a_packed_cell_is_the_cell(seed: int, batch_rows: int, window: int) -> None:
    rng = random.Random(seed)
    cell = fleet(rng, rng.randrange(1, 30), 40)
    p = packed(cell, batch_rows)
    assert isinstance(p, arrow.PackedPiece)
    assert (p.labels, p.canonical_keys(), p.offsets.tolist()) == (cell.labels, cell.canonical_keys(),
                                                                  cell.offsets.tolist())
    # Streamed by windows of whole series, and then read whole: the cell's very samples.
    with mock.patch.object(json_encode, "_WINDOW_SAMPLES", window):
        assert b"".join(iter_prometheus_json(p, None)) == encode_prometheus_json(cell)
    assert p.packed_samples() is not None
    nz = cell.counts > 0
    assert p.packed.firsts[nz].tolist() == cell.t_ms[cell.offsets[:-1][nz]].tolist()
    assert p.packed.lasts[nz].tolist() == cell.t_ms[cell.offsets[1:][nz] - 1].tolist()
    assert p.t_ms.tobytes() == cell.t_ms.tobytes() and p.value.tobytes() == cell.value.tobytes()
    assert p.packed_samples() is None  # decoded now: read as any result


def test_a_cursor_reads_forward_a_few_batches_and_starts_again_when_asked_back() -> None:
    n = 1000
    cell = QueryResult.from_series("matrix", [({"i": str(i)}, [T0 + k * STEP for k in range(10)],
                                               [float(i * 10 + k) for k in range(10)]) for i in range(n // 10)])
    p = packed(cell, 64)
    assert isinstance(p, arrow.PackedPiece)
    cur = p.packed.cursor()
    for lo in range(0, n, 50):
        t, v, base = cur.rows(lo, lo + 50)
        assert v[lo - base: lo - base + 50].tolist() == [float(x) for x in range(lo, lo + 50)]
        assert len(cur.t) <= 1 << 14 and cur.end - cur.start <= 50 + 2 * 64  # a window and its batches
    t, v, base = cur.rows(10, 20)  # backwards: read again from the start
    assert v[10 - base: 20 - base].tolist() == [float(x) for x in range(10, 20)]
    with pytest.raises(MalformedAnswer):
        cur.rows(n - 1, n + 1)  # past its rows: a broken payload, not a short answer


def test_small_single_batch_and_unasked_payloads_decode_as_before() -> None:
    cell = fleet(random.Random(3), 20, 30)
    with mock.patch.object(arrow, "PAYLOAD_BATCH_ROWS", 7):
        payload = arrow.to_ipc_bytes(cell, "lz4")
    assert isinstance(arrow.from_ipc_bytes(payload, pack_from=cell.n_samples), arrow.PackedPiece)
    small = arrow.from_ipc_bytes(payload, pack_from=cell.n_samples + 1)  # read without values, then them
    assert type(small) is QueryResult and 2 * (cell.n_samples + 1) <= len(payload)
    assert encode_prometheus_json(small) == encode_prometheus_json(cell)
    assert type(arrow.from_ipc_bytes(payload)) is QueryResult  # not asked
    with mock.patch.object(arrow, "PAYLOAD_BATCH_ROWS", 1 << 20):
        one_batch = arrow.to_ipc_bytes(cell, "lz4")  # as written before batches: read whole, the same cell
    whole = arrow.from_ipc_bytes(one_batch, pack_from=1)
    assert isinstance(whole, arrow.PackedPiece)
    assert encode_prometheus_json(whole) == encode_prometheus_json(cell)


def test_a_fetched_cell_packs_once_and_its_payload_is_what_is_stored() -> None:
    cell = fleet(random.Random(4), 30, 40)
    assert arrow.pack(cell, "lz4", cell.n_samples + 1) is cell  # under the threshold
    assert arrow.pack(cell, "lz4", 0) is cell  # off
    p = arrow.pack(cell, "lz4", 1)
    assert isinstance(p, arrow.PackedPiece) and p.packed_samples() is not None
    assert arrow.pack(p, "lz4", 1) is p
    # The store gets the payload made when it was packed (no second encoding), and it reads
    # back as the cell.
    assert arrow.to_ipc_view(p, "lz4").obj is arrow.to_ipc_view(p, "lz4").obj
    assert bytes(arrow.to_ipc_view(p, "lz4")) == arrow.to_ipc_bytes(cell, "lz4")
    assert encode_prometheus_json(arrow.from_ipc_bytes(arrow.to_ipc_view(p, "lz4"))) == encode_prometheus_json(cell)
    assert p.packed_samples() is not None
    assert bytes(arrow.to_ipc_view(p, "zstd")) == arrow.to_ipc_bytes(cell, "zstd")  # another compression: encoded again


def test_a_cell_out_of_time_order_is_refused() -> None:
    bad = QueryResult("matrix", [{"a": "1"}], np.array([0, 3]), np.array([T0, T0 + 2, T0 + 1]),
                      np.array([1.0, 2.0, 3.0]))
    with mock.patch.object(arrow, "PAYLOAD_BATCH_ROWS", 1):
        payload = arrow.to_ipc_bytes(bad, "lz4")
    with pytest.raises(MalformedAnswer):
        arrow.from_ipc_bytes(payload, pack_from=1)
