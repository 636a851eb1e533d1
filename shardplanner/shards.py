"""Partition the series of a query into node shards by one label (``Hostname``, ``instance``).

A shard is one injected label matcher. The N matchers of a partition must together select
every series exactly once — *any* series: one without the label (Prometheus treats a missing
label as the empty string), one whose value the planner has never seen (a node added after
the value list was fetched), one with a value full of regex metacharacters or unicode. So
shards ``0..N-2`` are positive regex matchers, and the final shard is always the negation of
their union: whatever the first ones miss, the last one takes. Disjointness of the positive
shards is then all that has to be proven, and each scheme below proves it by construction.

Two deterministic schemes, both balanced over the known values sorted by code point:

1. Listing (preferred: readable, and Prometheus turns an alternation of literals into a set
   lookup). The sorted values are cut into N near-equal chunks; shard i < N-1 lists its chunk,
   the last shard takes the complement of everything listed::

       Hostname=~"gpu-node-0000|gpu-node-0001|gpu-node-0002"
       Hostname=~"gpu-node-0003|gpu-node-0004|gpu-node-0005"
       Hostname=~"gpu-node-0006|gpu-node-0007"
       Hostname!~"gpu-node-0000|gpu-node-0001|...|gpu-node-0007"  # 0008, 0009, missing, new

2. Lexicographic ranges, used when a listing matcher would exceed ``MAX_MATCHER_BYTES``
   (4 KiB; 2,000 host names do not fit). Shard i takes the values ``v`` with
   ``b_i <= v < b_{i+1}`` in code point order, where the boundaries are the shortest strings
   that separate the chunks (``gpu-node-0500`` after ``gpu-node-0499`` needs only
   ``gpu-node-05``). Range regexes are a few hundred bytes whatever the number of values, and
   an unseen value still falls into the range it sorts into::

       Hostname=~"(?:|[\\x00-f](?s:.*)|g(?:|...))"             # v < "gpu-node-05"
       Hostname!~"<the same kind of regex for v < b_{N-1}>"   # v >= b_{N-1}

All regexes are fully anchored by Prometheus (``^(?:re)$``) and written in the common
subset of Go RE2 and Python ``re`` syntax: literals are escaped with :func:`regex_escape`
(Go's ``regexp.QuoteMeta`` set), character classes escape every ASCII non-alphanumeric
character (an escaped ASCII punctuation or control character is itself in both engines),
``(?s:.*)`` is "any rest", and ``\\x00`` is the only numeric escape. Hence
:func:`series_in_shard` checks a partition with RE2 (``shardplanner.regex``), as Prometheus does.

If no scheme fits within the byte bound at N shards, N is reduced; fewer than two known
values means no sharding (an empty list).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from shardplanner.plan import ShardSpec
from shardplanner.regex import fullmatch

__all__ = [
    "MAX_MATCHER_BYTES",
    "make_shards",
    "regex_escape",
    "series_in_shard",
]

MAX_MATCHER_BYTES = 4096

# Go's regexp.QuoteMeta escapes exactly these.
_RE2_META = frozenset("\\.+*?()|[]{}^$")
_ANY = "(?s:.*)"
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def regex_escape(value: str) -> str:
    """Escape ``value`` so that the regex matches exactly it (Go ``regexp.QuoteMeta``)."""
    return "".join("\\" + c if c in _RE2_META else c for c in value)


def make_shards(
    label: str,
    values: Iterable[str],
    n: int,
    *,
    max_matcher_bytes: int = MAX_MATCHER_BYTES,
    scheme: Literal["auto", "listing", "ranges"] = "auto",
) -> list[ShardSpec]:
    """Partition all series by ``label`` into at most ``n`` shards (see the module docstring).

    ``values`` are the label values known now (duplicates and the empty string are ignored).
    Returns between 2 and ``n`` specs, or ``[]`` when sharding is not possible (``n < 2``,
    fewer than two known values, or no scheme fits within ``max_matcher_bytes``).
    ``scheme`` restricts the choice ("auto": listing if it fits, else ranges).
    """
    known = sorted({v for v in values if v != ""})
    builders = {"auto": (_listing, _ranges), "listing": (_listing,), "ranges": (_ranges,)}[scheme]
    for count in range(min(n, len(known)), 1, -1):
        chunks = _chunks(known, count)
        for build in builders:
            matchers = build(chunks)
            if all(len(value.encode("utf-8")) <= max_matcher_bytes for _, value in matchers):
                return [
                    ShardSpec(label=label, index=i, count=count, matcher_op=op, matcher_value=value)
                    for i, (op, value) in enumerate(matchers)
                ]
    return []


def series_in_shard(labels: Mapping[str, str], spec: ShardSpec) -> bool:
    """Whether a series with ``labels`` is selected by ``spec`` (for tests and explain)."""
    matched = fullmatch(spec.matcher_value, labels.get(spec.label, ""))
    return matched if spec.matcher_op == "=~" else not matched


def _chunks(known: Sequence[str], count: int) -> list[list[str]]:
    """``count`` contiguous near-equal chunks (sizes differ by at most one, larger first)."""
    size, extra = divmod(len(known), count)
    chunks: list[list[str]] = []
    pos = 0
    for i in range(count):
        end = pos + size + (1 if i < extra else 0)
        chunks.append(list(known[pos:end]))
        pos = end
    return chunks


MatchOp = Literal["=~", "!~"]
Matcher = tuple[MatchOp, str]  # (op, regex)


def _listing(chunks: list[list[str]]) -> list[Matcher]:
    positive: list[Matcher] = [
        ("=~", "|".join(regex_escape(v) for v in chunk)) for chunk in chunks[:-1]
    ]
    listed = [v for chunk in chunks[:-1] for v in chunk]
    return [*positive, ("!~", "|".join(regex_escape(v) for v in listed))]


def _ranges(chunks: list[list[str]]) -> list[Matcher]:
    bounds = [_separator(prev[-1], nxt[0]) for prev, nxt in itertools.pairwise(chunks)]
    matchers: list[Matcher] = [("=~", _less_than(bounds[0]))]
    for lo, hi in itertools.pairwise(bounds):
        matchers.append(("=~", _between(lo, hi)))
    matchers.append(("!~", _less_than(bounds[-1])))
    return matchers


def _separator(lo: str, hi: str) -> str:
    """The shortest prefix of ``hi`` that sorts after ``lo`` (requires ``lo < hi``)."""
    p = _common_prefix_len(lo, hi)
    return hi[: p + 1]


def _common_prefix_len(a: str, b: str) -> int:
    p = 0
    while p < len(a) and p < len(b) and a[p] == b[p]:
        p += 1
    return p


def _less_than(b: str) -> str:
    """Regex for ``{s : s < b}`` in code point order; ``b`` must be non-empty.

    ``s < b`` iff some prefix ``b[:k]`` of ``b`` is followed in ``s`` by nothing, or by a
    character below ``b[k]``. Built inside out, one nested group per character of ``b``.
    """
    inner: str | None = None  # suffixes after all of b: nothing is below b there
    for k in reversed(range(len(b))):
        alts = [""]
        below = _char_class(0, ord(b[k]) - 1)
        if below is not None:
            alts.append(below + _ANY)
        if inner is not None:
            alts.append(regex_escape(b[k]) + inner)
        inner = "(?:" + "|".join(alts) + ")"
    assert inner is not None, "b must be non-empty"
    return inner


def _at_least(a: str) -> str:
    """Regex for ``{s : s >= a}`` in code point order."""
    inner = _ANY
    for k in reversed(range(len(a))):
        alts = []
        above = _char_class(ord(a[k]) + 1, _MAX_CODE_POINT)
        if above is not None:
            alts.append(above + _ANY)
        alts.append(regex_escape(a[k]) + inner)
        inner = "(?:" + "|".join(alts) + ")"
    return inner


def _between(lo: str, hi: str) -> str:
    """Regex for ``{s : lo <= s < hi}``; requires ``"" < lo < hi``."""
    p = _common_prefix_len(lo, hi)
    prefix, lo_rest, hi_rest = lo[:p], lo[p:], hi[p:]
    if lo_rest == "":  # lo is a prefix of hi: after it, anything below the rest of hi
        return regex_escape(prefix) + _less_than(hi_rest)
    # lo_rest[0] < hi_rest[0]: start with lo's char (then >= the rest of lo), a char strictly
    # between, or hi's char (then < the rest of hi).
    alts = [regex_escape(lo_rest[0]) + _at_least(lo_rest[1:])]
    middle = _char_class(ord(lo_rest[0]) + 1, ord(hi_rest[0]) - 1)
    if middle is not None:
        alts.append(middle + _ANY)
    if len(hi_rest) > 1:
        alts.append(regex_escape(hi_rest[0]) + _less_than(hi_rest[1:]))
    return regex_escape(prefix) + "(?:" + "|".join(alts) + ")"


def _char_class(lo: int, hi: int) -> str | None:
    """``[lo-hi]`` over code points, or None when empty. A class open to the top is written
    negated (``[^\\x00-c]``) so that no exotic code point appears in the regex. Surrogates
    never occur in label values (they are UTF-8), so a bound inside the surrogate block is
    moved out of it."""
    if _SURROGATES[0] <= lo <= _SURROGATES[1]:
        lo = _SURROGATES[1] + 1
    if _SURROGATES[0] <= hi <= _SURROGATES[1]:
        hi = _SURROGATES[0] - 1
    if lo > hi:
        return None
    if hi == _MAX_CODE_POINT and lo > 0:
        return "[^" + _class_range(0, lo - 1) + "]"
    return "[" + _class_range(lo, hi) + "]"


def _class_range(lo: int, hi: int) -> str:
    return _class_char(lo) if lo == hi else _class_char(lo) + "-" + _class_char(hi)


def _class_char(cp: int) -> str:
    if cp == 0:
        return "\\x00"
    c = chr(cp)
    if cp < 0x80 and not c.isalnum():
        return "\\" + c
    return c
