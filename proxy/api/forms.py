"""Request parameters as Prometheus reads them: URL query and form body merged.

Go's `r.FormValue` gives POST body values precedence over the URL query; repeated keys
(`match[]`) keep every value, body values first.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request

from ..errors import PromError, bad_data

Pairs = list[tuple[str, str]]

FORM_TYPE = "application/x-www-form-urlencoded"


async def read_pairs(request: Request, max_body_bytes: int) -> Pairs:
    body_pairs: Pairs = []
    if request.method in ("POST", "PUT", "PATCH"):
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                if int(declared) > max_body_bytes:
                    raise _too_large(max_body_bytes)
            except ValueError:
                raise bad_data("invalid Content-Length header") from None
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise _too_large(max_body_bytes)
                chunks.append(chunk)
        except ClientDisconnect:
            raise client_gone() from None
        body = b"".join(chunks)
        if body and ctype == FORM_TYPE:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise bad_data("error parsing form values: body is not valid UTF-8") from None
            body_pairs = parse_qsl(text, keep_blank_values=True)
    query_pairs = parse_qsl(request.url.query, keep_blank_values=True) if request.url.query else []
    return body_pairs + query_pairs


def _too_large(limit: int) -> PromError:
    return PromError(
        "too_large",
        f"request body too large: promaccel accepts at most {limit} bytes "
        "(limits.max_body_bytes)",
    )


def client_gone() -> PromError:
    """The client went away (or missed listen.body_timeout) before its body was complete:
    nobody reads the answer; 499 like Prometheus's "client closed connection", no traceback."""
    return PromError("canceled", "the client closed the connection before sending the whole request body",
                     status=499)


def first_values(pairs: Pairs) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in pairs:
        out.setdefault(k, v)
    return out


def without(pairs: Pairs, names: frozenset[str]) -> Pairs:
    return [(k, v) for k, v in pairs if k not in names]
