"""Secrets never reach a log line (proxy/backends/redaction.py): what `redact` scrubs and
leaves, structured fields, and the record factory and filter that apply it to every record.
Whole processes at debug level: tests/backends/test_secrets_logging.py."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from loadtests.amp_endpoint import TEST_SECRET_KEY
from proxy.backends.redaction import (
    RedactingFilter,
    install_log_redaction,
    redact,
    redact_fields,
    redact_record,
    register_secret,
)
from tests.backends.fake_secrets import STS_SECRET, STS_TOKEN, WEB_IDENTITY_TOKEN, leaks


def test_redact() -> None:
    register_secret("zzSECRETzzVALUEzz0123")
    line = ("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/aps/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            " x-amz-security-token=abcDEF123/+= aws_secret_access_key = wJalr/K7MDENG and zzSECRETzzVALUEzz0123")
    out = redact(line)
    for secret in ("5fa00fa3", "AKIDEXAMPLE/2015", "abcDEF123", "wJalr/K7MDENG", "zzSECRETzzVALUEzz0123"):
        assert secret not in out, out
    assert redact("sum(rate(x[5m])) by (Hostname)") == "sum(rate(x[5m])) by (Hostname)"


def test_redacting_filter_scrubs_messages_and_tracebacks() -> None:
    register_secret(TEST_SECRET_KEY)
    try:
        raise ValueError(f"boom {TEST_SECRET_KEY}")
    except ValueError:
        import sys
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "secret is %s", (TEST_SECRET_KEY,), sys.exc_info())
    RedactingFilter().filter(record)
    text = logging.Formatter().format(record)
    assert TEST_SECRET_KEY not in text and "<redacted>" in text


@pytest.mark.parametrize("line", [
    f"<Credentials><SessionToken>{STS_TOKEN}</SessionToken><SecretAccessKey>{STS_SECRET}</SecretAccessKey>",
    f'<sts:SecretAccessKey attr="1">{STS_SECRET}</sts:SecretAccessKey><Token>{STS_TOKEN}</Token>',
    f'{{"AccessKeyId": "ASIA1", "SecretAccessKey": "{STS_SECRET}", "Token": "{STS_TOKEN}"}}',
    f"{{'SecretAccessKey': '{STS_SECRET}', 'SessionToken': '{STS_TOKEN}'}}",
    f"Action=AssumeRoleWithWebIdentity&WebIdentityToken={WEB_IDENTITY_TOKEN}&RoleArn=x&token={STS_TOKEN}",
    f"aws_secret_access_key = {STS_SECRET}\naws_session_token={STS_TOKEN}",
    f"header x-amz-security-token: {STS_TOKEN}; some jwt {WEB_IDENTITY_TOKEN} in text",
    f"Bearer {WEB_IDENTITY_TOKEN}",
    f"password={STS_SECRET}",
], ids=["sts-xml", "xml-ns-attr", "json", "py-repr", "form", "ini", "header-and-jwt", "bearer", "password"])
def test_redact_covers_xml_json_forms_and_jwts(line: str) -> None:
    cleaned = redact(line)
    assert leaks(cleaned) == [], cleaned
    assert "<redacted" in cleaned


def test_redact_leaves_ordinary_lines_alone() -> None:
    for line in ("GET /api/v1/query 200 1.2ms x-dashboard-uid=abc",
                 'sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL{token_bucket="a"})',
                 "<AccessKeyId>ASIAFAKESTS0000000001</AccessKeyId><Expiration>2026</Expiration>"):
        assert redact(line) == line


def test_only_secrets_of_some_length_are_registered() -> None:
    # A short value ("admin", "1") would scrub ordinary words out of every line.
    register_secret("short")
    register_secret(None)
    assert redact("a short line") == "a short line"
    register_secret("long-enough-secret-01")
    assert redact("x long-enough-secret-01 y") == "x <redacted> y"


def test_the_access_key_id_is_an_identifier_not_a_secret() -> None:
    line = ("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/aps/aws4_request, "
            "SignedHeaders=host, Signature=" + "ab" * 32)
    assert "<AccessKeyId>AKIDEXAMPLE</AccessKeyId>" == redact("<AccessKeyId>AKIDEXAMPLE</AccessKeyId>")
    out = redact(line)
    assert "ab" * 32 not in out and out.startswith("Authorization: <redacted>")


def test_fields_keep_numbers_and_redact_texts_and_lists() -> None:
    fields = {"query": "up{password=\"p4ssw0rd-in-query\"}", "status": 200, "ok": True,
              "tags": ["Token=abcdef0123456789", 3], "none": None}
    out = redact_fields(fields)
    assert "p4ssw0rd-in-query" not in out["query"] and "<redacted>" in out["query"]
    assert out["status"] == 200 and out["ok"] is True and out["none"] is None
    assert out["tags"][0] == "Token=<redacted>" and out["tags"][1] == 3


def test_a_record_is_rendered_once_and_its_stack_redacted() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s and %d", ("SecretKey=abc123xyz", 5), None)
    record.stack_info = "Stack: password=hunter2hunter2"
    redact_record(record)
    assert record.getMessage() == "key SecretKey=<redacted> and 5" and record.args is None
    assert record.stack_info == "Stack: password=<redacted>"
    # A message that holds nothing secret keeps its format and arguments (rendered lazily).
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "took %d ms", (5,), None)
    redact_record(plain)
    assert plain.msg == "took %d ms" and plain.args == (5,)
    # A broken format string is left for logging to report, not raised here.
    broken = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("x",), None)
    redact_record(broken)


@pytest.fixture
def record_factory() -> Iterator[None]:
    """The process's record factory and root handlers as they were, after the test."""
    factory = logging.getLogRecordFactory()
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        root.handlers[:] = handlers


def test_installed_redaction_covers_every_logger_and_is_idempotent(record_factory: None) -> None:
    register_secret("factory-secret-0001")
    stream = io.StringIO()
    root_handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(root_handler)
    install_log_redaction()
    install_log_redaction()
    factory = logging.getLogRecordFactory()
    install_log_redaction()
    assert logging.getLogRecordFactory() is factory  # not wrapped twice
    assert sum(isinstance(f, RedactingFilter) for f in root_handler.filters) == 1
    # A logger that does not propagate, with a handler added after installation: the factory.
    lone = logging.getLogger("test_redaction.lone")
    lone.propagate = False
    own = io.StringIO()
    lone.addHandler(logging.StreamHandler(own))
    try:
        lone.warning("leaked factory-secret-0001?")
    finally:
        lone.handlers.clear()
    assert own.getvalue() == "leaked <redacted>?\n"
    # A record made without the factory (logging.makeLogRecord): the root handlers' filter.
    root_handler.handle(logging.makeLogRecord({"msg": "from a socket: factory-secret-0001"}))
    assert stream.getvalue() == "from a socket: <redacted>\n"


def test_an_exceptions_traceback_is_redacted() -> None:
    register_secret("trace-secret-00001")
    try:
        raise RuntimeError("failed with trace-secret-00001")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", None, sys.exc_info())
    redact_record(record)
    assert record.exc_info is None and record.exc_text is not None
    assert "trace-secret-00001" not in record.exc_text and "RuntimeError: failed with <redacted>" in record.exc_text
