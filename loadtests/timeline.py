"""Virtual time and the requests of a replay (pure): the bench, the soak and the chaos run.

Time is virtual: the data ends at a fixed past instant, "now" is that instant minus a small
phase (PHASE_S), and refresh i of n sees now - (n-1-i) * slide. Requests are aligned to their
step as Grafana aligns them.
"""

from __future__ import annotations

from .dashboard import PanelRequest, align_ns, parse_grafana_duration_ns

# "now" sits this far before the data's end: a real clock is never on a step boundary, and a
# window that is exactly aligned would hide alignment bugs.
PHASE_S = 12.345
NS = 1_000_000_000


def parse_duration_s(text: str) -> float:
    return parse_grafana_duration_ns(text) / NS


def sliding_windows(now_s: float, window_s: float, slide_s: float, refreshes: int) -> list[tuple[float, float]]:
    """(start, end) of each refresh of a "last window_s" dashboard: the last one ends at now_s,
    each earlier one slide_s before the next."""
    if refreshes < 1 or window_s <= 0 or slide_s < 0:
        raise ValueError("need refreshes >= 1, window > 0, slide >= 0")
    ends = [now_s - (refreshes - 1 - i) * slide_s for i in range(refreshes)]
    return [(e - window_s, e) for e in ends]


def range_request(title: str, expr: str, start_s: float, end_s: float, step_s: float) -> PanelRequest:
    """A range query with start and end rounded down to the step, as Grafana aligns them."""
    step_ns = int(round(step_s * NS))
    start_ns = align_ns(int(round(start_s * NS)), step_ns)
    end_ns = align_ns(int(round(end_s * NS)), step_ns)
    return PanelRequest(title=title, expr=expr, start=start_ns / NS, end=end_ns / NS, step=step_ns / NS,
                        start_ns=start_ns, end_ns=end_ns, step_ns=step_ns)


def instant_request(title: str, expr: str, t_s: float) -> PanelRequest:
    t_ns = int(round(t_s * NS))
    return PanelRequest(title=title, expr=expr, start=t_ns / NS, end=t_ns / NS, step=0.0,
                        start_ns=t_ns, end_ns=t_ns, instant=True)


def panel_key(req: PanelRequest) -> str:
    key = req.title or req.expr
    if req.ref_id not in ("A", ""):
        key += f" [{req.ref_id}]"
    return key
