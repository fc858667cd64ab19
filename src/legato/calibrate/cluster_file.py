"""A ``calibrate`` measurement as a cluster file, and as this host's device profile.

``write_cluster_file`` writes what ``load_cluster`` reads: one node of ``nproc`` devices
(one per training process) whose device table carries the measured GEMM peak and memory
bandwidth and whose link is the fitted gloo link, with the measurements as comments; the
raw measurements go beside it (``<stem>.calibration.json``), atomically both, with the
host's device profile (``"profile"``, ``measured_profile``), which
``legato.cost.calibration.load_calibration`` and ``legato predict/plan`` read back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from legato.atomic import write_text_atomic
from legato.calibrate.host import Measurement, comm_line
from legato.cost.calibration import side_path
from legato.devices.collectives import LEVELS, LevelLaw
from legato.devices.laws import AttentionLaw, Fit, GemmLaw, HostLaw, HostLinkLaw, MemoryLaw
from legato.devices.link_fit import CommTiming, fit_alpha_beta
from legato.devices.profile import DeviceProfile
from legato.devices.profile_file import render_profile
from legato.errors import ConfigError, SpecError
from legato.specs.registry import load_cluster
from legato.specs.typed import from_dict, read_table_file, toml_literal, tomllib

DEVICE_NAME = "cpu-measured"
NOMINAL_CLUSTER = "local-cpu"  # its link stands in when one process has no peer to measure


def _link(m: Measurement) -> dict[str, Any]:
    if m.link is None:
        nominal = load_cluster(NOMINAL_CLUSTER).levels[0]
        return {
            "name": f"{nominal.name}, nominal (one process: nothing to measure)",
            "bandwidth_gbps": nominal.bandwidth_gbps,
            "latency_us": nominal.latency_us,
        }
    return {
        "name": "gloo between processes (measured)",
        "bandwidth_gbps": round(m.link.bandwidth / 1e9, 4),
        "latency_us": round(m.link.latency_s * 1e6, 2),
    }


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):  # no sysconf: the nominal CPU's figure
        return load_cluster(NOMINAL_CLUSTER).device.memory_gib


def cluster_table(m: Measurement) -> dict[str, Any]:
    """The cluster file's keys: one node of ``nproc`` devices, each one process with its
    share of the host's memory."""
    link = _link(m)
    memory_gib = _host_memory_gib() / m.nproc
    what = f"{m.nproc} process(es) x {m.threads} thread(s) on {m.host}"
    return {
        "description": f"This host measured by `legato calibrate`: {what}",
        "nodes": 1,
        "devices_per_node": m.nproc,
        "device": {
            "name": DEVICE_NAME,
            "description": f"one training process: {m.threads} thread(s) (measured rates)",
            "peak_tflops": {
                "fp32": round(m.gemm_fit.peak_flops / 1e12, 6),
                "bf16": round(m.bf16_peak_flops / 1e12, 6),
            },
            "memory_gib": round(memory_gib, 2),
            "memory_bandwidth_gbps": round(m.copy_bandwidth / 1e9, 3),
            "link": link,
        },
        "intra_node": link,
    }


def measured_profile(m: Measurement) -> DeviceProfile:
    """This host's device profile: the device's figures are achieved rates, so GEMMs
    reach all of the measured asymptote with the measured half-efficiency size and no
    kernel latency; fused attention and elementwise kernels run at their measured rates;
    collectives cost exactly their kind's fitted link. No launch floor: a CPU runs each
    kernel as it issues it, nothing runs ahead."""
    measured = Fit(True, f"legato calibrate --nproc {m.nproc} on {m.host}")
    gemm = GemmLaw(m.gemm_fit.peak_flops / 1e12, m.gemm_fit.half_dim, 0.0, measured)
    bf16 = dataclasses.replace(gemm, rate_tflops=m.bf16_peak_flops / 1e12)
    attention = AttentionLaw(m.attention_rate / 1e12, 0.0, 0.0, m.copy_bandwidth / 1e9, 0.0,
                             2.5, measured)  # fmt: skip
    memory = m.elementwise_bandwidth / 1e9
    kinds = {kind: (latency, gbps) for kind, latency, gbps in collective_fits(m.comm)}
    level = LevelLaw(1.0, 0.0, "alpha_beta", kinds, measured)
    return DeviceProfile(
        device=DEVICE_NAME,
        description=f"this host, {m.nproc} process(es) x {m.threads} thread(s)",
        gemm={"fp32": gemm, "bf16": bf16},
        attention={"fp32": attention, "bf16": attention},
        memory=MemoryLaw(memory, measured),
        host_link=HostLinkLaw(memory, memory, measured),
        host=HostLaw(0.0, 0.0, 0.0, measured, Fit(False, "not measured")),
        collectives=dict.fromkeys(LEVELS, level),
    )


