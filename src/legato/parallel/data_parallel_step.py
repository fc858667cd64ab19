"""The step of a job without a pipeline: micro-batches accumulated, gradients reduced once.

The trainer sees one step interface (``forward_backward``, ``clip_grad_norm``,
``eval_sums``, ``module``, ``fqns``), implemented here and by ``parallel.pipeline_step.PipelineStep``.

Loss convention: the loss of a step is the mean cross-entropy over every label token of
the global batch, however it is split over ranks and micro-batches. Each micro-batch
backpropagates its summed token loss times ``gradient_ranks / tokens_in_global_batch``
and FSDP2 / DDP average over the ``dp x cp`` ranks, so the gradient is exactly that of the
full-batch mean. Tensor-parallel ranks hold the same tokens and count them once.

Because each token's loss enters with the same factor wherever it sits, the gradient stays
exact for uneven local batches too (``train.batch_split``; the rules in ``parallel/batch_split.py``): a
rank with 5 rows and one with 3 sum the same token losses as two with 4 or one process
with 8, so no per-rank reweighting (Gimbal's ``local_bs * world / global_bs``) is needed.
Every rank runs the same number of micro-batches (``batch_split.microbatch_count``), which
FSDP2's per-forward all-gathers require; a rank's rows are cut into that many nearly equal
chunks. (The MoE load-balance term is a per-micro-batch statistic, averaged over the
micro-batches and ranks: a regulariser that depends on the split, as it does on ``mbs``.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from legato.parallel.batch_split import chunk_sizes, even_split, microbatch_count
from legato.parallel.fsdp import gradient_sync, unwrap
from legato.parallel.grad_norm import clip_to_norm, squared_grad_norm
from legato.parallel.job import Job
from legato.parallel.loss import IGNORE_INDEX, eval_sums, first_tensor_rank, token_loss_sum
from legato.parallel.mesh import GRADIENT_DIM, submesh
from legato.parallel.parallelize import Parallelized


class DataParallelStep:
    """One optimizer step's forward and backward for a laid-out whole model."""

    def __init__(
        self,
        laid_out: Parallelized,
        job: Job,
        mesh: DeviceMesh | None,
        device: torch.device,
        aux_loss_coef: float = 0.0,
    ) -> None:
        self.laid_out, self.job, self.device = laid_out, job, device
        self.module = laid_out.module
        self.fqns: list[str] | None = None  # every rank checkpoints the whole model
        self.dp_group = submesh(mesh, "dp").get_group() if job.strategy.dp > 1 else None
        many = job.gradient_ranks > 1
        self.gradient_group = submesh(mesh, GRADIENT_DIM).get_group() if many else None
        self.aux_loss_coef = aux_loss_coef
        self.even_split = even_split(job.strategy.gbs, job.strategy.dp)
        self.counts_tokens = first_tensor_rank(mesh)

    def forward_backward(
        self,
        inputs: Tensor,
        labels: Tensor,
        split: Sequence[int] | None = None,
        loss_multiplier: float = 1.0,
    ) -> float:
        """This rank's rows in ``microbatch_count(split, mbs)`` micro-batches; returns the
        global batch's mean loss, the same on every rank. ``split``: every dp rank's row
        count this step (the same list on all ranks); None = the even ``gbs / dp``.
        ``loss_multiplier``: the backward runs on the objective times it, so the gradients
        come out times it (fp16 loss scaling)."""
        job, model = self.job, self.module
        steps = microbatch_count(split or self.even_split, job.strategy.mbs)
        sizes = chunk_sizes(len(inputs), steps)
        aux_coef = self.aux_loss_coef / steps * loss_multiplier
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        count = _sum((labels != IGNORE_INDEX).sum(), self.dp_group)  # cp ranks: same rows
        if self.laid_out.context is not None:  # this rank's zigzag share of each sequence
            inputs, labels, _ = self.laid_out.context.shard(inputs, labels)
        scale = job.gradient_ranks / max(int(count.item()), 1) * loss_multiplier
        loss_sum = torch.zeros((), device=self.device)
        for i, (rows_in, rows_out) in enumerate(
            zip(inputs.split(sizes), labels.split(sizes), strict=True)
        ):
            with (
                gradient_sync(model, i == steps - 1, job.strategy.zero),
                self.laid_out.step_context(),
            ):
                token_loss = token_loss_sum(model, rows_in, rows_out, job.strategy.loss_chunk)
                objective = token_loss * scale
                aux = unwrap(model).moe_aux_loss() if aux_coef else None
                if aux is not None:
                    objective = objective + aux_coef * aux.float()
                objective.backward()
            loss_sum += token_loss.detach()
        self.laid_out.finish_gradients()
        return _sum(loss_sum, self.gradient_group).item() / max(int(count.item()), 1)

    @torch.no_grad()
    def eval_sums(self, inputs: Tensor, labels: Tensor) -> Tensor:
        """Forward only: [summed token loss, label tokens] of this rank's share of
        ``inputs``/``labels`` (its cp shard), as ``loss.eval_sums`` (a sum over every rank
        counts each token once)."""
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        if self.laid_out.context is not None:
            inputs, labels, _ = self.laid_out.context.shard(inputs, labels)
        with self.laid_out.step_context():
            loss = token_loss_sum(self.module, inputs, labels, self.job.strategy.loss_chunk)
        return eval_sums(loss, labels, self.counts_tokens)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip to the global gradient norm; returns it (before clipping)."""
        params = list(self.module.parameters())
        total = squared_grad_norm(params, self.device).sqrt()
        clip_to_norm(params, max_norm, total)
        return float(total)


def _sum(tensor: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    if group is not None:
        dist.all_reduce(tensor, group=group)
    return tensor
