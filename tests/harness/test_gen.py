"""Tests for the fleet telemetry generator (loadtests.gen) and the TSDB loader (loadtests.load).

Most tests are pure and parse a tiny fleet's OpenMetrics text; the promtool and Prometheus
ones need Debian's prometheus package (`make test` installs it) and fail without it.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests import exporters, gen
from loadtests.gen import (
    DEFAULT_END,
    MODEL_DOTS,
    MODEL_QUOTE,
    Fleet,
    FleetSpec,
    escape_label_value,
    generate,
    slice_bounds,
)
from tests.servers import require

TINY = FleetSpec(nodes=5, gpus_per_node=2, hours=2, seed=3)
COUNTERS = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "node_network_receive_bytes_total", "node_network_transmit_bytes_total")

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+) (\d+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|\})')


def _unescape(v: str) -> str:
    return re.sub(r'\\(.)', lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    assert text[0] == "{" and text[-1] == "}", text
    out, pos = [], 1
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"bad labels at {pos}: {text}"
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    assert pos == len(text)
    return tuple(out)


@dataclass
class Doc:
    text: bytes
    families: list[tuple[str, str]] = field(default_factory=list)  # (name, type) in order
    # series key (name, labels) -> list of (ts, value string), in file order
    series: dict[tuple[str, tuple], list[tuple[int, str]]] = field(default_factory=dict)
    series_order: list[tuple[str, tuple]] = field(default_factory=list)


def parse(text: bytes) -> Doc:
    """A strict reader of the OpenMetrics subset the generator writes."""
    doc = Doc(text)
    lines = text.decode().split("\n")
    assert lines[-1] == "" and lines[-2] == "# EOF", "must end with '# EOF\\n'"
    assert lines.count("# EOF") == 1
    fam, ftype = None, None
    seen_fams: set[str] = set()
    last_key = None
    for line in lines[:-2]:
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, ftype = line.split(" ")
            assert name not in seen_fams, f"family {name} appears twice"
            seen_fams.add(name)
            fam = name
            doc.families.append((name, ftype))
            continue
        m = _SAMPLE.match(line)
        assert m, f"bad sample line: {line!r}"
        name, lbl, value, ts = m.groups()
        assert fam is not None
        assert name == fam or (ftype == "counter" and name == fam + "_total"), (name, fam)
        key = (name, _labels(lbl or ""))
        if key != last_key:
            assert key not in doc.series, f"series not contiguous: {key}"
            doc.series[key] = []
            doc.series_order.append(key)
            last_key = key
        float(value)
        doc.series[key].append((int(ts), value))
    return doc


@cache
def tiny_bytes(spec: FleetSpec = TINY) -> bytes:
    buf = io.BytesIO()
    generate(spec, buf)
    return buf.getvalue()


@cache
def tiny_doc() -> Doc:
    return parse(tiny_bytes())


def _of(doc: Doc, name: str) -> dict[tuple, list[tuple[int, str]]]:
    return {k[1]: v for k, v in doc.series.items() if k[0] == name}


# --------------------------------------------------------------------------- basics

def test_default_end_is_2026_11_01_utc() -> None:
    assert DEFAULT_END == 1793491200
    assert gen.iso_utc(DEFAULT_END) == "2026-11-01T00:00:00Z"
    assert gen.CI_SPEC.start == DEFAULT_END - 6 * 3600


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        FleetSpec(hours=0.001)  # 3.6 s is not a multiple of 30 s
    with pytest.raises(ValueError):
        FleetSpec(nodes=0)
    assert FleetSpec(hours=6) == FleetSpec(hours=6.0)
    assert FleetSpec.from_dict(TINY.to_dict()) == TINY


def test_deterministic() -> None:
    a = tiny_bytes()
    buf = io.BytesIO()
    generate(FleetSpec(**TINY.to_dict()), buf)
    assert buf.getvalue() == a


def test_seed_changes_output() -> None:
    other = tiny_bytes(FleetSpec(**{**TINY.to_dict(), "seed": 4}))
    assert other != tiny_bytes()


def test_escape_label_value() -> None:
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert _unescape(escape_label_value(MODEL_QUOTE)) == MODEL_QUOTE


# --------------------------------------------------------------------------- value formatting

def _expected(v: float, dec: int) -> str:
    if np.isnan(v):
        return "NaN"
    iv = int(np.rint(v * 10**dec))
    ip, fp = divmod(iv, 10**dec)
    return str(ip) + ("." + str(fp).rjust(dec, "0").rstrip("0") if fp else "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1e9, allow_nan=False), st.integers(0, 10**15).map(float),
                          st.just(float("nan"))), min_size=1, max_size=40),
       st.sampled_from([0, 1, 2, 3, 6]))
def test_format_lines_matches_python(values: list[float], dec: int) -> None:
    if dec:
        values = [v if np.isnan(v) or v < 1e9 else v / 1e7 for v in values]
    vals = np.array(values, np.float64)
    ts = np.arange(len(vals), dtype=np.int64) * 30 + DEFAULT_END
    blob, lens = exporters.format_lines(vals, dec, exporters.ts_tail(ts))
    lines = blob.decode().split("\n")
    assert lines[0] == ""
    assert [len(x) + 1 for x in lines[1:]] == lens.tolist()
    assert lines[1:] == [f"{_expected(v, dec)} {t}" for v, t in zip(values, ts.tolist())]


# --------------------------------------------------------------------------- document shape

def test_openmetrics_syntax_and_order() -> None:
    doc = tiny_doc()
    names = [f for f, _ in doc.families]
    assert names[:10] == ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED",
                          "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                          "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                          "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_XID_ERRORS"]
    assert set(names) >= {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                          "node_network_receive_bytes", "node_network_transmit_bytes", "node_load1",
                          "kube_pod_status_phase", "kube_node_status_allocatable", "up"}
    for (name, _labels), samples in doc.series.items():
        ts = [t for t, _ in samples]
        assert all(b > a for a, b in zip(ts, ts[1:])), f"timestamps not increasing in {name}"
        assert TINY.start <= ts[0] and ts[-1] < TINY.end
    hosts = {dict(l)["Hostname"] for n, l in doc.series if n == "DCGM_FI_DEV_GPU_UTIL"}
    assert hosts == {f"gpu-node-{i:04d}" for i in range(TINY.nodes)}


def test_labels_and_escaping_roundtrip() -> None:
    doc = tiny_doc()
    util = _of(doc, "DCGM_FI_DEV_GPU_UTIL")
    models = {dict(l)["modelName"] for l in util}
    assert MODEL_QUOTE in models and MODEL_DOTS in models
    assert b'modelName="NVIDIA Graphics Device \\"ES\\\\B0\\""' in doc.text
    for l in util:
        d = dict(l)
        assert d["job"] == "dcgm-exporter" and d["instance"].endswith(":9400")
        assert d["device"] == f"nvidia{d['gpu']}" and d["UUID"].startswith("GPU-")
        k8s = {"namespace", "pod", "container"} & d.keys()
        assert k8s in (set(), {"namespace", "pod", "container"})
    node = _of(doc, "node_network_receive_bytes_total")
    assert {dict(l)["device"] for l in node} == set(gen.NET_DEVICES)
    assert all(dict(l)["instance"].startswith("gpu-node-") for l in node)


def test_dotted_pod_names_exist_in_ci_fleet() -> None:
    fleet = Fleet(gen.CI_SPEC)
    assert any("." in p for p in fleet.job_pod)


def test_counters_monotonic_except_reboot_resets() -> None:
    doc = tiny_doc()
    fleet = Fleet(TINY)
    rebooted = {fleet.hostnames[n] for n in range(TINY.nodes) if fleet.reboots[n]}
    assert rebooted == {"gpu-node-0001"}
    for name in COUNTERS:
        # a GPU's counter carries on across its pod series; node counters are per device
        by_entity: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for labels, samples in _of(doc, name).items():
            d = dict(labels)
            host = d.get("Hostname") or d["instance"].split(":")[0]
            by_entity[(host, d.get("UUID"), d.get("device"))] += [(t, float(v)) for t, v in samples]
        hosts_with_resets = set()
        for (host, *_), samples in by_entity.items():
            vals = [v for _, v in sorted(samples)]
            drops = sum(1 for a, b in zip(vals, vals[1:]) if b < a)
            assert drops == (1 if host in rebooted else 0), (name, host)
            if drops:
                hosts_with_resets.add(host)
        assert hosts_with_resets == rebooted


def test_churn_and_idle_series() -> None:
    doc = tiny_doc()
    util = _of(doc, "DCGM_FI_DEV_GPU_UTIL")
    first, last = TINY.start + TINY.scrape_interval, TINY.end - TINY.scrape_interval
    late = [l for l, s in util.items() if s[0][0] > first]
    early = [l for l, s in util.items() if s[-1][0] < last]
    assert late and early
    assert any(s[0][0] > first and s[-1][0] < last for s in util.values())
    idle = [l for l in util if "pod" not in dict(l)]
    with_pod = [l for l in util if "pod" in dict(l)]
    assert idle and len(with_pod) > TINY.nodes * TINY.gpus_per_node
    # node 2 joins at 1/3 of the window, node 3 leaves at 2/3
    w = TINY.end - TINY.start
    n2 = [s for l, s in util.items() if dict(l)["Hostname"] == "gpu-node-0002"]
    n3 = [s for l, s in util.items() if dict(l)["Hostname"] == "gpu-node-0003"]
    assert min(s[0][0] for s in n2) >= TINY.start + w // 3
    assert max(s[-1][0] for s in n3) < TINY.start + 2 * w // 3


def test_gaps_and_failed_scrapes() -> None:
    doc = tiny_doc()
    up = _of(doc, "up")
    assert any(v == "0" for s in up.values() for _, v in s)
    iv = TINY.scrape_interval
    # dcgm-exporter on gpu-node-0000 misses 6 scrapes at 60% of the window
    fleet = Fleet(TINY)
    a, b = fleet.gap_ks
    phase = int(fleet.phase_dcgm[0])
    ts = sorted(t for l, s in _of(doc, "DCGM_FI_DEV_GPU_UTIL").items()
                if dict(l)["Hostname"] == "gpu-node-0000" and dict(l)["gpu"] == "0" for t, _ in s)
    gaps = [(x, y) for x, y in zip(ts, ts[1:]) if y - x > iv]
    assert (TINY.start + phase + (a - 1) * iv, TINY.start + phase + b * iv) in gaps
    # the reboot: node 1's series stop for minutes and up == 0 meanwhile
    up1 = next(s for l, s in up.items() if dict(l) == {"instance": fleet.ips[1] + ":9400", "job": "dcgm-exporter"})
    zeros = [t for t, v in up1 if v == "0"]
    assert len(zeros) >= 240 // iv


def test_nan_samples() -> None:
    doc = tiny_doc()
    nans = [(dict(l), t) for (n, l), s in doc.series.items() for t, v in s if v == "NaN"]
    fleet = Fleet(TINY)
    assert len(nans) == len(fleet.nan_ks) >= 4
    assert all(n == "DCGM_FI_DEV_POWER_USAGE" for (n, l), s in doc.series.items()
               for _, v in s if v == "NaN")
    assert all(d["Hostname"] == "gpu-node-0000" and d["gpu"] == "0" for d, _ in nans)


def test_xid_values() -> None:
    doc = tiny_doc()
    vals = {int(v) for s in _of(doc, "DCGM_FI_DEV_XID_ERRORS").values() for _, v in s}
    assert 0 in vals and 13 in vals
    assert vals <= {0, *gen.XID_CODES}


def test_kube_pod_status_phase_one_hot() -> None:
    doc = tiny_doc()
    by_pod: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    phases: dict[str, set[str]] = defaultdict(set)
    for l, s in _of(doc, "kube_pod_status_phase").items():
        d = dict(l)
        phases[d["pod"]].add(d["phase"])
        for t, v in s:
            by_pod[d["pod"]][t] += int(v)
    assert phases and all(p == set(gen.PHASES) for p in phases.values())
    assert all(c == 1 for per in by_pod.values() for c in per.values())


def test_slices_union_is_the_whole_window() -> None:
    whole = tiny_bytes()
    fleet = Fleet(TINY)
    parts = []
    for a, b in slice_bounds(TINY, 1800):
        buf = io.BytesIO()
        exporters.write_fleet(fleet, buf, a, b)
        text = buf.getvalue()
        parse(text)
        parts += [x for x in text.split(b"\n") if x and not x.startswith(b"#")]
    assert sorted(parts) == sorted(x for x in whole.split(b"\n") if x and not x.startswith(b"#"))


def test_slice_bounds_are_epoch_aligned() -> None:
    spec = FleetSpec(hours=5, end=DEFAULT_END + 3600)
    b = slice_bounds(spec, 7200)
    assert b[0][0] == spec.start and b[-1][1] == spec.end
    assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
    assert all(hi % 7200 == 0 for _, hi in b[:-1])


# --------------------------------------------------------------------------- real promtool / prometheus


def test_promtool_accepts_tiny_fleet(tmp_path) -> None:
    require("promtool")
    path = tmp_path / "tiny.om"
    with open(path, "wb") as f:
        stats = generate(TINY, f)
    out = tmp_path / "tsdb"
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # promtool silently drops out-of-order samples: every generated sample must be in a block
    n = 0
    for d in os.listdir(out):
        with open(out / d / "meta.json") as f:
            n += json.load(f)["stats"]["numSamples"]
    assert n == stats.samples


@pytest.mark.prom
def test_build_is_idempotent_and_prometheus_serves_it(tmp_path) -> None:
    require("promtool"), require("prometheus")
    from loadtests import load

    data = str(tmp_path / "tsdb")
    m = load.build_tsdb(TINY, data)
    assert m["samples"] == len([x for x in tiny_bytes().split(b"\n") if x and not x.startswith(b"#")])
    blocks = sorted(os.listdir(data))
    assert load.build_tsdb(TINY, data) == m  # manifest matches: nothing rebuilt
    assert sorted(os.listdir(data)) == blocks
    proc = load.start_prometheus(data, load.free_port())
    try:
        q = urllib.parse.urlencode({"query": 'count(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-0000"})',
                                    "start": TINY.start, "end": TINY.end, "step": 60})
        with urllib.request.urlopen(f"{proc.url}/api/v1/query_range?{q}", timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success"
        values = body["data"]["result"][0]["values"]
        assert len(values) > (TINY.end - TINY.start) // 60 - 10
        assert {v for _, v in values} == {str(TINY.gpus_per_node)}
        with pytest.raises(load.LoadError, match="Prometheus is running"):
            load.build_tsdb(TINY, data, force=True)
    finally:
        load.stop_prometheus(proc)
    assert proc.returncode is not None
