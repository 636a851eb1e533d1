"""Property-based fuzzing of every endpoint promaccel serves, against real Prometheus.

Hypothesis generates requests -- GET and POST forms, every parameter of each endpoint, repeated
and unknown parameters, hostile values (NaN/Inf/huge/negative times and steps, unicode, long
strings, bad PromQL, regex bombs, deep nesting) -- and sends each one to a real promaccel (time
split and node shards on, the cache on) in front of the real test Prometheus, and the same
request straight to that Prometheus. For every request:

- promaccel never answers 5xx (unless Prometheus does too: a timeout the client asked for);
- promaccel's status class is Prometheus's for the same request;
- a 4xx from promaccel on /api/ is Prometheus's error JSON.

Where promaccel legitimately differs the exception is declared in `_declared_difference` with
its reason (its own limits, its own endpoints Prometheus does not have). The runs are
derandomized (fixed seed) so CI sees the same requests every time; together they send well over
1,000 requests to promaccel in about a minute.
"""

from __future__ import annotations

import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.corpus import QUERIES
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"
MAX_HEADER_BYTES = 65536  # listen.max_header_bytes (the default)
MAX_BODY_BYTES = 1048576  # limits.max_body_bytes (the default)
SENT: Counter[tuple[str, int]] = Counter()  # (endpoint, promaccel's status) of every request sent


@dataclass(frozen=True)
class Req:
    method: str
    path: str  # already percent-encoded
    pairs: tuple[tuple[str, str], ...]
    headers: tuple[tuple[str, str], ...] = ()

    def encoded(self) -> bytes:
        return urllib.parse.urlencode(self.pairs).encode()

    def short(self) -> str:
        pairs = [(k, v if len(v) <= 120 else v[:120] + f"...({len(v)} chars)") for k, v in self.pairs]
        return f"{self.method} {self.path[:200]} {pairs} {dict(self.headers)}"


@dataclass
class Pair:
    proxy: httpx.Client
    prom: httpx.Client
    base_proxy: str
    base_prom: str
    problems: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def clients(prom: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("fuzz")
    cfg = work / "promaccel.yaml"
    cfg.write_text(f"cache:\n  admin_token: {ADMIN_TOKEN}\n")
    server = Promaccel.start(prom.url, ("--split-interval", "1h", "--shards", "4"), work, config=cfg)
    try:
        with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
            yield Pair(a, b, server.url, prom.url)
        assert server.proc.poll() is None, "promaccel died during the fuzzing"
    finally:
        server.stop()


def _send(client: httpx.Client, base: str, req: Req) -> httpx.Response:
    headers = dict(req.headers)
    if req.method in ("GET", "DELETE", "HEAD"):
        query = urllib.parse.urlencode(req.pairs)
        url = base + req.path + ("?" + query if query else "")
        return client.request(req.method, url, headers=headers)
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    return client.request(req.method, base + req.path, content=req.encoded(), headers=headers)


# --- hostile values ---------------------------------------------------------------------------

HOSTILE = [
    "", " ", "NaN", "nan", "Inf", "+Inf", "-Inf", "inf", "infinity", "-Infinity", "1e309", "-1e309",
    "1e308", "-1e308", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "1e18", "-1e18",
    "1e-320", "0", "-0", "0.0", "-1", "0x1p4", "0x10", "1_000", "\u0661\u0662", "\uff11\uff12", "1 ", " 1",
    "\x00", "%00", "%", "../..", "..%2f", "\u202e", "\U0001f600", "null", "[]", "{}", "true", "'", '"', "\\",
    "2023-02-30T00:00:00Z", "2023-01-01T00:00:00Z", "2023-01-01t00:00:00.123456789+05:30", "-292273086-05-16T16:47:06Z",
    "292277025-08-18T07:12:54.999999999Z", "99999-01-01T00:00:00Z", "1y", "1ms", "0s", "-1s", "1h30m", "5m30s1ms",
    "1d1h", "1w2y", "15x", "1e3", "1.5e3", ".5", "5.", "+5", "--5", "1/0",
]


# How Go's strconv.ParseFloat and Python's float() differ: Go reads hex floats and refuses
# Unicode digits, underscores, surrounding spaces, overflow; both read inf/nan spellings.
NUMBERS = ["0x1p4", "0x1.8p10", "0X1P+4", "0x_1p4", "0x1p99999", "1_000", "\u0661\u0662", "\uff11\uff12", " 1", "1 ",
           "1e3", "+1e3", "1E3", ".5", "5.", "inf", "INF", "infinity", "+Infinity", "-inf", "nan", "NAN", "+nan", "-nan",
           "1.7976931348623157e308", "1.8e308", "4.9e-324", "1e-400", "-0", "1e300", "-1e300", "1e17", "-1e17",
           "9.3e15", "0.0005", "0.0015", "1e-9"]


def hostile() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HOSTILE),
        st.sampled_from(NUMBERS),
        st.text(max_size=40),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=200, max_value=20000).map(lambda n: "7" * n),
    )


