"""The process-wide table of label sets: each distinct label JSON kept once, its dict parsed
once, on demand (`LABEL_CACHE`).

Results made from their canonical keys (proxy/codec/json_decode.py's decoder, the cache's
Arrow payloads in proxy/codec/arrow.py) adopt the kept bytes as their keys, and
`QueryResult.labels` parses the dicts from here the first time they are read. It lives with
the result type (not in codec) so that `QueryResult` needs nothing from the codecs: the
codecs import results, never the other way round.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["LABEL_CACHE", "BadLabelJSON", "LabelSets", "labels_of_keys"]


class BadLabelJSON(ValueError):
    """A new label JSON that is not UTF-8 (or not JSON): its dict could never be parsed."""


class LabelSets:
    """Label JSON -> the one bytes object kept for that JSON, and the dict decoded from it
    once anyone asked for it. Results adopt the kept bytes as their canonical keys
    (`intern` and `lookup` put it in place of the caller's span), so the hour cells of a
    day and the calls of a panel hold one copy of each label set's JSON, not one each.
    Dicts are parsed only for results whose label sets are read (`lookup`): a merge of raw
    series hashes, sorts and writes the keys alone, and a 2,048-GPU answer's 18,500 dicts
    are ~22 MB (issue 15). Dicts are shared between results (never mutated), and so are
    their values (a fleet's label sets repeat the same few hostnames, models, jobs).
    Bounded: cleared when it grows past `limit` entries or `max_bytes` held (a key counts
    its JSON; a dict and its strings about 3x more)."""

    def __init__(self, limit: int = 500_000, max_bytes: int = 32 << 20) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self.map: dict[bytes, list[Any]] = {}  # JSON -> [kept key, dict or None]
        self.values: dict[str, str] = {}

    def _room(self, entries: int, adding: int) -> None:
        if len(self.map) + entries > self.limit or self.bytes + adding > self.max_bytes:
            self.map.clear()
            self.values.clear()
            self.bytes = 0

    def _entry(self, key: bytes) -> list[Any]:
        e = self.map.get(key)
        if e is None:
            e = self.map[key] = [key, None]
            self.bytes += len(key)
        return e

    def intern(self, spans: list[bytes]) -> None:
        """Each span in the list replaced by the kept key of its JSON (new ones kept). Raises
        BadLabelJSON for a new span that is not UTF-8 (its dict could not be parsed later)."""
        self._take(spans, parse=False)

    def lookup(self, spans: list[bytes]) -> list[dict[str, str]]:
        """The label dicts of `spans`; each span in the list is replaced by the kept key.
        Raises BadLabelJSON for a span that does not parse."""
        return [e[1] for e in self._take(spans, parse=True)]

    def _take(self, spans: list[bytes], parse: bool) -> list[list[Any]]:
        """The entries of `spans` (made for new ones; their dicts parsed too when `parse`),
        each span replaced by its entry's kept key."""
        get = self.map.get
        found: list[Any] = [get(k) for k in spans]
        todo = [i for i, e in enumerate(found) if e is None or (parse and e[1] is None)]
        if todo:
            parsed: list[Any] = []
            try:
                if parse:  # orjson refuses invalid UTF-8
                    parsed = orjson.loads(b"[" + b",".join([spans[i] for i in todo]) + b"]")
                else:
                    for i in todo:
                        if not spans[i].isascii():
                            spans[i].decode()
            except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BadLabelJSON(str(exc)) from exc
            self._room(len(todo), (4 if parse else 1) * sum(len(spans[i]) for i in todo))
            share = self.values.setdefault
            for j, i in enumerate(todo):
                e = found[i] = self._entry(spans[i])
                if parse and e[1] is None:
                    d = parsed[j]
                    if type(d) is dict:
                        for name, value in d.items():
                            if type(value) is str:
                                d[name] = share(value, value)
                    e[1] = d
                    self.bytes += 3 * len(e[0])
        spans[:] = [e[0] for e in found]
        return found


def labels_of_keys(keys: list[bytes]) -> list[dict[str, str]]:
    """The label dicts of canonical keys (`QueryResult.labels` of a result made from its
    keys): looked up in, or parsed into, the shared table."""
    try:
        return LABEL_CACHE.lookup(list(keys))
    except BadLabelJSON:  # keys are checked UTF-8 when made: not expected
        return [orjson.loads(k) for k in keys]


LABEL_CACHE = LabelSets()
