"""Topological, load-aware ordering of fused groups' compute and communication."""

from __future__ import annotations

import itertools
import random

import pytest

from legato.lora.subgraph_order import SubGraph, group_subgraphs, order_subgraphs, simulate_order


def _valid(nodes, timeline):
    by_name = {n.name: n for n in nodes}
    position = {name: i for i, name in enumerate(timeline.order)}
    for n in nodes:
        for d in n.deps:
            assert position[d] < position[n.name]
            assert timeline.start[n.name] >= timeline.end[d] - 1e-12
    for resource in {n.resource for n in nodes}:
        spans = sorted(
            (timeline.start[n], timeline.end[n]) for n in by_name if by_name[n].resource == resource
        )
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(spans))


def test_tensor_parallel_groups_overlap_one_anothers_communication():
    nodes = group_subgraphs("g0", 4, 1.0, 1.0, "tp") + group_subgraphs("g1", 4, 1.0, 1.0, "tp")
    serial = simulate_order(nodes, [n.name for n in nodes])  # group after group
    timeline = order_subgraphs(nodes)
    _valid(nodes, timeline)
    # compute of one group under the other's all-reduce: only one comm step is exposed
    compute = sum(n.duration for n in nodes if n.resource == "compute")
    assert timeline.makespan == pytest.approx(compute + 1.0)
    assert timeline.makespan < 0.75 * serial.makespan
    first_three = [timeline.order[i].split(".")[0] for i in range(3)]
    assert first_three == ["g0", "g1", "g0"] or first_three == ["g1", "g0", "g1"]


def test_data_parallel_gradient_allreduce_hides_under_the_next_groups_compute():
    nodes = group_subgraphs("a", 3, 1.0, 0.5, "dp") + group_subgraphs("b", 3, 1.0, 0.5, "dp")
    timeline = order_subgraphs(nodes)
    _valid(nodes, timeline)
    compute = sum(n.duration for n in nodes if n.resource == "compute")
    assert timeline.makespan == pytest.approx(compute + 0.5)  # only the last all-reduce shows


def test_random_graphs_give_valid_orders_no_worse_than_a_plain_topological_order():
    rng = random.Random(0)
    for _ in range(30):
        nodes = []
        for i in range(12):
            deps = tuple(f"n{j}" for j in range(i) if rng.random() < 0.25)
            resource = rng.choice(["compute", "comm"])
            nodes.append(SubGraph(f"n{i}", resource, rng.uniform(0.1, 2.0), deps))
        timeline = order_subgraphs(nodes)
        _valid(nodes, timeline)
        assert sorted(timeline.order) == sorted(n.name for n in nodes)


def test_bad_graphs_are_rejected():
    with pytest.raises(ValueError, match="cycle"):
        order_subgraphs([SubGraph("a", "compute", 1, ("b",)), SubGraph("b", "comm", 1, ("a",))])
    with pytest.raises(ValueError, match="unknown"):
        order_subgraphs([SubGraph("a", "compute", 1, ("zzz",))])
    nodes = [SubGraph("a", "compute", 1), SubGraph("b", "comm", 1, ("a",))]
    with pytest.raises(ValueError, match="before one of its dependencies"):
        simulate_order(nodes, ["b", "a"])
