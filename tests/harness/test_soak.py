"""`make soak` (loadtests/soak.py): its bounds, its virtual clock, and a short real run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from loadtests import soak


def test_bounds() -> None:
    for bad in (["--users", "0"], ["--users", "201"], ["--minutes", "0"], ["--minutes", "241"], ["--sample-s", "0"]):
        with pytest.raises(SystemExit):
            soak.parse_args(bad)
    args = soak.parse_args([])
    assert (args.minutes, args.users) == (30.0, 50)


def test_the_window_slides_at_a_constant_pace_and_stops_at_the_end() -> None:
    assert soak.virtual_now(0, 600, 1000, 4000) == 1000
    assert soak.virtual_now(300, 600, 1000, 4000) == 2500
    assert soak.virtual_now(900, 600, 1000, 4000) == 4000
    assert soak.virtual_now(-5, 600, 1000, 4000) == 1000


@pytest.mark.prom
def test_a_short_soak_writes_its_csv_plot_and_summary(prom: Any, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    code = soak.main(["--minutes", "0.25", "--users", "3", "--sample-s", "2", "--check-s", "4", "--no-redis",
                      "--prometheus", prom.url, "--out", str(out)])
    assert code == 0, (out / "summary.md").read_text()
    with (out / "soak.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 5 and list(rows[0]) == list(soak.COLUMNS)
    assert sum(int(r["requests"]) for r in rows) > 50 and all(r["failures"] == "0" for r in rows)
    assert all(100 < float(r["rss_mib"]) < 4096 for r in rows)
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "0 failed" in summary and "0 mismatches" in summary and "answers compared" in summary
    assert " 0 answers compared" not in summary  # the check did compare
