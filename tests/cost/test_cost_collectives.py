"""Collectives from the device profile: the textbook alpha-beta forms, NCCL's law on top
of them, and the shipped A100 law against measured NCCL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import legato.cost
from legato.cost.collectives import collective_time
from legato.devices.collectives import LEVELS, LevelLaw, ideal_time, nccl_time
from legato.devices.link_fit import fit_level
from legato.devices.nccl_tests import read_nccl_tests
from legato.devices.registry import shipped_profile
from legato.errors import DataError
from legato.specs import Link

DATA = Path(legato.cost.__file__).parent / "data"
NVLINK = Link("NVLink 3", bandwidth_gbps=300, latency_us=2.0)
A100 = shipped_profile("a100-80g")
# every level alpha-beta on the link's own figures, nothing lost, nothing added per call
IDEAL = dataclasses.replace(
    A100, collectives=dict.fromkeys(LEVELS, LevelLaw(1.0, 0.0, "alpha_beta"))
)


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


def test_profiled_time_adds_call_latency_and_loses_bandwidth():
    """NCCL's law: each call pays the level's call latency on top of NCCL's own, and a
    large all-reduce moves its ring bytes at the fitted share of the link (Simple ring)."""
    ideal = collective_time("all_reduce", 1e9, 8, NVLINK, IDEAL)
    real = collective_time("all_reduce", 1e9, 8, NVLINK, A100)
    law = A100.collectives["intra_node"]
    assert real > ideal
    bus = NVLINK.bandwidth_gbps * 1e9 * law.bus_fraction
    assert real == pytest.approx(
        law.call_latency_us * 1e-6 + nccl_time("all_reduce", 1e9, 8, bus, False)
    )
    wire = 2 * 1e9 * 7 / 8
    assert real - law.call_latency_us * 1e-6 == pytest.approx(wire / bus, rel=0.01)


def test_groups_of_one_send_nothing_and_shared_links_are_slower():
    assert collective_time("all_reduce", 1e9, 1, NVLINK, A100) == 0.0
    assert collective_time("all_gather", 0, 8, NVLINK, A100) == 0.0
    alone = collective_time("all_gather", 1e9, 8, NVLINK, A100)
    call = A100.collectives["intra_node"].call_latency_us * 1e-6
    halved = collective_time("all_gather", 1e9, 8, NVLINK, A100, bandwidth_share=0.5)
    assert halved - call > 1.9 * (alone - call)


def _measurements():
    return [
        m for p in (2, 4, 8) for m in read_nccl_tests(DATA / f"a100_nccl_allreduce_{p}gpu.txt", p)
    ]


def test_the_a100_law_reproduces_measured_nccl_all_reduce():
    """vTrain's 1 MB - 1 GB all-reduce on 2, 4 and 8 A100s under the shipped profile (one
    law for every size and rank count, fitted with Vidur's and nccl-tests' sweeps): mean
    error within 11% per rank count, 90% of sizes within 15%."""
    measurements = _measurements()
    assert len(measurements) == 3 * 1024
    for p in (2, 4, 8):
        errors = [
            abs(collective_time("all_reduce", m.nbytes, p, NVLINK, A100) / m.seconds - 1)
            for m in measurements
            if m.ranks == p
        ]
        assert sum(errors) / len(errors) < 0.11, p
        assert sorted(errors)[int(0.9 * len(errors))] < 0.15, p


def test_the_level_fit_recovers_a_known_law():
    """``fit_level`` (what built the shipped laws) recovers the bus share and call latency
    of timings made by NCCL's own model."""
    timings = [
        dataclasses.replace(
            m, seconds=30e-6 + nccl_time("all_reduce", m.nbytes, m.ranks, 0.7 * 300e9, False)
        )
        for m in _measurements()[::64]
    ]
    fraction, call_us, median, _ = fit_level(timings, 300.0, False)
    assert fraction == pytest.approx(0.7, rel=1e-3)
    assert call_us == pytest.approx(30.0, rel=1e-2)
    assert median < 1e-3


def test_bad_nccl_file_is_one_data_error(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("size,count\n12,x,float\n")
    with pytest.raises(DataError, match="nccl-tests"):
        read_nccl_tests(bad, 8)
