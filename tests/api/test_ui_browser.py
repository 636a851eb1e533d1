"""The operator page in a real browser: Debian's chromium driven by playwright, against a real
promaccel process (Redis cache) in front of the real Prometheus. Queries run through promaccel
are listed with their pieces, cache hits and backend calls; a query holding `<script>` is
shown as text and runs nothing; the page logs no console error and makes no failed request.

PROMACCEL_UI_SCREENSHOT=docs/ui.png writes a screenshot of the page (docs/ui.png is one);
PROMACCEL_UI_SCREENSHOT_ERROR=<path> one of the page with a long error truncated.
The browser is never downloaded: chromium comes from Debian (`make test` installs it); a
missing one fails the test, never skips it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import Promaccel

pytestmark = [pytest.mark.prom, pytest.mark.redis]

H = 3600
CHROMIUM = ("chromium", "chromium-browser")
INSTALL_CHROMIUM = ("chromium not found on PATH: tests/api/test_ui_browser.py drives Debian's chromium with "
                    "playwright (never a downloaded browser). `make test` installs it (apt-get install chromium).")
XSS = 'count(DCGM_FI_DEV_GPU_UTIL{Hostname="<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"})'


def require_chromium(path: str | None = None) -> str:
    """chromium's path, or a test failure naming the package (never a skip)."""
    for name in CHROMIUM:
        exe = shutil.which(name, path=path)
        if exe is not None:
            return exe
    pytest.fail(INSTALL_CHROMIUM, pytrace=False)


