"""Label-matcher regexes, evaluated the way Prometheus does and never by backtracking.

Prometheus compiles `=~` / `!~` values with Go's `regexp` (RE2 syntax, linear time) anchored
as `^(?:value)$`. Client regexes reach the planner (shard-value counting, estimates), so they
must not run on Python's backtracking `re`: `(.*)*(.*)*(.*)*X` against a few hundred node
names took 16 s there and holds the event loop for all of it. RE2 (`google-re2`) matches in
time linear in the input and reads the same syntax as Go (`\\d` is ASCII, no look-around or
backreferences: such a pattern is invalid for Prometheus too).

    matcher("gpu-node-0.*").fullmatch("gpu-node-07")  -> truthy
    matcher("(?=x)")                                   -> raises RegexError
"""

from __future__ import annotations

import functools
from typing import Protocol

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 otherwise writes every rejected pattern to stderr
_OPTIONS.never_capture = True  # only "does it match" is ever asked
# RE2's own memory bound for a compiled program (default 8 MiB): a pattern that needs more
# fails to compile instead of growing without bound.
_OPTIONS.max_mem = 8 << 20


class RegexError(ValueError):
    """The pattern is not valid RE2 (Go regexp) syntax."""


class Matcher(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


@functools.lru_cache(maxsize=512)
def matcher(pattern: str) -> Matcher:
    """A compiled, linear-time matcher for `pattern`; `.fullmatch(text)` is Prometheus's
    anchored match. Raises RegexError for a pattern Go's regexp would reject."""
    try:
        return re2.compile(pattern, _OPTIONS)  # type: ignore[no-any-return]
    except re2.error as exc:
        msg = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise RegexError(msg) from None


def fullmatch(pattern: str, text: str) -> bool:
    """Whether `text` matches `pattern` as a whole (Prometheus's `=~`)."""
    return matcher(pattern).fullmatch(text) is not None


__all__ = ["Matcher", "RegexError", "fullmatch", "matcher"]
