"""QueryResult's own checks (proxy/result/query_result.py)."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.result import QueryResult


def test_query_result_validates_shape() -> None:
    with pytest.raises(ValueError):
        QueryResult("matrix", [{}], np.array([0, 2]), np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError):
        QueryResult("table", [], np.array([0]), np.array([], dtype=np.int64), np.array([]))  # type: ignore[arg-type]
