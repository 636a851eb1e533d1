"""The generated GPU fleet's model: its shape (`FleetSpec`), topology, pod schedule, reboots,
scrape misses and the per-GPU load they imply, as arrays over scrape indices.

Deterministic: values are functions of (seed, stream, row, scrape index), so any time slice can
be computed alone. What the fleet looks like is described in loadtests/gen.py; writing it as the
four exporters' OpenMetrics text is loadtests/exporters.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

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


# --------------------------------------------------------------------------- noise
# Values are functions of (seed, stream, row, scrape index) through a counter-based hash, so
# any time slice can be computed alone and gives the same numbers as the whole window.

_MASK = (1 << 64) - 1


def mix_int(x: int) -> int:
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


class Noise:
    def __init__(self, seed: int) -> None:
        self.seed = mix_int(seed * 0x632BE59BD9B4E019 + 0x1234567)

    def _hash(self, stream: int, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        key = np.uint64(mix_int(self.seed ^ (stream * 0xD6E8FEB86659FD93)))
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


# --------------------------------------------------------------------------- label sets

def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels_text(pairs: list[tuple[str, str]]) -> bytes:
    return ("{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}").encode()


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

COOL_K = 60  # scrapes after a pod ends until the GPU is back at idle temperature

# noise streams
S_UTIL, S_POW, S_TEMP, S_MEMCOPY, S_FB, S_GR, S_TENSOR, S_NVL, S_NET, S_LOAD, S_MISS = range(11)


def _split_groups(rng: np.random.Generator, n: int) -> list[int]:
    """Random partition of n GPUs into contiguous groups (one pod at a time per group)."""
    if n == 1 or rng.random() < 0.6:
        return [n]
    h = n // 2
    return _split_groups(rng, h) + _split_groups(rng, n - h)


def _draw_pods(fleet: "Fleet", rng: np.random.Generator) -> dict[str, list]:
    """Every pod of the window, node by node and GPU group by group, as column lists: when it
    is created, runs, ends and is deleted (reboots and a node leaving end pods as Failed), its
    namespace, names and load parameters."""
    s = fleet.spec
    N = s.nodes
    rec: dict[str, list] = {k: [] for k in (
        "node", "g0", "ng", "t_create", "t_run", "t_end", "t_delete", "failed", "ns", "pod",
        "container", "uid", "util", "noise", "mem", "tensor", "memcopy", "nvlink", "net",
        "dip_period", "dip_len", "startup", "wave_amp", "wave_period", "wave_phase")}
    seq = 0
    for n in range(N):
        groups = _split_groups(rng, fleet.G)
        g0 = n * fleet.G
        join, leave = int(fleet.join[n]), int(fleet.leave[n])
        stop = min(fleet.end, leave)
        blocked = fleet.reboots[n]
        for size in groups:
            if join < fleet.start:
                t = fleet.start - int(rng.uniform(0, 8 * 3600))
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
                if t_end > leave - 1 and leave < fleet.end:
                    t_delete = leave + 30
                stem = kind.stems[int(rng.integers(len(kind.stems)))]
                suffix = "%05x" % ((seq * 0x9E3779B1 + s.seed * 0x85EBCA6B) & 0xFFFFF)
                pod = f"{stem}-{suffix}-{int(rng.integers(0, 4)) if size == fleet.G else 0}"
                seq += 1
                if t_delete > fleet.start:
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
                    h = "%032x" % (mix_int(seq * 31 + s.seed) << 64 | mix_int(seq + 99 * s.seed))
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
    return rec


class Fleet:
    """The whole fleet's topology and schedule; cheap (no per-sample arrays)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        s = spec
        self.start, self.end, self.iv, self.T = s.start, s.end, s.scrape_interval, s.n_scrapes
        N, G, T, W = s.nodes, s.gpus_per_node, self.T, self.end - self.start
        self.noise = Noise(s.seed)
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
            h = "%032x" % (mix_int(s.seed * 1000003 + g) << 64 | mix_int(g * 7919 + s.seed + 17))
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
        # dcgm label sets by (gpu, job): the same series recur in every slice of a dataset
        self.label_cache: dict[tuple[int, int], bytes] = {}

    # ---- time <-> scrape index
    def kceil(self, t: np.ndarray | int, phase: np.ndarray | int) -> np.ndarray:
        """First scrape index whose time is >= t, clipped to [0, T]."""
        x = np.asarray(t, np.int64) - self.start - np.asarray(phase, np.int64)
        return np.clip(-((-x) // self.iv), 0, self.T)

    def _build_jobs(self, rng: np.random.Generator) -> None:
        rec = _draw_pods(self, rng)
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
            miss = self.noise.uniform(S_MISS + stream, np.arange(N), ks) < 0.002
            return exists, on, on & ~miss

        self.dcgm_exists, self.gpu_on, self.dcgm_ok = node_masks(self.phase_dcgm, 0)
        self.node_exists, self.node_on, self.node_ok = node_masks(self.phase_node, 100)
        a, b = self.gap_ks
        self.dcgm_ok[self.gap_node, a:b] = False
        # the NaN samples must exist: no random miss on them
        nan_node = int(self.gpu_node[self.nan_gpu])
        self.dcgm_ok[nan_node, self.nan_ks] = self.gpu_on[nan_node, self.nan_ks]
        self.ksm_ok = self.noise.uniform(S_MISS + 200, np.arange(1), ks)[0] >= 0.002

    # ---- scrape-index windows for a time slice
    def krange(self, phase: np.ndarray | int, t_from: int, t_to: int) -> tuple[np.ndarray, np.ndarray]:
        return self.kceil(t_from, phase), self.kceil(t_to, phase)

    # ---- per-GPU state
    def assign(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
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

    def util_power(self, k0: int, k1: int) -> dict[str, np.ndarray]:
        J, S = self.assign(k0, k1)
        gi = np.arange(self.spec.nodes * self.G)
        ks = np.arange(k0, k1)
        kk = ks[None, :]
        idle = J < 0
        dk = kk - S
        lvl = self.p_util[J]
        t_s = (self.start + kk * self.iv).astype(np.float64)
        wave = self.p_wave_amp[J] * np.sin(2 * np.pi * t_s / self.p_wave_period[J] + self.p_wave_phase[J])
        nz = self.noise.normal(S_UTIL, gi, ks)
        util = lvl + wave + nz * self.p_noise[J]
        startup = dk < self.p_startup[J]
        dip = ((dk % self.p_dip_period[J]) < self.p_dip_len[J]) & ~startup
        util = np.where(dip, lvl * 0.25 + 2 * nz, util)
        util = np.where(startup, 5 + 2 * nz, util)
        util = np.clip(np.rint(util), 0, 100)
        util[idle] = 0
        pw_n = self.noise.normal(S_POW, gi, ks)
        span = (self.max_w * 0.92 - self.idle_w)[:, None]
        power = self.idle_w[:, None] + span * (util / 100.0) ** 1.25 + np.where(idle, 1.2, 6.0) * pw_n
        power = np.round(np.maximum(power, 20.0), 3)
        return {"J": J, "S": S, "util": util, "power": power, "idle": idle, "dk": dk, "ks": ks}

    def prev_jobs(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """For idle cells: the previous job on the GPU (or -1) and the k it ended."""
        ng = self.spec.nodes * self.G
        P = np.full((ng, k1 - k0), -1, np.int64)
        E = np.zeros((ng, k1 - k0), np.int64)
        if self.n_jobs:
            kb = self.job_kb
            sel = np.nonzero((kb >= k0 - COOL_K) & (kb < k1) & (self.job_ka < kb))[0]
            for j in sel[np.argsort(kb[sel], kind="stable")].tolist():
                a = max(int(kb[j]), k0) - k0
                g0, g1 = int(self.job_g0[j]), int(self.job_g0[j] + self.job_ng[j])
                P[g0:g1, a:] = j
                E[g0:g1, a:] = kb[j]
        return P, E

    def resets(self, phase: np.ndarray) -> list[tuple[int, int]]:
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

    def node_activity(self, k1: int) -> tuple[np.ndarray, np.ndarray]:
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
