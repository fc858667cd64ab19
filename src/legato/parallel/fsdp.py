"""The data-parallel applier: FSDP2 or DDP over the run mesh's gradient group (``dp_cp``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from legato.parallel.mesh import GRADIENT_DIM, submesh
from legato.specs.strategy import Strategy


def apply_data_parallel(
    model: nn.Module,
    strategy: Strategy,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | None = None,
    ignored_params: set[nn.Parameter] | None = None,
) -> nn.Module:
    """``model`` data-parallel over ``mesh["dp_cp"]`` by ``strategy.zero``: FSDP2 per
    block then the root (3: resharded after forward, 2: kept gathered until the end of
    the backward, 1: kept gathered for the whole step), or DDP (0).

    ZeRO-1 is FSDP2 whose parameters stay gathered from the step's first forward to its
    last backward (``gradient_sync``), not DDP with torch's ``ZeroRedundancyOptimizer``:
    each rank holds whole parameters and whole gradients while they accumulate and the
    optimizer state of its shard only, with one all-gather and one reduce-scatter per step
    whatever the micro-batch count (Megatron's distributed optimizer); and the optimizer
    state stays a sharded DTensor that the distributed checkpoint saves and reshards like
    ZeRO-2/3's, which ``ZeroRedundancyOptimizer``'s rank-local state is not.

    ``param_dtype`` (e.g. bf16) is FSDP2's mixed precision: parameters are gathered and
    computed in it while the sharded master copy and gradient reduction stay fp32.
    ``ignored_params``: parameters FSDP2 leaves alone (experts sharded by EP).
    """
    group = submesh(mesh, GRADIENT_DIM)
    if strategy.zero == 0:
        device = group.device_type
        ids = [torch.cuda.current_device()] if device == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, process_group=group.get_group())
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    options = {
        "mesh": group,
        "reshard_after_forward": strategy.zero == 3,
        "mp_policy": policy,
        "ignored_params": ignored_params,
    }
    for block in model.blocks:
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
def gradient_sync(model: nn.Module, enabled: bool, zero: int = 3) -> Iterator[None]:
    """Wrap one micro-step's forward and backward; without sync, gradients only accumulate.

    Reducing on the last micro-step only is what makes accumulation cheap: FSDP2 skips
    the reduce-scatter (``set_requires_gradient_sync``), DDP the all-reduce (``no_sync``).
    Under ZeRO-1 the parameters are also kept gathered until that last micro-step.
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        if zero == 1:
            model.set_reshard_after_backward(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield


@contextlib.contextmanager
def reduce_after_pipeline(stages: Sequence[nn.Module]) -> Iterator[None]:
    """Wrap one pipeline step over FSDP2 ``stages``: gradients accumulate unsharded over
    all its micro-batches and are reduce-scattered once at the end, then the parameters
    are resharded (ZeRO-1/2 inside a stage; torchtitan's pp + FSDP2).

    The pipeline runner takes its gradients with ``torch.autograd.grad`` and deferred
    weight-gradient GEMMs, not ``backward()``, so FSDP2's own post-backward never sees a
    "last backward". As torch's ``pipelining`` stage does (``perform_reduce_grad``), the
    reduction is switched off while the schedule runs and each parameter group's
    post-backward is called by hand after it. On an exception nothing is reduced.
    """
    roots = [m for m in stages if isinstance(m, FSDPModule)]
    for root in roots:
        root.set_is_last_backward(False)
        root.set_reshard_after_backward(False)
        root.set_requires_gradient_sync(False)
    yield
    for root in roots:
        root.set_is_last_backward(True)
        root.set_reshard_after_backward(True)
        root.set_requires_gradient_sync(True)
        state = fully_shard.state(root)
        for inner in state._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()
