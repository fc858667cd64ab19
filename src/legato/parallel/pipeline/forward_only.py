"""A forward-only pass of a runner's stages: the summed loss of one batch, for evaluation.

Why not the runner's schedule: a training schedule interleaves backwards, holds units for
them and cuts the batch into its micro-batches and slices; evaluation needs none of that
and must run on batches of any size (the last, short one included). The stages run in
stage order, each rank waiting for its predecessor's hidden states: the pipeline runs one
stage at a time, which is what a validation pass of a few batches can afford. Every stage
needs the previous one's output, so the order cannot deadlock: when a rank sends stage
``v``'s output, the receiver has finished every stage before ``v + 1``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from legato.parallel.pipeline.runner import PipelineRunner, stage_loss_sum


@torch.no_grad()
def forward_loss(
    runner: PipelineRunner, input_ids: Tensor, labels: Tensor, position_ids: Tensor | None = None
) -> Tensor | None:
    """The summed token loss of ``input_ids``/``labels`` [B, S] on the rank holding the last
    stage, ``None`` on the others; every rank of the pipeline calls it with the same batch.
    ``position_ids`` as in ``PipelineRunner.step``."""
    placement, stages = runner.schedule.placement, runner.stages
    rows, seq = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(seq, device=runner.device).expand(rows, -1)
    shape = (rows, seq // runner.sequence_shards, runner.hidden_size)
    x, loss, sends = input_ids, None, []
    for vs in sorted(stages):
        stage = stages[vs]
        if not stage.is_first and vs - 1 not in stages:
            x = torch.empty(shape, dtype=runner.dtype, device=runner.device)
            dist.recv(x, _global(runner, placement.rank(vs - 1)), group=runner.group)
        if stage.is_last:
            loss = stage_loss_sum(stage, x, position_ids, labels, runner.loss_fn, runner.loss_chunk)
            continue
        x = stage(x, position_ids)
        if vs + 1 not in stages:
            out = x.to(runner.dtype).contiguous()
            peer = _global(runner, placement.rank(vs + 1))
            sends.append((dist.isend(out, peer, group=runner.group), out))
    for work, _ in sends:
        work.wait()
    return loss


def _global(runner: PipelineRunner, pipeline_rank: int) -> int:
    if runner.group is None:
        return pipeline_rank
    return dist.get_global_rank(runner.group, pipeline_rank)
