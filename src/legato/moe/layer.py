"""The MoE layer: router, dropless routed experts (optionally expert-parallel and
overlapped), shared experts, and per-forward statistics.

Module names are the reference model's (and Hugging Face's): ``gate`` (router),
``experts`` (stacked) and ``shared_experts`` (any module, e.g. one MLP of width
``num_shared * shared_ffn`` as DeepSeek stores it). The layer runs on one process by
default; :func:`legato.parallel.expert.apply_expert_parallel` sets ``ep`` and ``overlap``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import Tensor, nn

from legato.moe.chunked_overlap import Overlap, routed_experts
from legato.moe.comm import EPGroup, sum_gradient
from legato.moe.experts import Activation, GroupedExperts
from legato.moe.router import Router, load_balance_loss, router_z_loss
from legato.specs.model import MoESpec

# The grouped GEMMs and the all-to-alls are sized by the routed counts, shapes a compiled
# graph cannot trace (dynamo's fake tensors fail on them, torch 2.13): the routed experts
# run eagerly between the compiled parts of a block (``train.compile``), a graph break.
_routed_experts = torch.compiler.disable(routed_experts)


class MoELayer(nn.Module):
    """Top-k mixture of experts over ``hidden``-wide tokens, described by ``moe``.

    Under expert tensor parallelism (``expert_tp`` set) the output is this rank's partial
    sum (its slice of every expert's FFN, and of the shared experts' when they are
    row-parallel), which the tensor-parallel plan reduces after the layer.

    After each forward: ``last_expert_counts`` [E] (this rank's routed slots per expert,
    detached), ``last_aux_loss`` (load-balance loss) and ``last_z_loss`` (router z-loss),
    both scalars with gradient; adding them to the objective is the trainer's choice.
    """

    def __init__(
        self,
        hidden: int,
        moe: MoESpec,
        *,
        gated: bool,
        bias: bool,
        activation: Activation,
        shared_experts: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_experts = moe.num_experts
        self.top_k = moe.top_k
        self.gate = Router(hidden, moe.num_experts, moe.top_k, moe.router_score)
        self.experts = GroupedExperts(
            moe.num_experts,
            hidden,
            moe.expert_ffn_hidden_size,
            gated=gated,
            bias=bias,
            activation=activation,
        )
        self.shared_experts = shared_experts
        self.ep: EPGroup | None = None
        # expert tensor parallelism: the tp group over which every expert's FFN width is
        # split; the layer then returns this rank's partial sum (see forward)
        self.expert_tp: dist.ProcessGroup | None = None
        # ranks that split one replica's tokens between them, each routing its own
        # (sequence-parallel ranks when ep folds over tp): see moe_aux_loss
        self.token_shards = 1
        self.overlap = Overlap()
        self.last_expert_counts: Tensor | None = None
        self.last_aux_loss: Tensor | None = None
        self.last_z_loss: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.gate(tokens)
        routed_in = tokens
        if self.expert_tp is not None:  # each tp rank runs a slice of every expert's FFN
            # the same tokens and routing on every rank, each of whose gradient here is
            # this rank's slice's share: summed over tp in the backward
            routed_in = sum_gradient(tokens, self.expert_tp)
            routing = replace(routing, weights=sum_gradient(routing.weights, self.expert_tp))
        out = _routed_experts(routed_in, routing, self.experts, self.ep, self.overlap)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        self.last_expert_counts = routing.counts.detach()
        self.last_aux_loss = load_balance_loss(routing.scores, routing.counts)
        self.last_z_loss = router_z_loss(routing.logits)
        return out.view_as(x)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """Every MoE layer of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def moe_aux_loss(model: nn.Module) -> Tensor | None:
    """The sum of the last forward's load-balance losses over the MoE layers of ``model``
    (a whole model or a pipeline stage), as this rank's share of the objective: a layer
    whose replica's tokens are split over ``token_shards`` ranks adds ``1/token_shards`` of
    its own tokens' loss, so the shards' sum is their mean; None when none ran."""
    layers = [m for m in moe_layers(model) if m.last_aux_loss is not None]
    losses = [m.last_aux_loss / m.token_shards for m in layers]
    return torch.stack(losses).sum() if losses else None
