"""Mesh axes of a Strategy: sizes, strides and the link level each one crosses."""

from __future__ import annotations

import pytest

from legato.cost.mesh import mesh_axes
from legato.specs import load_cluster
from legato.specs.strategy import Strategy

NVLINK, IB = "NVLink 3", "HDR InfiniBand 200 Gb/s per GPU"


@pytest.fixture
def dgx4():
    return load_cluster("dgx-a100", nodes=4)  # 32 GPUs, 8 per node


def test_megatron_layout_puts_tp_on_nvlink_and_dp_pp_across_nodes(dgx4):
    axes = mesh_axes(Strategy(tp=8, dp=2, pp=2, gbs=8), dgx4)
    assert (axes["tp"].size, axes["tp"].stride, axes["tp"].level.name) == (8, 1, NVLINK)
    assert (axes["dp"].size, axes["dp"].stride, axes["dp"].level.name) == (2, 8, IB)
    assert (axes["pp"].stride, axes["pp"].level.name) == (16, IB)


def test_small_groups_stay_inside_a_node(dgx4):
    axes = mesh_axes(Strategy(tp=2, cp=2, dp=2, pp=4, gbs=8), dgx4)
    assert axes["tp"].level.name == NVLINK
    assert (axes["cp"].stride, axes["cp"].level.name) == (2, NVLINK)
    assert (axes["dp"].size, axes["dp"].stride, axes["dp"].level.name) == (4, 2, NVLINK)
    assert axes["pp"].level.name == IB  # stages are 8 ranks apart: one node each


def test_two_dimensional_tp_splits_into_inner_and_outer_axes(dgx4):
    axes = mesh_axes(Strategy(tp=16, tp_y=2, dp=2, gbs=2), dgx4)
    assert (axes["tp_x"].size, axes["tp_x"].stride, axes["tp_x"].level.name) == (8, 1, NVLINK)
    assert (axes["tp_y"].size, axes["tp_y"].stride, axes["tp_y"].level.name) == (2, 8, IB)


def test_expert_axes_fold_over_data_parallel_ranks(dgx4):
    axes = mesh_axes(Strategy(tp=2, dp=16, ep=4, gbs=16), dgx4)
    assert (axes["ep"].size, axes["ep"].stride, axes["ep"].level.name) == (4, 2, NVLINK)
    assert (axes["edp"].size, axes["edp"].stride, axes["edp"].level.name) == (4, 8, IB)


def test_ring_collectives_use_every_nic_of_a_node(dgx4):
    """A 32-rank data-parallel group holds all 8 GPUs of each node: its rings cross the
    node boundary through 8 NICs at once (8 x 25 GB/s, below NVLink's 300); point-to-point
    traffic goes to one peer over one NIC."""
    wide = mesh_axes(Strategy(dp=32, gbs=32), dgx4)["dp"]
    assert wide.level.name == IB
    assert wide.link("all_reduce").bandwidth_gbps == 8 * 25
    # an all-to-all gains only its in-node share (7 of 31 peers on NVLink)
    assert wide.link("all_to_all").bandwidth_gbps == pytest.approx(31 / (24 / 25))
    assert wide.link("p2p").bandwidth_gbps == 25
    strided = mesh_axes(Strategy(tp=8, dp=4, gbs=4), dgx4)["dp"]  # one GPU per node
    assert strided.link("all_reduce").bandwidth_gbps == 25


def test_folded_expert_parallelism_stays_inside_the_node():
    """ep=8 over tp=4 x dp=4 does not divide dp: it folds over the tp ranks first (stride
    1), so the all-to-all runs on NVLink, and the experts' gradient group is the other
    node's copy (edp = 16 / 8 = 2, stride 8, across nodes)."""
    cluster = load_cluster("dgx-h100", nodes=2)
    axes = mesh_axes(Strategy(dp=4, tp=4, sp=True, ep=8, gbs=4), cluster)
    assert (axes["ep"].size, axes["ep"].stride) == (8, 1)
    assert axes["ep"].level == cluster.levels[0]
    assert (axes["edp"].size, axes["edp"].stride) == (2, 8)
    assert axes["edp"].level == cluster.levels[1]
    unfolded = mesh_axes(Strategy(dp=8, tp=2, sp=True, ep=8, gbs=8), cluster)
    assert (unfolded["ep"].stride, unfolded["ep"].level) == (2, cluster.levels[1])


def test_an_all_to_all_half_inside_a_node_moves_that_half_on_nvlink():
    """ep=16 over two DGX H100 nodes (8 members per node): 8/16 of each buffer leaves the
    node on its 50 GB/s link while 7/16 goes over NVLink at once, so the 15/16 the
    all-to-all sends take as long as 8/16 on the outer link; a group with one member per
    node gets nothing from NVLink."""
    cluster = load_cluster("dgx-h100", nodes=2)
    outer, inner = cluster.levels[1], cluster.levels[0]
    folded = mesh_axes(Strategy(dp=4, tp=4, sp=True, ep=16, gbs=4), cluster)["ep"]
    assert folded.link("all_to_all").bandwidth_gbps == pytest.approx(
        15 / max(8 / outer.bandwidth_gbps, 7 / inner.bandwidth_gbps)
    )
    assert folded.link("p2p") == outer
    spread = mesh_axes(Strategy(dp=2, tp=8, ep=2, etp=8, gbs=2), cluster)["ep"]
    assert spread.stride == 8 and spread.link("all_to_all") == outer
