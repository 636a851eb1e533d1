"""Regexes in the primary's dialect, on real servers (issue 27 item 4).

The by_metric fleet (node_* on a local Prometheus, the primary; DCGM_* behind the AMP
endpoint) with its primary behind a small rewriting proxy whose buildinfo says `go1.22.0`
(everything else is relayed as is): promaccel reads that once and plans in Go 1.22's regexp
dialect, where `(?<name>...)` is a named group. A cross-store `label_replace(..., "(?<n>.+)")`,
which promaccel evaluates itself, then answers exactly as the real Prometheus answers the
`(?P<n>.+)` spelling (`$n`, `${n}` and `$1` expanded alike), and so does a `__name__` regex
resolved across the stores. (A regex on another label goes to the store holding the metric,
which here is really Go 1.19: not asked.) With the plain primary (Go 1.19, Prometheus 2.42)
the same queries keep Prometheus's own errors: test_crossstore_traps.py.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.test_crossstore_traps import INSTANT, JOIN, RANGE
from tests.e2e.test_hybrid import reference
from tests.equivalence import compare_case
from tests.hybrid import AmpProcess, SliceServer, promaccel_config, start_promaccel
from tests.servers import Promaccel, free_port

pytestmark = pytest.mark.prom

BUILDINFO = "/api/v1/status/buildinfo"


@dataclass
class SaysGo122:
    """A relay to `upstream` on a loopback port whose buildinfo says goVersion go1.22.0;
    `paths` counts the paths promaccel asked."""

    upstream: str
    url: str = ""
    paths: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> SaysGo122:
        relay = self
        up = urllib.parse.urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.partition("?")[0]
                if self.headers.get("User-Agent", "").startswith("promaccel"):
                    with relay.lock:
                        relay.paths[path] = relay.paths.get(path, 0) + 1
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    status, ctype, data = resp.status, resp.getheader("Content-Type", "application/json"), resp.read()
                finally:
                    conn.close()
                if path == BUILDINFO and status == 200:
                    doc = orjson.loads(data)
                    doc["data"]["goVersion"] = "go1.22.0"
                    data = orjson.dumps(doc)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _relay

            def log_message(self, format: str, *args: object) -> None:
                pass

        port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Go122Fleet:
    primary: SaysGo122
    proxy: Promaccel


@pytest.fixture(scope="module")
def go122(prom: Any, hybrid_slices: dict[tuple[str, str], SliceServer],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Go122Fleet]:
    work: Path = tmp_path_factory.mktemp("hybrid-go122")
    local, amp_slice = hybrid_slices[("by_metric", "local")], hybrid_slices[("by_metric", "amp")]
    primary = SaysGo122(local.url).start()
    amp = AmpProcess.start(amp_slice.url, work, "--seed", "1")
    proxy = None
    try:
        proxy = start_promaccel("by_metric-go122", promaccel_config("by_metric", primary.url, amp.workspace), work)
        yield Go122Fleet(primary, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        amp.stop()
        primary.stop()


def test_the_relay_says_go_1_22(go122: Go122Fleet) -> None:
    data = httpx.get(go122.primary.url + BUILDINFO, timeout=10).json()["data"]
    assert data["goVersion"] == "go1.22.0" and data["version"].startswith("2.42")


def _forms(query: str) -> list[tuple[str, dict[str, str]]]:
    forms = [("/api/v1/query", {"query": query, "time": str(t)}) for t in INSTANT["by_metric"]]
    return [*forms, ("/api/v1/query_range", {"query": query, **RANGE["by_metric"]})]


@pytest.mark.parametrize("template", [
    f'label_replace({JOIN}, "x", "$n", "Hostname", "(GROUP.+)")',
    f'label_replace({JOIN}, "x", "${{n}}:$2", "Hostname", "gpu-(GROUP[a-z]+)-(.*)")',
    f'count by (x) (label_replace({JOIN}, "x", "$n", "Hostname", "(GROUP.*[02468])"))',
    # metric names resolved by promaccel across the stores (each store is asked by name)
    'sum({__name__=~"(GROUPDCGM_FI_DEV_GPU_UTIL)|node_load1"})',
])
def test_a_named_group_across_stores_answers_as_the_go_spelling(prom: Any, go122: Go122Fleet, template: str) -> None:
    angle, go = template.replace("GROUP", "?<n>"), template.replace("GROUP", "?P<n>")
    assert "(?<n>" in angle and "(?P<n>" in go
    for path, form in _forms(angle):
        status, direct = reference(prom.url, path, {**form, "query": go})
        assert status == 200 and direct["data"]["result"], direct  # the reference has data to compare
        r = httpx.post(go122.proxy.url + path, data=form, timeout=60)
        problems = compare_case("go122", "named_group", go, path, status, direct, r.status_code,
                                orjson.loads(r.content))
        assert problems == [], (path, problems[:3], r.text[:300])
    with go122.primary.lock:
        asked = go122.primary.paths.get(BUILDINFO, 0)
    assert asked == 1  # read once by promaccel, whatever the number of queries
