"""Turn a Grafana dashboard JSON into the Prometheus requests Grafana would send for it.

The load tests replay a dashboard refresh the way Grafana (10.x/11.x, server-side Prometheus
data source) issues it, so the proxy sees the same steps, the same step-aligned windows and the
same substituted expressions as in production. The rules below follow Grafana's source:

1. Frontend (``PanelQueryRunner`` / scenes ``SceneQueryRunner`` and
   ``rangeutil.calculateInterval`` in ``packages/grafana-data/src/datetime/rangeutil.ts``):
   ``maxDataPoints`` is the panel's ``maxDataPoints`` or else the panel's width in pixels;
   ``intervalMs = max(roundInterval(rangeMs / maxDataPoints), lowLimit)`` where ``lowLimit`` is
   the panel's "Min interval" (``panel.interval``) if set, else the data source's
   ``timeInterval`` (default 15s). The frontend ``roundInterval`` uses strict ``<`` thresholds.
2. Backend (``pkg/promlib/models/query.go`` ``calculatePrometheusInterval``, with
   ``intervalv2.Calculate``/``CalculateSafeInterval`` and ``gtime.RoundInterval``):
   ``minInterval`` = the query's "Min step" (``target.interval``) if set, else ``intervalMs``
   from the frontend; ``calculated = range / maxDataPoints`` (integer nanoseconds);
   ``interval = minInterval if calculated < minInterval else RoundInterval(calculated)``
   (backend table uses ``<=`` thresholds); ``safe = RoundInterval(range / 11000)``;
   ``step = max(interval, safe) * intervalFactor``; if ``target.interval`` is
   ``$__rate_interval`` the step is the rate interval itself.
3. ``$__rate_interval = max(intervalMs + scrape, 4 * scrape)`` with ``scrape`` the query's
   "Min step" or else the data source ``timeInterval`` (``calculateRateInterval``), rendered
   with Go's ``Duration.String()`` ("2m30s", "1h0m0s"). ``$__interval`` is the step rendered
   by ``gtime.FormatInterval`` (truncating: 90s -> "1m"). ``$__range`` is the range rounded
   to whole seconds plus "s".
4. Alignment (``AlignTimeRange``): start and end are *both* rounded *down* to a multiple of the
   step, after shifting by the browser's UTC offset (``utcOffsetSec``; 0 for a dashboard in
   UTC). Instant queries are not aligned: ``time`` is the raw end.
5. Wire format (``pkg/promlib/client/client.go``): POST form ``query``, ``start``, ``end``,
   ``step`` with times and step formatted as the shortest decimal seconds
   (``strconv.FormatFloat(x, 'f', -1, 64)``: ``1700000000``, ``1700000000.5``, ``30``).

Public entry point: :func:`panel_requests`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlencode

DEFAULT_DASHBOARD = Path(__file__).resolve().parent.parent / "config" / "grafana" / "dashboards" / "gpu-fleet.json"

SCREEN_WIDTH_PX = 1920
GRID_COLUMNS = 24
# The provisioned data sources' timeInterval ("Scrape interval" in the UI).
DATASOURCE_TIME_INTERVAL = "30s"
# Grafana's defaults when a data source has no timeInterval.
GRAFANA_DEFAULT_SCRAPE_INTERVAL = "15s"
SAFE_RESOLUTION = 11_000  # promlib: safeResolution; Prometheus refuses > 11,000 points per series

_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000

# --------------------------------------------------------------------------------------------
# Interval rounding tables.
# Frontend: rangeutil.roundInterval, milliseconds, strict "<".
# Backend:  gtime.RoundInterval, time.Duration, "<=" (and a 48h step the frontend lacks).
# They differ only exactly on a threshold; both are kept so each stage is reproduced exactly.
# --------------------------------------------------------------------------------------------
_ROUND_TABLE_MS: tuple[tuple[int, int], ...] = (
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000, 2_592_000_000),
)
_YEAR_MS = 31_536_000_000

_BACKEND_ROUND_TABLE_MS: tuple[tuple[int, int], ...] = (
    *_ROUND_TABLE_MS[:26],  # up to "<= 24h -> 12h"
    (172_800_000, 86_400_000),  # <= 48h -> 24h
    (604_800_000, 86_400_000),  # <= 1w  -> 24h
    (1_814_400_000, 604_800_000),  # <= 3w -> 1w
)


def round_interval_frontend_ms(interval_ms: float) -> int:
    """Grafana frontend ``rangeUtil.roundInterval`` (strict ``<``)."""
    for limit, rounded in _ROUND_TABLE_MS:
        if interval_ms < limit:
            return rounded
    return _YEAR_MS


def round_interval_backend_ns(interval_ns: int) -> int:
    """Grafana backend ``gtime.RoundInterval`` (``<=``; last bucket ``<``)."""
    for limit, rounded in _BACKEND_ROUND_TABLE_MS:
        if interval_ns <= limit * _NS_PER_MS:
            return rounded * _NS_PER_MS
    if interval_ns < 3_628_800_000 * _NS_PER_MS:
        return 2_592_000_000 * _NS_PER_MS
    return _YEAR_MS * _NS_PER_MS


# --------------------------------------------------------------------------------------------
# Duration parsing and formatting, each the way the Grafana component that uses it does it.
# --------------------------------------------------------------------------------------------
_FE_INTERVAL_RE = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|[Mwdhmsy])")
_FE_UNIT_S = {"y": 31_536_000, "M": 2_592_000, "w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1, "ms": 0.001}


def parse_frontend_interval_ms(text: str) -> int:
    """``rangeUtil.intervalToMs``: first number+unit only, count truncated (``"1.5m"`` -> 60000);
    a bare number is seconds."""
    if re.fullmatch(r"\s*-?\d+(\.\d+)?\s*", text) and float(text) != 0:
        return int(float(text)) * 1000  # JS: if (Number(str)) -> parseInt(str) seconds
    m = _FE_INTERVAL_RE.match(text)
    if not m:
        raise ValueError(f"invalid Grafana interval {text!r}")
    count = int(float(m.group(1)))  # parseInt
    return int(round(_FE_UNIT_S[m.group(2)] * 1000 * count))


_GO_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": _NS_PER_MS,
    "s": _NS_PER_S,
    "m": 60 * _NS_PER_S,
    "h": 3_600 * _NS_PER_S,
}
_GO_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DATE_UNIT_RE = re.compile(r"^(\d+)([dwMy])$")
_DAY_NS = 86_400 * _NS_PER_S


def parse_grafana_duration_ns(text: str) -> int:
    """``gtime.ParseIntervalStringToTimeDuration``: ``<``/``>`` stripped, bare number = seconds,
    ``Nd``/``Nw``/``NM``/``Ny`` (Julian year), else Go ``time.ParseDuration``."""
    s = text.replace("<", "", 1).replace(">", "", 1)
    if re.fullmatch(r"\d+", s):
        s += "s"
    m = _DATE_UNIT_RE.match(s)
    if m:
        n, unit = int(m.group(1)), m.group(2)
        year_ns = int(_DAY_NS * 365.25)
        factor = {"d": _DAY_NS, "w": 7 * _DAY_NS, "M": int(year_ns / 12), "y": year_ns}[unit]
        return n * factor
    if s == "0":
        return 0
    pos, total = 0, 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    for part in _GO_DURATION_RE.finditer(s):
        if part.start() != pos:
            raise ValueError(f"invalid duration {text!r}")
        total += float(part.group(1)) * _GO_UNIT_NS[part.group(2)]
        pos = part.end()
    if pos != len(s):
        raise ValueError(f"invalid duration {text!r}")
    return int(total)


def format_interval(ns: int) -> str:
    """``gtime.FormatInterval``: the largest whole unit, truncating (90s -> ``"1m"``)."""
    for unit_ns, suffix in (
        (365 * _DAY_NS, "y"),
        (_DAY_NS, "d"),
        (3_600 * _NS_PER_S, "h"),
        (60 * _NS_PER_S, "m"),
        (_NS_PER_S, "s"),
        (_NS_PER_MS, "ms"),
    ):
        if ns >= unit_ns:
            return f"{ns // unit_ns}{suffix}"
    return "1ms"


def _trim_fraction(whole: int, frac: int, digits: int) -> str:
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def go_duration_string(ns: int) -> str:
    """Go's ``time.Duration.String()`` (``2m30s``, ``1h0m0s``, ``1.5s``, ``500ms``)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < _NS_PER_S:
        if ns < 1_000:
            return f"{sign}{ns}ns"
        if ns < _NS_PER_MS:
            return f"{sign}{_trim_fraction(ns // 1_000, ns % 1_000, 3)}µs"
        return f"{sign}{_trim_fraction(ns // _NS_PER_MS, ns % _NS_PER_MS, 6)}ms"
    hours, rest = divmod(ns, 3_600 * _NS_PER_S)
    minutes, rest = divmod(rest, 60 * _NS_PER_S)
    seconds = _trim_fraction(rest // _NS_PER_S, rest % _NS_PER_S, 9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


def format_seconds(ns: int) -> str:
    """``strconv.FormatFloat(float64(sec)+float64(nsec)/1e9, 'f', -1, 64)`` as promlib sends times."""
    sec, nsec = divmod(ns, _NS_PER_S)
    value = float(sec) + nsec / 1e9
    if value == math.floor(value) and abs(value) < 1e15:
        return str(int(value))
    text = repr(value)
    if "e" in text or "E" in text:  # Go's 'f' format never uses an exponent
        text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text


# --------------------------------------------------------------------------------------------
# The interval pipeline.
# --------------------------------------------------------------------------------------------
def frontend_interval_ms(range_ms: int, max_data_points: float, low_limit: str | None) -> int:
    """``rangeUtil.calculateInterval``: the ``intervalMs`` the browser puts on each query."""
    low_ms = parse_frontend_interval_ms(low_limit) if low_limit else 1
    interval_ms = round_interval_frontend_ms(range_ms / max_data_points)
    return max(interval_ms, low_ms)


def calculate_rate_interval_ns(interval_ns: int, scrape_ns: int) -> int:
    """promlib ``calculateRateInterval``: max(interval + scrape, 4 * scrape)."""
    return max(interval_ns + scrape_ns, 4 * scrape_ns)


_VAR_INTERVALS = {
    "$__interval",
    "${__interval}",
    "$__interval_ms",
    "${__interval_ms}",
    "$__rate_interval",
    "${__rate_interval}",
    "$__rate_interval_ms",
    "${__rate_interval_ms}",
}
_RATE_INTERVAL_VARS = {"$__rate_interval", "${__rate_interval}"}
_INTERVAL_VARS = {"$__interval", "${__interval}"}


def backend_step_ns(
    range_ns: int,
    *,
    interval_ms: int,
    max_data_points: int,
    query_interval: str = "",
    ds_time_interval: str = "",
    interval_factor: int = 0,
) -> int:
    """promlib ``calculatePrometheusInterval``: the ``step`` sent to Prometheus, in ns.

    ``query_interval`` is the target's "Min step" field (``target.interval``), ``interval_ms``
    the frontend's ``intervalMs``, ``ds_time_interval`` the data source's ``timeInterval``.
    """
    original = query_interval
    if query_interval in _VAR_INTERVALS:
        query_interval = ""
    # gtime.GetIntervalFrom(dsInterval, queryInterval, intervalMs, 15s)
    if query_interval == "0s":
        query_interval = ""
    if not query_interval and interval_ms:
        min_interval_ns = interval_ms * _NS_PER_MS
    else:
        text = query_interval or ds_time_interval
        min_interval_ns = parse_grafana_duration_ns(text) if text else 15 * _NS_PER_S
    # intervalv2.Calculate
    resolution = max_data_points or 1500
    calculated_ns = range_ns // resolution
    if calculated_ns < min_interval_ns:
        interval_ns = min_interval_ns
    else:
        interval_ns = round_interval_backend_ns(calculated_ns)
    safe_ns = round_interval_backend_ns(range_ns // SAFE_RESOLUTION)
    adjusted_ns = max(interval_ns, safe_ns)
    if original in _RATE_INTERVAL_VARS:
        scrape = ds_time_interval or GRAFANA_DEFAULT_SCRAPE_INTERVAL
        return calculate_rate_interval_ns(adjusted_ns, parse_grafana_duration_ns(scrape))
    return adjusted_ns * (interval_factor or 1)


def align_ns(t_ns: int, step_ns: int, utc_offset_s: int = 0) -> int:
    """promlib ``AlignTimeRange``: round down to a multiple of step, in the browser's time zone."""
    offset_ns = utc_offset_s * _NS_PER_S
    return (t_ns + offset_ns) // step_ns * step_ns - offset_ns


def _go_round(x: float) -> int:
    """Go's ``math.Round``/JS ``Math.round`` for the non-negative values used here."""
    return int(math.floor(x + 0.5))


def interpolate_builtins(
    expr: str,
    *,
    interval_ms: int,
    step_ns: int,
    query_interval: str,
    ds_time_interval: str,
    range_ms: int,
) -> str:
    """promlib ``interpolateVariables``: the server-side built-ins, in Grafana's order."""
    range_s = _go_round(range_ms / 1000.0)
    if query_interval in _RATE_INTERVAL_VARS:
        rate_ns = step_ns
    else:
        requested = query_interval
        if requested in _INTERVAL_VARS:
            requested = go_duration_string(step_ns)
        if not requested:
            requested = ds_time_interval
        scrape = requested or GRAFANA_DEFAULT_SCRAPE_INTERVAL
        try:
            scrape_ns = parse_grafana_duration_ns(scrape)
        except ValueError:  # Grafana turns an unparsable min step into a zero rate interval
            rate_ns = 0
        else:
            rate_ns = calculate_rate_interval_ns(interval_ms * _NS_PER_MS, scrape_ns)
    replacements = (
        ("__interval_ms", str(step_ns // _NS_PER_MS)),
        ("__interval", format_interval(step_ns)),
        ("__range_ms", str(range_ms)),
        ("__range_s", str(range_s)),
        ("__range", f"{range_s}s"),
        ("__rate_interval_ms", str(rate_ns // _NS_PER_MS)),
        ("__rate_interval", go_duration_string(rate_ns)),
    )
    for name, value in replacements:
        expr = expr.replace("$" + name, value)
    for name, value in replacements:
        expr = expr.replace("${" + name + "}", value)
    return expr


# --------------------------------------------------------------------------------------------
# Dashboard walking.
# --------------------------------------------------------------------------------------------
def panel_width_px(grid_w: int, screen_width_px: int = SCREEN_WIDTH_PX) -> int:
    """Approximate panel width in pixels: its share of the 24-column grid on the screen.

    Grafana uses the measured width of the panel body; gutters, padding and the side menu make
    the real number somewhat smaller, which changes the step only near a rounding threshold.
    """
    return max(1, (int(grid_w) * int(screen_width_px)) // GRID_COLUMNS)


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that runs queries, in dashboard order, including those inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", []) or []
            continue
        yield panel


def _regular_escape(value: str) -> str:
    # Prometheus data source prometheusRegularEscape: single-valued variables.
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def _special_regex_escape(value: str) -> str:
    # prometheusSpecialRegexEscape: multi-valued variables end up inside =~"..." regexes, so
    # regex metacharacters get a backslash that survives PromQL string unescaping.
    value = value.replace("\\", "\\" * 4)
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def _format_variable(value: Any, multi: bool) -> str:
    """Prometheus data source ``interpolateQueryExpr``."""
    if not multi:
        return _regular_escape(str(value[0] if isinstance(value, (list, tuple)) and value else value))
    if isinstance(value, (list, tuple)):
        items = [_special_regex_escape(str(v)) for v in value]
        return items[0] if len(items) == 1 else "(" + "|".join(items) + ")"
    return _special_regex_escape(str(value))


def dashboard_variables(dashboard: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """User template variables (not data source ones) with their current value, formatted as
    the Prometheus data source interpolates them into PromQL."""
    out: dict[str, str] = {}
    for var in (dashboard.get("templating") or {}).get("list", []) or []:
        if var.get("type") == "datasource":
            continue
        name = var.get("name")
        if not name:
            continue
        multi = bool(var.get("multi") or var.get("includeAll"))
        current = (var.get("current") or {}).get("value")
        if current is None:
            current = var.get("query", "") if var.get("type") in ("constant", "textbox") else ""
        if current in ("$__all", ["$__all"]):
            current = var.get("allValue") or ".*"
            out[name] = str(current)
            continue
        out[name] = _format_variable(current, multi)
    for name, value in (overrides or {}).items():
        out[name] = _format_variable(value, isinstance(value, (list, tuple)))
    return out


def substitute_user_variables(expr: str, variables: Mapping[str, str]) -> str:
    """``templateSrv.replace`` for user variables: ``$name``, ``${name}``, ``${name:raw}``, ``[[name]]``.
    Unknown variables are left as they are, as Grafana does."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        if name in variables:
            return variables[name]
        return m.group(0)

    pattern = re.compile(r"\$(\w+)|\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)\]\]")
    return pattern.sub(repl, expr)


@dataclass(frozen=True)
class PanelRequest:
    """One request Grafana's backend sends to the Prometheus data source URL."""

    title: str
    expr: str
    start: float  # aligned, seconds (for instant queries: the evaluation time)
    end: float
    step: float  # seconds
    panel_id: int | None = None
    ref_id: str = "A"
    width_px: int = 0
    max_data_points: int = 0
    interval_ms: int = 0
    instant: bool = False
    # exact integers behind the floats, so formatting never goes through a lossy float
    start_ns: int = 0
    end_ns: int = 0
    step_ns: int = 0

    @property
    def path(self) -> str:
        return "/api/v1/query" if self.instant else "/api/v1/query_range"

    def form(self) -> dict[str, str]:
        """The POST form fields, values formatted exactly as Grafana formats them."""
        if self.instant:
            return {"query": self.expr, "time": format_seconds(self.end_ns)}
        return {
            "query": self.expr,
            "start": format_seconds(self.start_ns),
            "end": format_seconds(self.end_ns),
            "step": format_seconds(self.step_ns),
        }

    def body(self) -> str:
        """The urlencoded body as Go's ``url.Values.Encode`` writes it (keys sorted)."""
        return urlencode(sorted(self.form().items()))

    @property
    def points(self) -> int:
        """Points per series Prometheus evaluates for this request."""
        if self.instant:
            return 1
        return (self.end_ns - self.start_ns) // self.step_ns + 1


def _load(dashboard_json: Any) -> dict[str, Any]:
    if isinstance(dashboard_json, Mapping):
        data = dict(dashboard_json)
    elif isinstance(dashboard_json, bytes) or (
        isinstance(dashboard_json, str) and dashboard_json.lstrip().startswith("{")
    ):
        data = json.loads(dashboard_json)
    elif isinstance(dashboard_json, (str, os.PathLike)):
        data = json.loads(Path(dashboard_json).read_text())
    else:
        raise TypeError(f"expected a dashboard dict, JSON text or path, got {type(dashboard_json).__name__}")
    # Grafana's import/export envelope: {"dashboard": {...}, "overwrite": ...}
    if "panels" not in data and isinstance(data.get("dashboard"), Mapping):
        data = dict(data["dashboard"])
    return data


def load_dashboard(path: str | os.PathLike[str] = DEFAULT_DASHBOARD) -> dict[str, Any]:
    return _load(Path(path))


def panel_requests(
    dashboard_json: Any,
    start_s: float,
    end_s: float,
    width_px: int = SCREEN_WIDTH_PX,
    *,
    ds_time_interval: str = DATASOURCE_TIME_INTERVAL,
    utc_offset_s: int = 0,
    variables: Mapping[str, Any] | None = None,
) -> list[PanelRequest]:
    """The requests one refresh of the dashboard sends for the time range ``[start_s, end_s]``.

    ``dashboard_json`` is a dict, JSON text or a path. ``width_px`` is the screen width the
    24-column grid spans. ``ds_time_interval`` is the data source's ``timeInterval``
    ("" = unset, Grafana then uses 15s). ``utc_offset_s`` is the browser's UTC offset when the
    dashboard is shown in browser time (the provisioned dashboard is in UTC: 0).
    ``variables`` overrides user template variables' current values.
    """
    dashboard = _load(dashboard_json)
    # Grafana's time range has millisecond resolution.
    from_ms = int(round(start_s * 1000))
    to_ms = int(round(end_s * 1000))
    if to_ms <= from_ms:
        raise ValueError("end must be after start")
    range_ms = to_ms - from_ms
    range_ns = range_ms * _NS_PER_MS
    user_vars = dashboard_variables(dashboard, variables)
    frontend_low_limit_default = ds_time_interval or GRAFANA_DEFAULT_SCRAPE_INTERVAL

    requests: list[PanelRequest] = []
    for panel in iter_panels(dashboard):
        targets: Sequence[Mapping[str, Any]] = panel.get("targets") or []
        if not targets:
            continue
        width = panel_width_px((panel.get("gridPos") or {}).get("w", GRID_COLUMNS), width_px)
        max_dp = int(panel.get("maxDataPoints") or width)
        min_interval = panel.get("interval") or None
        if min_interval:
            min_interval = substitute_user_variables(str(min_interval), user_vars)
        interval_ms = frontend_interval_ms(range_ms, max_dp, min_interval or frontend_low_limit_default)
        for target in targets:
            if target.get("hide") or not (target.get("expr") or "").strip():
                continue  # filterQuery: hidden or empty targets are not sent
            query_interval = substitute_user_variables(str(target.get("interval") or ""), user_vars)
            step_ns = backend_step_ns(
                range_ns,
                interval_ms=interval_ms,
                max_data_points=max_dp,
                query_interval=query_interval,
                ds_time_interval=ds_time_interval,
                interval_factor=int(target.get("intervalFactor") or 0),
            )
            expr = substitute_user_variables(str(target["expr"]), user_vars)
            expr = expr.replace("$__from", str(from_ms)).replace("${__from}", str(from_ms))
            expr = expr.replace("$__to", str(to_ms)).replace("${__to}", str(to_ms))
            expr = interpolate_builtins(
                expr,
                interval_ms=interval_ms,
                step_ns=step_ns,
                query_interval=query_interval,
                ds_time_interval=ds_time_interval,
                range_ms=range_ms,
            )
            instant = bool(target.get("instant"))
            ranged = bool(target.get("range")) or not instant  # old dashboards: neither -> range
            common = dict(
                title=str(panel.get("title", "")),
                expr=expr,
                step=step_ns / _NS_PER_S,
                step_ns=step_ns,
                panel_id=panel.get("id"),
                width_px=width,
                max_data_points=max_dp,
                interval_ms=interval_ms,
            )
            if ranged:
                start_ns = align_ns(from_ms * _NS_PER_MS, step_ns, utc_offset_s)
                end_ns = align_ns(to_ms * _NS_PER_MS, step_ns, utc_offset_s)
                requests.append(
                    PanelRequest(
                        **common,  # type: ignore[arg-type]
                        ref_id=str(target.get("refId", "A")),
                        start=start_ns / _NS_PER_S,
                        end=end_ns / _NS_PER_S,
                        start_ns=start_ns,
                        end_ns=end_ns,
                    )
                )
            if instant:
                t_ns = to_ms * _NS_PER_MS
                requests.append(
                    PanelRequest(
                        **common,  # type: ignore[arg-type]
                        ref_id=str(target.get("refId", "A")) + ("-Instant" if ranged else ""),
                        start=t_ns / _NS_PER_S,
                        end=t_ns / _NS_PER_S,
                        start_ns=t_ns,
                        end_ns=t_ns,
                        instant=True,
                    )
                )
    return requests


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import time

    p = argparse.ArgumentParser(description="print the requests one dashboard refresh sends")
    p.add_argument("--dashboard", default=str(DEFAULT_DASHBOARD))
    p.add_argument("--range", default="24h", help="time range ending now (or at --end), e.g. 6h, 7d")
    p.add_argument("--end", type=float, help="end time, unix seconds (default: now)")
    p.add_argument("--width", type=int, default=SCREEN_WIDTH_PX, help="screen width in px")
    args = p.parse_args(argv)
    end = args.end if args.end is not None else time.time()
    start = end - parse_grafana_duration_ns(args.range) / _NS_PER_S
    for r in panel_requests(load_dashboard(args.dashboard), start, end, args.width):
        print(f"{r.title!r:48} w={r.width_px:4}px step={r.step:>6g}s points={r.points:5}  {r.expr}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
