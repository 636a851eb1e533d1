"""What a fetch hands up to the merge (proxy/pipeline/fetch.py, `Fetcher.parts`): a call whose
cells all just landed gives those cells, its edge cells cropped to the pieces it answers at
once (a window's first and last cells are mostly outside it: held whole until every sibling
call was back, twenty heavy 24 h queries at once peaked higher, issue 29's scenario (e)); a
call not cut into cells gives its answer cropped the same way; an instant call its units'
answers. The calls themselves: tests/pipeline/test_lookup.py and the e2e suites."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.cache import CacheKey
from proxy.pipeline.fetch import Fetcher
from proxy.pipeline.landing import Landing
from proxy.pipeline.units import Fetch, Unit
from proxy.result import QueryResult
from shardplanner.plan import Span

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
H = 3_600_000
STEP = 60_000
Q = "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"


def answer(lo: int, hi: int, n_series: int = 3) -> QueryResult:
    t = list(range(lo, hi + 1, STEP))
    return QueryResult.from_series("matrix", [({"Hostname": f"n{s}"}, t, [float(s)] * len(t)) for s in range(n_series)])


def unit(hour: int) -> Unit:
    span = Span.range(T0 + hour * H, T0 + (hour + 1) * H - STEP, STEP)
    return Unit(Q, None, -1, span, key=CacheKey(query=Q, span=span, route=("prometheus",)))


def fetcher_answering(result: QueryResult, landing: Landing) -> Fetcher:
    f = Fetcher(landing, None, None, True)  # type: ignore[arg-type]

    async def fetch(_f: Fetch, _q: Any) -> QueryResult:
        return result

    f.fetch = fetch  # type: ignore[method-assign]
    return f


def times(r: QueryResult) -> tuple[int, int]:
    return int(r.t_ms.min()), int(r.t_ms.max())


@pytest.mark.parametrize("keep", [None, (T0 + 20 * STEP, T0 + 2 * H + 9 * STEP)])
def test_landed_cells_are_handed_up_with_their_edges_cropped_to_what_the_merge_keeps(
        keep: tuple[int, int] | None) -> None:
    landing = Landing()
    units = tuple(unit(h) for h in range(3))
    cells = [answer(u.span.start_ms, u.span.end_ms) for u in units]
    for u, c in zip(units, cells):
        assert u.key is not None
        landing.land(u.key.digest, c, 0)
    whole = answer(T0, T0 + 3 * H - STEP)
    f = Fetch(Q, None, -1, Span.range(T0, T0 + 3 * H - STEP, STEP), units, keep=keep)
    parts = asyncio.run(fetcher_answering(whole, landing).parts(f, None))
    assert len(parts) == 3 and parts[1] is cells[1]  # an inner cell as it landed
    if keep is None:
        assert parts[0] is cells[0] and parts[2] is cells[2]
    else:
        assert times(parts[0]) == (keep[0], T0 + H - STEP) and times(parts[2]) == (T0 + 2 * H, keep[1])
        assert parts[0].n_series == 3 and parts[2].n_series == 3


def test_an_answer_not_cut_into_cells_is_cropped_to_what_the_merge_keeps() -> None:
    units = tuple(unit(h) for h in range(2))  # nothing landed: the answer itself
    whole = answer(T0, T0 + 2 * H - STEP)
    span = Span.range(T0, T0 + 2 * H - STEP, STEP)
    keep = (T0 + 5 * STEP, T0 + H + 7 * STEP)
    (part,) = asyncio.run(fetcher_answering(whole, Landing()).parts(Fetch(Q, None, -1, span, units, keep=keep), None))
    assert times(part) == keep
    (same,) = asyncio.run(fetcher_answering(whole, Landing()).parts(Fetch(Q, None, -1, span, units), None))
    assert same is whole
