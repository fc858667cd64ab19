"""The 2-D tensor-parallel applier (``tp=AxB``): each block runs the planner's own layout.

Why not ``parallelize_module``: its styles split a module over one mesh dimension, while
the 2-D layout of the planner (``layout.sbp_layout``, after Hypertron / Optimus) splits the
weights over ``tp_x`` and ``tp_y`` at once and moves activations between the two axes
inside the block. ``tensor_parallel.run_dense_layout`` already executes such a layout op
by op on DTensors and checks every output against the placements the planner declared,
so this applier makes it the block's forward: the block's weights become DTensor
parameters placed as the layout says (under their own names, so checkpoints and
gradient checks see the model's FQNs), and autograd through DTensor gives the backward
collectives the planner counted.

Between blocks the residual stream is a plain tensor replicated over the tp ranks, and
the embedding, final norm and LM head are not split: each tp rank computes them in full
(with the same result and the same gradients), which costs their FLOPs tp-fold but keeps
the loss and the pipeline boundaries those of a one-rank model. Dense blocks only, of the
math the layout's ops implement (RMSNorm, RoPE, SwiGLU or GeLU, no biases, no qk-norm):
``job.check_tensor_parallel`` refuses the rest before any process starts.
"""

from __future__ import annotations

import functools

from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from legato.errors import ConfigError
from legato.layout.sbp_layout import PartLayout
from legato.models.attention import SdpaAttention
from legato.models.forward_context import ForwardContext, call_layer
from legato.parallel.tensor import block_layout
from legato.parallel.tensor_parallel import place_weights, run_dense_layout
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy

AXES = ("tp_y", "tp_x")  # the run mesh's 2-D tensor-parallel dimensions


def apply_tensor_2d(model: nn.Module, strategy: Strategy, mesh: DeviceMesh) -> None:
    """Lay every block of ``model`` (a ``Transformer`` or a ``StageModule``) out by the
    planner's 2-D layout on ``mesh["tp_y", "tp_x"]``, in place."""
    tp_mesh = mesh[AXES]
    layout = block_layout(model.spec, strategy)
    for block in model.blocks:
        placed = place_weights(block, tp_mesh, layout)
        left = sorted(set(dict(block.named_parameters())) - set(placed))
        if left:
            raise ConfigError(f"strategy.tp: the 2-D layout places no weight for {left}")
        for name, weight in placed.items():
            owner, _, attr = name.rpartition(".")
            setattr(block.get_submodule(owner), attr, nn.Parameter(weight.detach()))
        block.forward = functools.partial(_forward, block, layout, model.spec, tp_mesh)


def _forward(
    block: nn.Module,
    layout: PartLayout,
    spec: ModelSpec,
    mesh: DeviceMesh,
    x: Tensor,
    ctx: ForwardContext,
) -> Tensor:
    """One block on the replicated stream ``x``: in as a replicated DTensor, through the
    layout's ops, out gathered (the backward slices and reduces the gradients back)."""
    causal = isinstance(ctx.attention, SdpaAttention) and ctx.attention.mask is None
    if not causal or ctx.rope is None or ctx.linear is not call_layer:
        raise ConfigError("strategy.tp: 2-D tensor parallelism runs causal RoPE attention only")
    weights = dict(block.named_parameters())
    stream = DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, run_check=False)
    eps = block.input_layernorm.eps
    return run_dense_layout(weights, stream, ctx.rope, layout, spec, eps).full_tensor()
