"""What importing the result type and the JSON codec loads: `QueryResult` comes without
numba or pyarrow (the kernels load numba on first use; the Arrow conversions are
proxy/codec/arrow.py's), nor any codec, and the JSON codec without pyarrow. Each check runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after(statement: str, heavy: tuple[str, ...]) -> list[str]:
    code = (
        f"import sys\n{statement}\n"
        f"print(' '.join(sorted(m for m in {heavy!r} if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize(
    "statement",
    [
        "import proxy.result",
        "from proxy.result import QueryResult",
        "from proxy.result.query_result import QueryResult",
        "from proxy.result.labels import labels_json",
    ],
)
def test_query_result_imports_neither_numba_nor_pyarrow(statement: str) -> None:
    assert _loaded_after(statement, ("numba", "pyarrow")) == []


def test_query_result_in_use_without_arrow_or_kernels() -> None:
    # Building and inspecting a result needs neither; formatting its labels loads the
    # compiled scanner (numba) but still not pyarrow.
    statement = (
        "from proxy.result import QueryResult\n"
        "r = QueryResult.from_series('matrix', [({'a': '1'}, [1000, 2000], [1.0, 2.0])])\n"
        "assert r.n_samples == 2 and r.series_keys() == [(('a', '1'),)]"
    )
    assert _loaded_after(statement, ("numba", "pyarrow")) == []
    assert _loaded_after(statement + "\nr.canonical_keys()", ("numba", "pyarrow")) == ["numba"]


@pytest.mark.parametrize("module", ["proxy.codec.json_decode", "proxy.codec.json_encode", "proxy.result.merge"])
def test_json_codec_and_kernels_import_without_pyarrow(module: str) -> None:
    assert _loaded_after(f"import {module}", ("pyarrow",)) == []


def test_the_result_type_loads_no_codec() -> None:
    # The codecs convert results (proxy/codec/arrow.py, json_decode.py); a result never needs
    # a codec, not even to parse labels it was made from the keys of (no import cycle).
    statement = (
        "import numpy as np\n"
        "from proxy.result import QueryResult\n"
        "r = QueryResult('vector', None, np.array([0, 1]), np.array([1000]), np.array([1.5]), keys=[b'{\"a\":\"1\"}'])\n"
        "assert r.labels == [{'a': '1'}]"
    )
    assert _loaded_after(statement, ("proxy.codec", "pyarrow")) == []


def test_arrow_conversions_are_the_codecs() -> None:
    statement = (
        "from proxy.result import QueryResult\n"
        "r = QueryResult.from_series('vector', [({'a': '1'}, [1000], [1.5])])\n"
        "from proxy.codec import arrow\n"
        "assert arrow.from_ipc_bytes(arrow.to_ipc_bytes(r)).to_pylist() == r.to_pylist()"
    )
    assert _loaded_after(statement, ("pyarrow",)) == ["pyarrow"]
