"""No AWS secret in any log line, even at DEBUG with the HTTP/AWS libraries' loggers enabled.

The whole web-identity (IRSA) chain runs for real: botocore reads AWS_ROLE_ARN and
AWS_WEB_IDENTITY_TOKEN_FILE, calls AssumeRoleWithWebIdentity on a fake STS served here on
127.0.0.1 (AWS_ENDPOINT_URL_STS) that answers a real-shaped STS XML document, and promaccel's
signer (`sigv4.signer_for`, through `Backend`) signs requests with the temporary credentials
to the repo's AMP-compatible endpoint, which verifies the signature against those same
credentials. botocore logs the form it sends (with the web identity token) and the XML it
gets back (secret key, session token) at DEBUG: every captured line is searched for them.
"""

from __future__ import annotations

import asyncio
import datetime
import http.server
import io
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtests.amp_endpoint import AmpEndpoint, AmpSettings, KnownCredential, serve_in_thread
from proxy.backends import Backend
from proxy.backends.redaction import install_log_redaction
from proxy.cli import QUIET_LIBRARIES
from proxy.config import BackendConfig
from tests.backends.fake_secrets import STS_ACCESS_KEY, STS_SECRET, STS_TOKEN, WEB_IDENTITY_TOKEN, leaks
from tests.servers import Promaccel, free_port

ROLE_ARN = "arn:aws:iam::123456789012:role/promaccel"

STS_XML = """<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:mon:promaccel</SubjectFromWebIdentityToken>
    <Audience>sts.amazonaws.com</Audience>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/promaccel/botocore-session-1</Arn>
      <AssumedRoleId>AROAFAKEROLEID000001:botocore-session-1</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <SessionToken>{token}</SessionToken>
      <SecretAccessKey>{secret}</SecretAccessKey>
      <Expiration>{expiration}</Expiration>
      <AccessKeyId>{key}</AccessKeyId>
    </Credentials>
    <Provider>arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/FAKE</Provider>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata>
    <RequestId>c6104cbe-af31-11e0-8154-cbc7ccf896c7</RequestId>
  </ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>
"""


class FakeSts:
    """STS on 127.0.0.1: answers AssumeRoleWithWebIdentity with the known credentials and
    records the forms it received."""

    def __init__(self) -> None:
        forms: list[str] = []
        self.forms = forms

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = min(int(self.headers.get("content-length") or 0), 1 << 20)
                forms.append(self.rfile.read(length).decode())
                expiration = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
                body = STS_XML.format(token=STS_TOKEN, secret=STS_SECRET, key=STS_ACCESS_KEY,
                                      expiration=expiration.strftime("%Y-%m-%dT%H:%M:%SZ")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # not on stderr
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeSts":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def sts_env(sts_url: str, token_file: Path) -> dict[str, str]:
    """botocore's web-identity chain against the fake STS, nothing else reachable."""
    return {
        "AWS_ROLE_ARN": ROLE_ARN,
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file),
        "AWS_ROLE_SESSION_NAME": "promaccel-test",
        "AWS_ENDPOINT_URL_STS": sts_url,
        "AWS_STS_REGIONAL_ENDPOINTS": "regional",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds",
    }


_CLEARED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_ENDPOINT_URL")


