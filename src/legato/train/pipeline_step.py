"""The trainer's step when ``parallel.strategy`` has pp > 1: a pipeline times data parallel.

Every process builds the full seeded model (so any layout starts from the same weights),
keeps the virtual stages its pipeline rank holds (``build_stages``) and runs the strategy's
schedule on them with ``PipelineRunner`` over the ``"pp"`` group of a 2-D ``("pp", "dp")``
mesh. One step, for this rank's data-parallel replica (``gbs / dp`` rows, cut by the
runner into ``m = gbs / (mbs * dp)`` micro-batches):

* each token's loss is scaled by 1 / (label tokens in the *global* batch), so the units of
  all replicas sum to the global mean loss and the gradients to those of that mean;
* gradients are summed over the ``"dp"`` group with one flat all-reduce. Not FSDP2: the
  runner computes gradients with ``torch.autograd.grad`` and its own deferred
  weight-gradient GEMMs, which bypass the backward hooks that drive FSDP2's
  reduce-scatter; an all-reduce after the step is the simple route that is exact;
* the gradient norm for clipping is global: squared norms all-reduced over ``"pp"``, a
  tied embedding (held by the first and the last stage) counted once, by its first stage;
* the logged loss is the last stages' losses summed over every rank (the others add 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from legato.models.transformer import Transformer
from legato.parallel.job import pipeline_schedule
from legato.parallel.pipeline import IGNORE_INDEX, PipelineRunner, build_stages
from legato.parallel.process_group import DistContext, all_reduce_flat
from legato.specs.strategy import Strategy


class PipelineStep:
    """This rank's stages of ``model``, their runner and the collectives around a step."""

    def __init__(
        self,
        model: Transformer,
        strategy: Strategy,
        ctx: DistContext,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        mesh = ctx.mesh
        if mesh is None or "pp" not in (mesh.mesh_dim_names or ()):
            raise RuntimeError("PipelineStep needs the run mesh of parallel.mesh.build_mesh")
        self.ctx, self.autocast = ctx, autocast
        self.pp_rank = mesh.get_local_rank("pp")
        self.pp_group = mesh.get_group("pp")
        self.dp_group = mesh.get_group("dp") if strategy.dp > 1 else None
        self.schedule = pipeline_schedule(strategy)
        self.stages = build_stages(model, self.schedule.placement, self.pp_rank)
        self.runner = PipelineRunner(
            self.stages, self.schedule, rank=self.pp_rank, group=self.pp_group
        )
        # what the optimizer sees: embeddings found as modules, shared tensors once
        self.module = nn.ModuleList(self.stages.values())
        self.params = self.runner.parameters()
        held = {id(t) for t in [*self.params, *self.module.buffers()]}
        named = [*model.named_parameters(), *model.named_buffers()]
        self.fqns = sorted(name for name, t in named if id(t) in held)
        self._norm_params = self._count_once()

    def _count_once(self) -> list[nn.Parameter]:
        """The parameters whose gradients enter the global norm from this rank: a tied
        embedding on two ranks counts on the first stage's only."""
        placement, last = self.schedule.placement, self.schedule.num_stages - 1
        stage = self.stages.get(last)
        if stage is None or stage.output_embedding is None or placement.rank(0) == self.pp_rank:
            return self.params
        copy = id(stage.output_embedding.weight)
        return [p for p in self.params if id(p) != copy]

    def forward_backward(
        self, inputs: Tensor, labels: Tensor, split: Sequence[int] | None = None
    ) -> float:
        """Run the schedule over this replica's rows; gradients summed over dp. Returns the
        global batch's mean loss (the same on every rank). ``split`` (the step interface's
        rows per dp rank) is the even one here: ``train.batch_split`` needs pp = 1, as the
        schedule runs equal micro-batches on every replica."""
        device = self.ctx.device
        inputs, labels = inputs.to(device), labels.to(device)
        count = (labels != IGNORE_INDEX).sum()
        if self.dp_group is not None:
            dist.all_reduce(count, group=self.dp_group)
        with self.autocast():
            loss = self.runner.step(inputs, labels, loss_scale=1.0 / max(int(count), 1))
        self._reduce_gradients()
        total = loss.detach().clone() if loss is not None else torch.zeros((), device=device)
        return self.ctx.all_reduce_sum(total).item()

    def _reduce_gradients(self) -> None:
        """Sum this rank's gradients over its data-parallel group in one all-reduce."""
        if self.dp_group is None:
            return
        for p in self.params:
            if p.grad is None:  # every replica must send the same layout
                p.grad = torch.zeros_like(p)
        all_reduce_flat([p.grad for p in self.params], self.dp_group).wait()

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip to the global gradient norm over all pipeline ranks; returns the norm."""
        grads = [p.grad for p in self._norm_params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True) if grads else None
        squared = norm.square() if norm is not None else torch.zeros((), device=self.ctx.device)
        dist.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt()
        torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, total, foreach=True)
        return float(total)
