"""Device profiles: fitted on micro-benchmarks only, readable and replaceable as files."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

import legato.cost
from legato.devices.fit_profiles import fit_all
from legato.devices.micro import read_gemm_csv
from legato.devices.profile_file import read_profile, render_profile
from legato.devices.registry import shipped_profile, shipped_profiles
from legato.errors import DataError, SpecError
from legato.specs.registry import list_devices

DATA = Path(__file__).parent / "data"
END_TO_END = Path(legato.cost.__file__).parent / "data"
SHARED_MICRO = Path(__file__).resolve().parents[2].parent / "shared" / "calibration" / "micro"


def test_every_device_preset_ships_a_profile() -> None:
    assert set(shipped_profiles()) == set(list_devices())
    a100 = shipped_profile("a100-80g")
    assert "gemm.bf16" not in a100.unfitted() and "collectives.intra_node" not in a100.unfitted()
    assert "gemm.bf16" in shipped_profile("rtx4090").unfitted()  # no micro data: a prior


def _micro_folder(tmp: Path, with_end_to_end: str) -> Path:
    """The MIT test subset, beside end-to-end CSVs kept, removed or perturbed."""
    micro = tmp / "micro"
    shutil.copytree(DATA, micro)
    if with_end_to_end != "removed":
        for f in END_TO_END.glob("*.csv"):
            text = f.read_text()
            if with_end_to_end == "perturbed":  # every digit 5 becomes 9
                text = text.replace("5", "9")
            (tmp / f.name).write_text(text)
    return micro


def test_no_constant_is_fitted_on_end_to_end_runs(tmp_path: Path) -> None:
    """Removing or perturbing the end-to-end CSVs leaves every device constant unchanged."""
    fitted = {}
    for case in ("kept", "removed", "perturbed"):
        folder = _micro_folder(tmp_path / case, case)
        fitted[case] = fit_all(folder, {})
    assert fitted["kept"] == fitted["removed"] == fitted["perturbed"]
    a100 = fitted["kept"]["a100-80g"]
    assert a100.gemm["fp16"].fit.fitted and a100.collectives["intra_node"].fit.fitted
    assert a100.gemm["fp16"].fit.held_out_median_pct < 15


@pytest.mark.skipif(not SHARED_MICRO.is_dir(), reason="../shared/calibration/micro/ absent")
def test_shipped_profiles_are_the_fit_of_the_micro_folder() -> None:
    from legato.devices.fit_profiles import vtrain_logs

    fitted = fit_all(SHARED_MICRO, {"a100-80g": vtrain_logs(SHARED_MICRO.parent)})
    for device, profile in fitted.items():
        assert profile == shipped_profile(device), device


def test_profile_file_round_trips_and_names_bad_keys(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(render_profile(shipped_profile("h100"), ["mine"]))
    assert read_profile(path) == shipped_profile("h100")
    path.write_text(path.read_text().replace("[memory]\nbandwidth_gbs", "[memory]\nbandwith_gbs"))
    with pytest.raises(SpecError, match=r"memory.bandwith_gbs: unknown field"):
        read_profile(path)


def test_gemm_sweep_csv(tmp_path: Path) -> None:
    path = tmp_path / "sweep.csv"
    path.write_text("m,n,k,dtype,time_us,group\n4096,4096,4096,bf16,600,a\n")
    (row,) = read_gemm_csv(path)
    assert row.seconds == pytest.approx(600e-6)
    path.write_text("m,n,k,dtype\n1,2,3,bf16\n")
    with pytest.raises(DataError, match=r"sweep.csv:2: column time_us"):
        read_gemm_csv(path)


def test_collectives_pick_nccls_cheapest_algorithm() -> None:
    """Small all-reduces are latency-bound (LL), large ones reach the bus bandwidth."""
    law = shipped_profile("a100-80g")
    small = law.collective_time("all_reduce", 1024, 8, 300.0)
    large = law.collective_time("all_reduce", 2**30, 8, 300.0)
    assert 5e-6 < small < 100e-6
    busbw = 2**30 * 2 * 7 / 8 / large / 1e9
    assert 150 < busbw < 300


def test_priors_keep_a_slow_devices_rates() -> None:
    """A CPU-class device's datasheet figures (fractions of a TFLOP/s) stay non-zero in
    its priors: every law can price work (a cluster file of a measured host without its
    side file uses them)."""
    from legato.devices.priors import prior_profile
    from legato.specs import load_cluster

    device = load_cluster("local-cpu").device
    slow = dataclasses.replace(
        device, peak_tflops={k: v / 1000 for k, v in device.peak_tflops.items()}
    )
    profile = prior_profile(slow)
    assert all(law.rate_tflops > 0 for law in (*profile.gemm.values(), *profile.attention.values()))
    assert profile.attention_time(1, 256, 256, 4, 2, 32, dtype=next(iter(profile.attention))) > 0
    assert set(profile.unfitted()) == {name for name, _ in profile.fits()}
