"""Reference mixture-of-experts block: ``legato.moe``'s dropless layer built from a ModelSpec.

Routed expert weights are stored *stacked* ([E, ffn, h] / [E, h, ffn]) because the grouped
GEMMs consume them that way; ``hf_checkpoint`` splits them into HF's per-expert tensors.
Tokens are sorted by expert and run through grouped GEMMs, so every token costs exactly
``top_k`` expert MLPs and no token is dropped. ``bias=True`` specs give experts biases
too; the router never has one. Expert parallelism and the overlap schedules are applied
afterwards with ``legato.parallel.expert.apply_expert_parallel``.
"""

from __future__ import annotations

from torch import Tensor

from legato.models.forward_context import ForwardContext
from legato.models.mlp import MLP, activate
from legato.moe import MoELayer, Router, Routing, load_balance_loss
from legato.specs.model import ModelSpec

__all__ = ["MoE", "Router", "Routing", "load_balance_loss"]


class MoE(MoELayer):
    """``gate`` (router), ``experts`` (stacked) and ``shared_experts`` (one MLP of width
    ``num_shared_experts * shared_expert_ffn_hidden_size``, as DeepSeek stores it).

    After each forward, ``last_expert_counts`` [E] (tokens per expert, detached),
    ``last_aux_loss`` and ``last_z_loss`` (scalars with gradient) are available; using
    them is up to the trainer.
    """

    def __init__(self, spec: ModelSpec) -> None:
        moe = spec.moe
        assert moe is not None
        shared_ffn = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        shared = MLP(spec.hidden_size, shared_ffn, spec.mlp, spec.bias) if shared_ffn else None
        super().__init__(
            spec.hidden_size,
            moe,
            gated=spec.mlp == "swiglu",
            bias=spec.bias,
            activation=activate,
            shared_experts=shared,
        )

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        """The block's MLP slot. ``ctx``'s linear backend is not applied inside: the router
        and the stacked experts are no LoRA targets (adapters cover attention and dense
        MLP layers), and serving runs the experts as training does."""
        return super().forward(x)
