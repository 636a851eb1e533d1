"""Which backend holds which metric when: the fleet's holdings as merged time windows per
backend and metric, in preference order. Pure; routing (`shardplanner.routing`) asks it who
holds every read of a timestamp, and exact cross-store evaluation asks it how a sample window
is cut among the stores (`partition_window`).

A holding (`holdings.py`) is a closed window `[since_ms, until_ms]` (None: unbounded) of the
metrics whose names fully match one of its patterns. Data no backend holds at a time does not
exist (like data past retention): a read only has to be covered where *some* backend holds its
metric.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from shardplanner.holdings import BackendHolding
from shardplanner.read_windows import Shape

__all__ = ["Fleet", "Interval", "partition_window"]

Interval = tuple[float, float]  # closed; -inf / +inf for unbounded
_INF = float("inf")


class Fleet:
    """Holdings grouped by backend name, in preference order."""

    def __init__(self, holdings: Sequence[BackendHolding]) -> None:
        if not holdings:
            raise ValueError("no backend holdings to route to")
        self.holdings = tuple(holdings)
        rank: dict[str, tuple[int, int, int]] = {}
        for i, h in enumerate(self.holdings):
            mine = (0 if h.primary else 1, -h.priority, i)
            rank[h.name] = min(rank.get(h.name, mine), mine)
        self.order: tuple[str, ...] = tuple(sorted(rank, key=rank.__getitem__))
        self._windows: dict[tuple[str | None, str | None], tuple[Interval, ...]] = {}

    @staticmethod
    def _interval(h: BackendHolding) -> Interval:
        return (
            -_INF if h.since_ms is None else h.since_ms,
            _INF if h.until_ms is None else h.until_ms,
        )

    def windows(self, metric: str | None, name: str | None = None) -> tuple[Interval, ...]:
        """Merged windows in which backend `name` (None: any backend) holds `metric`. For
        a nameless selector, "any backend" means any at all: series matching its regex may be
        anywhere, so only a "*" holder covering all of that time can answer it."""
        key = (metric, name)
        if key not in self._windows:
            self._windows[key] = self._merged(metric, name)
        return self._windows[key]

    def _merged(self, metric: str | None, name: str | None) -> tuple[Interval, ...]:
        spans = sorted(
            self._interval(h)
            for h in self.holdings
            if (name is None or h.name == name)
            and (h.holds_metric(metric) or (name is None and metric is None))
        )
        merged: list[Interval] = []
        for s, u in spans:
            if merged and s <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], u))
            else:
                merged.append((s, u))
        return tuple(merged)

    def clip(self, metric: str | None, lo: int, hi: int) -> Interval | None:
        """The hull of the part of [lo, hi] where some backend holds `metric` (the only part a
        backend must cover: nobody has the rest), or None when nobody holds any of it."""
        parts = [
            (max(lo, s), min(hi, u)) for s, u in self.windows(metric) if max(lo, s) <= min(hi, u)
        ]
        if not parts:
            return None
        return parts[0][0], parts[-1][1]

    def covers(self, name: str, metric: str | None, lo: int, hi: int) -> bool:
        clipped = self.clip(metric, lo, hi)
        if clipped is None:
            return True
        return any(s <= clipped[0] and clipped[1] <= u for s, u in self.windows(metric, name))

    def holders(self, metric: str | None, lo: int, hi: int) -> tuple[str, ...]:
        return tuple(n for n in self.order if self.covers(n, metric, lo, hi))

    def serving(self, shapes: Sequence[Shape], t: int) -> tuple[str, ...]:
        """Backends that hold every read of evaluation time `t`, preferred first. When
        nobody holds any of it (all before every retention), the preferred backend among
        those whose patterns name every metric read."""
        windows = [(s.metric, *s.window(t, t)) for s in shapes]
        if all(self.clip(m, lo, hi) is None for m, lo, hi in windows):
            named = [n for n in self.order if all(self._names(n, m) for m, _, _ in windows)]
            return ((named or list(self.order))[0],)
        return tuple(
            n for n in self.order if all(self.covers(n, m, lo, hi) for m, lo, hi in windows)
        )

    def _names(self, name: str, metric: str | None) -> bool:
        return any(h.name == name and h.holds_metric(metric) for h in self.holdings)

    def critical_times(self, shapes: Sequence[Shape]) -> Iterator[int]:
        """Evaluation times at which `serving` may change: where a moving read window's edge
        crosses a holding boundary. Between two of them `serving` is constant."""
        bounds = {h.since_ms for h in self.holdings if h.since_ms is not None}
        bounds |= {h.until_ms + 1 for h in self.holdings if h.until_ms is not None}
        for s in shapes:
            if s.pinned is not None:
                continue
            for v in bounds:
                for edge in (s.lo_ms, s.hi_ms):
                    for d in (-1, 0, 1):
                        yield v - edge + d


def partition_window(holdings: Sequence[BackendHolding], metric: str | None, lo_ms: int,
                     hi_ms: int) -> list[tuple[str, int, int]]:
    """The closed sample window `[lo_ms, hi_ms]` of `metric` cut among the backends that hold
    it: `(backend, from, to)` in time order, disjoint, each stretch given to the preferred
    backend holding it (the primary where stores overlap). Stretches nobody holds are left
    out: no backend has their samples."""
    fleet = Fleet(holdings)
    cuts = {lo_ms, hi_ms + 1}
    for name in fleet.order:
        for s, u in fleet.windows(metric, name):
            for c in (s, u + 1):
                if lo_ms < c <= hi_ms:
                    cuts.add(int(c))
    edges = sorted(cuts)
    out: list[tuple[str, int, int]] = []
    for a, nxt in zip(edges, edges[1:]):
        b = nxt - 1
        who = next((n for n in fleet.order
                    if any(s <= a and b <= u for s, u in fleet.windows(metric, n))), None)
        if who is None:
            continue
        if out and out[-1][0] == who and out[-1][2] == a - 1:
            out[-1] = (who, out[-1][1], b)
        else:
            out.append((who, a, b))
    return out
