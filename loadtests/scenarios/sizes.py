"""Warm serving time by answer size, with and without gzip (issue 28 item 5).

After a scenario has asked for its panels (so promaccel holds them), each panel is asked again,
one request at a time (no queueing behind other panels), `reps` times asking for gzip as
Grafana does (Accept-Encoding: gzip) and `reps` times for the identity encoding, alternating.
The client takes the body as sent and measures the time to its last byte, so the bytes per
second are what promaccel served; the report groups the panels by answer size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..client import Budget, Client
from ..dashboard import PanelRequest

# Panel size classes by the answer's JSON bytes (decoded): (upper bound, label), smallest first.
SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (50_000, "tiny (< 50 KB)"),
    (1_000_000, "medium (50 KB – 1 MB)"),
    (math.inf, "large (> 1 MB)"),
)


def size_class(answer_bytes: float) -> str:
    for bound, label in SIZE_CLASSES:
        if answer_bytes < bound:
            return label
    return SIZE_CLASSES[-1][1]


@dataclass
class PanelSize:
    """One panel's warm answers: its size decoded and gzip-compressed, and the latencies."""

    panel: str
    answer_bytes: int = 0  # the JSON the client decodes
    gzip_bytes: int = 0  # on the wire when gzip was asked for
    gzip_s: list[float] = field(default_factory=list)
    identity_s: list[float] = field(default_factory=list)
    failures: int = 0
    # the gzip and identity answers' JSON differed (they must not: same cached answer)
    differs: bool = False

    @property
    def size_class(self) -> str:
        return size_class(self.answer_bytes)


async def probe_sizes(url: str, panels: Sequence[tuple[str, PanelRequest]], budget: Budget, timeout_s: float,
                      reps: int) -> list[PanelSize]:
    """`reps` warm answers per panel and encoding from promaccel at `url`, sequentially."""
    out: list[PanelSize] = []
    if reps < 1:
        return out
    async with Client(url, budget, timeout_s, gzip=True, wire=True) as gz, \
            Client(url, budget, timeout_s, gzip=False, wire=True) as plain:
        for key, req in panels:
            size = PanelSize(key)
            bodies: dict[bool, bytes] = {}
            for i in range(reps):
                for zipped in ((True, False) if i % 2 == 0 else (False, True)):
                    a = await (gz if zipped else plain).send(req)
                    if a.failed or a.status != 200:
                        size.failures += 1
                        continue
                    bodies.setdefault(zipped, a.body)
                    (size.gzip_s if zipped else size.identity_s).append(a.latency_s)
                    if zipped:
                        size.gzip_bytes = a.wire_bytes or 0
                    size.answer_bytes = len(a.body)
            size.differs = len(bodies) == 2 and bodies[True] != bodies[False]
            out.append(size)
    return out
