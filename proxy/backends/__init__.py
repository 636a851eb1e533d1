"""Calls to the backends (Prometheus, AMP): the only package that imports an HTTP client.

    backend.py     `Backend`: path check, tenant headers, semaphore, error translation
    retries.py     retries on connection errors and 502/503/504, AMP throttling, deadline
    transports.py  pooled aiohttp / httpx clients (the only importer of aiohttp and httpx)
    protocol.py    `BackendReply`, backend path check, Retry-After: no client library
    sigv4.py       SigV4 signing of AMP requests, credentials from botocore's chain
    redaction.py   secrets, signatures and tokens scrubbed from every log record
    tenancy.py     the client headers forwarded to backends, and the cache scope they make
"""

from __future__ import annotations

from .backend import Backend
from .protocol import BackendReply

__all__ = ["Backend", "BackendReply"]
