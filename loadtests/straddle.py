"""What a window straddling two stores costs: a 24 h panel of `increase(x[1h])` through
promaccel over one store, and over two stores whose holdings meet in the middle of the panel
(`old` holds everything until T, `new` since T - 30 min: the steps in (T, T + 30 min) have a
1 h window no store holds whole, so promaccel reads both stores' raw samples and evaluates
`increase` itself), beside direct Prometheus, side by side in one run.

    python -m loadtests.straddle [--data-dir .cache/bench/256x8x24h] [--rounds 5]

Both stores are the same Prometheus (the answers must be equal to direct; every answer is
compared). Cold: a different GPU per round (nothing cached); warm: the first panel again with
its end moved one step per round (a dashboard refresh). Prints median time and backend calls
per mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.compare import diff_answers
from loadtests.gen import BENCH_SPEC, iso_utc
from loadtests.load import build_tsdb, running_prometheus
from loadtests.services import Promaccel

ROOT = Path(__file__).resolve().parent.parent
QUERY = 'sum by (Hostname) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{gpu}"}}[1h]))'
STEP = 60


def _config(path: Path, prom_url: str, t: int | None) -> Path:
    if t is None:
        backends = [{"name": "local", "url": prom_url}]
    else:
        backends = [{"name": "new", "url": prom_url, "primary": True, "holds": {"since": iso_utc(t - 1800)}},
                    {"name": "old", "url": prom_url, "holds": {"until": iso_utc(t)}}]
    path.write_text(json.dumps({"backends": backends}))  # JSON is YAML
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "bench" / "256x8x24h")
    ap.add_argument("--shards", default="8")
    args = ap.parse_args(argv)
    spec = BENCH_SPEC
    build_tsdb(spec, str(args.data_dir))
    t = spec.start + (spec.end - spec.start) // 2
    t -= t % 3600
    work = Path(tempfile.mkdtemp(prefix="promaccel-straddle-"))
    flags = ["--split-interval", "1h", "--shards", args.shards]
    rows: dict[str, dict[str, list[float]]] = {}
    with running_prometheus(str(args.data_dir)) as prom:
        servers = {
            "one store": Promaccel.start(None, [*flags, "--config", str(_config(work / "one.yaml", prom.url, None))],
                                         work / "one"),
            "two stores, boundary mid-panel": Promaccel.start(
                None, [*flags, "--config", str(_config(work / "two.yaml", prom.url, t))], work / "two"),
        }
        try:
            modes = [("direct", prom.url), *((n, s.url) for n, s in servers.items())]
            with httpx.Client(timeout=300) as client:
                for phase in ("cold", "warm"):
                    for k in range(args.rounds):
                        gpu = k % spec.gpus_per_node if phase == "cold" else 0
                        end = spec.end - STEP * (k + 1 if phase == "warm" else 0)
                        form = {"query": QUERY.format(gpu=gpu), "start": str(end - 86_400 + STEP),
                                "end": str(end), "step": str(STEP)}
                        reference = None
                        for name, url in modes:
                            t0 = time.perf_counter()
                            r = client.post(url + "/api/v1/query_range", data=form)
                            ms = (time.perf_counter() - t0) * 1000
                            if r.status_code != 200:
                                raise RuntimeError(f"{name}: HTTP {r.status_code}: {r.text[:300]}")
                            if reference is None:
                                reference = r.json()
                            elif diff_answers(reference, r.json()):
                                raise RuntimeError(f"{name}: answer differs from direct: "
                                                   f"{diff_answers(reference, r.json())[:3]}")
                            row = rows.setdefault(name, {})
                            row.setdefault(f"{phase} ms", []).append(ms)
                            calls = r.headers.get("X-Promaccel-Backend-Calls")
                            if calls is not None:
                                row.setdefault(f"{phase} calls", []).append(float(calls))
        finally:
            for s in servers.values():
                s.stop()
    cols = ["cold ms", "cold calls", "warm ms", "warm calls"]
    print(f"boundary T = {iso_utc(t)}; {args.rounds} rounds per phase; medians; every answer equal to direct")
    print("| mode | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for name, row in rows.items():
        cells = [f"{statistics.median(row[c]):.0f}" if c in row else "-" for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