def times(prom: Any) -> st.SearchStrategy[str]:
    from datetime import datetime, timezone

    inside = st.integers(min_value=prom.start_s - 3600, max_value=prom.end_s + 3600)
    return st.one_of(
        inside.map(str),
        inside.map(lambda s: f"{s}.{s % 1000:03d}"),
        inside.map(lambda s: datetime.fromtimestamp(s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
        st.sampled_from(NUMBERS),
        hostile(),
    )


STEPS = ["15", "30", "60", "60s", "1m", "5m", "300", "900", "1h", "3600", "15m30s", "2.5", "86400"]


def steps() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(STEPS), st.sampled_from(STEPS), st.sampled_from(NUMBERS), hostile())


BAD_PROMQL = [
    "sum(", "sum(up", "rate(up)", "up{", "up{a=}", 'up{a="}', "up[5m", "up[5x]", "up offset", "1 +", "+", "()",
    "topk(up)", "by (a) sum(up)", "up @ foo", "up @ NaN", "up @ Inf", "up @ 1e300", "x[1h:0s]", "x[0s]",
    'label_replace(up, "a", "$1", "b", "(")', 'up{__name__=~""}', "{}", '{a=""}', "sum without", "\\", "`",
    "up{a=\"\\q\"}", "1 and 2", "vector(1) / on() group_left group_right vector(1)", "x[1000000000000y]",
    "histogram_quantile()", "sort(1)", "absent()", "{__name__=\"\u65e5\u672c\"}", "\u65e5\u672c",
]
REGEX_BOMBS = [
    "(a*)*b", "(.*)*(.*)*(.*)*(.*)*X", "(a|a)*b", "((a{100}){100}){100}", "a{1001}", "(x+x+)+y", "[",
    "(?P<n>a)", "\\p{Greek}+", "(?i)GPU-NODE-.*", "a{2,1}", ".*" * 200, "(" * 300 + ")" * 300,
]
BIG_NUMBERS = ["1e308", "-1e308", "9223372036854775807", "NaN", "Inf", "-Inf", "0x1p1023", "1e-320"]
OFFSETS = ["5m", "1h", "-30m", "1000y", "1y1d", "0s"]
METRICS = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "node_network_receive_bytes_total",
           "kube_pod_status_phase", "nosuch_metric", "up"]
LABELS = ["Hostname", "namespace", "gpu", "instance", "job", "__name__", "le"]


@st.composite
def promql(draw: Any) -> str:
    kind = draw(st.integers(0, 9))
    if kind <= 2:
        return str(draw(st.sampled_from(sorted(QUERIES.values()))))
    if kind == 3:  # a valid query cut short, or with noise added
        q = draw(st.sampled_from(sorted(QUERIES.values())))
        cut = draw(st.integers(0, len(q)))
        return q[:cut] + draw(st.sampled_from(["", ")", "}", "]", " +", " @", "[", " offset"]))
    if kind == 4:
        return str(draw(st.sampled_from(BAD_PROMQL)))
    if kind == 5:  # a regex bomb in a label matcher
        op = draw(st.sampled_from(["=~", "!~"]))
        rx = draw(st.sampled_from(REGEX_BOMBS)).replace("\\", "\\\\").replace('"', '\\"')
        return f'sum({draw(st.sampled_from(METRICS))}{{{draw(st.sampled_from(LABELS))}{op}"{rx}"}})'
    if kind == 6:  # huge numbers, offsets, @
        m = draw(st.sampled_from(METRICS))
        n = draw(st.sampled_from(BIG_NUMBERS))
        form = draw(st.integers(0, 3))
        if form == 0:
            return f"{m} * {n}"
        if form == 1:
            return f"sum(rate({m}[5m] offset {draw(st.sampled_from(OFFSETS))}))"
        if form == 2:
            return f"{m} @ {n}"
        return f"max_over_time({m}[{draw(st.sampled_from(['1m', '1h', '30d', '10y']))}])"
    if kind == 7:  # deep nesting, long operator chains (promaccel's parser bounds)
        depth = draw(st.integers(10, 200))
        if draw(st.booleans()):
            return "(" * depth + "vector(1)" + ")" * depth
        return " + ".join(["vector(1)"] * depth)
    if kind == 8:  # unicode and odd label values
        value = draw(st.text(max_size=30)).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'count({draw(st.sampled_from(METRICS))}{{{draw(st.sampled_from(LABELS))}="{value}"}})'
    return draw(hostile())


