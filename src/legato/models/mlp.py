"""Feed-forward blocks: SwiGLU (Llama) or GELU (GPT), with Hugging Face names.

:func:`activate` is shared with the stacked MoE experts so both compute the same function.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from legato.models.forward_context import ForwardContext, call_layer
from legato.specs.model import MlpKind


def activate(up: Tensor, gate: Tensor | None) -> Tensor:
    """SwiGLU when a gate projection exists, else GELU (tanh approximation, as GPT-2)."""
    if gate is not None:
        return F.silu(gate) * up
    return F.gelu(up, approximate="tanh")


class MLP(nn.Module):
    """``gate_proj``/``up_proj``/``down_proj`` (SwiGLU) or ``up_proj``/``down_proj`` (GELU)."""

    def __init__(self, hidden: int, ffn: int, kind: MlpKind, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=bias) if kind == "swiglu" else None
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        """``ctx`` supplies the linear backend (a LoRA's); without one (a shared expert
        inside an MoE layer) the layers run plain."""
        linear = ctx.linear if ctx is not None else call_layer
        gate = linear(self.gate_proj, x) if self.gate_proj is not None else None
        return linear(self.down_proj, activate(linear(self.up_proj, x), gate))
