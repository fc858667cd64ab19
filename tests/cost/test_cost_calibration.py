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
from legato.devices.laws import HostLaw
from legato.devices.profile_file import read_profile, render_profile
from legato.devices.registry import shipped_profile
from legato.errors import ConfigError
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy
from legato.specs.typed import tomllib

OVERHEAD = 2e-4


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def _profile_file(tmp_path: Path) -> Path:
    """A user's own profile: the shipped H100 one with a slower host."""
    profile = replace(shipped_profile("h100"), device="my-h100")
    profile = replace(profile, host=replace(profile.host, launch_us=25.0))
    path = tmp_path / "my_h100.toml"
    path.write_text(render_profile(profile, ["mine"]))
    return path


def test_flat_file_overrides_and_names_a_profile_beside_it(tmp_path: Path):
    profile = read_profile(_profile_file(tmp_path))
    data = {"framework_gib": 2.5, "kernel_overhead_s": 1e-5, "profile": "my_h100.toml"}
    cal = load_calibration(_write(tmp_path / "c.json", data))
    assert cal == replace(CALIBRATION, framework_gib=2.5, kernel_overhead_s=1e-5, profile=profile)
    # the profile replaces whichever device's shipped one
    assert cal.profile_of(load_cluster("dgx-a100").device).launch_overhead == pytest.approx(25e-6)
    assert CALIBRATION.profile_of(load_cluster("dgx-a100").device) == shipped_profile("a100-80g")


def test_side_file_uses_its_calibration_and_profile_entries(tmp_path: Path):
    profile = tomllib.loads(_profile_file(tmp_path).read_text())
    side = {"measurement": {"nproc": 1}, "calibration": {"framework_gib": 0.5},
            "profile": profile}  # fmt: skip
    cal = load_calibration(_write(tmp_path / "x.calibration.json", side))
    assert cal.framework_gib == 0.5 and cal.profile.device == "my-h100"


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"kernel_overhead": 1e-5}, "calibration.kernel_overhead: unknown field"),
        ({"calibration": {"bogus": 1}, "profile": {}}, "calibration.bogus: unknown field"),
        ({"framework_gib": "big"}, "calibration.framework_gib"),
        ({"profile": {"device": "x"}}, "profile.gemm: required table is missing"),
        ({"profile": "none.toml"}, "none.toml"),
        ({"profile": 3}, "profile must be a file name or a table"),
        ({"calibration": [1, 2], "profile": {}}, "must be a JSON object"),
        ({"measurement": {}, "calibration": {}}, "older `legato calibrate`"),
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
    host = replace(shipped_profile("cpu"), host=HostLaw(0.0, 0.0, 0.0))
    profile = tomllib.loads(render_profile(host, []))
    _write(side_path(cluster), {"calibration": {"kernel_overhead_s": OVERHEAD}, "profile": profile})
    # a side file is a CPU host's, with the host's own profile: no GPU launch floor
    want = replace(CALIBRATION, kernel_overhead_s=OVERHEAD, profile=host)
    assert calibration_beside(cluster) == want
    assert calibration_beside(cluster).profile.launch_overhead == 0.0
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