GOOD_SELECTORS = [*METRICS, 'DCGM_FI_DEV_GPU_TEMP{gpu="0"}', '{__name__=~"DCGM_.*"}', '{Hostname=~"gpu-node-000[0-3]"}',
                  '{__name__="up"}', 'kube_pod_status_phase{phase!="Running"}']


def selectors() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(GOOD_SELECTORS),
        st.sampled_from(REGEX_BOMBS).map(lambda r: '{Hostname=~"' + r.replace("\\", "\\\\").replace('"', '\\"') + '"}'),
        st.sampled_from(['{__name__=~".+"}', '{__name__=~".*"}', "{}", '{a=""}', "up{", "sum(up)", "up[5m]"]),
        hostile(),
    )


@dataclass(frozen=True)
class Param:
    good: st.SearchStrategy[str]  # values Prometheus accepts (mostly)
    bad: st.SearchStrategy[str]  # anything
    many: bool = False  # a list parameter (match[])


@st.composite
def form(draw: Any, params: dict[str, Param]) -> tuple[tuple[str, str], ...]:
    """A request's parameters: all good (a real answer), one bad, or chaos (each good or bad,
    absent, repeated: the first counts); in a drawn order, plus maybe an unknown one."""
    mode = draw(st.sampled_from(["clean", "clean", "one_bad", "one_bad", "chaos"]))
    bad_one = draw(st.sampled_from(sorted(params))) if params and mode == "one_bad" else None
    pairs: list[tuple[str, str]] = []
    for name, p in params.items():
        if mode == "chaos":
            count = draw(st.sampled_from([0, 1, 1, 2, 3] if p.many else [0, 1, 1, 1, 2]))
            pairs += [(name, draw(st.one_of(p.good, p.bad))) for _ in range(count)]
        elif name == bad_one:
            pairs += [(name, draw(p.bad)) for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2])))]
        else:
            pairs += [(name, draw(p.good)) for _ in range(draw(st.sampled_from([1, 1, 2])) if p.many else 1)]
    if draw(st.integers(0, 9)) == 0:
        pairs.append((draw(st.sampled_from(["x", "", "query[]", "\u00e9", "a" * 300])), draw(hostile())))
    return tuple(draw(st.permutations(pairs)))


# --- the endpoints --------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    name: str
    paths: Callable[[Any], st.SearchStrategy[str]]
    methods: tuple[str, ...]  # the methods it serves; others are drawn too, rarely
    params: Callable[[Any], dict[str, Param]]
    examples: int = 40
    headers: bool = False  # Accept: arrow sometimes (query endpoints)


def _fixed(path: str) -> Callable[[Any], st.SearchStrategy[str]]:
    return lambda _prom: st.just(path)


