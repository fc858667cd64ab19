"""``parallelize(model, job, mesh)``: lay a model (or one pipeline stage) out as its Job says.

One applier per file of ``legato.parallel``, applied in this order, each for a reason:

1. FP8 (``fp8``): swaps module classes in place, so everything after sees FP8 linears.
2. TP / SP (``tensor``, or ``tensor_2d`` for ``tp=AxB``): turns weights into DTensors on
   the tp ranks; FSDP2 then shards those DTensors over the data-parallel ranks (as
   torchtitan does).
3. CP (``context``): replaces the attention core; parameters are untouched.
4. EP (``expert``): the stacked expert weights become DTensors on the EP ranks, which the
   data-parallel applier must then leave alone.
5. recompute (``recompute``): wraps blocks (or their attention core) before FSDP2 wraps
   them, so the recomputed forward re-gathers nothing it does not need.
6. FSDP2 / DDP (``fsdp``): ZeRO by ``strategy.zero`` over ``mesh["dp_cp"]``.
7. swap (``swap``): hooks the blocks' ``__call__`` and must see gathered parameters.

The same function lays out a whole model (pp = 1) and each pipeline stage (pp > 1).
Adding a parallelism is one applier file, one mesh dimension and one line here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
from torch.distributed.tensor.parallel import loss_parallel

from legato.memory import ActivationSwap
from legato.parallel.context import ContextParallel, apply_context_parallel
from legato.parallel.expert import apply_expert, expert_gradient_groups
from legato.parallel.fp8 import apply_fp8, compute_dtype
from legato.parallel.fsdp import apply_data_parallel, unwrap
from legato.parallel.gradient_reduction import GradientReduction
from legato.parallel.job import Job
from legato.parallel.mesh import GRADIENT_DIM, submesh
from legato.parallel.recompute import apply_recompute
from legato.parallel.swap import apply_swap
from legato.parallel.tensor import apply_tensor
from legato.parallel.tensor_2d import apply_tensor_2d
from legato.parallel.tensor_families import tp_partial_parameters

ContextFactory = Callable[[], contextlib.AbstractContextManager]


@dataclass
class Parallelized:
    """The laid-out module and what a step must do around it.

    ``contexts``: entered, in order, around each micro-batch's forward and backward
    (autocast where no applier casts the parameters, the vocabulary-parallel loss, ...).
    ``context``: the sequence split a step applies to each micro-batch (cp > 1).
    ``swap`` is held so its hooks live as long as the module. ``reductions``: what the
    step reduces itself after the backward (``parallel.gradient_reduction``).
    """

    module: nn.Module
    contexts: list[ContextFactory] = field(default_factory=list)
    context: ContextParallel | None = None
    swap: ActivationSwap | None = None
    reductions: list[GradientReduction] = field(default_factory=list)

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for factory in self.contexts:
                stack.enter_context(factory())
            yield

    def finish_gradients(self) -> None:
        """After a step's backward (and FSDP2's reduce-scatter, which leaves each rank the
        same shard index as its tp and edp peers): run the ``reductions``, in the same
        order on every rank."""
        for reduction in self.reductions:
            reduction.run()


def parallelize(
    model: nn.Module, job: Job, mesh: DeviceMesh | None, *, fp8_all_gather: bool = False
) -> Parallelized:
    """Apply ``job`` to ``model`` (a ``Transformer`` or a pipeline ``StageModule``, built
    identically on every rank) over ``mesh`` (``parallel.mesh.build_mesh``; None for one
    process, where only the device-level appliers have work)."""
    s = job.strategy
    # FP8 weight gathers: FSDP2's all-gather of plain (not tensor-parallel) weights
    sharded = s.zero >= 2 and job.gradient_ranks > 1 and s.pp == 1 and s.tp == 1
    apply_fp8(model, job.dtype, all_gather=fp8_all_gather and sharded)
    if s.tp_y > 1:
        apply_tensor_2d(model, s, mesh)
    elif s.tp > 1:
        apply_tensor(model, s, mesh)
    context = apply_context_parallel(model, s, mesh) if s.cp > 1 else None
    ignored = apply_expert(model, s, mesh) if s.ep > 1 or s.etp > 1 else None
    apply_recompute(model, s)
    low = compute_dtype(job.dtype)
    module = model
    # a pipeline stage without ZeRO is not wrapped in DDP: its runner takes gradients with
    # autograd.grad, which DDP's hooks do not see; PipelineStep sums them itself. Nor is a
    # layout DDP cannot hold: the step averages its gradients after the backward.
    without_ddp = s.zero == 0 and (s.pp > 1 or s.tp > 1 or s.ep > 1 or s.loss_chunk > 0)
    if job.gradient_ranks > 1 and not without_ddp:
        module = apply_data_parallel(model, s, mesh, param_dtype=low, ignored_params=ignored)
    out = Parallelized(module, context=context)
    if job.gradient_ranks > 1 and without_ddp and s.pp == 1:
        shared = [p for p in model.parameters() if p not in (ignored or set())]
        group = submesh(mesh, GRADIENT_DIM).get_group()
        out.reductions.append(GradientReduction(shared, group, divisor=job.gradient_ranks))
    if s.tp > 1 and s.tp_y == 1:  # the logits stay split on the vocabulary
        out.contexts.append(loss_parallel)
    if context is not None:
        out.contexts.append(context.sharded)
    # FSDP2 computes in its param_dtype; anything it does not cast (no FSDP2, or the
    # experts EP keeps for itself) takes its compute dtype from autocast.
    if low is not None and (not isinstance(module, FSDPModule) or ignored):
        device = next(model.parameters()).device.type
        out.contexts.append(lambda: torch.autocast(device, dtype=low))
    if s.loss_chunk and isinstance(module, FSDPModule):
        # the chunked loss calls hidden_states, not forward: FSDP2 must gather around it
        register_fsdp_forward_method(module, "hidden_states")
    if s.swap:
        out.swap = apply_swap(unwrap(module))
    if s.folded_ep:
        routers = tp_partial_parameters(unwrap(module))
        out.reductions.append(GradientReduction(routers, submesh(mesh, "tp").get_group()))
    out.reductions += expert_gradient_groups(model, s, mesh) if s.ep > 1 else []
    return out
