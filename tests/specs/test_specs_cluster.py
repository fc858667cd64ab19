"""Which link level a group of ranks crosses, checked against brute force."""

from __future__ import annotations

import pytest

from legato.errors import SpecError
from legato.specs import load_cluster


def _brute_force_level(cluster, size, stride):
    """Slowest level over every group of a row-major mesh axis of ``size`` and ``stride``."""
    worst = 0
    for block in range(0, cluster.world_size, size * stride):
        for offset in range(stride):
            ranks = [block + offset + i * stride for i in range(size)]
            worst = max(worst, cluster.levels.index(cluster.level_of_ranks(ranks)))
    return cluster.levels[worst]


@pytest.mark.parametrize(
    ("name", "nodes"), [("dgx-h100", 4), ("cloudmatrix384", 96), ("local-cpu", 1)]
)
def test_level_for_group_matches_brute_force(name, nodes):
    cluster = load_cluster(name, nodes=nodes)
    world = cluster.world_size
    for size in range(1, world + 1):
        for stride in range(1, world // size + 1):
            if world % (size * stride):
                continue
            assert cluster.level_for_group(size, stride) == _brute_force_level(
                cluster, size, stride
            ), (size, stride)


def test_levels_of_typical_axes():
    cm = load_cluster("cloudmatrix384", nodes=96)  # 768 NPUs, two supernodes
    intra, supernode, roce = cm.levels
    assert cm.level_for_group(8) == intra  # TP inside a node
    assert cm.level_for_group(16, stride=8) == supernode  # next axis, still one supernode
    assert cm.level_for_group(48, stride=8) == supernode
    assert cm.level_for_group(2, stride=384) == roce  # DP across supernodes
    assert cm.level_for_group(3, stride=256) == roce  # 768 = 3 x 256 straddles supernodes
    assert cm.level_of_ranks([0, 7]) == intra
    assert cm.level_of_ranks([7, 8]) == supernode
    assert cm.level_of_ranks([383, 384]) == roce


def test_bad_groups():
    dgx = load_cluster("dgx-a100", nodes=2)
    with pytest.raises(SpecError, match="does not tile the world size 16"):
        dgx.level_for_group(3)
    with pytest.raises(SpecError, match="rank 16 is outside the cluster"):
        dgx.level_of_ranks([0, 16])
