"""`QueryResult`: one query answer as columns, the type every stage passes around.

    result_type   "matrix" | "vector" | "scalar" | "string"
    labels        list[dict[str, str]], one label set per series (thousands, not millions),
                  parsed on first use when the result was made from their keys
    offsets       int64[n_series + 1]: the samples of series i are [offsets[i], offsets[i+1])
    t_ms          int64[n_samples]   sample timestamps, milliseconds since the epoch
    value         float64[n_samples] sample values (NaN, +Inf, -Inf as IEEE values)
    warnings      list[str]          Prometheus's "warnings", carried along
    infos         list[str]          newer Prometheus's "infos", carried along
    string_value  str | None         only for result_type "string"

Invariants: the samples of a series are contiguous, in series order, and strictly
increasing in time within a series. A scalar or string result is one pseudo-series with an
empty label set and one sample (a string's value is NaN, its text is `string_value`).
The dicts in `labels` may be shared between results (proxy/codec/json_decode.py looks label
sets up in a process-wide table): never mutate them.

This module imports neither numba nor pyarrow, nor any codec: the conversions to and from
Arrow (the cache's payload) are proxy/codec/arrow.py's functions (`to_ipc_bytes`,
`from_ipc_bytes`, `pack`, ...), which import this module, not the other way round.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .label_sets import labels_of_keys
from .labels import label_block

__all__ = ["LazySamples", "QueryResult", "ResultType"]


ResultType = Literal["matrix", "vector", "scalar", "string"]
_RESULT_TYPES = ("matrix", "vector", "scalar", "string")

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class QueryResult:
    """See the module docstring. `labels` may be given as None with `keys` (the canonical
    keys of the label sets, `canonical_keys()`): the dicts are then parsed from the keys the
    first time `labels` is read (shared with every other result: label_sets.py's `LABEL_CACHE`).
    A merge of raw series never reads them (it hashes, sorts and writes the keys): a 24 h
    panel of 2,048 GPUs has 18,500 label sets, ~22 MB as dicts (issue 15)."""

    # Set on a result cut by time from another (`pieces.slice_time`): that result (weakly)
    # and, per series here, the index of its first sample there -- the samples are the same,
    # so the JSON encoder splices that result's encoded samples (codec/json_splice.py).
    origin: tuple[Callable[[], QueryResult | None], I64] | None = None
    # The encoded samples of this result once an encoder made them (codec/json_splice.py),
    # kept only on results marked `keeps_json`: the cells the cache reader keeps decoded
    # (pipeline/cache_read.py), which later answers read again.
    sample_json: Any = None
    keeps_json: bool = False

    def __init__(
        self,
        result_type: ResultType,
        labels: list[dict[str, str]] | None,
        offsets: I64,
        t_ms: I64,
        value: F64,
        warnings: list[str] | None = None,
        infos: list[str] | None = None,
        string_value: str | None = None,
        *,
        keys: list[bytes] | None = None,
    ) -> None:
        if result_type not in _RESULT_TYPES:
            raise ValueError(f"unknown result type {result_type!r}")
        if labels is None and keys is None:
            raise ValueError("labels or their keys are needed")
        n = len(labels) if labels is not None else len(keys)  # type: ignore[arg-type]
        if keys is not None and len(keys) != n:
            raise ValueError("one key per series")
        if offsets.shape != (n + 1,) or offsets[0] != 0:
            raise ValueError("offsets must have n_series + 1 entries starting at 0")
        if int(offsets[-1]) != len(t_ms) or len(t_ms) != len(value):
            raise ValueError("offsets, t_ms and value disagree on the sample count")
        self.result_type = result_type
        self._labels = labels
        self.offsets = offsets
        self.t_ms = t_ms
        self.value = value
        self.warnings = [] if warnings is None else warnings
        self.infos = [] if infos is None else infos
        self.string_value = string_value
        # Caches (labels never change once a result exists): Prometheus-formatted label
        # JSON as (bytes, starts, ends), per-series canonical keys, sortable keys.
        self._label_block: tuple[bytes, I64, I64] | None = None
        self._ckeys: list[bytes] | None = keys
        self._keys: list[tuple[tuple[str, str], ...]] | None = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.result_type}, {self.n_series} series, "
                f"{self.n_samples} samples)")

    @property
    def labels(self) -> list[dict[str, str]]:
        labels = self._labels
        if labels is None:
            if self._ckeys is None:
                raise ValueError("a result made from its keys lost them")
            labels = self._labels = labels_of_keys(self._ckeys)
        return labels

    @labels.setter
    def labels(self, labels: list[dict[str, str]]) -> None:
        self._labels = labels

    def parsed_labels(self) -> list[dict[str, str]] | None:
        """`labels` if they were parsed (or given), else None (they are in the keys)."""
        return self._labels

    def labels_of(self, series: Sequence[int]) -> list[dict[str, str]] | None:
        """The parsed label sets of these series, or None when they are not parsed: a
        result made of some of this one's series takes these and `canonical_keys()`'s."""
        labels = self._labels
        return None if labels is None else [labels[s] for s in series]

    # -- constructors ------------------------------------------------------------------

    @classmethod
    def from_series(
        cls,
        result_type: ResultType,
        series: Sequence[tuple[dict[str, str], Sequence[int], Sequence[float]]],
        *,
        warnings: Sequence[str] = (),
        infos: Sequence[str] = (),
    ) -> QueryResult:
        """Build from Python lists: [(labels, t_ms list, value list), ...] (tests, small data)."""
        labels = [dict(s[0]) for s in series]
        counts = [len(s[1]) for s in series]
        offsets = np.zeros(len(series) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        t = np.fromiter((x for s in series for x in s[1]), dtype=np.int64, count=int(offsets[-1]))
        v = np.fromiter((x for s in series for x in s[2]), dtype=np.float64, count=int(offsets[-1]))
        return cls(result_type, labels, offsets, t, v, list(warnings), list(infos))

    @classmethod
    def scalar(cls, t_ms: int, value: float, **kw: Any) -> QueryResult:
        return cls(
            "scalar",
            [{}],
            np.array([0, 1], dtype=np.int64),
            np.array([t_ms], dtype=np.int64),
            np.array([value], dtype=np.float64),
            **kw,
        )

    @classmethod
    def string(cls, t_ms: int, text: str, **kw: Any) -> QueryResult:
        return cls(
            "string",
            [{}],
            np.array([0, 1], dtype=np.int64),
            np.array([t_ms], dtype=np.int64),
            np.array([math.nan], dtype=np.float64),
            string_value=text,
            **kw,
        )

    @classmethod
    def empty(cls, result_type: ResultType = "matrix", **kw: Any) -> QueryResult:
        z = np.zeros(0, dtype=np.int64)
        return cls(result_type, [], np.zeros(1, dtype=np.int64), z, np.zeros(0), **kw)

    # -- views -------------------------------------------------------------------------

    @property
    def n_series(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_samples(self) -> int:
        return len(self.t_ms)

    @property
    def counts(self) -> I64:
        return np.diff(self.offsets)

    @property
    def series(self) -> npt.NDArray[np.int32]:
        """Series index of every sample (int32)."""
        return np.repeat(np.arange(self.n_series, dtype=np.int32), self.counts)

    def sample_windows(self, max_samples: int) -> Iterator[tuple[int, int, I64, F64]]:
        """The samples by windows of whole series, for writers that stream: (s0, s1, t, v),
        t and v holding the samples of series s0..s1-1 (from offsets[s0]). A result holding
        its samples gives them all at once; a merged result whose samples are still in its
        pieces (concat.py's `Concatenation`) gathers about `max_samples` at a time."""
        yield 0, self.n_series, self.t_ms, self.value

    def series_bounds(self) -> tuple[I64, I64] | None:
        """Each series' first and last timestamp (0 for a series without samples), known
        without reading the samples, which then increase within each series; or None (read
        the samples). A cell read back packed (`PackedPiece`) and a lazy cut of a cell
        (`pieces.TimeCut`) know them."""
        return None

    def packed_samples(self) -> Any:
        """None, or (a cached cell read back: codec/arrow.py's `PackedPiece`) its samples left
        packed: `.firsts` / `.lasts` (each series' first and last timestamp) and `.cursor()`,
        whose `rows(lo, hi)` reads them a few batches at a time."""
        return None

    def label_block(self) -> tuple[bytes, I64, I64]:
        """All label sets as Prometheus writes them: (bytes, start, end) per series."""
        if self._label_block is None:
            if self._ckeys is not None:
                keys = self._ckeys
                lens = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
                ends = np.cumsum(lens)
                self._label_block = (b"".join(keys), ends - lens, ends)
            else:
                self._label_block = label_block(self.labels)
        return self._label_block

    def label_block_of(self, s0: int, s1: int) -> tuple[bytes, I64, I64]:
        """`label_block()` of series s0..s1-1 (starts and ends into the bytes returned): the
        whole block's when it is at hand, else joined from those series' keys alone (a 24 h
        panel's label sets are ~13 MB joined; an encoder streaming it a window at a time
        needs one window's)."""
        if self._label_block is None and self._ckeys is not None:
            keys = self._ckeys[s0:s1]
            lens = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
            ends = np.cumsum(lens)
            return b"".join(keys), ends - lens, ends
        raw, starts, ends = self.label_block()
        return raw, starts[s0:s1], ends[s0:s1]

    def canonical_keys(self) -> list[bytes]:
        """Per series, its label set as Prometheus writes it (`labels_json`): equal label
        sets give equal keys, whichever backend sent them. Hash these, sort series_keys()."""
        if self._ckeys is None:
            raw, starts, ends = self.label_block()
            self._ckeys = [raw[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        return self._ckeys

    def set_canonical_keys(self, keys: list[bytes], block: tuple[bytes, I64, I64] | None = None) -> None:
        """Adopt keys known to be `canonical_keys()` of these very label sets (a merge
        reusing its pieces' keys), so that encoding does not format the labels again;
        `block`, when the caller has it, is `label_block()` of the same keys."""
        if len(keys) != self.n_series:
            raise ValueError("one key per series")
        self._label_block = block  # None: joined from the keys when an encoder asks for it
        self._ckeys = keys

    def series_keys(self) -> list[tuple[tuple[str, str], ...]]:
        """Per series, its label set as sorted (name, value) pairs. Comparing two keys as
        tuples is Prometheus's labels.Compare."""
        if self._keys is None:
            self._keys = [tuple(sorted(d.items())) for d in self.labels]
        return self._keys

    def to_pylist(self) -> list[tuple[dict[str, str], list[int], list[float]]]:
        """Slow, for tests and debugging."""
        out = []
        for i, d in enumerate(self.labels):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append((dict(d), self.t_ms[a:b].tolist(), self.value[a:b].tolist()))
        return out


class LazySamples(QueryResult):
    """A result whose samples are not held until they are read (concat.py's `Concatenation`:
    still in its pieces; codec/arrow.py's `PackedPiece`: still in its cache payload).
    Everything but `t_ms` and `value` is there at once; reading either loads every sample
    (`_load`) and keeps them. Writers that stream read `sample_windows` instead."""

    def __init__(self, result_type: ResultType, labels: list[dict[str, str]] | None, offsets: I64,
                 warnings: list[str], infos: list[str], keys: list[bytes] | None,
                 block: tuple[bytes, I64, I64] | None = None) -> None:
        # QueryResult's fields but the samples (its __init__ would check their count).
        if labels is None and keys is None:
            raise ValueError("labels or their keys are needed")
        self.result_type = result_type
        self._labels = labels
        self.offsets = offsets
        self.warnings = warnings
        self.infos = infos
        self.string_value = None
        self._label_block = block
        self._ckeys = keys
        self._keys = None
        self._samples: tuple[I64, F64] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[I64, F64]:
        raise NotImplementedError

    @property
    def loaded(self) -> bool:
        """Whether its samples were read (and are held now)."""
        return self._samples is not None

    def _loaded(self) -> tuple[I64, F64]:
        with self._lock:
            if self._samples is None:
                self._samples = self._load()
            return self._samples

    @property  # type: ignore[override]
    def t_ms(self) -> I64:
        return self._loaded()[0]

    @t_ms.setter
    def t_ms(self, t: I64) -> None:
        self._samples = (t, self._loaded()[1])

    @property  # type: ignore[override]
    def value(self) -> F64:
        return self._loaded()[1]

    @value.setter
    def value(self, v: F64) -> None:
        self._samples = (self._loaded()[0], v)

    @property
    def n_samples(self) -> int:
        return int(self.offsets[-1])

    def window_bounds(self, max_samples: int) -> list[tuple[int, int]]:
        """Series windows (s0, s1) of about `max_samples` samples each, whole series."""
        n = self.n_series
        cuts = np.searchsorted(self.offsets, np.arange(max_samples, self.n_samples, max_samples), side="left")
        bounds = sorted({0, n, *[c for c in cuts.tolist() if 0 < c < n]})
        return list(zip(bounds, bounds[1:]))
