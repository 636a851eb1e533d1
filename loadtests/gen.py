"""Synthetic GPU-fleet telemetry as OpenMetrics text for `promtool tsdb create-blocks-from`.

The fleet looks like what a Kubernetes GPU cluster scraped every 30 s produces:
dcgm-exporter (default metrics, Kubernetes pod mapping), node_exporter network counters and
kube-state-metrics, plus the `up` series Prometheus itself writes for each scrape target.
Output is deterministic (same `FleetSpec` -> same bytes), streamed, and can be cut into time
slices whose union is exactly the samples of the whole window.

Usage::

    python -m loadtests.gen --nodes 16 --gpus-per-node 4 --hours 6 --out fleet.om
    python -m loadtests.gen --hours 24 --slice-hours 2 --out DIR   # DIR/slice-000.om, ...
    python -m loadtests.gen --nodes 2 --gpus-per-node 2 --hours 0.5 --out - | head

Time
----
Samples lie in [end - hours, end). `end` defaults to DEFAULT_END = 1793491200 =
2026-11-01T00:00:00Z. Every scrape target has a fixed phase of 0..interval-1 whole seconds
(as Prometheus spreads targets), so target X scrapes at `start + phase_X + k * interval`;
sample times are not aligned to any query step grid. Timestamps are whole seconds.

Metrics and labels
------------------
dcgm-exporter, job="dcgm-exporter", instance="10.42.<n // 200>.<n % 200 + 20>:9400", one
series per GPU and per pod that ran on it; labels gpu ("0".."G-1"), UUID ("GPU-<uuid>"),
pci_bus_id ("00000000:18:00.0"...), device ("nvidia<gpu>"), modelName, Hostname
("gpu-node-0007"), and while a pod holds the GPU: namespace (team-llm, team-vision, research,
infra), pod, container. While no pod holds the GPU the series has no namespace/pod/container
labels (as dcgm-exporter does), so every job start or end ends one series and starts another.
  gauges   DCGM_FI_DEV_GPU_UTIL (0..100 int), DCGM_FI_DEV_MEM_COPY_UTIL (0..100 int),
           DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (MiB int; used + free + reserved = total),
           DCGM_FI_DEV_GPU_TEMP (C int), DCGM_FI_DEV_POWER_USAGE (W, 3 decimals),
           DCGM_FI_DEV_SM_CLOCK (MHz int), DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and
           DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio 0..1, 6 decimals),
           DCGM_FI_DEV_XID_ERRORS (last XID code: 0, or 13/31/43/48/79/94 on a few GPUs)
  counters DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since boot, int),
           DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (MB, int); both restart from 0 after a reboot.
           Their TYPE line says `unknown`: OpenMetrics wants counter samples named *_total.
node_exporter, job="node-exporter", instance="gpu-node-0007:9100":
  node_network_receive_bytes_total, node_network_transmit_bytes_total {device="eth0"|"ib0".."ib3"}
  (counters, reset on reboot), node_load1 (gauge, 2 decimals).
kube-state-metrics, job="kube-state-metrics", instance="10.43.0.15:8080":
  kube_pod_status_phase{namespace,pod,uid,phase} 0/1 for Pending/Running/Succeeded/Failed/
  Unknown, from pod creation (Pending up to 2 min before the GPU series appear) to a few
  minutes after it ends; kube_node_status_allocatable{node,resource,unit} for
  resource="nvidia_com_gpu" (unit "integer"; 0 while a node reboots), "cpu" ("core"),
  "memory" ("byte").
up{job,instance}: 1 per successful scrape, 0 per failed one (missed scrape, node down).

Shapes worth testing against (node roles are fixed, times depend only on the window)
-----------------------------------------------------------------------------------------
- gpu-node-0000: DCGM_FI_DEV_POWER_USAGE{gpu="0"} is NaN at scrape indices
  k = T*3//10, T//2, T//2+1, 7*T//10, 7*T//10+1 (T = scrapes in the window); its
  dcgm-exporter misses 6 scrapes from k = 6*T//10 (node-exporter keeps going); its last GPU
  reports XID 13 from k = T//5 for 60 scrapes.
- gpu-node-0001 reboots at 45% of the window (plus every node with n % 16 == 9 at a seeded
  time): ~5 min without dcgm/node-exporter samples (up == 0), counters restart from 0, the
  running pods end as Failed.
- gpu-node-0002 joins at 1/3 of the window; gpu-node-0003 leaves at 2/3 (pods Failed).
- Every target misses about 0.2% of its scrapes at random (up == 0 there).
- modelName: "NVIDIA H100 80GB HBM3"; "NVIDIA A100-SXM4-80GB" on nodes with n % 4 == 3;
  'NVIDIA H100 80GB HBM3 (MIG 3g.40gb)' on the last node and 'NVIDIA Graphics Device "ES\\B0"'
  (a double quote and a backslash) on the second-to-last (fleets of >= 3 nodes).
- Pod names contain dots (e.g. "qwen2.5-72b-pretrain-1a2b3-0", "jupyter-bob.smith-...").
- Backfilled data has no staleness markers: a series that ends stays visible to instant
  selectors for the lookback delta (5 min) after its last sample, in Prometheus too.

promtool 2.42 facts (checked): it accepts TYPE counter without `_total` and interleaved
families, and SILENTLY DROPS out-of-order or duplicate-timestamp samples (exit code 0), so the
loader compares promtool's sample count with `Stats.samples`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import math
import os
import sys
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import numpy as np

DEFAULT_END = 1793491200  # 2026-11-01T00:00:00Z
# Bump when the generated data changes, so cached TSDBs (loadtests.load manifests) rebuild.
GENERATOR_VERSION = 1

NAMESPACES = ("team-llm", "team-vision", "research", "infra")
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
XID_CODES = (13, 31, 43, 48, 79, 94)
NET_DEVICES = ("eth0", "ib0", "ib1", "ib2", "ib3")
PCI_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
KSM_INSTANCE = "10.43.0.15:8080"

MODEL_H100 = "NVIDIA H100 80GB HBM3"
MODEL_A100 = "NVIDIA A100-SXM4-80GB"
MODEL_DOTS = "NVIDIA H100 80GB HBM3 (MIG 3g.40gb)"
MODEL_QUOTE = 'NVIDIA Graphics Device "ES\\B0"'


@dataclass(frozen=True)
class FleetSpec:
    nodes: int = 16
    gpus_per_node: int = 4
    hours: float = 6.0
    scrape_interval: int = 30
    end: int = DEFAULT_END
    seed: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "hours", float(self.hours))
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be >= 1")
        if self.scrape_interval < 1:
            raise ValueError("scrape_interval must be >= 1 s")
        secs = self.hours * 3600
        if secs <= 0 or secs != int(secs) or int(secs) % self.scrape_interval:
            raise ValueError("hours * 3600 must be a positive multiple of scrape_interval")
        if not (10**9 <= self.end - secs and self.end < 10**10):
            raise ValueError("end must give 10-digit unix timestamps")

    @property
    def start(self) -> int:
        return self.end - int(self.hours * 3600)

    @property
    def n_scrapes(self) -> int:
        return int(self.hours * 3600) // self.scrape_interval

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> "FleetSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})  # type: ignore[arg-type]


CI_SPEC = FleetSpec(nodes=16, gpus_per_node=4, hours=6)
BENCH_SPEC = FleetSpec(nodes=256, gpus_per_node=8, hours=24)


@dataclass
class Stats:
    samples: int = 0
    series: int = 0
    bytes: int = 0

    def add(self, other: "Stats") -> None:
        self.samples += other.samples
        self.series += other.series
        self.bytes += other.bytes


# --------------------------------------------------------------------------- noise
# Values are functions of (seed, stream, row, scrape index) through a counter-based hash, so
# any time slice can be computed alone and gives the same numbers as the whole window.

_MASK = (1 << 64) - 1


def _mix_int(x: int) -> int:
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


class _Noise:
    def __init__(self, seed: int) -> None:
        self.seed = _mix_int(seed * 0x632BE59BD9B4E019 + 0x1234567)

    def _hash(self, stream: int, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        key = np.uint64(_mix_int(self.seed ^ (stream * 0xD6E8FEB86659FD93)))
        r = _mix(rows.astype(np.uint64) * _GOLDEN + key)
        x = r[:, None] + ks.astype(np.uint64)[None, :] * _M2
        return _mix(x)

    def uniform(self, stream: int, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        return (self._hash(stream, rows, ks) >> np.uint64(11)).astype(np.float64) * (2.0**-53)

    def normal(self, stream: int, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """Approximately standard normal (Irwin-Hall of 4 16-bit lanes)."""
        x = self._hash(stream, rows, ks)
        m = np.uint64(0xFFFF)
        s = (x & m).astype(np.float64)
        s += ((x >> np.uint64(16)) & m).astype(np.float64)
        s += ((x >> np.uint64(32)) & m).astype(np.float64)
        s += (x >> np.uint64(48)).astype(np.float64)
        return (s * (1.0 / 65536.0) - 2.0) * 1.7320508075688772


# --------------------------------------------------------------------------- formatting

def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels_text(pairs: list[tuple[str, str]]) -> bytes:
    return ("{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}").encode()


_TAIL_W = 11  # " " + 10 timestamp digits


def _ts_tail(ts: np.ndarray) -> np.ndarray:
    """(n, 11) uint8: b' ' followed by the 10 digits of each whole-second timestamp."""
    n = len(ts)
    out = np.empty((n, _TAIL_W), np.uint8)
    out[:, 0] = 32
    if n:
        if ts.min() < 10**9 or ts.max() >= 10**10:
            raise ValueError("timestamps must have 10 digits")
    x = ts.astype(np.int64)
    for j in range(_TAIL_W - 1, 0, -1):
        q = x // 10
        out[:, j] = x - q * 10 + 48
        x = q
    return out


def _format_lines(values: np.ndarray, decimals: int, tail: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Format samples as b"\\n<value> <ts>" each; returns the bytes and each line's length.

    Values are non-negative; NaN prints as NaN; `decimals` > 0 prints a fixed-point number
    with trailing zeros removed. Digit columns are computed with numpy, unused positions are
    NUL bytes, and one bytes.translate deletes them: no Python object per sample.
    """
    n = len(values)
    nan = np.isnan(values)
    has_nan = bool(nan.any())
    v = np.where(nan, 0.0, values) if has_nan else values
    if n and v.min() < 0:
        raise ValueError("negative values are not supported")
    scale = 10**decimals
    iv = np.rint(v * scale).astype(np.int64) if decimals else np.rint(v).astype(np.int64)
    ip = iv // scale if decimals else iv
    top = int(ip.max()) if n else 0
    wi = max(len(str(top)), 3 if has_nan else 1)
    wf = decimals + 1 if decimals else 0
    wv = wi + wf
    rows = np.zeros((n, 1 + wv + _TAIL_W), np.uint8)
    rows[:, 0] = 10
    nchar = np.ones(n, np.int64)
    x = ip.astype(np.uint32) if top < 2**32 else ip.copy()
    ten = x.dtype.type(10)
    for p in range(wi):
        col = 1 + wi - 1 - p
        q = x // ten
        d = (x - q * ten).astype(np.uint8) + np.uint8(48)
        if p == 0:
            rows[:, col] = d
        else:
            sig = ip >= 10**p
            nchar += sig
            rows[:, col] = d * sig
        x = q
    if decimals:
        fp = iv - ip * scale
        keep_any = fp != 0
        rows[:, 1 + wi] = np.uint8(46) * keep_any
        nchar += keep_any
        x = fp.copy()
        for p in range(decimals):  # p = 0 is the last fractional digit
            col = 1 + wi + decimals - p
            q = x // 10
            d = (x - q * 10).astype(np.uint8) + np.uint8(48)
            # a digit is kept unless it and every digit after it are zero
            keep = d != 48
            if p:
                keep |= fp % (10**p) != 0
            rows[:, col] = d * keep
            nchar += keep
            x = q
    if has_nan:
        idx = np.nonzero(nan)[0]
        rows[idx, 1 : 1 + wv] = 0
        rows[idx, 1 + wi - 3 : 1 + wi] = np.frombuffer(b"NaN", np.uint8)
        nchar[idx] = 3
    rows[:, 1 + wv :] = tail
    blob = rows.tobytes().translate(None, b"\0")
    return blob, nchar + (1 + _TAIL_W)


