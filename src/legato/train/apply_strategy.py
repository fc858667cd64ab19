"""Apply a pp = 1 strategy to the built model: FP8, expert parallelism, FSDP2/DDP, swap.

The order matters and is the point of this module. FP8 swaps module classes in place,
so it comes before any wrapping (parameters and state-dict keys do not change). Expert
parallelism turns the stacked expert weights into DTensors on the EP mesh, so it comes
before ``fully_shard``, which must then ignore them (FSDP2 would otherwise shard them a
second time). Activation swap hooks the blocks' ``__call__`` and recognises FSDP2's
gathered parameters, so it goes last. With the chunked loss the trainer calls the model's
``hidden_states`` instead of ``forward``; FSDP2 must run its gather/reshard hooks around
that method too (``register_fsdp_forward_method``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

from legato.memory import ActivationSwap
from legato.moe import Overlap, apply_expert_parallel, expert_parameters
from legato.parallel.process_group import DistContext
from legato.precision import convert_to_fp8
from legato.specs.dtypes import DTYPE_KINDS, FP8_TRAIN_DTYPES
from legato.specs.strategy import Strategy
from legato.train.distributed import unwrap, wrap_model


def compute_dtype(dtype: str) -> torch.dtype | None:
    """What the GEMMs around FP8 run in: bf16 for 'bf16' and the FP8 dtypes, else None
    (fp32). Master weights, gradients and optimizer state stay fp32 in every case."""
    return torch.bfloat16 if DTYPE_KINDS[dtype].compute == "bf16" else None


def to_fp8(model: nn.Module, dtype: str) -> list[str]:
    """Convert the block linears (and experts) for an FP8 ``train.dtype``; the names."""
    return convert_to_fp8(model, dtype) if dtype in FP8_TRAIN_DTYPES else []


def overlap_of(strategy: Strategy) -> Overlap:
    """The MoE layer's ``Overlap`` from the strategy's ``moe_overlap`` ('none' = plain)."""
    if strategy.moe_overlap == "none":
        return Overlap()
    return Overlap(strategy.moe_overlap, strategy.moe_chunks, strategy.moe_groups)


@dataclass
class DataParallelModel:
    """The trained module (FSDP2/DDP-wrapped, or the model alone) and its swap hooks."""

    module: nn.Module
    swap: ActivationSwap | None = None


def data_parallel(
    model: nn.Module,
    strategy: Strategy,
    ctx: DistContext,
    *,
    fsdp: bool,
    reshard_after_forward: bool,
    param_dtype: torch.dtype | None,
) -> DataParallelModel:
    """``model`` (already FP8-converted if asked) laid out by ``strategy`` over ``ctx.mesh``."""
    ignored = None
    if strategy.ep > 1:  # ep = dp = world (train.strategy checks): EP over the dp mesh
        apply_expert_parallel(model, ctx.mesh, overlap_of(strategy))
        ignored = set(expert_parameters(model))
    wrapped = wrap_model(
        model,
        ctx,
        fsdp=fsdp,
        reshard_after_forward=reshard_after_forward,
        param_dtype=param_dtype,
        ignored_params=ignored,
    )
    if strategy.loss_chunk and isinstance(wrapped, FSDPModule):
        register_fsdp_forward_method(wrapped, "hidden_states")
    swap = ActivationSwap(unwrap(wrapped).blocks) if strategy.swap else None
    return DataParallelModel(wrapped, swap)
