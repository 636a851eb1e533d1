"""Which answers are spliced from their cells' kept encoded samples (proxy/codec/json_splice.py,
issue 28), and that a spliced answer in the reused buffer is the encoder's bytes. Random
cells, cut and concatenated, byte for byte: tests/result/test_splice.py."""

from __future__ import annotations

import numpy as np

from proxy.codec.json_encode import encode_prometheus_json
from proxy.codec.json_splice import SPLICE_MAX_SAMPLES, memo_bytes, splice_prometheus_json, spliceable, spliced
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
        with spliced(answer) as view:
            assert view is not None and bytes(view) == want
        assert splice_prometheus_json(answer) == want
    assert memo_bytes() > 0 and all(c.sample_json is not None for c in cells)  # kept on the cells
    assert np.array_equal(cells[0].sample_json.buf[:2], np.frombuffer(b",[", dtype=np.uint8))