class _Writer:
    def __init__(self, fp: BinaryIO, keep: Callable[[str], bool] | None = None) -> None:
        self.fp = fp
        self.stats = Stats()
        self.tail_cache: tuple[int, np.ndarray] | None = None
        # Optional filter on sample metric names: a family's header is written only once a
        # kept series of it is (so a filtered document has no empty families).
        self.keep = keep
        self._pending: tuple[str, str, str] | None = None

    def header(self, name: str, mtype: str, help_: str) -> None:
        if self.keep is not None:
            self._pending = (name, mtype, help_)
            return
        self._header(name, mtype, help_)

    def _header(self, name: str, mtype: str, help_: str) -> None:
        b = f"\n# HELP {name} {help_}\n# TYPE {name} {mtype}".encode()
        if self.stats.bytes == 0:
            b = b[1:]
        self.fp.write(b)
        self.stats.bytes += len(b)

    def series(
        self,
        name: str,
        labelsets: list[bytes],
        bounds: np.ndarray,
        values: np.ndarray,
        decimals: int,
        ts: np.ndarray | None = None,
        tail: np.ndarray | None = None,
    ) -> None:
        """Write len(labelsets) series; series i owns samples bounds[i]:bounds[i+1]."""
        if len(values) == 0:
            return
        if self.keep is not None:
            if not self.keep(name):
                return
            if self._pending is not None:
                self._header(*self._pending)
                self._pending = None
        if tail is None:
            assert ts is not None
            tail = _ts_tail(ts)
        blob, lens = _format_lines(values, decimals, tail)
        offs = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        boffs = offs[bounds].tolist()
        nb = name.encode()
        w = self.fp.write
        nbytes = 0
        for i, ls in enumerate(labelsets):
            a, b = boffs[i], boffs[i + 1]
            if a == b:
                continue
            chunk = blob[a:b].replace(b"\n", b"\n" + nb + ls + b" ")
            w(chunk)
            nbytes += len(chunk)
        self.stats.bytes += nbytes
        self.stats.samples += len(values)
        self.stats.series += int(np.count_nonzero(np.diff(bounds)))

    def eof(self) -> None:
        b = b"\n# EOF\n" if self.stats.bytes else b"# EOF\n"
        self.fp.write(b)
        self.stats.bytes += len(b)


