"""`legato calibrate`: the fits recover known constants, the cluster file round-trips, and
the cost model reproduces the measured rates under the measured calibration."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from legato.calibrate.cluster_file import (
    DEVICE_NAME,
    measured_profile,
    read_measurement,
    side_path,
    write_cluster_file,
)
from legato.calibrate.host import Measurement
from legato.calibrate.matmul import GEMM_SHAPES
from legato.cli import main as cli
from legato.cost.calibration import CALIBRATION, calibration_beside
from legato.cost.collectives import collective_time
from legato.cost.compute import DeviceModel, Gemm
from legato.devices.gemm_fit import GemmFit, GemmTiming, fit_gemm_rate
from legato.devices.least_squares import fit_nonnegative
from legato.devices.link_fit import CommTiming, LinkFit, fit_alpha_beta
from legato.errors import ConfigError
from legato.specs import load_cluster

PEAK, HALF_DIM = 150e9, 24.0  # FLOP/s and elements of a synthetic CPU
ALPHA, BETA = 80e-6, 2.5e9  # seconds per ring step and bytes/s of a synthetic link


def _gemms(noise: float = 0.0) -> list[GemmTiming]:
    law = GemmFit(PEAK, HALF_DIM, 0.0)
    out = []
    for i, (m, n, k) in enumerate(GEMM_SHAPES):
        wobble = 1 + noise * (-1) ** i
        out.append(GemmTiming(m, n, k, "fp32", 2 * m * n * k / law.rate(m, n, k) * wobble))
    return out


def _comms(ranks: int) -> list[CommTiming]:
    law = LinkFit(ALPHA, BETA, 0.0)
    kinds = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")
    sizes = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
    out = [CommTiming(k, n, ranks, law.time(k, n, ranks)) for k in kinds for n in sizes]
    return out + [CommTiming("p2p", n, 2, law.time("p2p", n, 2)) for n in sizes]


def _measurement(nproc: int = 2) -> Measurement:
    gemm = _gemms()
    link = fit_alpha_beta(_comms(nproc)) if nproc > 1 else None
    return Measurement(
        nproc=nproc,
        threads=1,
        quick=False,
        host="synthetic",
        gemm=gemm,
        gemm_fit=fit_gemm_rate(gemm),
        bf16_gemm=[],
        bf16_peak_flops=4 * PEAK,
        copy_bandwidth=8e9,
        elementwise_bandwidth=6e9,
        parallel_overhead_s=0.0,
        attention_rate=30e9,
        comm=_comms(nproc) if nproc > 1 else [],
        link=link,
        seconds=12.0,
    )


def test_gemm_fit_recovers_the_law():
    fit = fit_gemm_rate(_gemms())
    assert fit.peak_flops == pytest.approx(PEAK, rel=1e-9)
    assert fit.half_dim == pytest.approx(HALF_DIM, rel=1e-9)
    assert fit.error < 1e-9
    noisy = fit_gemm_rate(_gemms(noise=0.05))  # +-5% per shape: constants within a few %
    assert noisy.peak_flops == pytest.approx(PEAK, rel=0.05)
    assert noisy.half_dim == pytest.approx(HALF_DIM, rel=0.25)
    assert 0.02 < noisy.error < 0.08


def test_gemm_fit_does_not_extrapolate_noise():
    """Small shapes slowed far beyond the law (threads descheduled under load) would make
    a free fit answer with an asymptote no shape comes near: it is capped near the best
    rate seen, and the slowdown goes into the half-efficiency size."""
    timings = [
        GemmTiming(t.m, t.n, t.k, "fp32", t.seconds * (1 + 2000 * (1 / t.m + 1 / t.n + 1 / t.k)))
        for t in _gemms()
    ]
    fit = fit_gemm_rate(timings)
    best = max(t.rate for t in timings)
    assert best <= fit.peak_flops <= 1.2 * best
    assert fit.half_dim > 10 * HALF_DIM


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_alpha_beta_fit_recovers_the_link(ranks):
    fit = fit_alpha_beta(_comms(ranks))
    assert fit.latency_s == pytest.approx(ALPHA, rel=1e-6)
    assert fit.bandwidth == pytest.approx(BETA, rel=1e-6)
    assert fit.error < 1e-6


def test_fit_holds_a_negative_coefficient_at_zero():
    # Times growing faster than the bytes would need a negative latency: held at 0.
    grow = [CommTiming("p2p", n, 2, n / BETA - 1e-6) for n in (1e5, 1e6, 1e7)]
    fit = fit_alpha_beta(grow)
    assert fit.latency_s == 0.0
    assert fit.bandwidth == pytest.approx(BETA, rel=0.02)
    # Times falling with size would need a negative 1/bandwidth: the latency hides the
    # bytes, and the best rate seen stands for the bandwidth.
    fall = [CommTiming("p2p", n, 2, t) for n, t in ((1e3, 5e-3), (1e6, 4e-3))]
    fit = fit_alpha_beta(fall)
    assert fit.bandwidth == pytest.approx(1e6 / 4e-3)
    assert fit.latency_s > 0
    assert fit_nonnegative([(1.0, 0.0), (0.0, 1.0)], [2.0, 3.0]) == pytest.approx([2.0, 3.0])


def test_cluster_file_round_trips(tmp_path: Path):
    m = _measurement()
    path = write_cluster_file(m, tmp_path / "sub" / "local.toml")
    cluster = load_cluster(path)
    assert cluster.world_size == 2 and cluster.nodes == 1
    assert cluster.device.name == DEVICE_NAME
    assert cluster.device.peak_flops("fp32") == pytest.approx(PEAK, rel=1e-5)
    assert cluster.device.peak_flops("bf16") == pytest.approx(4 * PEAK, rel=1e-5)
    assert cluster.device.memory_bandwidth_gbps == pytest.approx(8.0)
    (level,) = cluster.levels
    assert level.bandwidth_gbps == pytest.approx(BETA / 1e9, rel=1e-3)
    assert level.latency_us == pytest.approx(ALPHA * 1e6, rel=1e-3)
    assert "# GEMM fp32" in path.read_text()
    assert read_measurement(path) == m
    side = json.loads(side_path(path).read_text())
    assert side["profile"]["gemm"]["fp32"]["half_dim"] == pytest.approx(HALF_DIM)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "local.calibration.json",
        "local.toml",
    ]  # no temp files left


def test_measured_profile_reproduces_the_measurements(tmp_path: Path):
    """Under the host's measured profile the cost model's GEMM, attention, elementwise and
    collective times are the measured ones: no GPU efficiency is applied on top of
    achieved rates."""
    m = _measurement()
    cluster = load_cluster(write_cluster_file(m, tmp_path / "local.toml"))
    calibration = dataclasses.replace(CALIBRATION, profile=measured_profile(m))
    device = DeviceModel.of(cluster.device, "fp32", calibration)
    for t in m.gemm:
        assert device.gemm_time(Gemm(t.m, t.n, t.k)) == pytest.approx(t.seconds, rel=1e-4)
    assert device.memory_time(6e9) == pytest.approx(1.0)  # the elementwise rate
    # 4 x 1000 x 1000 x 7500 = 30 GFLOP of non-causal attention at the measured 30 GFLOP/s
    attention = device.profile.attention_time(1, 1000, 1000, 1, 1, 7500, causal=False, dtype="fp32")
    assert attention == pytest.approx(1.0, rel=1e-4)
    for c in m.comm:
        t = collective_time(c.kind, c.nbytes, c.ranks, cluster.levels[0], calibration.profile)
        assert t == pytest.approx(c.seconds, rel=1e-3)


def test_side_file_loads_back_as_the_measured_profile(tmp_path: Path):
    """What `legato predict --cluster FILE` uses is ``measured_profile``; the fork/join
    probe is recorded in the measurement but not charged per kernel, and a CPU host has
    no launch floor."""
    m = dataclasses.replace(_measurement(), threads=2, parallel_overhead_s=3e-5)
    path = write_cluster_file(m, tmp_path / "local.toml")
    loaded = calibration_beside(path)
    assert loaded == dataclasses.replace(CALIBRATION, profile=measured_profile(m))
    profile = loaded.profile
    assert profile.gemm["fp32"].rate_tflops * 1e12 == pytest.approx(PEAK)  # achieved, as is
    assert all(law.call_latency_us == 0.0 for law in profile.collectives.values())
    assert loaded.kernel_overhead_s == 0.0 and profile.launch_overhead == 0.0  # a CPU: no floor
    assert read_measurement(path).parallel_overhead_s == pytest.approx(3e-5)
    # a side file written before profiles existed: one line saying to measure again
    side = side_path(path)
    data = json.loads(side.read_text())
    del data["profile"]
    side.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="run `legato calibrate` again"):
        calibration_beside(path)


def test_one_process_file_has_the_nominal_link(tmp_path: Path):
    cluster = load_cluster(write_cluster_file(_measurement(1), tmp_path / "one.toml"))
    nominal = load_cluster("local-cpu").levels[0]
    assert cluster.world_size == 1
    assert cluster.levels[0].bandwidth_gbps == nominal.bandwidth_gbps
    assert "nominal" in cluster.levels[0].name


def test_out_must_be_toml(tmp_path: Path):
    with pytest.raises(ConfigError, match="--out"):
        write_cluster_file(_measurement(), tmp_path / "local.json")
    assert not list(tmp_path.iterdir())


def test_cli_quick_one_process(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("calibrate",))
    out = tmp_path / "cpu.toml"
    code = cli.main(["calibrate", "--nproc", "1", "--quick", "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cluster_file"] == str(out) and result["link"] is None
    cluster = load_cluster(out)
    assert cluster.world_size == 1
    assert cluster.device.peak_flops("fp32") == pytest.approx(
        result["gemm_fit"]["peak_flops"], rel=1e-4
    )
    assert all(t["seconds"] > 0 for t in result["gemm"])
    assert result["copy_bandwidth"] > 0 and result["attention_rate"] > 0