def _between(lo: int, hi: int) -> st.SearchStrategy[str]:
    from datetime import datetime, timezone

    inside = st.integers(min_value=lo, max_value=hi)
    return st.one_of(inside.map(str), inside.map(lambda s: f"{s}.{s % 1000:03d}"),
                     inside.map(lambda s: datetime.fromtimestamp(s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")))


def _starts(prom: Any) -> Param:  # a start before every good end
    return Param(_between(prom.start_s - 3600, prom.start_s + 3 * 3600), times(prom))


def _ends(prom: Any) -> Param:
    return Param(_between(prom.start_s + 3 * 3600, prom.end_s + 3600), times(prom))


TIMEOUT = Param(st.sampled_from(["30s", "1m", "60"]), st.one_of(st.sampled_from(["0", "-1", "1e-9", "NaN"]), hostile()))
QUERY = Param(st.sampled_from(sorted(QUERIES.values())), promql())


def _q(prom: Any) -> dict[str, Param]:
    return {"query": QUERY, "time": Param(_between(prom.start_s, prom.end_s), times(prom)), "timeout": TIMEOUT}


def _qr(prom: Any) -> dict[str, Param]:
    return {"query": QUERY, "start": _starts(prom), "end": _ends(prom), "step": Param(st.sampled_from(STEPS), steps()),
            "timeout": TIMEOUT}


def _matches(prom: Any) -> dict[str, Param]:
    return {"match[]": Param(st.sampled_from(GOOD_SELECTORS), selectors(), many=True), "start": _starts(prom),
            "end": _ends(prom)}


def _one(name: str, good: list[str]) -> Callable[[Any], dict[str, Param]]:
    return lambda _prom: {name: Param(st.sampled_from(good), hostile())}


def _label_name(_prom: Any) -> st.SearchStrategy[str]:
    names = st.one_of(st.sampled_from(LABELS), st.sampled_from(LABELS),
                      st.sampled_from(["0abc", "a-b", "a b", "..", ".", "a/b", "a%2Fb", "\u65e5\u672c", "x" * 3000]),
                      st.text(min_size=1, max_size=20))
    return names.map(lambda n: f"/api/v1/label/{urllib.parse.quote(n, safe='')}/values")


def _status_page(_prom: Any) -> st.SearchStrategy[str]:
    pages = st.one_of(st.sampled_from(["config", "flags", "runtimeinfo", "tsdb", "walreplay", "buildinfo"]),
                      st.sampled_from(["..", "Config", "tsdb/", "%2e%2e", "pprof", "x" * 500]),
                      st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/?#%"),
                              min_size=1, max_size=12))
    return pages.map(lambda p: f"/api/v1/status/{urllib.parse.quote(p, safe='')}")


def _none(_prom: Any) -> dict[str, Param]:
    return {}


ENDPOINTS = [
    Endpoint("query", _fixed("/api/v1/query"), ("GET", "POST"), _q, examples=300, headers=True),
    Endpoint("query_range", _fixed("/api/v1/query_range"), ("GET", "POST"), _qr, examples=300, headers=True),
    Endpoint("series", _fixed("/api/v1/series"), ("GET", "POST"), _matches, examples=70),
    Endpoint("labels", _fixed("/api/v1/labels"), ("GET", "POST"), _matches, examples=60),
    Endpoint("label_values", _label_name, ("GET",), _matches, examples=70),
    Endpoint("metadata", _fixed("/api/v1/metadata"), ("GET",),
             lambda p: {"metric": Param(st.sampled_from(METRICS), hostile()), "limit": Param(st.sampled_from(["1", "5"]),
                                                                                               hostile())}, examples=40),
    Endpoint("query_exemplars", _fixed("/api/v1/query_exemplars"), ("GET", "POST"),
             lambda p: {"query": QUERY, "start": _starts(p), "end": _ends(p)}, examples=60),
    Endpoint("format_query", _fixed("/api/v1/format_query"), ("GET", "POST"), lambda p: {"query": QUERY}, examples=50),
    Endpoint("rules", _fixed("/api/v1/rules"), ("GET",), _one("type", ["alert", "record"]), examples=20),
    Endpoint("alerts", _fixed("/api/v1/alerts"), ("GET",), _none, examples=10),
    Endpoint("targets", _fixed("/api/v1/targets"), ("GET",), _one("state", ["active", "dropped", "any"]), examples=20),
    Endpoint("targets_metadata", _fixed("/api/v1/targets/metadata"), ("GET",),
             lambda p: {"match_target": Param(st.just('{job="prometheus"}'), selectors()),
                        "metric": Param(st.just("up"), hostile()), "limit": Param(st.just("3"), hostile())}, examples=25),
    Endpoint("alertmanagers", _fixed("/api/v1/alertmanagers"), ("GET",), _none, examples=5),
    Endpoint("status", _status_page, ("GET",), _none, examples=40),
    Endpoint("explain", _fixed("/api/v1/explain"), ("GET", "POST"), _qr, examples=60),
    Endpoint("explain_instant", _fixed("/api/v1/explain"), ("GET", "POST"), _q, examples=30),
    Endpoint("admin_invalidate", _fixed("/api/v1/admin/cache/invalidate"), ("POST",), _matches, examples=40),
    Endpoint("admin_generation", _fixed("/api/v1/admin/cache/generation"), ("POST",), _none, examples=8),
    Endpoint("admin_stats", _fixed("/api/v1/admin/cache/stats"), ("GET",), _none, examples=8),
    Endpoint("health", lambda p: st.sampled_from(["/-/healthy", "/-/ready", "/metrics"]), ("GET",), _none,
             examples=20),
    Endpoint("ui", lambda p: st.sampled_from(["/ui", "/ui/data.json"]), ("GET",), _none, examples=10),
    Endpoint("unknown", lambda p: st.sampled_from(["/api/v1/nonsense", "/api/v2/query", "/api/v1/query/x",
                                                   "/api/v1/admin/tsdb/delete_series", "/debug/pprof/",
                                                   "/api/v1/label/job", "/api/v1//query"]),
             ("GET",), _none, examples=20),
]
PROMACCEL_ONLY = ("/api/v1/explain", "/api/v1/admin/cache/", "/ui")


@st.composite
def requests(draw: Any, endpoint: Endpoint, prom: Any) -> Req:
    method = draw(st.sampled_from(endpoint.methods)) if draw(st.integers(0, 14)) else draw(
        st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    pairs = draw(form(endpoint.params(prom)))
    headers: list[tuple[str, str]] = []
    if endpoint.headers and draw(st.integers(0, 4)) == 0:
        headers.append(("Accept", "application/vnd.apache.arrow.stream"))
    if endpoint.name.startswith("admin") and draw(st.integers(0, 3)):
        headers.append(("Authorization", draw(st.sampled_from([f"Bearer {ADMIN_TOKEN}", f"Bearer {ADMIN_TOKEN}",
                                                                "Bearer wrong", "Basic eDp5", "Bearer", ""]))))
    return Req(method, draw(endpoint.paths(prom)), pairs, tuple(headers))


# --- the check ------------------------------------------------------------------------------

def _first(req: Req, name: str) -> str | None:
    return next((v for k, v in req.pairs if k == name), None)


def _url_bytes(req: Req) -> int:
    query = urllib.parse.urlencode(req.pairs) if req.method in ("GET", "DELETE", "HEAD") else ""
    return len(req.path) + len(query) + 200  # + the request line's and headers' other bytes


def _declared_difference(req: Req, mine: httpx.Response, theirs: httpx.Response) -> str | None:
    """Why promaccel's status class may differ from Prometheus's for this request, or None."""
    if _url_bytes(req) > MAX_HEADER_BYTES - 1024 and mine.status_code == 431:
        return "listen.max_header_bytes: promaccel's bound on the request line and headers (Go allows 1 MB)"
    if len(req.encoded()) > MAX_BODY_BYTES and mine.status_code == 413:
        return "limits.max_body_bytes: promaccel's bound on a form body (Go reads 10 MB)"
    if mine.status_code == 422 and b"limits." in mine.content:
        return "one of promaccel's own limits (limits.*), named in the error"
    if theirs.status_code in (301, 302, 307, 308) and mine.status_code == 404:
        return ("Prometheus's router redirects a path that is not canonical (a trailing or double slash, a "
                "dot segment); promaccel redirects nothing and answers 404 for any path it does not serve")
    if req.path.startswith("/debug/") and mine.status_code == 404:
        return "Prometheus's debug endpoints (pprof): promaccel never serves or relays them (README, Security)"
    if req.path == "/api/v1/query_range" and mine.status_code == 400 and _sub_ms_step(req):
        return ("a step under 1 ms: Prometheus truncates it to a 0 ms interval (an instant vector when start = "
                "end, else a division by zero); promaccel refuses it as a zero step")
    return None


def _sub_ms_step(req: Req) -> bool:
    from proxy.api.params import parse_duration_param_ns

    try:
        return 0 < parse_duration_param_ns(_first(req, "step") or "") < 1_000_000
    except ValueError:
        return False


def _promaccel_only(req: Req, mine: httpx.Response) -> None:
    """Endpoints Prometheus does not have (it answers 404): promaccel's own contract."""
    code = mine.status_code
    if req.path.startswith("/api/v1/admin/cache/"):
        allowed_methods = ("GET",) if req.path.endswith("/stats") else ("POST",)
        if req.method not in allowed_methods:
            assert code in (404, 405), code
            return
        auth = dict(req.headers).get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            assert code == 401, (code, mine.text)
        elif auth != f"Bearer {ADMIN_TOKEN}":
            assert code == 403, (code, mine.text)
        elif req.path.endswith("/invalidate") and not any(k == "match[]" for k, _ in req.pairs):
            assert code == 400, (code, mine.text)
        else:
            assert code in (200, 400), (code, mine.text)
    elif req.path.startswith("/ui"):
        assert code == (200 if req.method == "GET" else 405), code
    else:  # explain: parameters validated as query/query_range; the plan, or a 4xx
        assert code in (200, 400, 404, 405, 413, 422, 431), (code, mine.text[:300])


def _check(pair: Pair, req: Req, endpoint: str) -> None:
    mine = _send(pair.proxy, pair.base_proxy, req)
    SENT[(endpoint, mine.status_code)] += 1
    code = mine.status_code
    if req.path.startswith(PROMACCEL_ONLY):
        try:
            _promaccel_only(req, mine)
        except AssertionError as exc:
            pair.problems.append(f"{req.short()}: promaccel {code} {mine.text[:300]!r} ({exc})")
        return
    theirs = _send(pair.prom, pair.base_prom, req)
    reason = _declared_difference(req, mine, theirs)
    if reason is not None:
        return
    if code // 100 != theirs.status_code // 100 or (code >= 500 and theirs.status_code < 500):
        pair.problems.append(f"{req.short()}: promaccel {code} {mine.text[:300]!r}, "
                             f"Prometheus {theirs.status_code} {theirs.text[:300]!r}")
        return
    if 400 <= code < 500 and req.path.startswith("/api/") and code != 405:
        try:
            body = orjson.loads(mine.content)
            assert body["status"] == "error" and body["errorType"] and body["error"], body
        except (orjson.JSONDecodeError, AssertionError, KeyError, TypeError):
            pair.problems.append(f"{req.short()}: promaccel {code} without Prometheus's error JSON: {mine.text[:300]!r}")


def _fuzz(pair: Pair, prom: Any, endpoint: Endpoint) -> None:
    @settings(max_examples=endpoint.examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(requests(endpoint, prom))
    def run(req: Req) -> None:
        _check(pair, req, endpoint.name)

    pair.problems.clear()
    run()
    problems = sorted(set(pair.problems))
    assert not problems, f"{len(problems)} requests where promaccel was wrong:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_fuzz_endpoint(clients: Pair, prom: Any, endpoint: Endpoint) -> None:
    _fuzz(clients, prom, endpoint)


def test_fuzzing_sent_enough_requests() -> None:
    """The runs above together (this file runs whole, in order): at least 1,000 requests, and
    the query endpoints got both answers and refusals (the fuzzing reached past validation)."""
    total = sum(SENT.values())
    by_endpoint = {name: {code: n for (e, code), n in sorted(SENT.items()) if e == name} for name, _ in SENT}
    print(f"\n{total} requests to promaccel, statuses by endpoint: {by_endpoint}")
    assert total >= 1000, total
    for name in ("query", "query_range", "series", "label_values", "explain"):
        codes = by_endpoint[name]
        ok, refused = codes.get(200, 0), sum(n for c, n in codes.items() if 400 <= c < 500)
        assert ok >= 0.2 * sum(codes.values()) and refused >= 0.05 * sum(codes.values()), (name, codes)


def test_nan_and_infinite_times_are_answered_as_prometheus_does(clients: Pair, prom: Any) -> None:
    """Go converts a NaN or infinite Unix time to math.MinInt64 seconds, a time in 1677
    (-9223372036.855 s once Prometheus's int64 arithmetic wraps): Prometheus evaluates an instant
    query there, and a range query whose start and end are both such times."""
    for text in ("NaN", "Inf", "-Inf", "+inf"):
        for path, form_ in (("/api/v1/query", {"query": "vector(1)", "time": text}),
                            ("/api/v1/query_range", {"query": "vector(1)", "start": text, "end": text, "step": "60"})):
            req = Req("POST", path, tuple(form_.items()))
            mine, theirs = _send(clients.proxy, clients.base_proxy, req), _send(clients.prom, clients.base_prom, req)
            assert theirs.status_code == 200, theirs.text
            assert (mine.status_code, orjson.loads(mine.content)) == (200, orjson.loads(theirs.content)), mine.text
