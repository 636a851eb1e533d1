"""Raw samples of one selector over a sample window, from the stores that hold its parts.

A range function whose window straddles two stores (AMP until 2 h ago, the local Prometheus
since 3 h ago) cannot be asked of either. Its samples can: the window is cut among the
stores that hold the metric (`shardplanner.routing.partition_window`: each stretch to the
preferred holder, the primary where they overlap), each stretch is asked as a matrix
selector at an instant (`x[3599999ms]` at the stretch's end returns the samples in
[end - 3599999ms, end], both ends included as in Prometheus 2), and the stretches are
concatenated per series. Stale markers never appear in a range vector, so none is lost.

Stretches are asked in chunks of at most a day (AMP refuses instant queries that read 32
days or more; a day keeps each answer bounded), and the samples gathered are bounded by
`limits.max_window_samples`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace

from shardplanner.ast import MatrixSel, Selector
from shardplanner.holdings import BackendHolding
from shardplanner.plan import Span
from shardplanner.routing import listed_names, partition_window
from shardplanner.serialize import to_promql

from ..backends import Backend
from ..errors import PromError
from ..result import QueryResult
from ..result.merge import concat
from ..result.pieces import slice_time
from .ask import Asker, query_call

CHUNK_MS = 86_400_000


def window_parts(holdings: Sequence[BackendHolding], selector: Selector, lo_ms: int,
                 hi_ms: int) -> list[tuple[str, int, int]]:
    """The calls that fetch `selector`'s samples in `[lo_ms, hi_ms]`: (backend, from, to),
    each at most CHUNK_MS long, in time order."""
    names = listed_names(selector) or (selector.metric_name,)
    cuts = {tuple(partition_window(holdings, n, lo_ms, hi_ms)) for n in names}
    if len(cuts) > 1:
        raise PromError("execution", f"the metrics of {to_promql(selector)} are held by different stores over the "
                        "window of a range function: not supported")
    out: list[tuple[str, int, int]] = []
    for name, a, b in cuts.pop():
        while a <= b:
            end = min(b, a + CHUNK_MS - 1)
            out.append((name, a, end))
            a = end + 1
    return out


async def fetch_raw(selector: Selector, parts: Sequence[tuple[str, int, int]], backends: Mapping[str, Backend],
                    timeout_s: float, max_samples: int) -> QueryResult:
    """Every sample of `selector` (its offset and `@` ignored: the window is absolute) in the
    stretches `parts` (`window_parts`), per series, from the stores that hold them."""
    bare = replace(selector, offset_ms=0, at=None)
    if not parts:
        return QueryResult.empty("matrix")
    ask = Asker()

    async def one(name: str, a: int, b: int) -> QueryResult:
        text = to_promql(MatrixSel(bare, max(b - a, 1)))
        path, form = query_call(text, Span.instant(b))
        got = await ask(backends[name], path, form, timeout_s)
        if got.result_type != "matrix":
            raise PromError("execution", f"backend {name!r} answered {text} with a {got.result_type}, not a matrix")
        return slice_time(got, a, b) if got.n_samples else got

    results = await asyncio.gather(*(one(*p) for p in parts))
    total = sum(r.n_samples for r in results)
    if max_samples and total > max_samples:
        raise PromError("execution", f"the raw samples of {to_promql(bare)} over the window straddling the stores "
                        f"number {total}, more than limits.max_window_samples ({max_samples})")
    nonempty = [r for r in results if r.n_samples]
    if not nonempty:
        return QueryResult.empty("matrix")
    return concat(nonempty)  # stretches are disjoint in time: concat never sees a sample twice
