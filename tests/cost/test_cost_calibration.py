"""Calibration files and the per-kernel overhead term: `load_calibration` reads what
`legato calibrate` writes (and rejects the rest in one line), and `kernel_overhead_s`
adds exactly its kernels' cost to the step, and nothing at its GPU default of 0."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from legato.cost.calibration import (
    CALIBRATION,
    calibration_beside,
    load_calibration,
    side_path,
)
from legato.cost.runtime import Runtime, kernels_per_pass
from legato.cost.training_step import predict
from legato.errors import ConfigError
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy

OVERHEAD = 2e-4


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_flat_file_overrides_and_lists_become_tuples(tmp_path: Path):
    data = {
        "gemm_half_dim": 12,
        "peak_fraction_by_device": [["cpu", 1.0]],
        "kernel_overhead_s": 1e-5,
    }
    cal = load_calibration(_write(tmp_path / "c.json", data))
    assert cal == replace(
        CALIBRATION,
        gemm_half_dim=12.0,
        peak_fraction_by_device=(("cpu", 1.0),),
        kernel_overhead_s=1e-5,
    )
    assert cal.gemm_peak_fraction("cpu-measured") == 1.0
    assert isinstance(cal.peak_fraction_by_device, tuple)


def test_side_file_uses_its_calibration_entry(tmp_path: Path):
    side = {"measurement": {"nproc": 1}, "calibration": {"attention_fraction": 0.3}}
    assert load_calibration(_write(tmp_path / "x.calibration.json", side)).attention_fraction == 0.3


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"kernel_overhead": 1e-5}, "calibration.kernel_overhead: unknown field"),
        ({"calibration": {"bogus": 1}}, "calibration.bogus: unknown field"),
        ({"gemm_half_dim": "big"}, "calibration.gemm_half_dim"),
        ({"peak_fraction_by_device": [["h100"]]}, "peak_fraction_by_device[0]"),
        ({"calibration": [1, 2]}, "must be a JSON object"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, data, fragment):
    with pytest.raises(ConfigError) as err:
        load_calibration(_write(tmp_path / "bad.json", data))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="file not found"):
        load_calibration(tmp_path / "none.json")


def test_calibration_beside_a_cluster_file(tmp_path: Path):
    cluster = tmp_path / "local.toml"
    cluster.write_text("")
    assert side_path(cluster) == tmp_path / "local.calibration.json"
    assert calibration_beside(cluster) is None  # no side file
    _write(side_path(cluster), {"calibration": {"kernel_overhead_s": OVERHEAD}})
    # a side file is a CPU host's: no GPU launch floor unless it says so
    want = replace(CALIBRATION, kernel_overhead_s=OVERHEAD, launch_s=0.0)
    assert calibration_beside(cluster) == want
    assert calibration_beside("local-cpu") is None  # a preset name


def _step(overhead: float, runtime: Runtime, recompute: str = "none") -> float:
    model, cluster = load_model("tiny"), load_cluster("local-cpu")
    strategy = Strategy(dp=2, zero=3, mbs=6, gbs=24, dtype="fp32", recompute=recompute)
    cal = replace(CALIBRATION, kernel_overhead_s=overhead)
    return predict(
        model, cluster, strategy, overlap=False, runtime=runtime, calibration=cal
    ).step_time_s


@pytest.mark.parametrize("fused", [False, True])
def test_kernel_term_is_overhead_times_kernels(fused: bool):
    runtime = Runtime(fused_elementwise=fused)
    k = kernels_per_pass(runtime)
    layers, microbatches = load_model("tiny").num_layers, 2
    kernels = layers * (k.block_fwd + k.block_bwd) + k.edge_fwd + k.edge_bwd
    added = _step(OVERHEAD, runtime) - _step(0.0, runtime)
    assert added == pytest.approx(OVERHEAD * kernels * microbatches, rel=1e-9)
    # full recompute reruns every block's forward kernels
    again = _step(OVERHEAD, runtime, "full") - _step(0.0, runtime, "full")
    assert again - added == pytest.approx(OVERHEAD * layers * k.block_fwd * microbatches, rel=1e-6)


def test_fused_runs_fewer_kernels_and_gpu_default_is_zero():
    eager, fused = kernels_per_pass(Runtime(fused_elementwise=False)), kernels_per_pass(Runtime())
    assert fused.block_fwd < eager.block_fwd and fused.block_bwd < eager.block_bwd
    assert CALIBRATION.kernel_overhead_s == 0.0
