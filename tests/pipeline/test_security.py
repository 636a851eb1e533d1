"""One small request must not stall promaccel or multiply its backend calls.

Each attack of the security review, replayed against a real promaccel in front of the real
test Prometheus (bounded in size and time), plus the pure guards behind the fixes:
- a 3,000-term query and 3,000-deep nesting: not planned (promql-parser's cost grows with the
  square of the depth, holding the GIL), forwarded as they are, the same answer as Prometheus,
  and /-/healthy keeps answering meanwhile;
- a backtracking regex (`(.*)*(.*)*(.*)*(.*)*X`) at 16 shards: matched with RE2, as Prometheus;
- an instant `max_over_time(x[3650d])`: its sub-windows fetched in a few range calls, not one
  call each; `limits.max_backend_calls` and `limits.max_new_cache_keys` enforced;
- /metrics label values only from a fixed vocabulary, whatever the query's text.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.compare import diff_answers
from shardplanner import promql
from shardplanner.explain import REASON_CODES, reason_code
from shardplanner.promql import CannotParse, TooComplex, parse
from shardplanner.regex import RegexError, fullmatch, matcher
from tests.servers import Promaccel, free_port

EVIL_REGEX = "(.*)*(.*)*(.*)*(.*)*X"


# --- pure guards ------------------------------------------------------------------------------


def test_long_operator_chain_is_refused_before_the_parser() -> None:
    query = "+".join(["1"] * 3000)
    t0 = time.perf_counter()
    with pytest.raises(CannotParse, match="operators"):
        parse(query)
    assert time.perf_counter() - t0 < 0.05  # a lexical scan, stopped at the bound
    with pytest.raises(CannotParse, match="nested"):
        parse("sum(" * 3000 + "x" + ")" * 3000)
    with pytest.raises(TooComplex, match="characters"):
        parse("x" * (promql.MAX_QUERY_BYTES + 1))
    # Keyword operators count too.
    with pytest.raises(CannotParse, match="operators"):
        parse(" or ".join(f"m{i}" for i in range(promql.MAX_OPERATORS + 2)))


def test_queries_within_the_bounds_still_parse() -> None:
    # At the bound: planned as usual.
    parse("+".join(["x"] * promql.MAX_OPERATORS))
    parse("abs(" * (promql.MAX_NESTING - 1) + "x" + ")" * (promql.MAX_NESTING - 1))
    # Operators and brackets inside strings and comments are not counted.
    many = "+" * 2000
    assert parse(f'x{{a="{many}"}}').matchers[0].value == many  # type: ignore[attr-defined]
    parse(f"x # {'(' * 500}\n")
    # A shard-injected piece query of a 2,000-node fleet (a 30 KB regex) is read.
    hosts = "|".join(f"gpu-node-{i:05d}" for i in range(2000))
    parse(f'sum(x{{Hostname=~"{hosts}"}})')


def test_parse_results_and_failures_are_cached() -> None:
    query = "sum(rate(never_seen_before_metric[5m])"  # unbalanced: the parser rejects it
    with pytest.raises(CannotParse) as first:
        parse(query)
    with pytest.raises(CannotParse) as second:
        parse(query)
    assert str(first.value) == str(second.value)
    ok = "sum by (a) (never_seen_other_metric)"
    assert parse(ok) is parse(ok)  # the same immutable tree, not parsed again


def test_client_regexes_run_on_re2() -> None:
    values = [f"gpu-node-{i:05d}-{'a' * 20}" for i in range(64)]
    t0 = time.perf_counter()
    assert not any(fullmatch(EVIL_REGEX, v) for v in values)
    # Python's re takes seconds on one of these values; RE2 is linear.
    assert time.perf_counter() - t0 < 0.1
    assert fullmatch("gpu-node-0.*", "gpu-node-00012") and not fullmatch("node", "gpu-node")
    assert not fullmatch(r"\d+", "١٢")  # Go's \d is ASCII, as RE2's
    with pytest.raises(RegexError):
        matcher("(?=lookahead)")  # Go's regexp rejects look-around; so does RE2


def test_planner_notes_map_to_a_fixed_vocabulary() -> None:
    hostile = 'not sharded: no shard label configured for metric evil_{"x"}_metric_with_a_long_name'
    assert reason_code((hostile,)) == "no_shard_label"
    assert reason_code(("something a future planner says",)) == "other"
    assert reason_code(()) == ""
    assert REASON_CODES >= {"no_shard_label", "other", "", "unparsable"}


# --- against a real promaccel -----------------------------------------------------------------


class HealthProbe:
    """Polls /-/healthy every 20 ms in a thread while an attack runs; latencies in ms."""

    def __init__(self, url: str) -> None:
        self.url = url + "/-/healthy"
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set() and len(self.latencies) < 5000:
                t0 = time.perf_counter()
                r = client.get(self.url)
                assert r.status_code == 200
                self.latencies.append((time.perf_counter() - t0) * 1000)
                self._stop.wait(0.02)

    def __enter__(self) -> "HealthProbe":
        self._thread.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def check(self) -> None:
        """The event loop stayed free: the review measured /-/healthy waiting 4.2 s. Under 50 ms
        at the median, or within 3x of the same probe's median with no attack running (the
        suite shares 2 cores with another worker); never a stall of a second."""
        assert len(self.latencies) >= 5, self.latencies
        quiet = _quiet_median(self.url)
        assert statistics.median(self.latencies) < max(50.0, 3 * quiet), (quiet, sorted(self.latencies)[-5:])
        assert max(self.latencies) < 1000, sorted(self.latencies)[-5:]


def _quiet_median(url: str) -> float:
    latencies = []
    with httpx.Client(timeout=30) as client:
        for _ in range(15):
            t0 = time.perf_counter()
            client.get(url)
            latencies.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.02)
    return statistics.median(latencies)


def _post(url: str, path: str, data: dict[str, str]) -> httpx.Response:
    return httpx.post(url + path, data=data, timeout=120)


@pytest.fixture(scope="module")
def sharded16(proxies: Any) -> Promaccel:
    return proxies.get("--split-interval", "1h", "--shards", "16")  # type: ignore[no-any-return]


@pytest.mark.prom
def test_long_query_is_forwarded_unplanned_and_answers_as_prometheus(prom: Any, sharded16: Promaccel) -> None:
    form = {"query": "+".join(["1"] * 3000), "time": str(prom.end_s - 60)}
    direct = _post(prom.url, "/api/v1/query", form)
    with HealthProbe(sharded16.url) as probe:
        answers = [_post(sharded16.url, "/api/v1/query", form) for _ in range(3)]
    probe.check()
    for proxied in answers:
        assert proxied.status_code == direct.status_code == 200
        assert diff_answers(direct.json(), proxied.json()) == []
    explained = httpx.get(sharded16.url + "/api/v1/explain", params=form, timeout=60).json()["data"]
    assert explained["piece_count"] == 1
    assert explained["notes"] == ["too complex to plan (more than 256 operators): forwarded unplanned"]


@pytest.mark.prom
def test_deep_nesting_is_forwarded_unplanned(prom: Any, sharded16: Promaccel) -> None:
    form = {"query": "sum(" * 3000 + "DCGM_FI_DEV_GPU_UTIL" + ")" * 3000,
            "start": str(prom.end_s - 3600), "end": str(prom.end_s), "step": "60"}
    direct = _post(prom.url, "/api/v1/query_range", form)
    with HealthProbe(sharded16.url) as probe:
        proxied = _post(sharded16.url, "/api/v1/query_range", form)
    probe.check()
    assert proxied.status_code == direct.status_code
    assert diff_answers(direct.json(), proxied.json()) == []


@pytest.mark.prom
def test_backtracking_regex_is_matched_in_linear_time(prom: Any, sharded16: Promaccel) -> None:
    query = f'sum(DCGM_FI_DEV_GPU_UTIL{{Hostname=~"{EVIL_REGEX}"}})'
    hosts = httpx.get(prom.url + "/api/v1/label/Hostname/values", timeout=30).json()["data"]
    assert len(hosts) >= 16  # every value is tried against the regex when counting nodes
    instant = {"query": query, "time": str(prom.end_s - 60)}
    ranged = {"query": query, "start": str(prom.end_s - 7200), "end": str(prom.end_s), "step": "60"}
    with HealthProbe(sharded16.url) as probe:
        t0 = time.perf_counter()
        explained = httpx.get(sharded16.url + "/api/v1/explain", params=ranged, timeout=60)
        took = time.perf_counter() - t0
        answers = [(_post(prom.url, path, form), _post(sharded16.url, path, form))
                   for path, form in (("/api/v1/query", instant), ("/api/v1/query_range", ranged))]
    probe.check()
    assert explained.status_code == 200 and took < 2, took
    for direct, proxied in answers:
        assert proxied.status_code == direct.status_code == 200
        assert diff_answers(direct.json(), proxied.json()) == []
    # A matching variant of the same shape still selects the right nodes (RE2 = Go's regexp).
    ok = {"query": 'count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"(.*)*(.*)*-(0|1).*"})', "time": str(prom.end_s - 60)}
    direct, proxied = _post(prom.url, "/api/v1/query", ok), _post(sharded16.url, "/api/v1/query", ok)
    assert direct.json()["data"]["result"], "the variant must select something"
    assert diff_answers(direct.json(), proxied.json()) == []


def _backend_calls(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in re.finditer(r"^promaccel_backend_calls_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.prom
def test_instant_window_sub_windows_are_coalesced(prom: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("planner:\n  split_interval: 1h\n  shards: 4\ncache:\n  enabled: false\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg)), tmp_path)
    try:
        for query in ("max_over_time(DCGM_FI_DEV_GPU_TEMP[3650d])",
                      "sum by (namespace) (sum_over_time(DCGM_FI_DEV_GPU_UTIL[30d]))",
                      "max_over_time(DCGM_FI_DEV_GPU_TEMP[5h])"):
            form = {"query": query, "time": str(prom.end_s - 1234)}
            explained = httpx.get(server.url + "/api/v1/explain", params=form, timeout=60).json()["data"]
            before = _backend_calls(server.url)
            proxied = _post(server.url, "/api/v1/query", form)
            calls = _backend_calls(server.url) - before
            direct = _post(prom.url, "/api/v1/query", form)
            assert proxied.status_code == 200 and direct.json()["data"]["result"]
            assert diff_answers(direct.json(), proxied.json(), rel=1e-9) == []
            # Per shard: the interior sub-windows in one range call, the two edges alone
            # (the review counted 1,992 calls for [3650d], one per sub-window).
            assert explained["piece_count"] >= 16
            assert calls <= 4 * 3, (query, calls, explained["piece_count"])
    finally:
        server.stop()


@pytest.mark.prom
def test_backend_call_and_cache_key_limits(prom: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "promaccel.yaml"
    cfg.write_text("planner:\n  split_interval: 1h\n  shards: 8\n"
                   "limits:\n  max_backend_calls: 4\n  max_new_cache_keys: 3\n")
    server = Promaccel.start(prom.url, ("--config", str(cfg)), tmp_path)
    try:
        wide = {"query": "sum(DCGM_FI_DEV_GPU_UTIL)", "start": str(prom.end_s - 5 * 3600),
                "end": str(prom.end_s - 3600), "step": "60"}
        refused = _post(server.url, "/api/v1/query_range", wide)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["status"] == "error" and body["errorType"] == "execution"
        assert "limits.max_backend_calls" in body["error"] and "4" in body["error"]
        # Within the call limit (not shardable: 4 hour cells, at most 4 calls) but over the key
        # limit: answered in full; only 3 of its 4 hour cells are kept, so the repeat is a
        # PARTIAL hit (it keeps the fourth: the allowance is per query).
        narrow = dict(wide, query="quantile(0.5, DCGM_FI_DEV_GPU_UTIL)")
        direct = _post(prom.url, "/api/v1/query_range", narrow)
        statuses = []
        for _ in range(2):
            proxied = _post(server.url, "/api/v1/query_range", narrow)
            assert proxied.status_code == 200
            assert diff_answers(direct.json(), proxied.json(), rel=1e-9) == []
            statuses.append(proxied.headers["X-Cache"])
            time.sleep(0.3)
        assert statuses == ["MISS", "PARTIAL"], statuses
        text = httpx.get(server.url + "/metrics", timeout=30).text
        assert re.search(r'^promaccel_cache_skipped_total\{reason="max_new_cache_keys"\} [1-9]', text, re.M)
    finally:
        server.stop()


@pytest.mark.prom
def test_metrics_labels_come_from_a_fixed_vocabulary(prom: Any, sharded16: Promaccel) -> None:
    marker = "zz_client_text_never_a_label"
    for query in (f"sum({marker}_metric)", f'sum(up{{job="{marker}"}} or {marker}_b)', f"{marker} +"):
        _post(sharded16.url, "/api/v1/query", {"query": query, "time": str(prom.end_s)})
    text = httpx.get(sharded16.url + "/metrics", timeout=30).text
    assert marker not in text
    reasons = set(re.findall(r'^promaccel_queries_planned_total\{[^}]*reason="([^"]*)"', text, re.M))
    assert reasons and reasons <= REASON_CODES, reasons


# --- round 3: no request may crash the parser -------------------------------------------------


def _chain(kind: str, n: int) -> str:
    """Queries the review sent to kill the process (SIGSEGV in promql-parser's recursion):
    unary minus signs separated by spaces, a binary chain, and a nest of parentheses."""
    if kind == "unary_spaced":
        return "- " * n + "up"
    if kind == "unary_tight":
        return "-" * n + "up"
    if kind == "binary":
        return " - ".join(["up"] * (n // 2 + 1))
    return "(" * (n // 2) + "up" + ")" * (n // 2)


@pytest.mark.parametrize("kind", ["unary_spaced", "unary_tight", "binary", "parens"])
@pytest.mark.parametrize("n", [10_000, 50_000, 200_000])
def test_operator_chains_never_reach_the_parser(kind: str, n: int) -> None:
    with pytest.raises(TooComplex):
        parse(_chain(kind, n))


def test_every_operator_character_counts() -> None:
    # Spaced or not, each operator is a token; two-character operators count once.
    with pytest.raises(TooComplex, match="operators"):
        parse(" * ".join(["up"] * (promql.MAX_OPERATORS + 2)))
    parse('x{a!~"b", c=~"d", e!="f"} >= 1 <= 2 == 3 != 4')
    # Unary chains are nesting: each sign is one more level of the parser's recursion.
    with pytest.raises(TooComplex, match="nested"):
        parse("- " * (promql.MAX_NESTING + 1) + "up")
    with pytest.raises(TooComplex, match="nested"):
        parse("-(" * 40 + "up" + ")" * 40)
    parse("- " * (promql.MAX_NESTING - 1) + "up")
    parse(" - ".join(["-up"] * 100))  # 100 unary signs, none nested in another


class _RefusingBackend:
    """A stand-in backend on 127.0.0.1 that refuses every query at once (400 bad_data) and
    answers metadata with an empty list: what promaccel does with a query too complex to plan
    is the subject here, not how long a real Prometheus takes to parse 200,000 operators
    (minutes)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                if size:
                    self.rfile.read(size)
                if self.path.startswith("/api/v1/query"):
                    code, body = 400, {"status": "error", "errorType": "bad_data", "error": "refused"}
                else:
                    code, body = 200, {"status": "success", "data": []}
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def over_refusing(tmp_path_factory: pytest.TempPathFactory) -> Any:
    fake = _RefusingBackend()
    proxy = Promaccel.start(fake.url, (), tmp_path_factory.mktemp("refusing"))
    try:
        yield proxy
    finally:
        proxy.stop()
        fake.server.shutdown()


def test_operator_chains_through_every_endpoint_leave_the_process_alive(over_refusing: Promaccel) -> None:
    url = over_refusing.url
    with HealthProbe(url) as probe:
        for n in (10_000, 50_000, 200_000):
            for kind in ("unary_spaced", "unary_tight", "binary", "parens"):
                query = _chain(kind, n)
                calls = [
                    ("/api/v1/query", {"query": query}),
                    ("/api/v1/query_range", {"query": query, "start": "1700000000", "end": "1700003600",
                                             "step": "60"}),
                    ("/api/v1/series", {"match[]": query}),
                ]
                for path, form in calls:
                    proxied = _post(url, path, form)  # a form POST of up to 400 KB
                    assert proxied.status_code < 500, (path, kind, n, proxied.text[:300])
                    body = proxied.json()
                    assert body["status"] in ("success", "error"), body
                    if body["status"] == "error":
                        assert body["errorType"] == "bad_data" and body["error"], body
                explained = _post(url, "/api/v1/explain", {"query": query})
                assert explained.status_code == 200, explained.text[:300]
                assert "too complex to plan" in explained.json()["data"]["notes"][0]
                assert over_refusing.proc.poll() is None, (kind, n)  # still running
        # A GET of the review's size (20 KB) as well.
        got = httpx.get(url + "/api/v1/query", params={"query": _chain("unary_spaced", 10_000)}, timeout=60)
        assert got.status_code == 400 and got.json()["errorType"] == "bad_data"
    probe.check()
    assert httpx.get(url + "/-/healthy", timeout=5).status_code == 200


@pytest.mark.prom
def test_spaced_unary_chain_answers_as_prometheus(prom: Any, sharded16: Promaccel) -> None:
    form = {"query": _chain("unary_spaced", 10_000), "time": str(prom.end_s - 60)}
    direct = _post(prom.url, "/api/v1/query", form)
    proxied = _post(sharded16.url, "/api/v1/query", form)
    assert proxied.status_code == direct.status_code == 200
    assert diff_answers(direct.json(), proxied.json()) == []
    assert sharded16.proc.poll() is None
