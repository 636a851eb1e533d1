"""The image's compiled numba cache, emulated without Docker (issue 30 item 2).

What the Dockerfile and deploy/base/deployment.yaml do, step by step, with their own commands:

1. install: the package's sources copied to a fresh directory (what `pip install .` puts in
   site-packages: numba keys a cache entry on the source file's directory and content);
2. seed: the Dockerfile's warmup RUN line, with its NUMBA_* ENV (the cache directory and the
   CPU the code is compiled for), from / so that the installed copy is what is compiled;
3. the seed made read-only (the image's layer under a read-only root filesystem);
4. the init container's command copies it into a fresh writable directory (the emptyDir);
5. `promaccel serve` with NUMBA_CACHE_DIR at that copy, timed from process start to a 200 from
   /-/ready (its backend: a stub that answers /-/ready).

`python -m tests.deploy.numba_seed [--runs N]` prints the start-to-ready seconds with the seeded
cache and with a cold (empty) one: docs/SCALE.md "Pod start". tests/deploy/test_numba_seed.py
checks that the seeded cache is used (nothing compiled).
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_CACHE = "/var/cache/promaccel/numba"  # the Dockerfile's NUMBA_CACHE_DIR
PACKAGES = ("proxy", "shardplanner", "loadtests")


def dockerfile_numba() -> tuple[dict[str, str], list[str]]:
    """The image's NUMBA_* environment (ARG defaults substituted) and the modules its warmup RUN
    line runs, read from the Dockerfile."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    args = {m.group(1): m.group(2).strip('"') for m in re.finditer(r"(?m)^ARG (\w+)=(\S*)", text)}
    env: dict[str, str] = {}
    for line in re.findall(r"(?m)^ENV (.+)$", text):
        for k, v in re.findall(r"(\w+)=(\S*)", line):
            if k.startswith("NUMBA_"):
                env[k] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), v).strip('"')
    (run,) = [r for r in re.findall(r"(?m)^RUN (.+)$", text) if "warmup" in r]
    modules = re.findall(r"python -m ([\w.]+warmup)", run)
    assert env.get("NUMBA_CACHE_DIR") == IMAGE_CACHE and modules, (env, run)
    return env, modules


def init_container_command() -> list[str]:
    """The numba-cache init container's command, from the rendered base Deployment."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "base" / "deployment.yaml").read_text())
    (dep,) = [d for d in docs if d and d["kind"] == "Deployment"]
    (init,) = [c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "numba-cache"]
    return list(init["command"])


def install(dst: Path) -> Path:
    """The package's sources in `dst/site` (no __pycache__): the installed files."""
    site = dst / "site"
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _env(site: Path, cache: Path, numba_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PROMACCEL_"))}
    env.update(numba_env)
    env.update(NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    return env


def seed(site: Path, cache: Path) -> float:
    """The Dockerfile's warmup into `cache`; returns the seconds it took."""
    numba_env, modules = dockerfile_numba()
    t0 = time.perf_counter()
    for mod in modules:
        subprocess.run([sys.executable, "-m", mod], cwd="/", env=_env(site, cache, numba_env),
                       check=True, capture_output=True, timeout=900)
    return time.perf_counter() - t0


def make_read_only(tree: Path) -> None:
    for p in [tree, *tree.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


def init_copy(seeded: Path, empty_dir: Path) -> None:
    """The init container's command with the image's cache at `seeded` and its emptyDir at
    `empty_dir`."""
    argv = [a.replace(IMAGE_CACHE, str(seeded)).replace("/numba-cache", str(empty_dir))
            for a in init_container_command()]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def snapshot(tree: Path) -> dict[str, tuple[int, str]]:
    """Every file under `tree`: its size and content digest (numba rewrites an index and adds
    a data file for each kernel it compiles)."""
    return {str(p.relative_to(tree)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(tree.rglob("*")) if p.is_file()}


@contextmanager
def stub_backend() -> Iterator[str]:
    """A loopback HTTP server that answers /-/ready (and anything else) with 200."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"Prometheus Server is Ready.\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def start_to_ready(site: Path, cache: Path, backend: str, workdir: Path, timeout: float = 600) -> float:
    """`promaccel serve` (the image's entrypoint, from the installed copy) with NUMBA_CACHE_DIR
    at `cache`: seconds from process start to the first 200 from /-/ready."""
    sys.path.insert(0, str(ROOT))
    from tests.servers import free_port, stop

    numba_env, _ = dockerfile_numba()
    port = free_port()
    log = workdir / f"serve-{port}.log"
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--backend", backend,
                                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                cwd=workdir, env=_env(site, cache, numba_env), stdout=out, stderr=subprocess.STDOUT)
    try:
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"promaccel exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"not ready in {timeout} s: {log.read_text()[-2000:]}")
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/promaccel-numba-seed"))
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    a.workdir.mkdir(parents=True)
    site = install(a.workdir)
    image_cache = a.workdir / "image-cache"
    print(f"seeding (the Dockerfile's warmup): {seed(site, image_cache):.1f} s", flush=True)
    make_read_only(image_cache)
    seeded, cold = [], []
    with stub_backend() as backend:
        for i in range(a.runs):
            copy = a.workdir / f"emptydir-{i}"
            copy.mkdir()
            init_copy(image_cache, copy)
            before = snapshot(copy)
            seeded.append(start_to_ready(site, copy, backend, a.workdir))
            assert snapshot(copy) == before, "the seeded cache was not used: numba compiled"
            empty = a.workdir / f"cold-{i}"
            empty.mkdir()
            cold.append(start_to_ready(site, empty, backend, a.workdir))
            print(f"run {i + 1}: seeded {seeded[-1]:.2f} s, cold {cold[-1]:.2f} s", flush=True)
    print(f"start to /-/ready, median of {a.runs}: seeded {statistics.median(seeded):.2f} s, "
          f"cold {statistics.median(cold):.2f} s")


if __name__ == "__main__":
    main()