def collective_fits(timings: list[CommTiming]) -> tuple[tuple[str, float, float], ...]:
    """``(kind, latency_us, bandwidth_gbps)``: an alpha-beta fit of each kind measured at
    two sizes or more (``devices.link_fit.fit_alpha_beta`` on that kind's timings alone)."""
    fits = []
    for kind in dict.fromkeys(t.kind for t in timings):
        mine = [t for t in timings if t.kind == kind]
        if len({t.nbytes for t in mine}) >= 2:
            fit = fit_alpha_beta(mine)
            fits.append((kind, round(fit.latency_s * 1e6, 3), round(fit.bandwidth / 1e9, 6)))
    return tuple(fits)


def _comments(m: Measurement, side: str) -> list[str]:
    lines = [
        f"Written by `legato calibrate --nproc {m.nproc}{' --quick' if m.quick else ''}` "
        f"({m.seconds:.0f} s); medians per process. Raw measurements: {side}",
        f"GEMM fp32: {m.gemm_fit.peak_flops / 1e9:.1f} GFLOP/s asymptote, half-efficiency "
        f"size {m.gemm_fit.half_dim:.1f} (fit error {100 * m.gemm_fit.error:.0f}%)",
    ]
    lines += [f"  {t.m} x {t.n} x {t.k}: {t.rate / 1e9:.1f} GFLOP/s" for t in m.gemm]
    lines += [
        f"copy {m.copy_bandwidth / 1e9:.2f} GB/s, elementwise kernels "
        f"{m.elementwise_bandwidth / 1e9:.2f} GB/s, fused attention "
        f"{m.attention_rate / 1e9:.1f} GFLOP/s",
        f"a multi-threaded kernel pays {m.parallel_overhead_s * 1e6:.0f} us for its threads "
        "(recorded; not the cost model's kernel_overhead_s, see Calibration)",
    ]
    if m.link is not None:
        lines.append(
            f"link fit: {m.link.latency_s * 1e6:.1f} us per step, "
            f"{m.link.bandwidth / 1e9:.3f} GB/s (fit error {100 * m.link.error:.0f}%)"
        )
        lines += [comm_line(t) for t in m.comm]
    return lines


def render_cluster_toml(m: Measurement, side: str) -> str:
    """The cluster file: comments with the measurements (``side``: where the raw ones
    are), then the tables."""
    table = cluster_table(m)
    lines = [f"# {line}" for line in _comments(m, side)] + [""]
    nested = {k: v for k, v in table.items() if isinstance(v, dict)}
    lines += [f"{k} = {toml_literal(v)}" for k, v in table.items() if k not in nested]
    for key, value in nested.items():
        lines += ["", f"[{key}]"]
        lines += [f"{k} = {toml_literal(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def write_cluster_file(m: Measurement, path: str | Path) -> Path:
    """Write the cluster file and its raw measurements beside it, each atomically."""
    path = Path(path)
    if path.suffix != ".toml":
        raise ConfigError(f"--out: the cluster file must end in .toml, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = render_profile(measured_profile(m), [])
    side = {"measurement": m.to_dict(), "calibration": {},
            "profile": tomllib.loads(profile)}  # fmt: skip
    write_text_atomic(side_path(path), json.dumps(side, indent=1) + "\n")
    write_text_atomic(path, render_cluster_toml(m, side_path(path).name))
    return path


def read_measurement(cluster_file: str | Path) -> Measurement:
    """The measurement a cluster file was written from (its side file)."""
    side = side_path(cluster_file)
    data = read_table_file(side, SpecError)
    if "measurement" not in data:
        raise SpecError(f"{side}: not a `legato calibrate` measurement file")
    return from_dict(Measurement, data["measurement"], "measurement", SpecError)