@pytest.fixture
def sts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeSts, dict[str, str]]]:
    token_file = tmp_path / "token"
    token_file.write_text(WEB_IDENTITY_TOKEN)
    with FakeSts() as server:
        env = sts_env(server.url, token_file)
        for var in _CLEARED:
            monkeypatch.delenv(var, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield server, env


@pytest.fixture
def amp() -> Iterator[str]:
    """The AMP-compatible endpoint accepting only the fake STS's credentials; its upstream
    answers a fixed vector."""
    upstream = httpx.MockTransport(lambda request: httpx.Response(
        200, json={"status": "success", "data": {"resultType": "vector", "result": []}}))
    creds = {STS_ACCESS_KEY: KnownCredential(STS_SECRET, STS_TOKEN)}
    endpoint = AmpEndpoint(AmpSettings(upstream="http://prom.test", credentials=creds), transport=upstream)
    with serve_in_thread(endpoint.app) as url:
        yield url + "/workspaces/ws-test"


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_web_identity_chain_at_debug_logs_no_secret(sts: tuple[FakeSts, dict[str, str]], amp: str,
                                                    transport: str, caplog: pytest.LogCaptureFixture) -> None:
    server, _ = sts
    install_log_redaction()
    # Library loggers explicitly at DEBUG (what PROMACCEL_DEBUG_LIBRARIES=1 leaves them at),
    # plus a handler on a non-propagating logger added after redaction was installed.
    late = io.StringIO()
    late_handler = logging.StreamHandler(late)
    botocore_log = logging.getLogger("botocore")
    saved = {name: logging.getLogger(name).level for name in QUIET_LIBRARIES}
    caplog.set_level(logging.DEBUG)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG)
    botocore_log.addHandler(late_handler)
    try:
        async def go() -> list[int]:
            backend = Backend(BackendConfig(name="amp", kind="amp", url=amp, region="us-east-1",
                                            transport=transport))
            try:
                statuses = []
                for method in ("GET", "POST"):
                    kw: dict[str, Any] = ({"params": [("query", "up")]} if method == "GET"
                                          else {"form": [("query", "up")]})
                    reply = await backend.request(method, "/api/v1/query", timeout_s=20, **kw)
                    statuses.append(reply.status)
                return statuses
            finally:
                await backend.aclose()

        statuses = asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        botocore_log.removeHandler(late_handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    # The endpoint verified signatures made with the STS credentials, which botocore got
    # by sending the web identity token.
    assert statuses == [200, 200]
    assert len(server.forms) == 1 and "AssumeRoleWithWebIdentity" in server.forms[0]
    assert WEB_IDENTITY_TOKEN in server.forms[0]
    # botocore did log the exchange (so the redaction had something to do) ...
    text = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert "AssumeRoleWithWebIdentity" in text and "<SecretAccessKey><redacted></SecretAccessKey>" in text
    assert "'WebIdentityToken': '<redacted>'" in text
    assert late.getvalue() and "<redacted>" in late.getvalue()
    # ... and no line holds a secret.
    assert leaks(text) == [] and leaks(late.getvalue()) == []
    assert STS_ACCESS_KEY in text  # the key id is an identifier, kept for debugging


def test_json_log_fields_are_redacted() -> None:
    """`log_format: json` writes a record's structured fields (the access line's `query`):
    redacted like the message, even for a record no factory or filter saw (issue 26)."""
    from proxy.api.access_log import JsonFormatter

    query = f'up{{password="hunter2-json", job="node"}} * on() vector({WEB_IDENTITY_TOKEN!r})'
    record = logging.makeLogRecord({"name": "promaccel.access", "levelno": logging.INFO, "levelname": "INFO",
                                    "msg": "GET /api/v1/query 200",
                                    "fields": {"query": query, "status": 200, "range": False,
                                               "dashboard_uid": "abc", "tags": [f"Token={STS_TOKEN}"]}})
    line = JsonFormatter().format(record)
    out = orjson.loads(line)
    assert "hunter2-json" not in line and leaks(line) == [], line
    assert "<redacted>" in str(out["query"]) and 'job="node"' in str(out["query"]), out
    assert out["status"] == 200 and out["range"] is False and out["dashboard_uid"] == "abc"


def _serve(sts_url: str, token_file: Path, amp_url: str, work: Path, *flags: str,
           env: dict[str, str] | None = None) -> tuple[Promaccel, str]:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "amp.yaml"
    config.write_text(orjson.dumps({"backends": [
        {"name": "amp", "kind": "amp", "url": amp_url, "region": "us-east-1"}]}).decode())
    proc_env = {**sts_env(sts_url, token_file), **(env or {})}
    proxy = Promaccel.start(None, ("--log-level", "debug", *flags), work, config=config, env=proc_env)
    try:
        for path in ("/api/v1/query", "/api/v1/labels"):
            r = httpx.post(proxy.url + path, data={"query": "up", "time": "1700000000"}, timeout=60)
            assert r.status_code == 200, r.text
    finally:
        proxy.stop()
    return proxy, proxy.log.read_text(errors="replace")


def test_promaccel_serve_at_debug_logs_no_secret(sts: tuple[FakeSts, dict[str, str]], amp: str,
                                                 tmp_path: Path) -> None:
    """`promaccel serve --log-level debug`, libraries at DEBUG (--debug-libraries) and not
    (the default: pinned to WARNING): the process's whole output holds no secret."""
    server, env = sts
    token_file = Path(env["AWS_WEB_IDENTITY_TOKEN_FILE"])
    _, loud = _serve(server.url, token_file, amp, tmp_path / "loud", "--debug-libraries")
    _, quiet = _serve(server.url, token_file, amp, tmp_path / "quiet")
    _, env_flag = _serve(server.url, token_file, amp, tmp_path / "env", env={"PROMACCEL_DEBUG_LIBRARIES": "1"})
    assert len(server.forms) == 3  # each process assumed the role through the fake STS
    for name, text in (("--debug-libraries", loud), ("default", quiet), ("env", env_flag)):
        assert leaks(text) == [], name
        assert "AWS4-HMAC-SHA256 Credential=" not in text.replace("Credential=<redacted>", ""), name
    # With the libraries enabled botocore logged the exchange, redacted; by default it did not.
    for text in (loud, env_flag):
        assert "DEBUG botocore" in text and "<SecretAccessKey><redacted></SecretAccessKey>" in text
    assert "DEBUG botocore" not in quiet and "DEBUG urllib3" not in quiet and "DEBUG httpcore" not in quiet
    assert "INFO promaccel.access POST /api/v1/query 200" in quiet  # it did log
