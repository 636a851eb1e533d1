"""Which answers are spliced from their cells' kept encoded samples (proxy/codec/json_splice.py,
issue 28), and that a spliced answer in the reused buffer is the encoder's bytes. Random
cells, cut and concatenated, byte for byte: tests/result/test_splice.py."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.codec.json_encode import encode_prometheus_json
from proxy.codec.json_splice import (
    SPLICE_MAX_SAMPLES,
    copy_runs,
    memo_bytes,
    splice_prometheus_json,
    spliceable,
    spliced_runs,
)
from proxy.result import QueryResult
from proxy.result.concat import concat
from proxy.result.pieces import slice_time

T0 = 1_700_000_000_000
STEP = 10_000


def cell(hour: int, n_series: int = 3, kept: bool = True) -> QueryResult:
    t = [T0 + hour * 3_600_000 + STEP * j for j in range(360)]
    r = QueryResult.from_series("matrix", [({"Hostname": f"node-{s}", "le": '"q"'}, t,
                                            [s + j / 7 for j in range(360)]) for s in range(n_series)])
    r.keeps_json = kept  # as the cache reader marks the cells it keeps decoded
    return r


def test_only_matrices_of_kept_cells_within_the_bound_are_spliced() -> None:
    assert spliceable(cell(0))
    assert not spliceable(cell(0, kept=False))  # a cold answer's fetched cell: encoded as before
    assert splice_prometheus_json(cell(0, kept=False)) is None
    vector = QueryResult.from_series("vector", [({"a": "b"}, [T0], [1.0])])
    vector.keeps_json = True
    assert not spliceable(vector)
    empty = QueryResult.from_series("matrix", [])
    empty.keeps_json = True
    assert not spliceable(empty)
    big = QueryResult.from_series("matrix", [({"s": str(s)}, list(range(0, 1000 * STEP, STEP)), [1.0] * 1000)
                                             for s in range(SPLICE_MAX_SAMPLES // 1000 + 1)])
    big.keeps_json = True
    assert not spliceable(big)  # streamed by the encoder instead


def test_a_window_over_two_cells_is_the_encoders_bytes_in_the_reused_buffer() -> None:
    cells = [cell(0), cell(1)]
    for slide in range(3):  # a refreshing panel: the window slides, the cells stay
        lo = T0 + 1_800_000 + slide * 30_000
        hi = lo + 3_600_000
        answer = concat([slice_time(c, lo, hi) for c in cells], lazy=True)  # as merging asks
        want = encode_prometheus_json(concat([slice_time(c, lo, hi) for c in [cell(0, kept=False),
                                                                              cell(1, kept=False)]]))
        with spliced_runs(answer) as sp:
            assert sp is not None and sp.body.tobytes() == want
        assert splice_prometheus_json(answer) == want
    assert memo_bytes() > 0 and all(c.sample_json is not None for c in cells)  # kept on the cells
    assert np.array_equal(cells[0].sample_json.buf[:2], np.frombuffer(b",[", dtype=np.uint8))


def test_copy_runs_copies_each_run_and_refuses_runs_outside_the_buffers() -> None:
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, 10_000, dtype=np.uint8)
    n = rng.integers(0, 300, 40).astype(np.int64)
    a = rng.integers(0, 10_000 - 300, 40).astype(np.int64)
    dest = np.concatenate([[0], np.cumsum(n[:-1] + 3)]).astype(np.int64)  # gaps between runs
    out = np.zeros(int(dest[-1] + n[-1]) + 5, dtype=np.uint8)
    want = out.copy()
    for d, s0, m in zip(dest.tolist(), a.tolist(), n.tolist()):
        want[d:d + m] = src[s0:s0 + m]
    copy_runs(out, dest, src, a, n)
    assert np.array_equal(out, want)
    copy_runs(out, dest[:0], src, a[:0], n[:0])  # no runs: nothing to do
    readonly = np.frombuffer(src.tobytes(), dtype=np.uint8)
    again = np.zeros_like(out)
    copy_runs(again, dest, readonly, a, n)  # read-only bytes: copied too (numba's slices)
    assert np.array_equal(again, want)
    for bad in (dict(dest=dest + len(out)), dict(a=a + 10_000), dict(n=n - 1_000), dict(dest=dest - 1_000)):
        args = {"dest": dest, "a": a, "n": n, **bad}
        with pytest.raises(ValueError, match="outside"):
            copy_runs(out, args["dest"], src, args["a"], args["n"])
    with pytest.raises(ValueError, match="contiguous"):
        copy_runs(out, dest, src[::2], a // 2, n // 2)


def test_keep_at_most_drops_the_least_recently_used_down_to_the_bound_and_zero_keeps_none() -> None:
    from proxy.codec.json_splice import MEMO_MAX_BYTES, keep_at_most

    try:
        keep_at_most(MEMO_MAX_BYTES)
        cells = [cell(h) for h in range(6)]
        for c in cells:
            assert splice_prometheus_json(c) == encode_prometheus_json(c)
        one = cells[0].sample_json.nbytes
        assert memo_bytes() >= 6 * one and all(c.sample_json is not None for c in cells)
        keep_at_most(2 * one)  # smaller: the oldest go, with their bytes
        assert memo_bytes() <= 2 * one
        assert [c.sample_json is not None for c in cells] == [False] * 4 + [True] * 2
        keep_at_most(0)
        assert all(c.sample_json is None for c in cells)
        fresh = cell(7)
        assert splice_prometheus_json(fresh) == encode_prometheus_json(fresh)  # still spliced, kept nowhere
        assert fresh.sample_json is None
    finally:
        keep_at_most(MEMO_MAX_BYTES)
