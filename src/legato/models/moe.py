"""Reference mixture-of-experts block: router, stacked experts, optional shared experts.

Routed expert weights are stored *stacked* ([E, ffn, h] / [E, h, ffn]) because the grouped
GEMMs of ``legato.moe`` consume them that way; ``hf_checkpoint`` splits them into HF's
per-expert tensors. The dispatch here is the plain dense loop (gather each expert's tokens,
run its MLP, scale, scatter-add back), so every token costs exactly ``top_k`` expert MLPs
and no token is dropped. ``bias=True`` specs give experts biases too; the router never
has one. The fast dropless / expert-parallel path lives in ``legato.moe``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.models.mlp import MLP, activate
from legato.specs.model import MlpKind, ModelSpec, RouterScore


@dataclass
class Routing:
    """Router decision for T tokens: ``scores`` [T, E], ``weights`` and ``indices`` [T, k]."""

    scores: Tensor
    weights: Tensor
    indices: Tensor


class Router(nn.Module):
    """Linear router (HF name ``gate``) with softmax or sigmoid scores and top-k selection.

    The top-k weights are renormalised to sum to one (Mixtral, Qwen3-MoE, DeepSeek-V3). With
    sigmoid scores the buffer ``e_score_correction_bias`` (DeepSeek-V3's aux-loss-free
    balancing) shifts only *which* experts are selected, never their weights.
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, score: RouterScore) -> None:
        super().__init__()
        self.top_k = top_k
        self.score = score
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        bias = torch.zeros(num_experts) if score == "sigmoid" else None
        self.register_buffer("e_score_correction_bias", bias)

    @torch.no_grad()
    def reset_buffers(self) -> None:
        if self.e_score_correction_bias is not None:
            self.e_score_correction_bias.zero_()

    def forward(self, x: Tensor) -> Routing:
        logits = F.linear(x, self.weight).float()
        if self.score == "softmax":
            scores = logits.softmax(dim=-1)
            weights, indices = scores.topk(self.top_k, dim=-1)
        else:
            scores = logits.sigmoid()
            _, indices = (scores + self.e_score_correction_bias).topk(self.top_k, dim=-1)
            weights = scores.gather(-1, indices)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(scores, weights, indices)


def load_balance_loss(scores: Tensor, counts: Tensor) -> Tensor:
    """Switch-style auxiliary loss ``E * sum_e f_e * P_e``; equals 1 when perfectly balanced.

    ``f_e`` is expert e's share of routed token slots, ``P_e`` its mean (per-token
    normalised) router score; only ``P_e`` carries gradient.
    """
    fraction = counts.float() / counts.sum().clamp(min=1)
    probs = scores / scores.sum(dim=-1, keepdim=True)
    return scores.shape[-1] * (fraction * probs.mean(dim=0)).sum()


class StackedExperts(nn.Module):
    """E expert MLPs as stacked parameters: ``gate_proj``/``up_proj`` [E, ffn, h] and
    ``down_proj`` [E, h, ffn] (no ``gate_proj`` for GELU experts); with ``bias``, also
    ``gate_proj_bias``/``up_proj_bias`` [E, ffn] and ``down_proj_bias`` [E, h]."""

    def __init__(self, num_experts: int, hidden: int, ffn: int, kind: MlpKind, bias: bool):
        super().__init__()
        shapes = {"up_proj": (ffn, hidden), "down_proj": (hidden, ffn)}
        if kind == "swiglu":
            shapes = {"gate_proj": (ffn, hidden), **shapes}
        for name in ("gate_proj", "up_proj", "down_proj"):
            shape = shapes.get(name)
            weight = None if shape is None else nn.Parameter(torch.empty(num_experts, *shape))
            self.register_parameter(name, weight)
            has_bias = bias and shape is not None
            bias_param = nn.Parameter(torch.empty(num_experts, shape[0])) if has_bias else None
            self.register_parameter(f"{name}_bias", bias_param)

    def _project(self, name: str, expert: int, x: Tensor) -> Tensor:
        bias = getattr(self, f"{name}_bias")
        return F.linear(x, getattr(self, name)[expert], None if bias is None else bias[expert])

    def forward(self, expert: int, x: Tensor) -> Tensor:
        """Expert ``expert``'s MLP on its tokens ``x`` [n, h]."""
        gate = None if self.gate_proj is None else self._project("gate_proj", expert, x)
        hidden = activate(self._project("up_proj", expert, x), gate)
        return self._project("down_proj", expert, hidden)


class MoE(nn.Module):
    """``gate`` (router), ``experts`` (stacked) and ``shared_experts`` (one MLP of width
    ``num_shared_experts * shared_expert_ffn_hidden_size``, as DeepSeek stores it).

    After each forward, ``last_expert_counts`` [E] (tokens per expert, detached) and
    ``last_aux_loss`` (scalar with gradient) are available; using them is up to the trainer.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        h = spec.hidden_size
        self.num_experts = moe.num_experts
        self.top_k = moe.top_k
        self.gate = Router(h, moe.num_experts, moe.top_k, moe.router_score)
        self.experts = StackedExperts(
            moe.num_experts, h, moe.expert_ffn_hidden_size, spec.mlp, spec.bias
        )
        shared_ffn = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        self.shared_experts = MLP(h, shared_ffn, spec.mlp, spec.bias) if shared_ffn else None
        self.last_expert_counts: Tensor | None = None
        self.last_aux_loss: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.gate(tokens)
        slot_experts = routing.indices.reshape(-1)  # slot = token * top_k + j
        counts = torch.bincount(slot_experts, minlength=self.num_experts)
        slots = slot_experts.argsort(stable=True)  # slots grouped by expert
        slot_weights = routing.weights.reshape(-1).to(x.dtype)
        splits = counts.tolist()  # the one host sync of this reference
        out = torch.zeros_like(tokens)
        for expert, expert_slots in enumerate(slots.split(splits)):
            token_ids = expert_slots // self.top_k
            y = self.experts(expert, tokens.index_select(0, token_ids))
            out.index_add_(0, token_ids, y * slot_weights[expert_slots].unsqueeze(-1))
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        self.last_expert_counts = counts.detach()
        self.last_aux_loss = load_balance_loss(routing.scores, counts)
        return out.view_as(x)
