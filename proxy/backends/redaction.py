"""Secrets never reach a log line: redaction of log records and error texts.

Secrets (secret keys, session tokens, web identity tokens, passwords), signatures and
Authorization headers never go into a log line, an exception message or a metric. `redact()`
scrubs any text that might hold them (`key: value`, `key=value` in query strings and forms,
JSON and Python reprs, XML elements as in STS answers, JWTs anywhere, and every secret
registered with `register_secret`). `install_log_redaction()` applies it to every log record
of the process (a LogRecord factory), `redact_fields` to a record's structured fields (the
`extra={"fields": ...}` that `log_format: json` writes: a query's text, Grafana's headers;
redacted by the handlers' filter and again by the JSON formatter, proxy/api/access_log.py),
and `promaccel serve` pins the chatty HTTP/AWS libraries' loggers to WARNING unless
PROMACCEL_DEBUG_LIBRARIES=1 (proxy/cli.py).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
from typing import Any, Callable

_SECRETS: collections.deque[str] = collections.deque(maxlen=32)
_SECRETS_LOCK = threading.Lock()
# Names whose values are secret wherever they appear: `key: value`, `key=value` (query
# strings, forms), JSON / Python reprs (`"key": "value"`, `'key': 'value'`) and XML elements
# (`<key>value</key>`, as in STS answers). AccessKeyId is not among them: it is an
# identifier (it is in every Authorization header AWS logs) and helps debugging.
_SECRET_NAMES = (r"x-amz-security-token|aws_session_token|session_token|SessionToken|security_token|"
                 r"aws_secret_access_key|secret_access_key|SecretAccessKey|secret_key|SecretKey|"
                 r"WebIdentityToken|web_identity_token|Token|password|passwd|client_secret")
_PATTERNS = (
    # Authorization: AWS4-HMAC-SHA256 Credential=AKID/..., SignedHeaders=..., Signature=hex
    (re.compile(r"(AWS4-HMAC-SHA256\s+Credential=)[^,\s\"']+", re.I), r"\1<redacted>"),
    (re.compile(r"((?:X-Amz-)?Signature=)[0-9a-f]{16,}", re.I), r"\1<redacted>"),
    # <SecretAccessKey>...</SecretAccessKey>, <SessionToken>, <Token>, <WebIdentityToken> ...
    (re.compile(r"(<(?:[\w-]+:)?(" + _SECRET_NAMES + r")(?:\s[^>]*)?>)[^<]*(</)", re.I), r"\1<redacted>\3"),
    # "SecretAccessKey": "...", 'Token': '...', SessionToken=..., WebIdentityToken=...&...
    (re.compile(r"(\b(?:" + _SECRET_NAMES + r")[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}<>]+", re.I),
     r"\1<redacted>"),
    (re.compile(r"(authorization[\"']?\s*[:=]\s*[\"']?)[^\"'\n]+", re.I), r"\1<redacted>"),
    # A JWT (an IRSA / OIDC web identity token, a bearer token) anywhere: header.payload.sig
    (re.compile(r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*"), "<redacted-jwt>"),
)
_MARKERS = ("aws4-hmac", "signature=", "token", "secret", "authorization", "password", "passwd", "eyj")


def register_secret(value: str | None) -> None:
    """Remember a secret so that `redact` scrubs it verbatim wherever it turns up."""
    if value and len(value) >= 8:
        with _SECRETS_LOCK:
            if value not in _SECRETS:
                _SECRETS.append(value)


def redact(text: str) -> str:
    """`text` with known secrets, signatures, session tokens and Authorization values masked."""
    with _SECRETS_LOCK:
        secrets = list(_SECRETS)
    for s in secrets:
        if s in text:
            text = text.replace(s, "<redacted>")
    low = text.lower()
    if any(m in low for m in _MARKERS):  # most log lines: no regex at all
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
    return text


def redact_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Structured log fields with every text value redacted (numbers and flags as they are)."""
    return {k: redact(v) if isinstance(v, str) else
            [redact(x) if isinstance(x, str) else x for x in v] if isinstance(v, (list, tuple)) else v
            for k, v in fields.items()}


def redact_record(record: logging.LogRecord) -> None:
    """Render `record`'s message once and replace it (and any traceback) by the redacted text;
    its structured `fields` (set by `extra`, after the record factory ran) redacted too."""
    fields = getattr(record, "fields", None)
    if isinstance(fields, dict):
        record.fields = redact_fields(fields)
    try:
        message = record.getMessage()
    except Exception:  # a broken format string is logging's problem, not ours
        return
    cleaned = redact(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[1] is not None:
        # Tracebacks are formatted later from exc_info; pre-format and redact them here.
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        record.exc_info = None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """A logging filter that renders each record's message once and redacts it."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


_FILTER = RedactingFilter()


class _RedactingFactory:
    """A LogRecord factory that redacts every record as it is made, whatever logger made it
    (propagating or not) and whatever handlers exist then or are added later."""

    def __init__(self, inner: Callable[..., logging.LogRecord]) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        redact_record(record)
        return record


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Redact every log record of this process. Idempotent.

    The record factory (`logging.setLogRecordFactory`) sees each record at creation, before
    any handler, so it covers botocore, urllib3, httpx, aiohttp, uvicorn and promaccel's own
    loggers, handlers added later (pytest's caplog, uvicorn's) and loggers that do not
    propagate. Records made without the factory (`logging.makeLogRecord`, e.g. from a socket)
    are caught by the filter also put on the handlers of `logger` (the root logger by
    default) present now."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _RedactingFactory):
        logging.setLogRecordFactory(_RedactingFactory(current))
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
