"""Alpha-beta collective formulas, and the calibrated model against measured NCCL."""

from __future__ import annotations

from pathlib import Path

import pytest

import legato.cost
from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.collectives import collective_time, ideal_time
from legato.devices.link_fit import fit_collective_model
from legato.devices.nccl_tests import read_nccl_tests
from legato.errors import DataError
from legato.specs import Link

DATA = Path(legato.cost.__file__).parent / "data"
NVLINK = Link("NVLink 3", bandwidth_gbps=300, latency_us=2.0)
IDEAL = Calibration(base_latency_us=0.0, latency_scale=1.0, bandwidth_fraction=1.0)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # p = 8, a = 2 us, b = 300 GB/s, 1 GB: hand-computed from the textbook forms.
        ("all_gather", 7 * 2e-6 + 1e9 * 7 / 8 / 300e9),
        ("reduce_scatter", 7 * 2e-6 + 1e9 * 7 / 8 / 300e9),
        ("all_to_all", 7 * 2e-6 + 1e9 * 7 / 8 / 300e9),
        ("all_reduce", 2 * 7 * 2e-6 + 2 * 1e9 * 7 / 8 / 300e9),
        ("p2p", 2e-6 + 1e9 / 300e9),
    ],
)
def test_textbook_formulas(kind, expected):
    assert collective_time(kind, 1e9, 8, NVLINK, IDEAL) == pytest.approx(expected, rel=1e-12)
    assert ideal_time(kind, 1e9, 8, 2e-6, 300e9) == pytest.approx(expected, rel=1e-12)


def test_calibrated_time_adds_launch_latency_and_loses_bandwidth():
    ideal = collective_time("all_reduce", 1e8, 8, NVLINK, IDEAL)
    real = collective_time("all_reduce", 1e8, 8, NVLINK)
    base = CALIBRATION.base_latency_us * 1e-6
    assert real > ideal
    wire = 2 * 1e8 * 7 / 8 / 300e9
    assert real - base - 14 * 2e-6 == pytest.approx(wire / CALIBRATION.bandwidth_fraction)


def test_groups_of_one_send_nothing_and_shared_links_are_slower():
    assert collective_time("all_reduce", 1e9, 1, NVLINK) == 0.0
    assert collective_time("all_gather", 0, 8, NVLINK) == 0.0
    alone = collective_time("all_gather", 1e9, 8, NVLINK)
    assert collective_time("all_gather", 1e9, 8, NVLINK, bandwidth_share=0.5) > 1.9 * (
        alone - CALIBRATION.base_latency_us * 1e-6 - 7 * 2e-6
    )


def _measurements():
    return [
        m for p in (2, 4, 8) for m in read_nccl_tests(DATA / f"a100_nccl_allreduce_{p}gpu.txt", p)
    ]


def test_fit_reproduces_measured_nccl_all_reduce():
    """The fitted model reproduces 1 MB - 1 GB all-reduce on 2, 4 and 8 A100s: mean error
    6%, 95% of sizes within 11%; only a few sizes of 1-2 MB, where NCCL switches protocol,
    are further off."""
    measurements = _measurements()
    assert len(measurements) == 3 * 1024
    fit = fit_collective_model(measurements, NVLINK.latency_us, NVLINK.bandwidth_gbps)
    assert fit.mean_error < 0.07
    assert fit.p95_error < 0.15
    for p in (2, 4, 8):
        errors = [
            abs(collective_time("all_reduce", m.nbytes, p, NVLINK) / m.seconds - 1)
            for m in measurements
            if m.ranks == p
        ]
        assert sum(errors) / len(errors) < 0.10, p
        assert sorted(errors)[int(0.9 * len(errors))] < 0.15, p


def test_calibration_holds_the_fitted_constants():
    fit = fit_collective_model(_measurements(), NVLINK.latency_us, NVLINK.bandwidth_gbps)
    assert CALIBRATION.base_latency_us == pytest.approx(fit.base_latency_us, abs=0.1)
    assert CALIBRATION.bandwidth_fraction == pytest.approx(fit.bandwidth_fraction, abs=1e-3)


def test_bad_nccl_file_is_one_data_error(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("size,count\n12,x,float\n")
    with pytest.raises(DataError, match="nccl-tests"):
        read_nccl_tests(bad, 8)
