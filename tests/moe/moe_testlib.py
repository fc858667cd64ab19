"""Small MoE layers with random weights, and a per-token reference to check them against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from legato.models.mlp import MLP, activate
from legato.moe import MoELayer
from legato.specs.model import MoESpec

# name -> (hidden, MoESpec, gated, bias, shared ffn). Sizes keep rows 16-byte aligned so
# the fp32 grouped GEMM takes torch._grouped_mm; "odd" forces the loop fallback.
CONFIGS = {
    "swiglu-softmax": (16, MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=8), True, False, 0),
    "gelu-sigmoid-bias-shared": (
        16,
        MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=12, router_score="sigmoid"),
        False,
        True,
        8,
    ),
    "odd": (10, MoESpec(num_experts=3, top_k=1, expert_ffn_hidden_size=6), True, True, 0),
}  # fmt: skip


def make_layer(name: str, seed: int = 0) -> MoELayer:
    hidden, moe, gated, bias, shared_ffn = CONFIGS[name]
    kind = "swiglu" if gated else "gelu"
    shared = MLP(hidden, shared_ffn, kind, bias) if shared_ffn else None
    layer = MoELayer(
        hidden, moe, gated=gated, bias=bias, activation=activate, shared_experts=shared
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        layer.gate.weight[:, 0] = 0.0
        layer.gate.weight[-1, 0] = -30.0  # with tokens()' feature 0, expert E-1 gets nothing
    return layer


def tokens(n: int, hidden: int, seed: int) -> torch.Tensor:
    """Random tokens whose feature 0 is a constant 3: the last expert is never chosen."""
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 3.0
    return x


def per_token_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Each token on its own: score, pick top-k, weighted sum of those experts' MLPs."""
    ex = layer.experts

    def proj(name: str, e: int, v: torch.Tensor) -> torch.Tensor:
        bias = getattr(ex, f"{name}_bias")
        return v @ getattr(ex, name)[e].T + (0 if bias is None else bias[e])

    def expert(e: int, token: torch.Tensor) -> torch.Tensor:
        up = proj("up_proj", e, token)
        gate = None if ex.gate_proj is None else proj("gate_proj", e, token)
        hidden = F.silu(gate) * up if gate is not None else F.gelu(up, approximate="tanh")
        return proj("down_proj", e, hidden)

    router = layer.gate
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        logits = router.weight @ token
        scores = logits.softmax(-1) if router.score == "softmax" else logits.sigmoid()
        bias = router.e_score_correction_bias
        chosen = (scores if bias is None else scores + bias).topk(layer.top_k).indices
        weights = scores[chosen] / scores[chosen].sum()
        out = sum(w * expert(int(e), token) for w, e in zip(weights, chosen, strict=True))
        if layer.shared_experts is not None:
            out = out + layer.shared_experts(token)
        rows.append(out)
    return torch.stack(rows).view_as(x)


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    found = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found, strict=True)]
