"""Top-k router: softmax or sigmoid scores, selection bias, balance losses, load counts.

The router's output is all a dropless dispatch needs: which ``k`` experts each token goes
to and with what weight. Two balancing mechanisms coexist:

* the auxiliary load-balance loss (Switch Transformer) and the router z-loss (ST-MoE),
  recorded on each forward for the trainer to add to its objective;
* auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores
  *only to choose* the experts, never to weight them, nudged after every optimizer step
  by :meth:`Router.update_bias` from the load counted since the last update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.specs.model import RouterScore


@dataclass
class Routing:
    """Router decision for T tokens: ``scores`` [T, E] (fp32), ``weights`` and ``indices``
    [T, k], ``counts`` [E] (routed slots per expert) and the raw ``logits`` [T, E]."""

    scores: Tensor
    weights: Tensor
    indices: Tensor
    counts: Tensor
    logits: Tensor


class Router(nn.Module):
    """Linear router (HF name ``gate``, no bias) with top-k selection.

    Top-k weights are renormalised to sum to one (Mixtral, Qwen3-MoE, DeepSeek-V3). The
    buffer ``e_score_correction_bias`` (DeepSeek-V3's name) exists when ``expert_bias``
    (default: for sigmoid scores only) and shifts only which experts are selected.
    ``load`` (not saved in checkpoints) counts routed slots per expert in training mode
    since the last ``legato.moe.end_step`` or :meth:`reset_buffers`.
    """

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        score: RouterScore,
        expert_bias: bool | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.score = score
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        use_bias = score == "sigmoid" if expert_bias is None else expert_bias
        self.register_buffer(
            "e_score_correction_bias", torch.zeros(num_experts) if use_bias else None
        )
        # int64: counts stay exact, and model.to(bfloat16) leaves integer buffers alone
        self.register_buffer("load", torch.zeros(num_experts, dtype=torch.long), persistent=False)

    @torch.no_grad()
    def reset_buffers(self) -> None:
        if self.e_score_correction_bias is not None:
            self.e_score_correction_bias.zero_()
        self.load.zero_()

    def forward(self, x: Tensor) -> Routing:
        logits = F.linear(x, self.weight).float()
        scores = logits.softmax(dim=-1) if self.score == "softmax" else logits.sigmoid()
        if self.e_score_correction_bias is None:
            weights, indices = scores.topk(self.top_k, dim=-1)
        else:
            _, indices = (scores + self.e_score_correction_bias).topk(self.top_k, dim=-1)
            weights = scores.gather(-1, indices)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        counts = torch.bincount(indices.reshape(-1), minlength=self.num_experts)
        if self.training:
            with torch.no_grad():
                self.load += counts
        return Routing(scores, weights, indices, counts, logits)

    @torch.no_grad()
    def update_bias(self, load: Tensor, rate: float) -> None:
        """Auxiliary-loss-free balancing rule (DeepSeek-V3, arXiv 2412.19437, sec. 2.1.2):
        ``bias_e += rate * sign(mean(load) - load_e)``: overloaded experts become less
        likely to be chosen, underloaded ones more. ``load`` [E] is the step's count
        (summed over micro-batches and data-parallel ranks by the caller)."""
        if self.e_score_correction_bias is None:
            return
        load = load.to(self.e_score_correction_bias)
        self.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def load_balance_loss(scores: Tensor, counts: Tensor) -> Tensor:
    """Switch-style auxiliary loss ``E * sum_e f_e * P_e``; equals 1 when perfectly balanced.

    ``f_e`` is expert e's share of routed token slots, ``P_e`` its mean (per-token
    normalised) router score; only ``P_e`` carries gradient.
    """
    fraction = counts.float() / counts.sum().clamp(min=1)
    probs = scores / scores.sum(dim=-1, keepdim=True)
    return scores.shape[-1] * (fraction * probs.mean(dim=0)).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE z-loss ``mean_t logsumexp(logits_t)^2``: keeps router logits small (stable
    softmax in low precision)."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()
