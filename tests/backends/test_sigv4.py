"""SigV4: the signer (proxy/backends/sigv4.py over requests-aws4auth, applied by
proxy/backends/transports.py's httpx hook) against the AMP-compatible endpoint's own verifier
(loadtests/amp_endpoint.py), in process: httpx.ASGITransport into the endpoint, whose upstream is
an httpx.MockTransport.

Both sides are also checked against AWS's published SigV4 test vectors, so agreement between
them means real signatures, not two copies of one mistake."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any, Callable
from urllib.parse import parse_qsl

import httpx
import pytest
from botocore.credentials import Credentials, RefreshableCredentials
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from loadtests.amp_endpoint import (
    SIGNATURE_MISMATCH,
    TEST_ACCESS_KEY,
    TEST_SECRET_KEY,
    AmpEndpoint,
    AmpSettings,
    AuthFailure,
    KnownCredential,
    canonical_query,
    verify_request,
)
from proxy.backends.sigv4 import (
    CredentialSource,
    SigV4Signer,
    strict_query,
)
from proxy.backends.transports import SigV4Auth as _SigV4Auth
from proxy.errors import PromError
from proxy.observe.metrics import METRICS

REGION = "us-east-1"
BASE = "http://amp.test/workspaces/ws-test"
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLEsessionTOKEN+with/slashes=="
SESSION_KEY = "ASIAEXAMPLESESSION"
SESSION_SECRET = "sessionSecretEXAMPLE/K7MDENG+bPxRfiCYzzzz"

# AWS SigV4 test suite (aws-sig-v4-test-suite, 2015-08-30T12:36:00Z, us-east-1, service
# "service", AKIDEXAMPLE): request, signed headers, published signature.
AWS_VECTORS = {
    "get-vanilla": ("GET", "/", "", [], b"",
                    "host;x-amz-date", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    "get-vanilla-query-order-key-case": (
        "GET", "/", "Param2=value2&Param1=value1", [], b"",
        "host;x-amz-date", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    "post-x-www-form-urlencoded": (
        "POST", "/", "", [("content-type", "application/x-www-form-urlencoded")], b"Param1=value1",
        "content-type;host;x-amz-date", "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"),
}
VECTOR_TIME = 1440938160.0  # 20150830T123600Z

AWKWARD = {
    "plus": "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE",
    "plus_no_spaces": "sum(x)+sum(y)*1e+3",
    "spaces": "sum  by (Hostname)  (  DCGM_FI_DEV_GPU_UTIL )",
    "unicode": 'up{team="gpu-温度 ü ✓"}',
    "regex_backslashes": 'up{instance=~"10\\\\.42\\\\..+"}',
    "label_replace": 'label_replace(up, "n", "$1", "instance", "(\\\\d+)")',
    "reserved_chars": 'up{a="x&y=z;%2B#?/:@[]!$\'()*,"}',
    "percent_and_tilde": 'up{a="100%~_-."}',
    "raw_string": "up{a=`raw\\d+`}",
}


def creds() -> CredentialSource:
    return CredentialSource(credentials=Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY))


class Upstream:
    """A fake Prometheus that records what reached it."""

    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    def params(self, i: int = -1) -> list[tuple[str, str]]:
        req = self.seen[i]
        pairs = parse_qsl(req.url.query.decode(), keep_blank_values=True)
        if req.method == "POST":
            pairs = parse_qsl(req.content.decode(), keep_blank_values=True) + pairs
        return pairs


def endpoint(upstream: Upstream, **settings: Any) -> AmpEndpoint:
    settings.setdefault("credentials", {TEST_ACCESS_KEY: KnownCredential(TEST_SECRET_KEY)})
    return AmpEndpoint(AmpSettings(upstream="http://prom.test", **settings), transport=upstream.transport)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def send(amp: AmpEndpoint, *, signer: SigV4Signer | None, method: str, path: str,
               params: list[tuple[str, str]] | None = None, form: list[tuple[str, str]] | None = None,
               mutate: Callable[[httpx.Request], httpx.Request] | None = None) -> httpx.Response:
    """One request through the signing hook (as Backend sends it), optionally altered after
    signing, into the endpoint."""
    auth = _SigV4Auth(signer) if signer else None
    content = str(httpx.QueryParams(form)).encode() if form is not None else None
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if form is not None else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=amp.app), base_url=BASE) as client:
        request = client.build_request(method, path, params=params, content=content, headers=headers)
        if auth is not None:
            flow = auth.async_auth_flow(request)
            request = await flow.__anext__()
        if mutate is not None:
            request = mutate(request)
        return await client.send(request)


# --- AWS's published vectors ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(AWS_VECTORS))
def test_signer_matches_aws_test_suite(name: str) -> None:
    method, path, query, headers, body, signed_headers, signature = AWS_VECTORS[name]
    signer = SigV4Signer("us-east-1", "service", creds(), signed_headers=signed_headers.split(";"),
                         clock=lambda: VECTOR_TIME)
    url = "https://example.amazonaws.com" + path + ("?" + query if query else "")
    signed = signer.sign(method, url, [("host", "example.amazonaws.com"), *headers], body)
    assert signed.headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders={signed_headers}, Signature={signature}"
    )
    assert signed.headers["x-amz-date"] == "20150830T123600Z"


@pytest.mark.parametrize("name", sorted(AWS_VECTORS))
def test_verifier_accepts_aws_test_suite(name: str) -> None:
    method, path, query, headers, body, signed_headers, signature = AWS_VECTORS[name]
    authz = ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
             f"SignedHeaders={signed_headers}, Signature={signature}")
    hdrs = [("host", "example.amazonaws.com"), ("x-amz-date", "20150830T123600Z"), *headers,
            ("authorization", authz)]
    kwargs: dict[str, Any] = dict(credentials={TEST_ACCESS_KEY: KnownCredential(TEST_SECRET_KEY)},
                                  region="us-east-1", service="service", now=VECTOR_TIME + 10)
    assert verify_request(method, path, query, hdrs, body, **kwargs) == TEST_ACCESS_KEY
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    with pytest.raises(AuthFailure) as exc:
        verify_request(method, path, query, [*hdrs[:-1], ("authorization", authz.replace(signature, flipped))],
                       body, **kwargs)
    assert exc.value.message == SIGNATURE_MISMATCH


# --- encoding ------------------------------------------------------------------------------


def test_strict_query_encodes_plus_and_space() -> None:
    # httpx writes a PromQL `+` as %2B and a space as `+`; the signed URL has neither bare.
    raw = str(httpx.QueryParams([("query", "a + b"), ("match[]", "up"), ("x", "")]))
    assert raw == "query=a+%2B+b&match%5B%5D=up&x="
    assert strict_query(raw) == "query=a%20%2B%20b&match%5B%5D=up&x="
    # The verifier reads a bare `+` as a plus (RFC 3986), so the two readings differ ...
    assert canonical_query("q=a+b") == "q=a%2Bb"
    # ... and agree once it is percent-encoded.
    assert canonical_query(strict_query("q=a+%2B+b")) == "q=a%20%2B%20b"


# --- accepted ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_awkward_promql_signed_and_accepted(method: str, name: str) -> None:
    upstream = Upstream()
    amp = endpoint(upstream)
    pairs = [("query", AWKWARD[name]), ("time", "1700000000.5"), ("empty", "")]
    signer = SigV4Signer(REGION, "aps", creds())
    kw = {"params": pairs} if method == "GET" else {"form": pairs}
    resp = run(send(amp, signer=signer, method=method, path="/api/v1/query", **kw))
    assert resp.status_code == 200, resp.text
    assert upstream.params() == pairs  # Prometheus reads exactly the PromQL that was sent
    assert amp.stats.by_status == {200: 1}


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_repeated_match_params(method: str) -> None:
    upstream = Upstream()
    amp = endpoint(upstream)
    pairs = [("match[]", 'up{job="a b"}'), ("match[]", "DCGM_FI_DEV_GPU_UTIL"), ("match[]", "x+y"),
             ("start", "1"), ("end", "2")]
    kw = {"params": pairs} if method == "GET" else {"form": pairs}
    resp = run(send(amp, signer=SigV4Signer(REGION, "aps", creds()), method=method, path="/api/v1/series", **kw))
    assert resp.status_code == 200, resp.text
    assert upstream.params() == pairs


def test_label_values_and_metadata_paths() -> None:
    upstream = Upstream()
    amp = endpoint(upstream)
    signer = SigV4Signer(REGION, "aps", creds())
    for path in ("/api/v1/label/Hostname/values", "/api/v1/label/__name__/values", "/api/v1/metadata",
                 "/api/v1/labels", "/api/v1/query_range"):
        resp = run(send(amp, signer=signer, method="GET", path=path, params=[("limit", "5")]))
        assert resp.status_code == 200, (path, resp.text)
    assert [r.url.path for r in upstream.seen] == [
        "/api/v1/label/Hostname/values", "/api/v1/label/__name__/values", "/api/v1/metadata",
        "/api/v1/labels", "/api/v1/query_range"]


def test_session_token_credentials() -> None:
    upstream = Upstream()
    amp = endpoint(upstream, credentials={SESSION_KEY: KnownCredential(SESSION_SECRET, TOKEN)})
    signer = SigV4Signer(REGION, "aps", CredentialSource(credentials=Credentials(SESSION_KEY, SESSION_SECRET, TOKEN)))
    resp = run(send(amp, signer=signer, method="POST", path="/api/v1/query", form=[("query", "a+b")]))
    assert resp.status_code == 200, resp.text
    sent = upstream.seen  # the token is not forwarded to Prometheus
    assert all("x-amz-security-token" not in r.headers for r in sent)

    no_token = SigV4Signer(REGION, "aps", CredentialSource(credentials=Credentials(SESSION_KEY, SESSION_SECRET)))
    wrong_token = SigV4Signer(REGION, "aps", CredentialSource(
        credentials=Credentials(SESSION_KEY, SESSION_SECRET, TOKEN + "x")))
    for bad in (no_token, wrong_token):
        resp = run(send(amp, signer=bad, method="GET", path="/api/v1/query", params=[("query", "up")]))
        assert resp.status_code == 403
        assert resp.json() == {"message": "The security token included in the request is invalid."}
        assert resp.headers["x-amzn-ErrorType"] == "UnrecognizedClientException"


def test_refreshable_credentials_refresh_before_expiry() -> None:
    """Temporary credentials near expiry are refreshed (off the event loop) before signing;
    the endpoint knows only the new key, so a 200 proves the new one signed."""
    upstream = Upstream()
    amp = endpoint(upstream, credentials={"ASIANEW": KnownCredential("new-secret-EXAMPLE-0123456789", "tok-new-0123")})
    calls: list[int] = []

    def expiry(seconds: int) -> str:
        return (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)).isoformat()

    def refresh() -> dict[str, str]:
        calls.append(1)
        return {"access_key": "ASIANEW", "secret_key": "new-secret-EXAMPLE-0123456789",
                "token": "tok-new-0123", "expiry_time": expiry(3600)}

    rc = RefreshableCredentials.create_from_metadata(
        {"access_key": "ASIAOLD", "secret_key": "old-secret-EXAMPLE-0123456789", "token": "tok-old-0123",
         "expiry_time": expiry(60)},  # inside botocore's 15-minute advisory window
        refresh_using=refresh, method="test")
    signer = SigV4Signer(REGION, "aps", CredentialSource(credentials=rc))
    assert signer.needs_refresh()
    resp = run(send(amp, signer=signer, method="GET", path="/api/v1/query", params=[("query", "up")]))
    assert resp.status_code == 200, resp.text
    assert calls == [1]
    assert not signer.needs_refresh()
    resp = run(send(amp, signer=signer, method="GET", path="/api/v1/query", params=[("query", "up")]))
    assert resp.status_code == 200 and calls == [1]  # fresh credentials are reused


# --- rejected ------------------------------------------------------------------------------


def _retarget(request: httpx.Request, url: str | None = None, content: bytes | None = None,
              headers: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> httpx.Request:
    h = {k: v for k, v in request.headers.items() if k.lower() not in drop and k.lower() != "content-length"}
    h.update(headers or {})
    return httpx.Request(request.method, url or request.url, headers=h,
                         content=request.content if content is None else content)


def _flip_signature(r: httpx.Request) -> httpx.Request:
    authz = r.headers["authorization"]
    flipped = authz[:-1] + ("0" if authz[-1] != "0" else "1")
    return _retarget(r, headers={"authorization": flipped})


REJECTIONS: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (how, x-amzn-ErrorType, message prefix)
    "tampered_body": (
        {"method": "POST", "mutate": lambda r: _retarget(r, content=r.content.replace(b"up", b"on"))},
        "InvalidSignatureException", SIGNATURE_MISMATCH),
    "tampered_query": (
        {"mutate": lambda r: _retarget(r, url=str(r.url).replace("up", "on"))},
        "InvalidSignatureException", SIGNATURE_MISMATCH),
    "form_style_plus_in_query": (  # %20 sent as `+`: the verifier reads a plus
        {"mutate": lambda r: _retarget(r, url=str(r.url).replace("%20", "+"))},
        "InvalidSignatureException", SIGNATURE_MISMATCH),
    "tampered_signature": ({"mutate": _flip_signature}, "InvalidSignatureException", SIGNATURE_MISMATCH),
    "added_signed_header_value": (
        {"mutate": lambda r: _retarget(r, headers={"x-amz-date": "20300101T000000Z"})},
        "InvalidSignatureException", "Date in Credential scope does not match"),
    "wrong_region": ({"region": "us-west-2"}, "InvalidSignatureException",
                     "Credential should be scoped to a valid region."),
    "wrong_service": ({"service": "execute-api"}, "InvalidSignatureException",
                      "Credential should be scoped to correct service: 'aps'."),
    "unknown_access_key": ({"creds": Credentials("AKIDUNKNOWN", TEST_SECRET_KEY)},
                           "UnrecognizedClientException", "The security token included in the request is invalid."),
    "wrong_secret": ({"creds": Credentials(TEST_ACCESS_KEY, "wrongSecretKeyEXAMPLE0123456789")},
                     "InvalidSignatureException", SIGNATURE_MISMATCH),
    "stale_date": ({"clock": lambda: time.time() - 600}, "InvalidSignatureException", "Signature expired: "),
    "future_date": ({"clock": lambda: time.time() + 600}, "InvalidSignatureException",
                    "Signature not yet current: "),
    "host_not_signed": ({"signed_headers": ["x-amz-date", "x-amz-content-sha256"]}, "InvalidSignatureException",
                        "'Host' or ':authority' must be a 'SignedHeader'"),
    "missing_signature": ({"unsigned": True}, "MissingAuthenticationTokenException", "Missing Authentication Token"),
    "missing_date": ({"mutate": lambda r: _retarget(r, drop=("x-amz-date",))}, "IncompleteSignatureException",
                     "Authorization header requires existence of either a 'X-Amz-Date'"),
}


@pytest.mark.parametrize("name", sorted(REJECTIONS))
def test_rejected_with_403(name: str) -> None:
    how, error_type, message = REJECTIONS[name]
    upstream = Upstream()
    amp = endpoint(upstream)
    signer = None if how.get("unsigned") else SigV4Signer(
        how.get("region", REGION), how.get("service", "aps"),
        CredentialSource(credentials=how.get("creds", Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY))),
        clock=how.get("clock", time.time),
        **({"signed_headers": how["signed_headers"]} if "signed_headers" in how else {}),
    )
    method = how.get("method", "GET")
    pairs = [("query", "up + up"), ("time", "1700000000")]
    kw = {"params": pairs} if method == "GET" else {"form": pairs}
    resp = run(send(amp, signer=signer, method=method, path="/api/v1/query", mutate=how.get("mutate"), **kw))
    assert resp.status_code == 403, resp.text
    assert resp.headers["x-amzn-ErrorType"] == error_type
    assert resp.json()["message"].startswith(message), resp.json()
    assert upstream.seen == []
    assert amp.stats.rejected == {error_type: 1}


def test_unknown_workspace_and_buildinfo_are_404() -> None:
    upstream = Upstream()
    amp = endpoint(upstream)
    signer = SigV4Signer(REGION, "aps", creds())

    async def go() -> list[httpx.Response]:
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=amp.app), auth=_SigV4Auth(signer)) as c:
            for url in ("http://amp.test/workspaces/ws-other/api/v1/query?query=up",
                        BASE + "/api/v1/status/buildinfo", BASE + "/api/v1/targets", BASE + "/api/v2/query"):
                out.append(await c.get(url))
        return out

    other, buildinfo, targets, v2 = run(go())
    assert other.status_code == 404 and other.headers["x-amzn-ErrorType"] == "ResourceNotFoundException"
    assert buildinfo.status_code == targets.status_code == v2.status_code == 404
    assert upstream.seen == []


def test_fault_injection_is_deterministic() -> None:
    def pattern(seed: int) -> list[int]:
        upstream = Upstream()
        amp = endpoint(upstream, throttle_ratio=0.3, retry_after_s=2, seed=seed)
        signer = SigV4Signer(REGION, "aps", creds())
        codes = []
        for i in range(40):
            resp = run(send(amp, signer=signer, method="GET", path="/api/v1/query", params=[("query", f"up{i}")]))
            codes.append(resp.status_code)
            if resp.status_code == 429:
                assert resp.json() == {"message": "Rate exceeded"}
                assert resp.headers["Retry-After"] == "2"
                assert resp.headers["x-amzn-ErrorType"] == "ThrottlingException"
        assert amp.stats.throttled == codes.count(429)
        return codes

    first = pattern(7)
    assert first == pattern(7)
    assert 4 <= first.count(429) <= 20
    assert first != pattern(8)


def test_injected_errors() -> None:
    upstream = Upstream()
    amp = endpoint(upstream, error_ratio=1.0, error_status=503)
    resp = run(send(amp, signer=SigV4Signer(REGION, "aps", creds()), method="GET", path="/api/v1/query",
                    params=[("query", "up")]))
    assert resp.status_code == 503 and resp.json() == {"message": "Service Unavailable"}
    assert amp.stats.errors_injected == 1 and upstream.seen == []


# --- credentials chain ---------------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> pytest.MonkeyPatch:
    """An environment where botocore's chain can only find what the test puts there (and
    never tries instance metadata, which is off the loopback)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return monkeypatch


