"""The trainer's step when ``parallel.strategy`` has pp > 1: a pipeline times data parallel.

Every process builds the full seeded model (so any layout starts from the same weights),
keeps the virtual stages its pipeline rank holds (``build_stages``), lays each stage out
with ``parallelize`` (the appliers of a whole model: FP8, TP/SP, CP, EP, recompute,
FSDP2, swap) and runs the strategy's schedule on them with ``PipelineRunner`` over the
``"pp"`` dimension of the run mesh, which pairs ranks of equal dp, cp and tp index. One
step, for this rank's data-parallel replica (``gbs / dp`` rows, cut by the runner into
``m = gbs / (mbs * dp)`` micro-batches; under cp each rank runs its zigzag share of every
row, at its true positions):

* each token's loss is scaled by ``dp * cp / (label tokens in the *global* batch)``, so
  the mean of the replicas' gradients is the global batch's (FSDP2's and expert
  parallelism's convention);
* gradients over ``"dp_cp"``: with ``zero=0`` averaged by one flat all-reduce after the
  step (DDP's hooks never fire: the runner takes gradients with ``torch.autograd.grad``
  and its own deferred weight-gradient GEMMs; a tensor-parallel gradient is reduced shard
  by shard; experts, reduced by EP, are left out); with ``zero=1/2`` each stage is
  FSDP2-sharded, its parameters are gathered once at the start of the step and kept
  whole to its end, and its gradients are
  reduce-scattered once after the last micro-batch (``fsdp.reduce_after_pipeline``), then
  the parameters are resharded. The optimizer states (and, between steps, parameters and
  gradients) are this rank's shard only. ``zero=3`` also reshards each block after every
  micro-batch's forward and gathers the stage again around its B (``_gathered``);
* a tied embedding (held by the first and the last stage) gets the sum of both copies'
  gradients after that reduction, and the gradient norm for clipping is global: squared
  norms all-reduced over ``"pp"``, the tied matrix counted once, by its first stage;
* the logged loss is the last stages' losses summed over every rank (the others add 0),
  divided by the tp ranks that each hold it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from legato.models.transformer import Transformer
from legato.parallel.expert import expert_parameters
from legato.parallel.fsdp import reduce_after_pipeline
from legato.parallel.grad_norm import clip_to_norm, squared_grad_norm
from legato.parallel.gradient_reduction import GradientReduction
from legato.parallel.job import Job, pipeline_schedule
from legato.parallel.loss import eval_sums, first_tensor_rank
from legato.parallel.mesh import GRADIENT_DIM, submesh
from legato.parallel.parallelize import parallelize
from legato.parallel.pipeline import IGNORE_INDEX, PipelineRunner, build_stages
from legato.parallel.pipeline.forward_only import forward_loss
from legato.parallel.process_group import DistContext
from legato.schedule import token_bounds
from legato.specs.strategy import stage_layers


class PipelineStep:
    """This rank's laid-out stages of ``model``, their runner and the collectives around
    a step."""

    def __init__(
        self, model: Transformer, job: Job, ctx: DistContext, aux_loss_coef: float = 0.0
    ) -> None:
        mesh = ctx.mesh
        if mesh is None or "pp" not in (mesh.mesh_dim_names or ()):
            raise RuntimeError("PipelineStep needs the run mesh of parallel.mesh.build_mesh")
        strategy = job.strategy
        self.ctx, self.job = ctx, job
        self.pp_rank = mesh.get_local_rank("pp")
        self.pp_group = mesh.get_group("pp")
        self.dp_group = mesh.get_group("dp") if strategy.dp > 1 else None
        # the ranks that see other tokens (cp shards too) and sum one weight's gradient
        many = job.gradient_ranks > 1
        self.gradient_group = submesh(mesh, GRADIENT_DIM).get_group() if many else None
        self.schedule = job.schedule or pipeline_schedule(strategy)
        counts = stage_layers(model.spec.num_layers, strategy)  # the cost model's split
        self.stages = build_stages(model, self.schedule.placement, self.pp_rank, counts)
        # FSDP2 shards each stage in place: the stages (and the model) keep their modules
        self.laid_out = [parallelize(stage, job, mesh) for stage in self.stages.values()]
        self.sharded = any(isinstance(p.module, FSDPModule) for p in self.laid_out)
        # the load-balance loss averaged over every unit (micro-batch x slice)
        units = self.schedule.microbatches * self.schedule.slices
        self.runner = PipelineRunner(
            self.stages, self.schedule, rank=self.pp_rank, group=self.pp_group,
            sequence_shards=strategy.tp if strategy.sp else 1, loss_chunk=strategy.loss_chunk,
            gathered=self._gathered if self.sharded and strategy.zero == 3 else None,
            aux_loss_scale=aux_loss_coef / units, context=self.laid_out[0].context,
        )  # fmt: skip
        # what the optimizer sees: embeddings found as modules, shared tensors once
        self.module = nn.ModuleList(self.stages.values())
        self.params = self.runner.parameters()
        # what zero=0's all-reduce averages: all but the experts, which EP reduces
        experts = {id(p) for stage in self.stages.values() for p in expert_parameters(stage)}
        self._averaged = [p for p in self.params if id(p) not in experts]
        held = {id(t) for t in [*self.params, *self.module.buffers()]}
        named = [*model.named_parameters(), *model.named_buffers()]
        self.fqns = sorted(name for name, t in named if id(t) in held)
        self._norm_params = self._count_once()
        self.counts_tokens = first_tensor_rank(mesh)

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
        self,
        inputs: Tensor,
        labels: Tensor,
        split: Sequence[int] | None = None,
        loss_multiplier: float = 1.0,
    ) -> float:
        """Run the schedule over this replica's rows; gradients reduced over dp, times
        ``loss_multiplier`` (fp16 loss scaling). Returns the global batch's mean loss (the
        same on every rank). ``split`` (the step interface's rows per dp rank) is the even
        one here: ``train.batch_split`` needs pp = 1, as the schedule runs equal
        micro-batches on every replica."""
        device = self.ctx.device
        inputs, labels = inputs.to(device), labels.to(device)
        count = (labels != IGNORE_INDEX).sum()  # cp ranks hold the same rows: count over dp
        if self.dp_group is not None:
            dist.all_reduce(count, group=self.dp_group)
        positions = None
        context = self.laid_out[0].context
        if context is not None:  # this rank's zigzag share of each sequence (of each slice)
            cuts = token_bounds(self.schedule.slice_bounds, inputs.shape[1])
            inputs, labels, positions = context.shard(inputs, labels, cuts)
        averaged = self.job.gradient_ranks  # FSDP2 (or _sum_gradients) averages
        scale = averaged / max(int(count), 1)
        with reduce_after_pipeline(self.stages.values()), self.laid_out[0].step_context():
            self._gather()
            loss = self.runner.step(inputs, labels, loss_scale=scale, position_ids=positions,
                                    loss_multiplier=loss_multiplier, sync_tied=False)  # fmt: skip
        if not self.sharded:
            self._sum_gradients()
        for laid_out in self.laid_out:
            laid_out.finish_gradients()
        self.runner.sync_tied_embeddings()
        total = loss.detach().clone() if loss is not None else torch.zeros((), device=device)
        # every tensor-parallel rank of a last stage holds the same loss
        return self.ctx.all_reduce_sum(total).item() / (averaged * self.job.strategy.tp)

    @torch.no_grad()
    def eval_sums(self, inputs: Tensor, labels: Tensor) -> Tensor:
        """Forward only, through the stages in order (``forward_only``): [summed token loss,
        label tokens] of this rank's share, nonzero on the last stage's first tp rank only
        (``loss.eval_sums``)."""
        device = self.ctx.device
        inputs, labels = inputs.to(device), labels.to(device)
        positions = None
        context = self.laid_out[0].context
        if context is not None:
            inputs, labels, positions = context.shard(inputs, labels)
        with self.laid_out[0].step_context():
            loss = forward_loss(self.runner, inputs, labels, positions)
        return eval_sums(loss, labels, self.counts_tokens)

    def _gather(self) -> None:
        """All-gather every FSDP2 group of the stages once, before the first forward: the
        runner asks autograd for the gradients of the parameters the stages hold *now*
        (under ZeRO-3 the blocks reshard after each forward, and ``_gathered`` brings them
        back for each backward)."""
        for stage in self.stages.values():
            _unshard(stage)

    @staticmethod
    @contextlib.contextmanager
    def _gathered(stage: nn.Module) -> Iterator[None]:
        """ZeRO-3: one micro-batch's B with the stage's parameters gathered, the same
        parameter objects its forward used (FSDP2 keeps them), resharded after it.
        Gradients stay whole until the step's one reduce-scatter, as in torch's own
        pipelining with ``reshard_after_forward``."""
        _unshard(stage)
        yield
        for module in stage.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def _sum_gradients(self) -> None:
        """Average this rank's gradients over its dp x cp group in one all-reduce (the
        experts, reduced by expert parallelism, left out)."""
        if self.gradient_group is not None:
            GradientReduction(self._averaged, self.gradient_group, self.job.gradient_ranks).run()

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip to the global gradient norm over all pipeline ranks; returns the norm."""
        squared = squared_grad_norm(self._norm_params, self.ctx.device)
        dist.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt()
        clip_to_norm(self.params, max_norm, total)
        return float(total)


def _unshard(stage: nn.Module) -> None:
    for module in stage.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