def test_missing_chromium_fails_naming_the_package(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        require_chromium(path=str(tmp_path))  # an empty directory as PATH


@pytest.fixture(scope="module")
def promaccel(prom: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    proxy = Promaccel.start(prom.url, ("--redis", redis_server.url, "--split-interval", "1h", "--shards", "4"),
                            tmp_path_factory.mktemp("promaccel-ui"))
    try:
        yield proxy
    finally:
        proxy.stop()


def _run_queries(proxy: Promaccel, prom: Any) -> dict[str, httpx.Response]:
    start, end = prom.end_s - 6 * H, prom.end_s
    grafana = {"X-Dashboard-Uid": "gpu-fleet", "X-Panel-Id": "3"}
    util = "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"
    power = "sum by (namespace) (DCGM_FI_DEV_POWER_USAGE)"
    out: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=proxy.url, timeout=120) as c:
        for name, query in (("util", util), ("power", power), ("power_again", power)):
            out[name] = c.post("/api/v1/query_range", headers=grafana,
                               data={"query": query, "start": str(start), "end": str(end), "step": "60"})
        out["xss"] = c.get("/api/v1/query", params={"query": XSS, "time": str(end)})
        out["bad"] = c.get("/api/v1/query_range", params={"query": "rate(DCGM_FI_DEV_GPU_UTIL[5m]",
                                                           "start": str(start), "end": str(end), "step": "60"})
    assert [r.status_code for r in out.values()] == [200, 200, 200, 200, 400]
    return out


def test_page_shows_queries_just_run_without_console_errors(promaccel: Promaccel, prom: Any) -> None:
    from playwright.sync_api import sync_playwright

    chromium = require_chromium()
    answers = _run_queries(promaccel, prom)
    problems: list[str] = []
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
            page.goto(promaccel.url + "/ui")
            page.wait_for_selector("body[data-loaded='1']", timeout=30_000)

            # Each query is a row of the recent list, found by its query id.
            rows = {name: page.locator(f"#recent tr[data-query-id='{r.headers['x-promaccel-query-id']}']")
                    for name, r in answers.items()}
            for name, row in rows.items():
                assert row.count() == 1, f"{name} is not listed"
            cells = {name: row.locator("td").all_inner_texts() for name, row in rows.items()}
            util, cold, warm = cells["util"], cells["power"], cells["power_again"]
            cols = page.locator("#recent th").all_inner_texts()
            at = {c: i for i, c in enumerate(cols)}
            assert util[at["query"]].startswith("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)")
            assert "dashboard gpu-fleet, panel 3" in util[at["query"]]
            # Pieces and backend calls as the answer's headers said; sharded by Hostname.
            assert util[at["pieces"]] == answers["util"].headers["x-promaccel-pieces"] != "1"
            assert util[at["backend calls"]] == answers["util"].headers["x-promaccel-backend-calls"] != "0"
            assert "sharded" in util[at["plan"]] and "range" in util[at["plan"]]
            pieces = answers["power"].headers["x-promaccel-pieces"]
            assert cold[at["cache (hits/pieces)"]] == f"MISS 0/{pieces}"
            assert warm[at["cache (hits/pieces)"]] == f"HIT {pieces}/{pieces}" and warm[at["backend calls"]] == "0"
            assert cells["bad"][at["status"]] == "400" and cells["bad"][at["error"]].startswith("bad_data: ")
            # The <script> query is text: shown verbatim, nothing of it ran or became an element.
            assert cells["xss"][at["query"]] == XSS
            assert page.evaluate("window.__pwned") is None
            assert page.locator("#recent script, #recent img").count() == 0
            # Health: Redis reachable with its breaker closed, the backend ready.
            health = page.locator("#health").inner_text()
            assert "Redis cache" in health and "closed" in health and "yes (" in health
            assert "Backend default" in health and "prometheus (primary)" in health
            # The charts have this minute's cache lookups and backend latency.
            assert page.locator("#hits rect.bar").count() >= 1
            assert page.locator("#latency rect.bar").count() >= 1 and page.locator("#latency line.max").count() >= 1
            assert "piece lookups hit" in page.locator("#hits-legend").inner_text()
            shot = os.environ.get("PROMACCEL_UI_SCREENSHOT")
            if shot:
                page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert problems == []


# A regex that does not compile: the error echoes it, ~400 characters of words (under the 500 the server keeps).
LONG_ERROR_QUERY = ('count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"(' + " ".join(["this regex never closes its group"] * 9)
                    + '"})')


def test_long_error_is_truncated_with_the_full_text_on_hover_and_expand(promaccel: Promaccel, prom: Any) -> None:
    """Issue 30: a long error used to wrap one word per line in a squeezed column. It shows
    its first characters in a column wide enough to read, the whole text as the cell's title
    (hover) and behind a "more" button, which stays open across the page's refreshes."""
    from playwright.sync_api import sync_playwright

    chromium = require_chromium()
    r = httpx.get(promaccel.url + "/api/v1/query", params={"query": LONG_ERROR_QUERY, "time": str(prom.end_s)},
                  timeout=60)
    assert r.status_code == 400, r.text
    body = r.json()
    full = f"{body['errorType']}: {body['error']}"
    assert len(full) > 300, full
    problems: list[str] = []
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(promaccel.url + "/ui")
            page.wait_for_selector("body[data-loaded='1']", timeout=30_000)
            cols = page.locator("#recent th").all_inner_texts()
            row = page.locator(f"#recent tr[data-query-id='{r.headers['x-promaccel-query-id']}']")
            cell = row.locator("td").nth(cols.index("error"))
            clip = cell.locator("span.clip")
            # Truncated: a short text and a "more" button; the whole error on hover.
            shown = cell.inner_text()
            assert shown.startswith("bad_data: ") and shown.endswith("\u2026 more"), shown
            assert len(shown) < 200 < len(full)
            assert clip.get_attribute("title") == full
            # Readable: not a column of single words (the old page: ~40 px wide, 60+ lines).
            box, text_box = cell.bounding_box(), clip.bounding_box()
            assert box is not None and text_box is not None
            assert box["width"] >= 200 and text_box["height"] < 160, (box, text_box)  # <= 8 lines
            if os.environ.get("PROMACCEL_UI_SCREENSHOT_ERROR"):
                page.screenshot(path=os.environ["PROMACCEL_UI_SCREENSHOT_ERROR"], full_page=True)
            # Expanded: the whole text, still after the next refresh; "less" truncates again.
            cell.locator("button.more").click()
            assert cell.inner_text() == full + " less"
            page.evaluate("refresh()")
            page.wait_for_timeout(500)
            cell = page.locator(f"#recent tr[data-query-id='{r.headers['x-promaccel-query-id']}'] td").nth(
                cols.index("error"))
            assert cell.inner_text() == full + " less"
            cell.locator("button.more").click()
            assert cell.inner_text() == shown
        finally:
            browser.close()
    assert problems == []


# --- auth on (issue 26): the page needs credentials; a tenant's page lists its own queries only ---

TOKEN_A, TOKEN_B = "browser-team-a-token-3c2b1a0f9e8d", "browser-team-b-token-7d6c5b4a3f2e"
ADMIN = "browser-admin-token-1f2e3d4c5b6a"


@pytest.fixture(scope="module")
def promaccel_auth(prom: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promaccel]:
    import orjson

    from proxy.config.auth import sha256_hex

    work = tmp_path_factory.mktemp("promaccel-ui-auth")
    cfg = {"backends": [{"name": "default", "url": prom.url}], "cache": {"redis_url": redis_server.url},
           "auth": {"tenants": [{"name": "team-a", "tokens_sha256": [sha256_hex(TOKEN_A)]},
                                {"name": "team-b", "tokens_sha256": [sha256_hex(TOKEN_B)]}]}}
    path = work / "c.yaml"
    path.write_text(orjson.dumps(cfg).decode())
    proxy = Promaccel.start(None, ("--split-interval", "1h"), work, config=path, env={"PROMACCEL_ADMIN_TOKEN": ADMIN})
    try:
        yield proxy
    finally:
        proxy.stop()


def test_page_with_auth_on_shows_a_tenant_its_own_queries(promaccel_auth: Promaccel, prom: Any) -> None:
    """Signed in at the browser's basic-auth prompt (a token as the password): team-a's page
    loads, its script fetches data.json with the same credentials, team-a's query is listed and
    team-b's is not. Without credentials the page is a 401."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    chromium = require_chromium()
    t = str(prom.end_s)
    mine = httpx.get(promaccel_auth.url + "/api/v1/query", params={"query": 'count(up{job!="team-a-browser"})',
                     "time": t}, headers={"Authorization": f"Bearer {TOKEN_A}"}, timeout=60)
    theirs = httpx.get(promaccel_auth.url + "/api/v1/query", params={"query": 'count(up{job!="team-b-private"})',
                       "time": t}, headers={"Authorization": f"Bearer {TOKEN_B}"}, timeout=60)
    assert [mine.status_code, theirs.status_code] == [200, 200]
    problems: list[str] = []
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            # No credentials, or a wrong token: the browser is challenged and cannot sign in.
            for creds in (None, {"username": "team-a", "password": TOKEN_A + "x"}):
                anonymous = browser.new_context(http_credentials=creds).new_page()  # type: ignore[arg-type]
                try:  # the 401 itself, or chromium giving up on the challenge
                    r = anonymous.goto(promaccel_auth.url + "/ui")
                    assert r is not None and r.status == 401, (creds is None, r and r.status)
                    assert "unauthorized" in r.text() and "team-a-browser" not in r.text()
                except PlaywrightError as exc:
                    assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
            context = browser.new_context(http_credentials={"username": "team-a", "password": TOKEN_A})
            page = context.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
                    if r.status >= 400 and r.status != 401 else None)  # 401: the challenge, answered
            page.goto(promaccel_auth.url + "/ui")
            page.wait_for_selector("body[data-loaded='1']", timeout=30_000)
            rows = page.locator("#recent tr[data-query-id]")
            listed = {rows.nth(i).get_attribute("data-query-id") for i in range(rows.count())}
            assert listed == {mine.headers["x-promaccel-query-id"]}
            text = page.locator("body").inner_text()
            assert "team-a-browser" in text and "team-b-private" not in text
            assert "tenant team-a" in page.locator("#meta").inner_text()
            health = page.locator("#health").inner_text()
            assert "Redis cache" in health and "address" not in health and "Backend default" in health
            assert page.locator("#banner").is_hidden()
        finally:
            browser.close()
    assert problems == []