# --------------------------------------------------------------------------- fleet model

@dataclass(frozen=True)
class _Kind:
    ns: str
    stems: tuple[str, ...]
    container: str
    util: tuple[float, float]
    noise: float
    mem: tuple[float, float]
    tensor: tuple[float, float]
    memcopy: tuple[float, float]
    nvlink: float  # MB/s per GPU when the pod spans >1 GPU
    net: float  # bytes/s per GPU over InfiniBand
    dur_min: tuple[float, float, float]  # median, min, max (minutes)
    dips: bool


_KINDS: dict[str, tuple[_Kind, ...]] = {
    "team-llm": (
        _Kind("team-llm", ("llama3-70b-pretrain", "mixtral-8x7b-pretrain", "qwen2.5-72b-pretrain"),
              "pytorch", (86, 98), 2.5, (0.85, 0.97), (0.35, 0.6), (0.25, 0.45), 45000, 6e9,
              (240, 60, 600), True),
        _Kind("team-llm", ("llama3-8b-sft", "qwen2.5-7b-sft", "mistral-7b-v0.3-sft"),
              "pytorch", (70, 95), 4.0, (0.6, 0.9), (0.25, 0.5), (0.2, 0.4), 20000, 2e9,
              (120, 30, 360), True),
        _Kind("team-llm", ("vllm-llama3-70b", "vllm-qwen2.5-32b", "tgi-mistral-7b"),
              "vllm", (25, 70), 12.0, (0.88, 0.93), (0.1, 0.3), (0.3, 0.6), 8000, 2e7,
              (180, 30, 720), False),
    ),
    "team-vision": (
        _Kind("team-vision", ("vit-h14-train", "sam2-finetune", "yolov8x-train"),
              "pytorch", (75, 96), 5.0, (0.4, 0.8), (0.15, 0.4), (0.3, 0.5), 15000, 1e9,
              (150, 30, 480), True),
        _Kind("team-vision", ("clip-embed-serve", "sam2-serve"),
              "server", (15, 55), 10.0, (0.2, 0.5), (0.05, 0.2), (0.1, 0.3), 0, 1e7,
              (200, 30, 720), False),
    ),
    "research": (
        _Kind("research", ("exp-rlhf-ppo", "exp-moe-router", "exp-flashattn3-bench"),
              "trainer", (40, 90), 8.0, (0.3, 0.95), (0.1, 0.5), (0.1, 0.4), 12000, 5e8,
              (60, 30, 240), True),
        _Kind("research", ("jupyter-alice", "jupyter-bob.smith", "jupyter-chen.w"),
              "notebook", (2, 25), 6.0, (0.05, 0.5), (0.0, 0.08), (0.0, 0.1), 0, 1e6,
              (90, 30, 300), False),
    ),
    "infra": (
        _Kind("infra", ("gpu-burnin",), "dcgmproftester", (99, 100), 0.5, (0.9, 0.95),
              (0.8, 0.95), (0.5, 0.7), 0, 0, (35, 30, 45), False),
        _Kind("infra", ("nccl-allreduce-test",), "nccl-tests", (60, 80), 5.0, (0.3, 0.4),
              (0.0, 0.05), (0.4, 0.6), 150000, 2e10, (32, 30, 40), False),
    ),
}
_NS_WEIGHTS = (0.40, 0.25, 0.25, 0.10)
_KIND_WEIGHTS = {"team-llm": (0.4, 0.3, 0.3), "team-vision": (0.7, 0.3),
                 "research": (0.6, 0.4), "infra": (0.5, 0.5)}


@dataclass(frozen=True)
class _Model:
    name: str
    fb_total: int
    fb_reserved: int
    idle_w: float
    max_w: float
    sm_max: int
    sm_idle: int
    temp_gain: float


_MODELS = {
    MODEL_H100: _Model(MODEL_H100, 81559, 538, 70.0, 700.0, 1980, 345, 0.48),
    MODEL_A100: _Model(MODEL_A100, 81920, 562, 58.0, 400.0, 1410, 210, 0.40),
    MODEL_DOTS: _Model(MODEL_DOTS, 81559, 538, 70.0, 700.0, 1980, 345, 0.48),
    MODEL_QUOTE: _Model(MODEL_QUOTE, 97871, 612, 80.0, 750.0, 1980, 345, 0.50),
}

_COOL_K = 60  # scrapes after a pod ends until the GPU is back at idle temperature

# noise streams
_S_UTIL, _S_POW, _S_TEMP, _S_MEMCOPY, _S_FB, _S_GR, _S_TENSOR, _S_NVL, _S_NET, _S_LOAD, _S_MISS = range(11)


def _split_groups(rng: np.random.Generator, n: int) -> list[int]:
    """Random partition of n GPUs into contiguous groups (one pod at a time per group)."""
    if n == 1 or rng.random() < 0.6:
        return [n]
    h = n // 2
    return _split_groups(rng, h) + _split_groups(rng, n - h)


