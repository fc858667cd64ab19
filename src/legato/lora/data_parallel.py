"""Data parallelism for the multi-task LoRA trainer, with the fused groups' overlap executed.

Every rank holds the whole frozen backbone and every task's adapter. Each rank draws the
same global batch per task and keeps its contiguous share of rows, so the global batch is
the same for any world size. A task's loss is normalised by the trained tokens of the
*global* batch, so each rank's gradient is its share of the global-batch mean and the
all-reduce (a sum) gives exactly the 1-process gradient, to rounding.

The tasks of a fused step are split into ``fused_groups`` groups, each with its own
forward and backward. A group's gradients (and loss sums, for the logs) go out in one
asynchronous all-reduce as soon as its backward is done, and are waited for only before
its optimizer steps, so group A's communication runs under group B's compute. The groups
run in the order :func:`order_subgraphs` gives for their ``dp`` sub-graphs. One all-reduce
per group rather than one per layer keeps the collective count low; the overlap it
exploits is between groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TypeVar

import torch.distributed as dist
from torch import Tensor

from legato.errors import ConfigError
from legato.lora.subgraph_order import SubGraph, group_subgraphs, order_subgraphs
from legato.parallel.process_group import PendingReduce, all_reduce_flat, broadcast_object

T = TypeVar("T")


class DataParallel:
    """The process group over which a :class:`MultiTaskTrainer` sums its adapters' gradient
    shares (each already divided by the global batch's tokens: the sum is the average)."""

    def __init__(self, group: dist.ProcessGroup | None = None, fused_groups: int = 2) -> None:
        if fused_groups < 1:
            raise ValueError(f"fused_groups must be >= 1, got {fused_groups}")
        self.group = group
        self.fused_groups = fused_groups
        active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if active else 0
        self.world = dist.get_world_size(group) if active else 1

    def local_batch(self, batch_size: int, where: str) -> int:
        """This rank's sequences per optimizer step; the global batch must split evenly."""
        if batch_size % self.world:
            raise ConfigError(
                f"{where}.batch_size: {batch_size} does not split over {self.world} "
                "data-parallel ranks; use a multiple of the world size"
            )
        return batch_size // self.world

    def shard(self, rows: int) -> tuple[int, int]:
        """This rank's contiguous row range of a global batch of ``rows`` sequences."""
        share = rows // self.world
        return self.rank * share, (self.rank + 1) * share

    def groups(self, tokens: Sequence[int], grads: Sequence[int]) -> list[list[int]]:
        """Split a step's tasks (``tokens`` and gradient elements each, in pack order)
        into contiguous groups of about equal tokens, in the overlap order to run them."""
        k = min(self.fused_groups, len(tokens))
        total, bounds, acc = sum(tokens), [], 0
        for i, t in enumerate(tokens):
            acc += t
            if len(bounds) < k - 1 and acc * k >= total * (len(bounds) + 1) and i < len(tokens) - 1:
                bounds.append(i + 1)
        edges = [0, *bounds, len(tokens)]
        members = [list(range(a, b)) for a, b in pairwise(edges)]
        if len(members) == 1:
            return members
        nodes: list[SubGraph] = []
        for g, idx in enumerate(members):  # relative costs: a step's compute vs its comm
            compute = sum(tokens[i] for i in idx) / total
            comm = sum(grads[i] for i in idx) / max(1, sum(grads))
            nodes += group_subgraphs(f"g{g}", 1, compute, comm, "dp")
        starts = order_subgraphs(nodes).start
        order = sorted(range(len(members)), key=lambda g: starts[f"g{g}.fwd0"])
        return [members[g] for g in order]

    def reduce_async(self, tensors: list[Tensor]) -> PendingReduce:
        """Start summing ``tensors`` over the ranks (nothing to do on one rank)."""
        if self.world == 1:
            return all_reduce_flat([])
        return all_reduce_flat(tensors, self.group, async_op=True)

    def same_on_all(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (e.g. a scheduler built from local timings,
        which must plan identical steps everywhere or the collectives would not match)."""
        return obj if self.world == 1 else broadcast_object(obj, self.group)