def test_credentials_from_environment(aws_env: pytest.MonkeyPatch) -> None:
    aws_env.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    aws_env.setenv("AWS_SESSION_TOKEN", TOKEN)
    frozen = CredentialSource().frozen()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == (TEST_ACCESS_KEY, TEST_SECRET_KEY, TOKEN)
    assert TEST_SECRET_KEY not in repr(frozen) and TOKEN not in repr(frozen)


def test_credentials_from_shared_profile(aws_env: pytest.MonkeyPatch, tmp_path: Any) -> None:
    (tmp_path / "credentials").write_text(
        f"[amp-reader]\naws_access_key_id = {SESSION_KEY}\naws_secret_access_key = {SESSION_SECRET}\n")
    frozen = CredentialSource(profile="amp-reader").frozen()
    assert (frozen.access_key, frozen.secret_key) == (SESSION_KEY, SESSION_SECRET)


def test_missing_credentials_are_a_clear_error(aws_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(PromError) as exc:
        CredentialSource(backend="amp-east").frozen()
    assert exc.value.kind == "unavailable"
    assert "no AWS credentials for backend 'amp-east'" in exc.value.message
    with pytest.raises(PromError) as exc:
        CredentialSource(profile="nope").frozen()
    assert "ProfileNotFound" in exc.value.message


def test_no_credentials_fails_the_request_not_the_loop(aws_env: pytest.MonkeyPatch) -> None:
    upstream = Upstream()
    amp = endpoint(upstream)
    with pytest.raises(PromError) as exc:
        run(send(amp, signer=SigV4Signer(REGION, "aps", CredentialSource()), method="GET",
                 path="/api/v1/query", params=[("query", "up")]))
    assert exc.value.kind == "unavailable"
    assert upstream.seen == []


# --- secrets stay secret -------------------------------------------------------------------


def test_no_secret_in_logs_errors_or_metrics(caplog: pytest.LogCaptureFixture, aws_env: pytest.MonkeyPatch) -> None:
    """Failures of every kind, with DEBUG logging everywhere: no secret key, session token,
    signature or Authorization value in the logs, the errors, the responses or /metrics."""
    caplog.set_level(logging.DEBUG)
    sent_signatures: list[str] = []
    upstream = Upstream()
    amp = endpoint(upstream, credentials={SESSION_KEY: KnownCredential(SESSION_SECRET, TOKEN)})
    session = CredentialSource(credentials=Credentials(SESSION_KEY, SESSION_SECRET, TOKEN))
    texts: list[str] = []

    def capture(r: httpx.Request) -> httpx.Request:
        sent_signatures.append(r.headers["authorization"].rpartition("Signature=")[2])
        return r

    # accepted, wrong region, wrong secret, stale, tampered
    cases = [
        SigV4Signer(REGION, "aps", session),
        SigV4Signer("eu-west-1", "aps", session),
        SigV4Signer(REGION, "aps", CredentialSource(credentials=Credentials(SESSION_KEY, TEST_SECRET_KEY, TOKEN))),
        SigV4Signer(REGION, "aps", session, clock=lambda: time.time() - 3600),
    ]
    for signer in cases:
        resp = run(send(amp, signer=signer, method="POST", path="/api/v1/query",
                        form=[("query", "a + b")], mutate=capture))
        texts.append(resp.text)
    # No credentials at all, and a profile that does not exist.
    for source in (CredentialSource(), CredentialSource(profile="missing")):
        with pytest.raises(PromError) as exc:
            run(send(amp, signer=SigV4Signer(REGION, "aps", source), method="GET", path="/api/v1/query",
                     params=[("query", "up")]))
        texts.extend([exc.value.message, str(exc.value), repr(exc.value), exc.value.body().decode()])
    texts.append(repr(session) + repr(cases[0]) + repr(session.frozen()))
    texts.append(generate_latest(METRICS.registry).decode())
    texts.append(caplog.text)
    assert len(sent_signatures) == 4
    everything = "\n".join(texts)
    for secret in (SESSION_SECRET, TOKEN, TEST_SECRET_KEY, *sent_signatures):
        assert secret not in everything


def test_backend_attaches_signer_for_amp(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.backends import Backend
    from proxy.config import BackendConfig

    amp = Backend(BackendConfig(name="amp", kind="amp",
                                url="https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1",
                                transport="httpx"))
    prom = Backend(BackendConfig(url="http://127.0.0.1:9090", transport="httpx"))
    try:
        auth = amp._client.auth
        assert isinstance(auth, _SigV4Auth)
        assert (auth.signer.region, auth.signer.service) == ("eu-west-1", "aps")
        assert not isinstance(prom._client.auth, _SigV4Auth)
    finally:
        run(amp.aclose())
        run(prom.aclose())


# --- the verifier against botocore's signer ---------------------------------------------------

_AWKWARD_CHARS = " +*%&=?#/:;,@!$'()[]~-_.\\\"<>{}|^`\t" + "éü漢字😀\u00a0"
_param_text = st.text(alphabet=st.sampled_from(_AWKWARD_CHARS) | st.characters(codec="utf-8", exclude_categories=("Cs",)),
                      max_size=12)
_param_name = st.sampled_from(["query", "match[]", "time", "start", "end", "step", "a b", "x+y", "é", "*"]) | _param_text


def _strict(s: str) -> str:
    from urllib.parse import quote

    return quote(s.encode(), safe="-_.~")


@settings(max_examples=250, deadline=None, derandomize=True)
@given(method=st.sampled_from(["GET", "POST"]),
       pairs=st.lists(st.tuples(_param_name, _param_text), max_size=6),
       body_pairs=st.lists(st.tuples(_param_name, _param_text), max_size=6),
       label=st.sampled_from(["job", "__name__", "é", "a b", "x+y", "*"]),
       endpoint_path=st.sampled_from(["query", "query_range", "series", "labels", "metadata", "label"]))
def test_verifier_agrees_with_botocore(method: str, pairs: list[tuple[str, str]], body_pairs: list[tuple[str, str]],
                                       label: str, endpoint_path: str) -> None:
    """A request botocore's SigV4Auth signs (canonical query from its parameters, body hash
    of the POST form) is accepted by the AMP emulator's verifier as sent on the wire (strict
    RFC 3986 query, parameters in the client's order, repeated names); one byte changed in
    the query or the body is refused."""
    from urllib.parse import quote, urlsplit

    from botocore.auth import SigV4Auth as BotoSigV4Auth
    from botocore.awsrequest import AWSRequest

    path = f"/workspaces/ws-1/api/v1/{endpoint_path}"
    if endpoint_path == "label":
        path += f"/{quote(label.encode(), safe='')}/values"
    url = "http://aps-workspaces.us-east-1.amazonaws.com" + path
    body = b""
    headers = {}
    if method == "POST":
        body = "&".join(f"{_strict(k)}={_strict(v)}" for k, v in body_pairs).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    request = AWSRequest(method=method, url=url, params=list(pairs), data=body, headers=headers)
    BotoSigV4Auth(Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY), "aps", "us-east-1").add_auth(request)
    raw_query = "&".join(f"{_strict(k)}={_strict(v)}" for k, v in pairs)
    sent = [(k, v) for k, v in request.headers.items()]
    if not any(k.lower() == "host" for k, _ in sent):
        sent.append(("host", urlsplit(url).netloc))
    kwargs: dict[str, Any] = dict(credentials={TEST_ACCESS_KEY: KnownCredential(TEST_SECRET_KEY)},
                                  region="us-east-1", service="aps", now=time.time())
    raw_path = urlsplit(url).path
    assert verify_request(method, raw_path, raw_query, sent, body, **kwargs) == TEST_ACCESS_KEY
    if raw_query:
        with pytest.raises(AuthFailure):
            verify_request(method, raw_path, raw_query + "0", sent, body, **kwargs)
    if body:
        with pytest.raises(AuthFailure):
            verify_request(method, raw_path, raw_query, sent, body[:-1], **kwargs)
    with pytest.raises(AuthFailure):
        verify_request(method, raw_path + "x", raw_query, sent, body, **kwargs)
