"""cost.moe_layer_time: the schedules' predicted time obeys the resource bounds, and the
published-model predictions come out in a sensible range."""

from __future__ import annotations

from dataclasses import replace

import pytest

from legato.cost.calibration import CALIBRATION
from legato.cost.compute import DeviceModel
from legato.cost.moe_layer_time import MoEWork, best_schedule, moe_layer_time, overlap_gain
from legato.devices.collectives import LEVELS, LevelLaw
from legato.devices.registry import shipped_profile
from legato.specs.device import Link
from legato.specs.registry import load_cluster, load_model

DEVICE = DeviceModel.of(load_cluster("h800").device, "bf16", CALIBRATION)
NVLINK = Link("nvlink", 200.0, 2.0)
WORK = MoEWork(tokens=8192, hidden=4096, ffn=14336, top_k=2, num_experts=8, ep=8)
# every collective level alpha-beta on the link's own figures, nothing added per call
ALPHA_BETA = replace(
    shipped_profile("h800"), collectives=dict.fromkeys(LEVELS, LevelLaw(1.0, 0.0, "alpha_beta"))
)


def test_plain_is_compute_plus_communication():
    plain = moe_layer_time(WORK, DEVICE, NVLINK)
    assert plain.seconds == pytest.approx(plain.compute_s + plain.comm_s)
    assert plain.hidden_fraction == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("bandwidth", [20.0, 60.0, 200.0, 600.0])
@pytest.mark.parametrize(
    ("schedule", "chunks", "groups"), [("domino", 2, 1), ("comet", 2, 2), ("comet", 8, 4)]
)
def test_overlap_stays_between_the_resource_bound_and_plain(bandwidth, schedule, chunks, groups):
    link = Link("l", bandwidth, 2.0)
    fused = replace(CALIBRATION, profile=ALPHA_BETA)  # no per-call latency beyond the link's
    plain = moe_layer_time(WORK, DEVICE, link, calibration=fused)
    timed = moe_layer_time(WORK, DEVICE, link, schedule, chunks, groups, fused)
    assert max(timed.compute_s, timed.comm_s) <= timed.seconds * (1 + 1e-9)
    # smaller GEMMs cost compute (the profile's GEMM law); the overlap hides more than that
    # where communication matters, and always hides some of it
    extra_compute = timed.compute_s - plain.compute_s
    assert timed.seconds < plain.seconds + extra_compute
    if plain.comm_s > 2 * extra_compute:
        assert timed.seconds < plain.seconds
    assert 0.0 < timed.hidden_fraction <= 1.0


def test_overlap_gain_peaks_where_communication_equals_compute():
    gains = {}
    for bandwidth in (10.0, 40.0, 160.0, 640.0, 5000.0):
        link = Link("l", bandwidth, 0.0)
        plain = moe_layer_time(WORK, DEVICE, link)
        gains[bandwidth] = plain.seconds / best_schedule(WORK, DEVICE, link).seconds
    balanced = max(gains, key=gains.get)
    assert balanced not in (10.0, 5000.0)  # neither the comm- nor the compute-bound end
    assert 1.3 < gains[balanced] < 2.0  # overlap can at most halve the time


def test_fine_chunks_lose_when_communication_is_negligible():
    link = Link("fast", 1e5, 0.0)
    plain = moe_layer_time(WORK, DEVICE, link)
    assert moe_layer_time(WORK, DEVICE, link, "comet", 8, 4).seconds > plain.seconds
    assert best_schedule(WORK, DEVICE, link).seconds >= 0.99 * plain.seconds


def test_single_rank_has_nothing_to_hide():
    alone = replace(WORK, ep=1)
    timed = moe_layer_time(alone, DEVICE, NVLINK, "comet", 4, 4)
    assert timed.comm_s == 0.0
    assert timed.seconds == pytest.approx(timed.compute_s)


def test_more_chunks_pay_more_latency_on_a_wide_group():
    ib = Link("ib", 50.0, 5.0)
    work = replace(WORK, ep=64, num_experts=256, top_k=8, hidden=7168, ffn=2048, tokens=4096)
    few = moe_layer_time(work, DEVICE, ib, "comet", 2, 1)
    many = moe_layer_time(work, DEVICE, ib, "comet", 8, 8)
    assert many.comm_s > few.comm_s  # 63 latency steps per all-to-all, 4x the all-to-alls


@pytest.mark.parametrize(("name", "nodes", "ep"), [("mixtral-8x7b", 1, 8), ("deepseek-v3", 8, 64)])
def test_published_models_gain_from_overlap(name, nodes, ep):
    model = load_model(name)
    cluster = load_cluster("h800", nodes=nodes)
    link = cluster.level_for_group(ep)
    gain = overlap_gain(model, DEVICE, link, tokens=4096, ep=ep, dense_flops=1e15)
    assert 1.0 < gain.end_to_end < gain.layer < 2.0
    assert gain.overlapped.schedule in ("domino", "comet")
