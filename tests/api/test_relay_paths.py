"""Relays reach only the endpoint they name. A double-encoded `..%252F` once went out of
/api/v1/status/<what> as `..%2F`, the backend answered 301 and the redirect was followed to
/debug/pprof/cmdline, /federate and /api/v1/query. Every relaying route is tried with encoded
slashes and dot segments (sent byte for byte): behind a recording fake backend, the exact
backend paths are asserted; in front of a real Prometheus, the answer must be an error or the
intended endpoint's, never pprof, federate or query output."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.rawhttp import Answer, Recorder, raw_request
from tests.servers import Promaccel

pytestmark = pytest.mark.prom

# Every relaying route of proxy/api/relays.py (buildinfo is promaccel's own, but it calls the backend).
FIXED = [
    "/api/v1/series", "/api/v1/labels", "/api/v1/metadata", "/api/v1/query_exemplars", "/api/v1/format_query",
    "/api/v1/rules", "/api/v1/alerts", "/api/v1/targets", "/api/v1/targets/metadata", "/api/v1/alertmanagers",
    "/api/v1/status/config", "/api/v1/status/flags", "/api/v1/status/runtimeinfo", "/api/v1/status/buildinfo",
    "/api/v1/status/tsdb", "/api/v1/status/walreplay", "/api/v1/label/job/values",
]
# What a traversal aims at, encoded in the ways that got through (or might).
TAILS = [
    "..%2F..%2F..%2Fdebug%2Fpprof%2Fcmdline",
    "..%252F..%252F..%252Fdebug%252Fpprof%252Fcmdline",
    "..%252F..%252F..%252Ffederate%253Fmatch%255B%255D%253Dup",
    "%2e%2e%2F%2e%2e%2F%2e%2e%2Ffederate",
    "%2e%2e%252F%2e%2e%252F%2e%2e%252Fapi%252Fv1%252Fquery%253Fquery%253Dup",
    "%252e%252e%252F%252e%252e%252F%252e%252e%252Fdebug%252Fpprof%252F",
    "../../../debug/pprof/",
    "%2e%2e/%2e%2e/%2e%2e/federate",
    "..%5C..%5C..%5Cdebug%5Cpprof%5Ccmdline",
    "..",
    "%2e%2e",
]


def _targets() -> list[str]:
    out: list[str] = []
    for tail in TAILS:
        for path in FIXED:
            out += [f"{path}/{tail}", f"{path}%2F{tail}", f"{path}%252F{tail}"]
        # The templated slots themselves.
        out += [f"/api/v1/status/{tail}", f"/api/v1/status/config%2F{tail}", f"/api/v1/status/flags%252F{tail}",
                f"/api/v1/label/{tail}/values", f"/api/v1/label/job%2F{tail}/values",
                f"/api/v1/label/job%252F{tail}/values", f"/api/v1/label/{tail}%2Fvalues",
                f"/api/v1/label/{tail}/values?match[]=up"]
    return out


TARGETS = _targets()
LEAKS = (b"--config.file", b"pprof", b"# TYPE", b"resultType", b"SECRET", b"Types of profiles")


def _refused(target: str, ans: Answer) -> None:
    """A Prometheus-style 400/404 that carries nothing from another endpoint."""
    assert ans.status in (400, 404), (target, ans.status, ans.body[:300])
    body = orjson.loads(ans.body)
    assert body["status"] == "error" and body["errorType"] in ("bad_data", "not_found") and body["error"], body
    leaked = [m for m in LEAKS if m in ans.body and m.decode() not in target]
    assert not leaked, (target, ans.body[:300])


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    rec = Recorder.start()
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture(scope="module")
def recorded(recorder: Recorder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    # The breaker off: every attack below must reach the recorder, though redirects fail.
    work = tmp_path_factory.mktemp("relay-recorded")
    cfg = work / "promaccel.yaml"
    cfg.write_text(f"backends:\n  - name: default\n    url: {recorder.url}\n    breaker: {{failures: 0}}\n")
    p = Promaccel.start(None, ("--split-interval", "none", "--shards", "1"), work, config=cfg)
    try:
        yield p
    finally:
        p.stop()


def test_each_relay_reaches_exactly_its_own_path(recorder: Recorder, recorded: Promaccel) -> None:
    """The control: each route, asked plainly, calls its own backend path (so the recorder
    sees what promaccel sends, and the traversal test below is not vacuous)."""
    for path in FIXED:
        recorder.seen.clear()
        ans = raw_request(recorded.url, path + "?match[]=up")
        assert ans.status == 200, (path, ans.status, ans.body[:200])
        assert recorder.paths() == [path], (path, recorder.seen)
    for method in ("GET", "POST"):
        recorder.seen.clear()
        ans = raw_request(recorded.url, "/api/v1/series" + ("?match[]=up" if method == "GET" else ""),
                          method=method, body=b"match%5B%5D=up" if method == "POST" else None)
        assert ans.status == 200 and recorder.paths() == ["/api/v1/series"], recorder.seen
        (seen_method, target), = recorder.seen
        query = urllib.parse.urlsplit(target).query
        assert seen_method == method and urllib.parse.parse_qs(query) == ({"match[]": ["up"]} if method == "GET" else {})


def test_traversal_never_leaves_the_endpoint(recorder: Recorder, recorded: Promaccel) -> None:
    assert len(TARGETS) > 500
    for target in TARGETS:
        recorder.seen.clear()
        ans = raw_request(recorded.url, target)
        _refused(target, ans)
        assert recorder.seen == [], (target, recorder.seen)


def test_label_names_are_validated_and_encoded(recorder: Recorder, recorded: Promaccel) -> None:
    for name in ("job", "__name__", "Hostname", "_x9"):
        recorder.seen.clear()
        assert raw_request(recorded.url, f"/api/v1/label/{name}/values").status == 200
        assert recorder.paths() == [f"/api/v1/label/{name}/values"]
    for raw, shown in [("a%252Fb", '"a%2Fb"'), ("1abc", '"1abc"'), ("a.b", '"a.b"'), ("a-b", '"a-b"'),
                       ("%C3%A9t%C3%A9", '"été"'), ("a%22b", '"a\\"b"'), ("a%0Ab", '"a\\nb"'),
                       ("%2e%2e", '".."')]:
        recorder.seen.clear()
        ans = raw_request(recorded.url, f"/api/v1/label/{raw}/values")
        assert ans.status == 400 and orjson.loads(ans.body) == {
            "status": "error", "errorType": "bad_data", "error": f"invalid label name: {shown}"}, (raw, ans.body)
        assert recorder.seen == []


def test_unknown_status_pages_are_404(recorder: Recorder, recorded: Promaccel) -> None:
    for what in ("nope", "pprof", "..", "%2e%2e", "config.json", "CONFIG", "federate"):
        recorder.seen.clear()
        ans = raw_request(recorded.url, f"/api/v1/status/{what}")
        _refused(what, ans)
        assert ans.status == 404 and recorder.seen == []


def test_backend_redirects_are_not_followed(recorder: Recorder, recorded: Promaccel) -> None:
    recorder.redirect = True
    try:
        for target in ("/api/v1/labels", "/api/v1/status/flags", "/api/v1/label/job/values",
                       "/api/v1/query?query=up&time=1000", "/api/v1/query_range?query=up&start=0&end=60&step=15"):
            recorder.seen.clear()
            ans = raw_request(recorded.url, target)
            assert ans.status == 502, (target, ans.status, ans.body)
            body = orjson.loads(ans.body)
            assert body["status"] == "error" and body["errorType"] == "unavailable", body
            assert "'default'" in body["error"] and "redirect" in body["error"], body
            assert recorder.url not in body["error"] and recorder.url.rsplit(":", 1)[1] not in body["error"]
            assert b"SECRET" not in ans.body
            assert recorder.seen and not any(p.startswith("/debug") for p in recorder.paths()), recorder.seen
    finally:
        recorder.redirect = False


# --- in front of a real Prometheus ------------------------------------------------------------


def test_traversal_against_real_prometheus(prom: Any, passthrough: Promaccel) -> None:
    # The control: Prometheus itself does redirect such a path (the finding's mechanism).
    direct = raw_request(prom.url, "/api/v1/status/..%2F..%2F..%2Fdebug%2Fpprof%2Fcmdline")
    assert direct.status == 301, direct
    for target in TARGETS:
        _refused(target, raw_request(passthrough.url, target))


def test_label_name_errors_match_prometheus(prom: Any, passthrough: Promaccel) -> None:
    # (`%2e%2e` is not here: Prometheus cleans /label/../values and redirects; promaccel says 400.)
    for raw in ("a%252Fb", "..%252F..%252Fdebug", "1abc", "a.b", "%C3%A9t%C3%A9", "a%22b", "a%5Cb", "a%0Ab",
                "a%09b", "%2e%2e%252F"):
        target = f"/api/v1/label/{raw}/values"
        direct, proxied = raw_request(prom.url, target), raw_request(passthrough.url, target)
        assert direct.status == 400 and (proxied.status, proxied.body) == (direct.status, direct.body), (
            raw, direct.body, proxied.body)
    for name in ("job", "__name__"):
        target = f"/api/v1/label/{name}/values"
        direct, proxied = raw_request(prom.url, target), raw_request(passthrough.url, target)
        assert proxied.status == 200 and orjson.loads(proxied.body)["data"] == orjson.loads(direct.body)["data"]


def test_status_pages_against_real_prometheus(prom: Any, passthrough: Promaccel) -> None:
    for what in ("config", "flags", "runtimeinfo", "buildinfo", "tsdb", "walreplay"):
        ans = raw_request(passthrough.url, f"/api/v1/status/{what}")
        assert ans.status == 200 and orjson.loads(ans.body)["status"] == "success", (what, ans.body[:200])
    flags = orjson.loads(raw_request(passthrough.url, "/api/v1/status/flags").body)["data"]
    assert flags == orjson.loads(raw_request(prom.url, "/api/v1/status/flags").body)["data"]
    for what in ("nope", "..", "%2e%2e"):
        ans = raw_request(passthrough.url, f"/api/v1/status/{what}")
        assert ans.status == 404, (what, ans.body)