class Fleet:
    """The whole fleet's topology and schedule; cheap (no per-sample arrays)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        s = spec
        self.start, self.end, self.iv, self.T = s.start, s.end, s.scrape_interval, s.n_scrapes
        N, G, T, W = s.nodes, s.gpus_per_node, self.T, self.end - self.start
        self.noise = _Noise(s.seed)
        rng = np.random.default_rng([s.seed, 0x5EED])

        # ---- nodes
        self.hostnames = [f"gpu-node-{n:04d}" for n in range(N)]
        self.ips = [f"10.42.{n // 200}.{n % 200 + 20}" for n in range(N)]
        models = []
        for n in range(N):
            m = MODEL_A100 if n % 4 == 3 else MODEL_H100
            if N >= 2 and n == N - 1:
                m = MODEL_DOTS
            elif N >= 3 and n == N - 2:
                m = MODEL_QUOTE
            models.append(m)
        self.node_model = models
        self.cpu = [190 if _MODELS[m].max_w > 500 else 126 for m in models]
        self.mem_bytes = [2_015_000_000_000 if c == 190 else 1_031_000_000_000 for c in self.cpu]
        self.phase_dcgm = rng.integers(0, self.iv, N)
        self.phase_node = rng.integers(0, self.iv, N)
        self.phase_ksm = int(rng.integers(0, self.iv))
        self.join = np.full(N, self.start - 3600, np.int64)
        self.leave = np.full(N, self.end + 3600, np.int64)
        if N >= 3:
            self.join[2] = self.start + W // 3
        if N >= 4:
            self.leave[3] = self.start + 2 * W // 3
        self.reboots: list[list[tuple[int, int]]] = [[] for _ in range(N)]
        for n in range(N):
            if (n == 1) or (n % 16 == 9):
                if n == 1:
                    down = self.start + int(W * 0.45)
                else:
                    down = self.start + int(W * rng.uniform(0.15, 0.85))
                down = max(down, int(self.join[n]) + 600)
                up = down + int(rng.integers(240, 420))
                if up < min(self.end, int(self.leave[n])):
                    self.reboots[n].append((down, up))

        # ---- GPUs
        ng = N * G
        self.G = G
        self.gpu_node = np.repeat(np.arange(N), G)
        self.gpu_idx = np.tile(np.arange(G), N)
        self.uuids = []
        for g in range(ng):
            h = "%032x" % (_mix_int(s.seed * 1000003 + g) << 64 | _mix_int(g * 7919 + s.seed + 17))
            self.uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
        self.pci = [
            f"00000000:{PCI_BUS[i]}:00.0" if i < len(PCI_BUS) else f"00000000:{0xc0 + i:02x}:00.0"
            for i in self.gpu_idx.tolist()
        ]
        gm = [_MODELS[models[n]] for n in self.gpu_node.tolist()]
        self.fb_total = np.array([m.fb_total for m in gm], np.float64)
        self.fb_reserved = np.array([m.fb_reserved for m in gm], np.float64)
        self.idle_w = np.array([m.idle_w for m in gm]) + rng.uniform(-3, 5, ng)
        self.max_w = np.array([m.max_w for m in gm])
        self.sm_max = np.array([m.sm_max for m in gm], np.float64)
        self.sm_idle = np.array([m.sm_idle for m in gm], np.float64)
        self.temp_gain = np.array([m.temp_gain for m in gm])
        self.temp_idle = rng.uniform(27, 36, ng)
        self.energy_base = rng.uniform(5e9, 9e11, ng).round()
        self.nvlink_base = rng.uniform(1e6, 5e9, ng).round()

        # ---- XID events (gpu, k_from, k_to, code), in dcgm scrape indices
        self.xid: list[tuple[int, int, int, int]] = []
        if T >= 5:
            k0 = T // 5
            self.xid.append((G - 1, k0, min(T, k0 + 60), 13))
        p_evt = min(0.5, 0.03 * W / 86400 + 0.01)
        for g in range(ng):
            if rng.random() < p_evt:
                code = int(rng.choice(XID_CODES, p=(0.25, 0.30, 0.15, 0.05, 0.10, 0.15)))
                ka = int(rng.integers(0, T))
                self.xid.append((g, ka, min(T, ka + int(rng.integers(20, 240))), code))

        # ---- NaN samples and the dcgm-exporter restart gap on node 0
        self.nan_gpu = 0
        self.nan_ks = sorted({T * 3 // 10, T // 2, T // 2 + 1, 7 * T // 10, 7 * T // 10 + 1} & set(range(T)))
        self.gap_node = 0
        self.gap_ks = (6 * T // 10, min(T, 6 * T // 10 + 6))

        self._build_jobs(rng)
        self._build_presence()
        self._label_cache: dict[tuple[int, int], bytes] = {}

    # ---- time <-> scrape index
    def kceil(self, t: np.ndarray | int, phase: np.ndarray | int) -> np.ndarray:
        """First scrape index whose time is >= t, clipped to [0, T]."""
        x = np.asarray(t, np.int64) - self.start - np.asarray(phase, np.int64)
        return np.clip(-((-x) // self.iv), 0, self.T)

    def _build_jobs(self, rng: np.random.Generator) -> None:
        s = self.spec
        N = s.nodes
        rec: dict[str, list] = {k: [] for k in (
            "node", "g0", "ng", "t_create", "t_run", "t_end", "t_delete", "failed", "ns", "pod",
            "container", "uid", "util", "noise", "mem", "tensor", "memcopy", "nvlink", "net",
            "dip_period", "dip_len", "startup", "wave_amp", "wave_period", "wave_phase")}
        seq = 0
        for n in range(N):
            groups = _split_groups(rng, self.G)
            g0 = n * self.G
            join, leave = int(self.join[n]), int(self.leave[n])
            stop = min(self.end, leave)
            blocked = self.reboots[n]
            for size in groups:
                if join < self.start:
                    t = self.start - int(rng.uniform(0, 8 * 3600))
                else:
                    t = join + int(rng.integers(60, 900))
                while t < stop:
                    nsi = int(rng.choice(4, p=_NS_WEIGHTS))
                    ns = NAMESPACES[nsi]
                    kind = _KINDS[ns][int(rng.choice(len(_KINDS[ns]), p=_KIND_WEIGHTS[ns]))]
                    med, lo, hi = kind.dur_min
                    dur = int(60 * min(hi, max(lo, med * math.exp(rng.normal(0, 0.5)))))
                    t_create = t
                    t_run = t + int(rng.integers(5, 121))
                    t_end = t_run + dur
                    failed = rng.random() < 0.12
                    t_next = None  # set when a reboot decides when the next pod comes
                    postponed = False
                    for down, up in blocked:
                        if t_create < up and t_end > down:
                            t_next = up + int(rng.integers(60, 600))
                            if t_run >= down:  # the pod could not start: retry after the reboot
                                postponed = True
                            else:  # the reboot kills the running pod
                                t_end, failed = down, True
                            break
                    if postponed:
                        assert t_next is not None
                        t = t_next
                        continue
                    if t_end > leave:
                        t_end, failed = leave, True
                    t_delete = t_end + int(rng.integers(60, 600))
                    if t_end > leave - 1 and leave < self.end:
                        t_delete = leave + 30
                    stem = kind.stems[int(rng.integers(len(kind.stems)))]
                    suffix = "%05x" % ((seq * 0x9E3779B1 + s.seed * 0x85EBCA6B) & 0xFFFFF)
                    pod = f"{stem}-{suffix}-{int(rng.integers(0, 4)) if size == self.G else 0}"
                    seq += 1
                    if t_delete > self.start:
                        r = rec
                        r["node"].append(n)
                        r["g0"].append(g0)
                        r["ng"].append(size)
                        r["t_create"].append(t_create)
                        r["t_run"].append(t_run)
                        r["t_end"].append(t_end)
                        r["t_delete"].append(t_delete)
                        r["failed"].append(failed)
                        r["ns"].append(ns)
                        r["pod"].append(pod)
                        r["container"].append(kind.container)
                        h = "%032x" % (_mix_int(seq * 31 + s.seed) << 64 | _mix_int(seq + 99 * s.seed))
                        r["uid"].append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
                        r["util"].append(rng.uniform(*kind.util))
                        r["noise"].append(kind.noise)
                        r["mem"].append(rng.uniform(*kind.mem))
                        r["tensor"].append(rng.uniform(*kind.tensor))
                        r["memcopy"].append(rng.uniform(*kind.memcopy))
                        r["nvlink"].append(kind.nvlink * rng.uniform(0.7, 1.2) if size > 1 else 0.0)
                        r["net"].append(kind.net * rng.uniform(0.5, 1.2))
                        r["dip_period"].append(int(rng.integers(40, 120)) if kind.dips else 10**9)
                        r["dip_len"].append(int(rng.integers(2, 5)) if kind.dips else 0)
                        r["startup"].append(int(rng.integers(2, 12)))
                        r["wave_amp"].append(rng.uniform(0, 4))
                        r["wave_period"].append(rng.uniform(600, 3600))
                        r["wave_phase"].append(rng.uniform(0, 2 * math.pi))
                    gap = 0 if rng.random() < 0.3 else int(min(3 * 3600, rng.exponential(20 * 60)))
                    t = t_next if t_next is not None else t_end + gap
        self.n_jobs = len(rec["node"])
        ii = lambda k: np.array(rec[k], np.int64)  # noqa: E731
        self.job_node, self.job_g0, self.job_ng = ii("node"), ii("g0"), ii("ng")
        self.job_t_create, self.job_t_run = ii("t_create"), ii("t_run")
        self.job_t_end, self.job_t_delete = ii("t_end"), ii("t_delete")
        self.job_failed = np.array(rec["failed"], bool)
        self.job_ns, self.job_pod, self.job_container, self.job_uid = (
            rec["ns"], rec["pod"], rec["container"], rec["uid"])

        # per-job parameters with one trailing "idle" entry, so index -1 means no pod
        def p(k: str, idle: float, dtype: type = np.float64) -> np.ndarray:
            return np.array(rec[k] + [idle], dtype)

        self.p_util, self.p_noise, self.p_mem = p("util", 0), p("noise", 0), p("mem", 0)
        self.p_tensor, self.p_memcopy = p("tensor", 0), p("memcopy", 0)
        self.p_nvlink, self.p_net = p("nvlink", 0), p("net", 0)
        self.p_dip_period = p("dip_period", 10**9, np.int64)
        self.p_dip_len, self.p_startup = p("dip_len", 0, np.int64), p("startup", 0, np.int64)
        self.p_wave_amp, self.p_wave_period = p("wave_amp", 0), p("wave_period", 1000)
        self.p_wave_phase = p("wave_phase", 0)
        ph = self.phase_dcgm[self.job_node] if self.n_jobs else np.zeros(0, np.int64)
        self.job_ka = self.kceil(self.job_t_run, ph)
        self.job_kb = self.kceil(self.job_t_end, ph)

    def _build_presence(self) -> None:
        """Per target and scrape: exists (in service discovery) and scraped OK."""
        N, T = self.spec.nodes, self.T
        ks = np.arange(T)

        def node_masks(phase: np.ndarray, stream: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            t = self.start + phase[:, None] + ks[None, :] * self.iv
            exists = (t >= self.join[:, None]) & (t < self.leave[:, None])
            on = exists.copy()
            for n in range(N):
                for down, up in self.reboots[n]:
                    on[n] &= ~((t[n] >= down) & (t[n] < up))
            miss = self.noise.uniform(_S_MISS + stream, np.arange(N), ks) < 0.002
            return exists, on, on & ~miss

        self.dcgm_exists, self.gpu_on, self.dcgm_ok = node_masks(self.phase_dcgm, 0)
        self.node_exists, self.node_on, self.node_ok = node_masks(self.phase_node, 100)
        a, b = self.gap_ks
        self.dcgm_ok[self.gap_node, a:b] = False
        # the NaN samples must exist: no random miss on them
        nan_node = int(self.gpu_node[self.nan_gpu])
        self.dcgm_ok[nan_node, self.nan_ks] = self.gpu_on[nan_node, self.nan_ks]
        self.ksm_ok = self.noise.uniform(_S_MISS + 200, np.arange(1), ks)[0] >= 0.002

    # ---- scrape-index windows for a time slice
    def krange(self, phase: np.ndarray | int, t_from: int, t_to: int) -> tuple[np.ndarray, np.ndarray]:
        return self.kceil(t_from, phase), self.kceil(t_to, phase)

    # ---- per-GPU state
    def _assign(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """J: job index or -1 for every (gpu, k in [k0, k1)); S: that job's first k."""
        ng = self.spec.nodes * self.G
        J = np.full((ng, k1 - k0), -1, np.int64)
        S = np.zeros((ng, k1 - k0), np.int64)
        if self.n_jobs:
            ka, kb = self.job_ka, self.job_kb
            for j in np.nonzero((ka < k1) & (kb > k0) & (ka < kb))[0].tolist():
                a, b = max(int(ka[j]), k0) - k0, min(int(kb[j]), k1) - k0
                g0, g1 = int(self.job_g0[j]), int(self.job_g0[j] + self.job_ng[j])
                J[g0:g1, a:b] = j
                S[g0:g1, a:b] = ka[j]
        return J, S

    def _util_power(self, k0: int, k1: int) -> dict[str, np.ndarray]:
        J, S = self._assign(k0, k1)
        gi = np.arange(self.spec.nodes * self.G)
        ks = np.arange(k0, k1)
        kk = ks[None, :]
        idle = J < 0
        dk = kk - S
        lvl = self.p_util[J]
        t_s = (self.start + kk * self.iv).astype(np.float64)
        wave = self.p_wave_amp[J] * np.sin(2 * np.pi * t_s / self.p_wave_period[J] + self.p_wave_phase[J])
        nz = self.noise.normal(_S_UTIL, gi, ks)
        util = lvl + wave + nz * self.p_noise[J]
        startup = dk < self.p_startup[J]
        dip = ((dk % self.p_dip_period[J]) < self.p_dip_len[J]) & ~startup
        util = np.where(dip, lvl * 0.25 + 2 * nz, util)
        util = np.where(startup, 5 + 2 * nz, util)
        util = np.clip(np.rint(util), 0, 100)
        util[idle] = 0
        pw_n = self.noise.normal(_S_POW, gi, ks)
        span = (self.max_w * 0.92 - self.idle_w)[:, None]
        power = self.idle_w[:, None] + span * (util / 100.0) ** 1.25 + np.where(idle, 1.2, 6.0) * pw_n
        power = np.round(np.maximum(power, 20.0), 3)
        return {"J": J, "S": S, "util": util, "power": power, "idle": idle, "dk": dk, "ks": ks}

    def _prev_jobs(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """For idle cells: the previous job on the GPU (or -1) and the k it ended."""
        ng = self.spec.nodes * self.G
        P = np.full((ng, k1 - k0), -1, np.int64)
        E = np.zeros((ng, k1 - k0), np.int64)
        if self.n_jobs:
            kb = self.job_kb
            sel = np.nonzero((kb >= k0 - _COOL_K) & (kb < k1) & (self.job_ka < kb))[0]
            for j in sel[np.argsort(kb[sel], kind="stable")].tolist():
                a = max(int(kb[j]), k0) - k0
                g0, g1 = int(self.job_g0[j]), int(self.job_g0[j] + self.job_ng[j])
                P[g0:g1, a:] = j
                E[g0:g1, a:] = kb[j]
        return P, E

    def _counter(self, incr: np.ndarray, base: np.ndarray, resets: list[tuple[int, int]],
                 rows_of_node: np.ndarray) -> np.ndarray:
        """Cumulative counter from k = 0 with restarts from 0 at each (node, k) reset."""
        C = np.cumsum(incr, axis=1)
        V = C + base[:, None]
        for n, kr in sorted(resets, key=lambda x: x[1]):
            if 0 < kr < C.shape[1]:
                rows = np.nonzero(rows_of_node == n)[0]
                V[rows, kr:] = C[rows, kr:] - C[rows, kr - 1 : kr]
        return np.floor(V)

    def _resets(self, phase: np.ndarray) -> list[tuple[int, int]]:
        out = []
        for n, rb in enumerate(self.reboots):
            for _down, up in rb:
                out.append((n, int(self.kceil(up, phase[n]))))
        return out

    # ---- labels
    def dcgm_labels(self, g: int, j: int) -> bytes:
        n = int(self.gpu_node[g])
        i = int(self.gpu_idx[g])
        pairs = [("gpu", str(i)), ("UUID", self.uuids[g]), ("pci_bus_id", self.pci[g]),
                 ("device", f"nvidia{i}"), ("modelName", self.node_model[n]),
                 ("Hostname", self.hostnames[n])]
        if j >= 0:
            pairs += [("container", self.job_container[j]), ("namespace", self.job_ns[j]),
                      ("pod", self.job_pod[j])]
        pairs += [("instance", f"{self.ips[n]}:9400"), ("job", "dcgm-exporter")]
        return labels_text(pairs)

    # ---- output
    def write(self, fp: BinaryIO, t_from: int | None = None, t_to: int | None = None, *,
              keep: Callable[[str], bool] | None = None) -> Stats:
        """Write one OpenMetrics document with the samples whose time is in [t_from, t_to)
        (and, with `keep`, only the series whose metric name it accepts)."""
        a = self.start if t_from is None else max(int(t_from), self.start)
        b = self.end if t_to is None else min(int(t_to), self.end)
        w = _Writer(fp, keep)
        if a < b:
            self._write_dcgm(w, a, b)
            self._write_node(w, a, b)
            self._write_ksm(w, a, b)
            self._write_up(w, a, b)
        w.eof()
        return w.stats

    def _write_dcgm(self, w: _Writer, a: int, b: int) -> None:
        N, G = self.spec.nodes, self.G
        ng = N * G
        klo, khi = self.krange(self.phase_dcgm, a, b)
        k0, k1 = int(klo.min()), int(khi.max())
        if k1 <= k0:
            return
        K = k1 - k0
        full = self._util_power(0, k1)  # counters need the whole history up to k1
        st = {k: (v[:, k0:] if isinstance(v, np.ndarray) and v.ndim == 2 else v) for k, v in full.items()}
        st["ks"] = full["ks"][k0:]
        gi = np.arange(ng)
        ks = st["ks"]
        kk = ks[None, :]
        gn = self.gpu_node
        # which cells are emitted: scrape ok and inside this slice for the node's phase
        valid = self.dcgm_ok[gn][:, k0:k1] & (kk >= klo[gn][:, None]) & (kk < khi[gn][:, None])
        gidx, cidx = np.nonzero(valid)
        if len(gidx) == 0:
            return
        J = st["J"]
        jv = J[gidx, cidx]
        order = np.lexsort((cidx, jv, gidx))
        gidx, cidx, jv = gidx[order], cidx[order], jv[order]
        brk = np.nonzero((np.diff(gidx) != 0) | (np.diff(jv) != 0))[0] + 1
        bounds = np.concatenate([[0], brk, [len(gidx)]])
        cache = self._label_cache
        labelsets = []
        for g, j in zip(gidx[bounds[:-1]].tolist(), jv[bounds[:-1]].tolist()):
            key = (g, j)
            ls = cache.get(key)
            if ls is None:
                ls = cache[key] = self.dcgm_labels(g, j)
            labelsets.append(ls)
        ts = self.start + self.phase_dcgm[gn[gidx]] + (cidx + k0) * self.iv
        tail = _ts_tail(ts)

        util, power, idle, dk = st["util"], st["power"], st["idle"], st["dk"]
        gr_n = self.noise.normal(_S_GR, gi, ks)

        def emit(name: str, mtype: str, help_: str, m: np.ndarray, dec: int) -> None:
            w.header(name, mtype, help_)
            w.series(name, labelsets, bounds, m[gidx, cidx], dec, tail=tail)

        emit("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", util, 0)
        mc = util * self.p_memcopy[J] + 2.0 * self.noise.normal(_S_MEMCOPY, gi, ks)
        mc = np.clip(np.rint(mc), 0, 100)
        mc[idle] = 0
        emit("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", mc, 0)
        del mc
        fb_cap = (self.fb_total - self.fb_reserved)[:, None]
        fb = self.p_mem[J] * self.fb_total[:, None] * np.minimum(1.0, (dk + 1) / 4.0)
        fb = np.clip(np.rint(fb + 40.0 * self.noise.normal(_S_FB, gi, ks)), 0, fb_cap)
        fb[idle] = 0
        emit("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", fb, 0)
        emit("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", fb_cap - fb, 0)
        del fb
        # temperature follows the pod's load with a lag, and cools down after it ends
        P, E = self._prev_jobs(k0, k1)
        t_idle = self.temp_idle[:, None]
        gain = self.temp_gain[:, None]
        target = t_idle + gain * self.p_util[J]
        hot = t_idle + (target - t_idle) * (1 - np.exp(-dk / 6.0))
        prev_target = t_idle + gain * self.p_util[P]
        # exactly cooled after _COOL_K scrapes, so a slice needs no older history
        since = kk - E
        decay = np.where(since > _COOL_K, 0.0, np.exp(-np.minimum(since, _COOL_K) / 8.0))
        cool = t_idle + (prev_target - t_idle) * decay
        temp = np.where(idle, cool, hot) + 0.7 * self.noise.normal(_S_TEMP, gi, ks)
        temp = np.rint(np.clip(temp, 20, 95))
        del P, E, hot, cool, target, prev_target
        emit("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", temp, 0)
        del temp
        pw = power.copy()
        nan_rows = self.nan_gpu
        for k in self.nan_ks:
            if k0 <= k < k1:
                pw[nan_rows, k - k0] = np.nan
        emit("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", pw, 3)
        del pw
        throttle = np.maximum(0.0, power - 0.85 * self.max_w[:, None]) / 10.0
        sm = self.sm_max[:, None] - 15.0 * np.floor(throttle)
        sm = np.where(idle | (dk < self.p_startup[J]) & (util < 10), self.sm_idle[:, None], sm)
        emit("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", sm, 0)
        del sm, throttle
        gr = np.clip(util / 100.0 * 0.97 + 0.01 * gr_n, 0.0, 1.0)
        gr[idle] = 0.0
        tensor = np.clip(gr * self.p_tensor[J] + 0.004 * gr_n, 0.0, 1.0)
        tensor[idle] = 0.0
        emit("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
             "Ratio of cycles the tensor (HMMA) pipe is active.", np.round(tensor, 6), 6)
        emit("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
             "Ratio of time the graphics engine is active.", np.round(gr, 6), 6)
        del tensor, gr
        xid = np.zeros((ng, K))
        for g, xa, xb, code in self.xid:
            lo, hi = max(xa, k0), min(xb, k1)
            if lo < hi:
                xid[g, lo - k0 : hi - k0] = code
        emit("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", xid, 0)
        del xid

        on = self.gpu_on[gn][:, :k1]
        resets = self._resets(self.phase_dcgm)
        energy = self._counter(full["power"] * (self.iv * 1000.0) * on, self.energy_base, resets, gn)
        emit("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "unknown",
             "Total energy consumption since boot (in mJ).", energy[:, k0:], 0)
        del energy
        Jf = full["J"]
        nv_rate = self.p_nvlink[Jf] * (full["util"] / 100.0)
        nv_rate *= np.maximum(0.0, 1 + 0.15 * self.noise.normal(_S_NVL, gi, full["ks"]))
        nv_rate += 0.5  # background link traffic
        nv = self._counter(nv_rate * self.iv * on, self.nvlink_base, resets, gn)
        emit("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "unknown",
             "Total number of NVLink bandwidth counters for all lanes.", nv[:, k0:], 0)

    def _node_activity(self, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """Busy GPUs and InfiniBand bytes/s per node for k in [0, k1) on node-exporter's grid."""
        N = self.spec.nodes
        busy = np.zeros((N, k1))
        ib = np.zeros((N, k1))
        if self.n_jobs:
            ph = self.phase_node[self.job_node]
            ka, kb = self.kceil(self.job_t_run, ph), self.kceil(self.job_t_end, ph)
            for j in np.nonzero((ka < k1) & (ka < kb))[0].tolist():
                n, a, b = int(self.job_node[j]), int(ka[j]), min(int(kb[j]), k1)
                busy[n, a:b] += self.job_ng[j]
                ib[n, a:b] += self.job_ng[j] * self.p_net[j] * (self.p_util[j] / 100.0)
        return busy, ib

    def _write_node(self, w: _Writer, a: int, b: int) -> None:
        N, nd = self.spec.nodes, len(NET_DEVICES)
        klo, khi = self.krange(self.phase_node, a, b)
        k0, k1 = int(klo.min()), int(khi.max())
        if k1 <= k0:
            return
        busy, ib = self._node_activity(k1)
        ks = np.arange(k1)
        nodes = np.arange(N)
        kw = ks[None, k0:]
        valid = self.node_ok[:, k0:k1] & (kw >= klo[:, None]) & (kw < khi[:, None])
        nidx, cidx = np.nonzero(valid)  # node-major, then time
        nb = np.bincount(nidx, minlength=N)
        node_bounds = np.concatenate([[0], np.cumsum(nb)])
        ts = self.start + self.phase_node[nidx] + (cidx + k0) * self.iv
        tail = _ts_tail(ts)
        # counter rows are (node, device), node-major; each row takes its node's samples
        rows_node = np.repeat(nodes, nd)
        rows_dev = np.tile(np.arange(nd), N)
        pick = np.concatenate([np.tile(np.arange(node_bounds[n], node_bounds[n + 1]), nd) for n in range(N)])
        row_of_sample = np.repeat(np.arange(N * nd), np.repeat(nb, nd))
        bounds = np.concatenate([[0], np.cumsum(np.repeat(nb, nd))])
        col_of_sample = cidx[pick] + k0
        tail_rows = tail[pick]
        on = self.node_on[:, :k1][rows_node]
        resets = self._resets(self.phase_node)
        base_rng = np.random.default_rng([self.spec.seed, 0xE7])
        eth = {"rx": base_rng.uniform(2e6, 2e7, N), "tx": base_rng.uniform(1e6, 8e6, N)}
        for stream, (d, fam) in enumerate((("rx", "node_network_receive_bytes"),
                                           ("tx", "node_network_transmit_bytes"))):
            rate = np.where(rows_dev[:, None] == 0,
                            eth[d][rows_node][:, None] * (1 + 0.05 * busy[rows_node]),
                            ib[rows_node] / (nd - 1))
            nz = self.noise.normal(_S_NET + 10 * stream, np.arange(N * nd), ks)
            incr = np.maximum(0.0, rate * (1 + 0.2 * nz)) * self.iv * on
            base = np.random.default_rng([self.spec.seed, 0xB0 + stream]).uniform(1e9, 5e13, N * nd).round()
            val = self._counter(incr, base, resets, rows_node)
            labelsets = [labels_text([("device", NET_DEVICES[dv]), ("instance", f"{self.hostnames[n]}:9100"),
                                      ("job", "node-exporter")]) for n in range(N) for dv in range(nd)]
            what = "receive" if d == "rx" else "transmit"
            w.header(fam, "counter", f"Network device statistic {what}_bytes.")
            w.series(fam + "_total", labelsets, bounds, val[row_of_sample, col_of_sample], 0, tail=tail_rows)
        load = busy[:, k0:k1] * 1.3 + 0.4 + 0.6 * np.abs(self.noise.normal(_S_LOAD, nodes, ks[k0:k1]))
        load = np.round(load, 2)
        labelsets = [labels_text([("instance", f"{self.hostnames[n]}:9100"), ("job", "node-exporter")])
                     for n in range(N)]
        w.header("node_load1", "gauge", "1m load average.")
        w.series("node_load1", labelsets, node_bounds, load[nidx, cidx], 2, tail=tail)

    def _write_ksm(self, w: _Writer, a: int, b: int) -> None:
        N, G = self.spec.nodes, self.G
        ph = self.phase_ksm
        k0, k1 = (int(x) for x in self.krange(ph, a, b))
        if k1 <= k0:
            return
        inst = ("instance", KSM_INSTANCE)
        job = ("job", "kube-state-metrics")
        ok = np.nonzero(self.ksm_ok[k0:k1])[0] + k0
        # pods
        labelsets: list[bytes] = []
        vals: list[np.ndarray] = []
        tss: list[np.ndarray] = []
        if self.n_jobs:
            kc = self.kceil(self.job_t_create, ph)
            kd = self.kceil(self.job_t_delete, ph)
            kr = self.kceil(self.job_t_run, ph)
            ke = self.kceil(self.job_t_end, ph)
            for j in np.nonzero((kc < k1) & (kd > k0) & (kc < kd))[0].tolist():
                lo, hi = np.searchsorted(ok, [max(int(kc[j]), k0), min(int(kd[j]), k1)])
                kk = ok[lo:hi]
                if len(kk) == 0:
                    continue
                code = np.where(kk < kr[j], 0, np.where(kk < ke[j], 1, 3 if self.job_failed[j] else 2))
                t = self.start + ph + kk * self.iv
                for pi, phase in enumerate(PHASES):
                    labelsets.append(labels_text([("namespace", self.job_ns[j]), ("pod", self.job_pod[j]),
                                                  ("uid", self.job_uid[j]), ("phase", phase), inst, job]))
                    vals.append((code == pi).astype(np.float64))
                    tss.append(t)
        w.header("kube_pod_status_phase", "gauge", "The pods current phase.")
        if vals:
            bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
            w.series("kube_pod_status_phase", labelsets, bounds, np.concatenate(vals), 0, ts=np.concatenate(tss))
        # nodes
        labelsets, vals, tss = [], [], []
        t_ok = self.start + ph + ok * self.iv
        for n in range(N):
            m = (t_ok >= self.join[n]) & (t_ok < self.leave[n])
            if not m.any():
                continue
            t = t_ok[m]
            gpus = np.full(len(t), float(G))
            for down, up in self.reboots[n]:
                gpus[(t >= down) & (t < up + 120)] = 0.0
            for res, unit, v in (("nvidia_com_gpu", "integer", gpus), ("cpu", "core", float(self.cpu[n])),
                                 ("memory", "byte", float(self.mem_bytes[n]))):
                labelsets.append(labels_text([("node", self.hostnames[n]), ("resource", res),
                                              ("unit", unit), inst, job]))
                vals.append(np.broadcast_to(np.asarray(v, np.float64), t.shape).copy())
                tss.append(t)
        w.header("kube_node_status_allocatable", "gauge", "The allocatable for different resources of a node.")
        if vals:
            bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
            w.series("kube_node_status_allocatable", labelsets, bounds, np.concatenate(vals), 0,
                     ts=np.concatenate(tss))

    def _write_up(self, w: _Writer, a: int, b: int) -> None:
        N = self.spec.nodes
        labelsets, vals, tss = [], [], []
        for job, inst_of, phase, exists, ok in (
            ("dcgm-exporter", lambda n: f"{self.ips[n]}:9400", self.phase_dcgm, self.dcgm_exists, self.dcgm_ok),
            ("node-exporter", lambda n: f"{self.hostnames[n]}:9100", self.phase_node, self.node_exists,
             self.node_ok),
        ):
            klo, khi = self.krange(phase, a, b)
            for n in range(N):
                kk = np.nonzero(exists[n, int(klo[n]) : int(khi[n])])[0] + int(klo[n])
                if len(kk) == 0:
                    continue
                labelsets.append(labels_text([("instance", inst_of(n)), ("job", job)]))
                vals.append(ok[n, kk].astype(np.float64))
                tss.append(self.start + phase[n] + kk * self.iv)
        k0, k1 = (int(x) for x in self.krange(self.phase_ksm, a, b))
        if k1 > k0:
            kk = np.arange(k0, k1)
            labelsets.append(labels_text([("instance", KSM_INSTANCE), ("job", "kube-state-metrics")]))
            vals.append(self.ksm_ok[kk].astype(np.float64))
            tss.append(self.start + self.phase_ksm + kk * self.iv)
        w.header("up", "gauge", "1 if the scrape succeeded, 0 if it failed.")
        if vals:
            bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
            w.series("up", labelsets, bounds, np.concatenate(vals), 0, ts=np.concatenate(tss))


# --------------------------------------------------------------------------- API

def slice_bounds(spec: FleetSpec, slice_seconds: int) -> list[tuple[int, int]]:
    """[t_from, t_to) slices covering the window, cut at multiples of slice_seconds since
    the epoch (2 h multiples line up with promtool's 2 h blocks)."""
    if slice_seconds <= 0:
        raise ValueError("slice_seconds must be > 0")
    out = []
    t = spec.start
    while t < spec.end:
        nxt = min(spec.end, (t // slice_seconds + 1) * slice_seconds)
        out.append((t, nxt))
        t = nxt
    return out


def generate(spec: FleetSpec, fp: BinaryIO, t_from: int | None = None, t_to: int | None = None,
             fleet: Fleet | None = None) -> Stats:
    """Write the OpenMetrics document for `spec` (optionally only [t_from, t_to)) to fp."""
    return (fleet or Fleet(spec)).write(fp, t_from, t_to)


def generate_slices(spec: FleetSpec, out_dir: str, slice_seconds: int) -> Iterator[tuple[str, Stats]]:
    """Write DIR/slice-NNN.om files one at a time, yielding (path, stats) after each."""
    fleet = Fleet(spec)
    os.makedirs(out_dir, exist_ok=True)
    for i, (a, b) in enumerate(slice_bounds(spec, slice_seconds)):
        path = os.path.join(out_dir, f"slice-{i:03d}.om")
        with open(path, "wb", buffering=1 << 20) as f:
            st = fleet.write(f, a, b)
        yield path, st


def iso_utc(t: int) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    d = FleetSpec()
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--hours", type=float, default=d.hours)
    p.add_argument("--scrape-interval", type=int, default=d.scrape_interval, help="seconds")
    p.add_argument("--end", type=int, default=d.end, help=f"unix seconds (default {d.end} = {iso_utc(d.end)})")
    p.add_argument("--seed", type=int, default=d.seed)


def spec_from_args(a: argparse.Namespace) -> FleetSpec:
    return FleetSpec(nodes=a.nodes, gpus_per_node=a.gpus_per_node, hours=a.hours,
                     scrape_interval=a.scrape_interval, end=a.end, seed=a.seed)


def main(argv: list[str] | None = None) -> int:
    import time

    p = argparse.ArgumentParser(prog="python -m loadtests.gen", description=__doc__.split("\n")[0])
    add_fleet_args(p)
    p.add_argument("--out", default="-", help="file, '-' for stdout, or a directory with --slice-hours")
    p.add_argument("--slice-hours", type=float, default=None,
                   help="write DIR/slice-NNN.om files of this many hours (epoch-aligned)")
    a = p.parse_args(argv)
    spec = spec_from_args(a)
    t0 = time.perf_counter()
    total = Stats()
    if a.slice_hours:
        if a.out == "-":
            p.error("--slice-hours needs --out DIR")
        for path, st in generate_slices(spec, a.out, int(a.slice_hours * 3600)):
            total.add(st)
            print(f"{path}: {st.samples} samples, {st.bytes} bytes", file=sys.stderr)
    elif a.out == "-":
        total = generate(spec, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with open(a.out, "wb", buffering=1 << 20) as f:
            total = generate(spec, f)
    dt = time.perf_counter() - t0
    print(f"{total.samples} samples, {total.bytes / 2**20:.1f} MiB, {iso_utc(spec.start)} .. {iso_utc(spec.end)}"
          f" in {dt:.1f} s ({total.samples / max(dt, 1e-9) / 1e6:.2f} M samples/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
