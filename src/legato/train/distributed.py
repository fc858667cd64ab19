"""Data-parallel wrapping for the trainer, on the process group of ``parallel.process_group``.

With several processes the model is sharded with FSDP2 (``fully_shard`` on every block,
then the root) over the 1-D ``"dp"`` mesh ``join`` builds, or replicated with DDP when
``parallel.fsdp`` is false. A pipeline job (pp > 1) uses a 2-D ``("pp", "dp")`` mesh
instead (``use_pipeline_mesh``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from legato.parallel.process_group import DistContext


def use_pipeline_mesh(ctx: DistContext, pp: int) -> None:
    """Replace ``ctx.mesh`` by the 2-D ``("pp", "dp")`` mesh of a pipeline job.

    pp is the outer dimension (the strategy's rank order): the ranks of one pipeline are
    ``world / pp`` apart and each data-parallel group is a contiguous block of ranks.
    """
    shape = (pp, ctx.world_size // pp)
    ctx.mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=("pp", "dp"))


def wrap_model(
    model: nn.Module,
    ctx: DistContext,
    *,
    fsdp: bool,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    ignored_params: set[nn.Parameter] | None = None,
) -> nn.Module:
    """Data-parallel ``model`` over ``ctx.mesh``: FSDP2 per block then the root, or DDP.

    ``param_dtype`` (e.g. bf16) is FSDP2's mixed precision: parameters are gathered and
    computed in it while the sharded master copy and gradient reduction stay fp32.
    ``ignored_params``: parameters FSDP2 leaves alone (experts sharded by EP).
    Alone (world size 1) the model is returned as is.
    """
    if not ctx.distributed:
        return model
    if not fsdp:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    options = {
        "mesh": ctx.mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": policy,
        "ignored_params": ignored_params,
    }
    for block in model.model.layers:
        fully_shard(block, **options)
    # The root stays gathered after forward (torch's own heuristic for the root: backward
    # needs it at once), which also keeps the LM head whole for a chunked loss computed
    # after ``hidden_states`` returns.
    fully_shard(model, **{**options, "reshard_after_forward": False})
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place, nothing to unwrap)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Wrap one micro-step's forward and backward; without sync, gradients only accumulate.

    Reducing on the last micro-step only is what makes accumulation cheap: FSDP2 skips
    the reduce-scatter (``set_requires_gradient_sync``), DDP the all-reduce (``no_sync``).
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield
