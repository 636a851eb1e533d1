"""A pod starts ready without compiling (issue 30 item 2): the numba cache the Dockerfile
compiles into the image, made read-only and copied by the Deployment's init container into a
fresh directory, is what `promaccel serve` loads -- it compiles nothing (numba writes an index
and a data file for every kernel it compiles; the copy stays byte-identical), and it is ready
in a fraction of the seeding's compile time. The emulation and its steps: numba_seed.py.

A relative check on purpose (a noisy 2-core CI box): "nothing written" does not depend on
timing, and the time bound is against the same machine's own compile.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import numba_seed

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, float]]:
    """(installed sources, the image's read-only seeded cache, seconds the seeding took)."""
    root = tmp_path_factory.mktemp("numba-image")
    site = numba_seed.install(root)
    cache = root / "image-cache"
    took = numba_seed.seed(site, cache)
    numba_seed.make_read_only(cache)
    yield site, cache, took
    for p in [cache, *cache.rglob("*")]:  # let pytest clean it up
        p.chmod(p.stat().st_mode | 0o200)


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    with numba_seed.stub_backend() as url:
        yield url


def test_the_seed_is_for_the_installed_files(image: tuple[Path, Path, float]) -> None:
    """numba names a cache directory after the source directory's path: the seed's must be the
    installed copy's (a seed compiled from elsewhere would never be found)."""
    site, cache, _ = image
    want = {f"{d.name}_{hashlib.sha1(str(d).encode()).hexdigest()}" for d in
            (site / "proxy" / "codec", site / "proxy" / "result")}
    assert want <= {p.name for p in cache.iterdir()}, sorted(p.name for p in cache.iterdir())


def test_pod_starts_on_the_seeded_cache_without_compiling(
        image: tuple[Path, Path, float], backend: str, tmp_path: Path) -> None:
    site, cache, seed_s = image
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    numba_seed.init_copy(cache, empty_dir)
    before = numba_seed.snapshot(empty_dir)
    assert before == numba_seed.snapshot(cache), "the init container's copy differs from the image's cache"
    took = numba_seed.start_to_ready(site, empty_dir, backend, tmp_path)
    assert numba_seed.snapshot(empty_dir) == before, "numba compiled: the seeded cache was not used"
    assert took < seed_s / 2, f"ready after {took:.1f} s; compiling took {seed_s:.1f} s"


def test_a_compile_is_detected(image: tuple[Path, Path, float], backend: str, tmp_path: Path) -> None:
    """The check above can fail: without the JSON encoder's indexes in the copy, serve compiles
    the encoder's kernels and the copy changes."""
    site, cache, _ = image
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    numba_seed.init_copy(cache, empty_dir)
    indexes = list(empty_dir.rglob("json_encode.*.nbi"))
    assert indexes
    for index in indexes:
        index.unlink()
    before = numba_seed.snapshot(empty_dir)
    numba_seed.start_to_ready(site, empty_dir, backend, tmp_path)
    after = numba_seed.snapshot(empty_dir)
    assert after != before and any(index.exists() for index in indexes)


def test_init_copy_is_writable_even_from_a_read_only_seed(image: tuple[Path, Path, float], tmp_path: Path) -> None:
    """numba uses a cache directory only if it can write to it (it creates a temporary file
    there first): the copy of a read-only seed must be writable."""
    _, cache, _ = image
    assert not any(p.stat().st_mode & 0o222 for p in [cache, *cache.rglob("*")])
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    numba_seed.init_copy(cache, empty_dir)
    for d in [empty_dir, *(p for p in empty_dir.rglob("*") if p.is_dir())]:
        assert d.stat().st_mode & 0o200, d
