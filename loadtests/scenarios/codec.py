"""(f) Decode + merge + encode throughput: loadtests/codec_bench.py's output, when it exists."""

from __future__ import annotations

import importlib.util
import math
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

from .env import ROOT, Env
from .result import ScenarioResult


@dataclass(kw_only=True)
class CodecResult(ScenarioResult):
    name: ClassVar[str] = "codec"
    ran: bool = False
    note: str = ""
    command: str = ""
    returncode: int = 0
    output: str = ""
    elapsed_s: float = math.nan

    @property
    def compares(self) -> bool:
        return False  # it measures, it compares no answers


def run(env: Env) -> CodecResult:
    s = CodecResult()
    if importlib.util.find_spec("loadtests.codec_bench") is None:
        s.note = "loadtests/codec_bench.py does not exist yet: not run."
        return s
    cmd = [sys.executable, "-m", "loadtests.codec_bench", *shlex.split(env.args.codec_args)]
    env.progress.update("(f) codec bench running", force=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(60, env.args.duration_limit))
        out, rc = proc.stdout + (("\n" + proc.stderr) if proc.returncode else ""), proc.returncode
    except subprocess.TimeoutExpired as exc:
        # the partial output comes as bytes even with text=True
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        out, rc = f"timed out after {exc.timeout} s\n{partial}", -1
    s.ran, s.command, s.returncode, s.output = True, shlex.join(["python", *cmd[1:]]), rc, out
    s.elapsed_s = time.perf_counter() - t0
    if rc != 0:
        s.tally.failures = 1
    return s
