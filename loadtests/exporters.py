"""The four exporters' OpenMetrics text for a generated fleet (loadtests/fleet.py's model):
dcgm-exporter, node-exporter, kube-state-metrics, and the `up` series Prometheus writes for
each scrape target; numpy-formatted, streamed, for `promtool tsdb create-blocks-from`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable

import numpy as np

from .fleet import (
    COOL_K,
    KSM_INSTANCE,
    NET_DEVICES,
    PHASES,
    S_FB,
    S_GR,
    S_LOAD,
    S_MEMCOPY,
    S_NET,
    S_NVL,
    S_TEMP,
    Fleet,
    labels_text,
)


@dataclass
class Stats:
    samples: int = 0
    series: int = 0
    bytes: int = 0

    def add(self, other: "Stats") -> None:
        self.samples += other.samples
        self.series += other.series
        self.bytes += other.bytes


# --------------------------------------------------------------------------- formatting

TAIL_W = 11  # " " + 10 timestamp digits


def ts_tail(ts: np.ndarray) -> np.ndarray:
    """(n, 11) uint8: b' ' followed by the 10 digits of each whole-second timestamp."""
    n = len(ts)
    out = np.empty((n, TAIL_W), np.uint8)
    out[:, 0] = 32
    if n:
        if ts.min() < 10**9 or ts.max() >= 10**10:
            raise ValueError("timestamps must have 10 digits")
    x = ts.astype(np.int64)
    for j in range(TAIL_W - 1, 0, -1):
        q = x // 10
        out[:, j] = x - q * 10 + 48
        x = q
    return out


def format_lines(values: np.ndarray, decimals: int, tail: np.ndarray) -> tuple[bytes, np.ndarray]:
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
    rows = np.zeros((n, 1 + wv + TAIL_W), np.uint8)
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
    return blob, nchar + (1 + TAIL_W)


class OpenMetricsWriter:
    """Series of one OpenMetrics document, written as numpy-formatted lines (no Python object
    per sample), with the samples, series and bytes written so far in `stats`."""

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
            tail = ts_tail(ts)
        blob, lens = format_lines(values, decimals, tail)
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


def cumulative_counter(incr: np.ndarray, base: np.ndarray, resets: list[tuple[int, int]],
             rows_of_node: np.ndarray) -> np.ndarray:
    """Cumulative counter from k = 0 with restarts from 0 at each (node, k) reset."""
    C = np.cumsum(incr, axis=1)
    V = C + base[:, None]
    for n, kr in sorted(resets, key=lambda x: x[1]):
        if 0 < kr < C.shape[1]:
            rows = np.nonzero(rows_of_node == n)[0]
            V[rows, kr:] = C[rows, kr:] - C[rows, kr - 1 : kr]
    return np.floor(V)


def write_fleet(fleet: Fleet, fp: BinaryIO, t_from: int | None = None, t_to: int | None = None, *,
                keep: Callable[[str], bool] | None = None) -> Stats:
    """Write one OpenMetrics document with the fleet's samples whose time is in [t_from, t_to)
    (and, with `keep`, only the series whose metric name it accepts): dcgm-exporter,
    node-exporter, kube-state-metrics, and the `up` series of each scrape target."""
    a = fleet.start if t_from is None else max(int(t_from), fleet.start)
    b = fleet.end if t_to is None else min(int(t_to), fleet.end)
    w = OpenMetricsWriter(fp, keep)
    if a < b:
        write_dcgm(fleet, w, a, b)
        write_node(fleet, w, a, b)
        write_ksm(fleet, w, a, b)
        write_up(fleet, w, a, b)
    w.eof()
    return w.stats


def write_dcgm(fleet: Fleet, w: OpenMetricsWriter, a: int, b: int) -> None:
    N, G = fleet.spec.nodes, fleet.G
    ng = N * G
    klo, khi = fleet.krange(fleet.phase_dcgm, a, b)
    k0, k1 = int(klo.min()), int(khi.max())
    if k1 <= k0:
        return
    K = k1 - k0
    full = fleet.util_power(0, k1)  # counters need the whole history up to k1
    st = {k: (v[:, k0:] if isinstance(v, np.ndarray) and v.ndim == 2 else v) for k, v in full.items()}
    st["ks"] = full["ks"][k0:]
    gi = np.arange(ng)
    ks = st["ks"]
    kk = ks[None, :]
    gn = fleet.gpu_node
    # which cells are emitted: scrape ok and inside this slice for the node's phase
    valid = fleet.dcgm_ok[gn][:, k0:k1] & (kk >= klo[gn][:, None]) & (kk < khi[gn][:, None])
    gidx, cidx = np.nonzero(valid)
    if len(gidx) == 0:
        return
    J = st["J"]
    jv = J[gidx, cidx]
    order = np.lexsort((cidx, jv, gidx))
    gidx, cidx, jv = gidx[order], cidx[order], jv[order]
    brk = np.nonzero((np.diff(gidx) != 0) | (np.diff(jv) != 0))[0] + 1
    bounds = np.concatenate([[0], brk, [len(gidx)]])
    cache = fleet.label_cache
    labelsets = []
    for g, j in zip(gidx[bounds[:-1]].tolist(), jv[bounds[:-1]].tolist()):
        key = (g, j)
        ls = cache.get(key)
        if ls is None:
            ls = cache[key] = fleet.dcgm_labels(g, j)
        labelsets.append(ls)
    ts = fleet.start + fleet.phase_dcgm[gn[gidx]] + (cidx + k0) * fleet.iv
    tail = ts_tail(ts)

    util, power, idle, dk = st["util"], st["power"], st["idle"], st["dk"]
    gr_n = fleet.noise.normal(S_GR, gi, ks)

    def emit(name: str, mtype: str, help_: str, m: np.ndarray, dec: int) -> None:
        w.header(name, mtype, help_)
        w.series(name, labelsets, bounds, m[gidx, cidx], dec, tail=tail)

    emit("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", util, 0)
    mc = util * fleet.p_memcopy[J] + 2.0 * fleet.noise.normal(S_MEMCOPY, gi, ks)
    mc = np.clip(np.rint(mc), 0, 100)
    mc[idle] = 0
    emit("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", mc, 0)
    del mc
    fb_cap = (fleet.fb_total - fleet.fb_reserved)[:, None]
    fb = fleet.p_mem[J] * fleet.fb_total[:, None] * np.minimum(1.0, (dk + 1) / 4.0)
    fb = np.clip(np.rint(fb + 40.0 * fleet.noise.normal(S_FB, gi, ks)), 0, fb_cap)
    fb[idle] = 0
    emit("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", fb, 0)
    emit("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", fb_cap - fb, 0)
    del fb
    # temperature follows the pod's load with a lag, and cools down after it ends
    P, E = fleet.prev_jobs(k0, k1)
    t_idle = fleet.temp_idle[:, None]
    gain = fleet.temp_gain[:, None]
    target = t_idle + gain * fleet.p_util[J]
    hot = t_idle + (target - t_idle) * (1 - np.exp(-dk / 6.0))
    prev_target = t_idle + gain * fleet.p_util[P]
    # exactly cooled after COOL_K scrapes, so a slice needs no older history
    since = kk - E
    decay = np.where(since > COOL_K, 0.0, np.exp(-np.minimum(since, COOL_K) / 8.0))
    cool = t_idle + (prev_target - t_idle) * decay
    temp = np.where(idle, cool, hot) + 0.7 * fleet.noise.normal(S_TEMP, gi, ks)
    temp = np.rint(np.clip(temp, 20, 95))
    del P, E, hot, cool, target, prev_target
    emit("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", temp, 0)
    del temp
    pw = power.copy()
    nan_rows = fleet.nan_gpu
    for k in fleet.nan_ks:
        if k0 <= k < k1:
            pw[nan_rows, k - k0] = np.nan
    emit("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", pw, 3)
    del pw
    throttle = np.maximum(0.0, power - 0.85 * fleet.max_w[:, None]) / 10.0
    sm = fleet.sm_max[:, None] - 15.0 * np.floor(throttle)
    sm = np.where(idle | (dk < fleet.p_startup[J]) & (util < 10), fleet.sm_idle[:, None], sm)
    emit("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", sm, 0)
    del sm, throttle
    gr = np.clip(util / 100.0 * 0.97 + 0.01 * gr_n, 0.0, 1.0)
    gr[idle] = 0.0
    tensor = np.clip(gr * fleet.p_tensor[J] + 0.004 * gr_n, 0.0, 1.0)
    tensor[idle] = 0.0
    emit("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
         "Ratio of cycles the tensor (HMMA) pipe is active.", np.round(tensor, 6), 6)
    emit("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
         "Ratio of time the graphics engine is active.", np.round(gr, 6), 6)
    del tensor, gr
    xid = np.zeros((ng, K))
    for g, xa, xb, code in fleet.xid:
        lo, hi = max(xa, k0), min(xb, k1)
        if lo < hi:
            xid[g, lo - k0 : hi - k0] = code
    emit("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", xid, 0)
    del xid

    on = fleet.gpu_on[gn][:, :k1]
    resets = fleet.resets(fleet.phase_dcgm)
    energy = cumulative_counter(full["power"] * (fleet.iv * 1000.0) * on, fleet.energy_base, resets, gn)
    emit("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "unknown",
         "Total energy consumption since boot (in mJ).", energy[:, k0:], 0)
    del energy
    Jf = full["J"]
    nv_rate = fleet.p_nvlink[Jf] * (full["util"] / 100.0)
    nv_rate *= np.maximum(0.0, 1 + 0.15 * fleet.noise.normal(S_NVL, gi, full["ks"]))
    nv_rate += 0.5  # background link traffic
    nv = cumulative_counter(nv_rate * fleet.iv * on, fleet.nvlink_base, resets, gn)
    emit("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "unknown",
         "Total number of NVLink bandwidth counters for all lanes.", nv[:, k0:], 0)

def write_node(fleet: Fleet, w: OpenMetricsWriter, a: int, b: int) -> None:
    N, nd = fleet.spec.nodes, len(NET_DEVICES)
    klo, khi = fleet.krange(fleet.phase_node, a, b)
    k0, k1 = int(klo.min()), int(khi.max())
    if k1 <= k0:
        return
    busy, ib = fleet.node_activity(k1)
    ks = np.arange(k1)
    nodes = np.arange(N)
    kw = ks[None, k0:]
    valid = fleet.node_ok[:, k0:k1] & (kw >= klo[:, None]) & (kw < khi[:, None])
    nidx, cidx = np.nonzero(valid)  # node-major, then time
    nb = np.bincount(nidx, minlength=N)
    node_bounds = np.concatenate([[0], np.cumsum(nb)])
    ts = fleet.start + fleet.phase_node[nidx] + (cidx + k0) * fleet.iv
    tail = ts_tail(ts)
    # counter rows are (node, device), node-major; each row takes its node's samples
    rows_node = np.repeat(nodes, nd)
    rows_dev = np.tile(np.arange(nd), N)
    pick = np.concatenate([np.tile(np.arange(node_bounds[n], node_bounds[n + 1]), nd) for n in range(N)])
    row_of_sample = np.repeat(np.arange(N * nd), np.repeat(nb, nd))
    bounds = np.concatenate([[0], np.cumsum(np.repeat(nb, nd))])
    col_of_sample = cidx[pick] + k0
    tail_rows = tail[pick]
    on = fleet.node_on[:, :k1][rows_node]
    resets = fleet.resets(fleet.phase_node)
    base_rng = np.random.default_rng([fleet.spec.seed, 0xE7])
    eth = {"rx": base_rng.uniform(2e6, 2e7, N), "tx": base_rng.uniform(1e6, 8e6, N)}
    for stream, (d, fam) in enumerate((("rx", "node_network_receive_bytes"),
                                       ("tx", "node_network_transmit_bytes"))):
        rate = np.where(rows_dev[:, None] == 0,
                        eth[d][rows_node][:, None] * (1 + 0.05 * busy[rows_node]),
                        ib[rows_node] / (nd - 1))
        nz = fleet.noise.normal(S_NET + 10 * stream, np.arange(N * nd), ks)
        incr = np.maximum(0.0, rate * (1 + 0.2 * nz)) * fleet.iv * on
        base = np.random.default_rng([fleet.spec.seed, 0xB0 + stream]).uniform(1e9, 5e13, N * nd).round()
        val = cumulative_counter(incr, base, resets, rows_node)
        labelsets = [labels_text([("device", NET_DEVICES[dv]), ("instance", f"{fleet.hostnames[n]}:9100"),
                                  ("job", "node-exporter")]) for n in range(N) for dv in range(nd)]
        what = "receive" if d == "rx" else "transmit"
        w.header(fam, "counter", f"Network device statistic {what}_bytes.")
        w.series(fam + "_total", labelsets, bounds, val[row_of_sample, col_of_sample], 0, tail=tail_rows)
    load = busy[:, k0:k1] * 1.3 + 0.4 + 0.6 * np.abs(fleet.noise.normal(S_LOAD, nodes, ks[k0:k1]))
    load = np.round(load, 2)
    labelsets = [labels_text([("instance", f"{fleet.hostnames[n]}:9100"), ("job", "node-exporter")])
                 for n in range(N)]
    w.header("node_load1", "gauge", "1m load average.")
    w.series("node_load1", labelsets, node_bounds, load[nidx, cidx], 2, tail=tail)

def write_ksm(fleet: Fleet, w: OpenMetricsWriter, a: int, b: int) -> None:
    N, G = fleet.spec.nodes, fleet.G
    ph = fleet.phase_ksm
    k0, k1 = (int(x) for x in fleet.krange(ph, a, b))
    if k1 <= k0:
        return
    inst = ("instance", KSM_INSTANCE)
    job = ("job", "kube-state-metrics")
    ok = np.nonzero(fleet.ksm_ok[k0:k1])[0] + k0
    # pods
    labelsets: list[bytes] = []
    vals: list[np.ndarray] = []
    tss: list[np.ndarray] = []
    if fleet.n_jobs:
        kc = fleet.kceil(fleet.job_t_create, ph)
        kd = fleet.kceil(fleet.job_t_delete, ph)
        kr = fleet.kceil(fleet.job_t_run, ph)
        ke = fleet.kceil(fleet.job_t_end, ph)
        for j in np.nonzero((kc < k1) & (kd > k0) & (kc < kd))[0].tolist():
            lo, hi = np.searchsorted(ok, [max(int(kc[j]), k0), min(int(kd[j]), k1)])
            kk = ok[lo:hi]
            if len(kk) == 0:
                continue
            code = np.where(kk < kr[j], 0, np.where(kk < ke[j], 1, 3 if fleet.job_failed[j] else 2))
            t = fleet.start + ph + kk * fleet.iv
            for pi, phase in enumerate(PHASES):
                labelsets.append(labels_text([("namespace", fleet.job_ns[j]), ("pod", fleet.job_pod[j]),
                                              ("uid", fleet.job_uid[j]), ("phase", phase), inst, job]))
                vals.append((code == pi).astype(np.float64))
                tss.append(t)
    w.header("kube_pod_status_phase", "gauge", "The pods current phase.")
    if vals:
        bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
        w.series("kube_pod_status_phase", labelsets, bounds, np.concatenate(vals), 0, ts=np.concatenate(tss))
    # nodes
    labelsets, vals, tss = [], [], []
    t_ok = fleet.start + ph + ok * fleet.iv
    for n in range(N):
        m = (t_ok >= fleet.join[n]) & (t_ok < fleet.leave[n])
        if not m.any():
            continue
        t = t_ok[m]
        gpus = np.full(len(t), float(G))
        for down, up in fleet.reboots[n]:
            gpus[(t >= down) & (t < up + 120)] = 0.0
        for res, unit, v in (("nvidia_com_gpu", "integer", gpus), ("cpu", "core", float(fleet.cpu[n])),
                             ("memory", "byte", float(fleet.mem_bytes[n]))):
            labelsets.append(labels_text([("node", fleet.hostnames[n]), ("resource", res),
                                          ("unit", unit), inst, job]))
            vals.append(np.broadcast_to(np.asarray(v, np.float64), t.shape).copy())
            tss.append(t)
    w.header("kube_node_status_allocatable", "gauge", "The allocatable for different resources of a node.")
    if vals:
        bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
        w.series("kube_node_status_allocatable", labelsets, bounds, np.concatenate(vals), 0,
                 ts=np.concatenate(tss))

def write_up(fleet: Fleet, w: OpenMetricsWriter, a: int, b: int) -> None:
    N = fleet.spec.nodes
    labelsets, vals, tss = [], [], []
    for job, inst_of, phase, exists, ok in (
        ("dcgm-exporter", lambda n: f"{fleet.ips[n]}:9400", fleet.phase_dcgm, fleet.dcgm_exists, fleet.dcgm_ok),
        ("node-exporter", lambda n: f"{fleet.hostnames[n]}:9100", fleet.phase_node, fleet.node_exists,
         fleet.node_ok),
    ):
        klo, khi = fleet.krange(phase, a, b)
        for n in range(N):
            kk = np.nonzero(exists[n, int(klo[n]) : int(khi[n])])[0] + int(klo[n])
            if len(kk) == 0:
                continue
            labelsets.append(labels_text([("instance", inst_of(n)), ("job", job)]))
            vals.append(ok[n, kk].astype(np.float64))
            tss.append(fleet.start + phase[n] + kk * fleet.iv)
    k0, k1 = (int(x) for x in fleet.krange(fleet.phase_ksm, a, b))
    if k1 > k0:
        kk = np.arange(k0, k1)
        labelsets.append(labels_text([("instance", KSM_INSTANCE), ("job", "kube-state-metrics")]))
        vals.append(fleet.ksm_ok[kk].astype(np.float64))
        tss.append(fleet.start + fleet.phase_ksm + kk * fleet.iv)
    w.header("up", "gauge", "1 if the scrape succeeded, 0 if it failed.")
    if vals:
        bounds = np.concatenate([[0], np.cumsum([len(v) for v in vals])])
        w.series("up", labelsets, bounds, np.concatenate(vals), 0, ts=np.concatenate(tss))
