"""Cut the reference transformer into pipeline stages (model chunks).

Virtual stage ``vs`` (of S = ranks * chunks) gets a contiguous run of blocks; the first
also holds the embeddings, the last the final norm, the LM head and (in the runtime) the
loss. Chunk c of rank d is the virtual stage the schedule's ``StagePlacement`` names, so the
interleaved and the V placements come out of the same code. Stages *share* the model's
modules (no copies): building the stages of one rank from a full model leaves the other
ranks' layers unused there, and parameter names stay the model's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.errors import ConfigError
from legato.models.attention import SdpaAttention
from legato.models.forward_context import ForwardContext
from legato.models.transformer import Transformer
from legato.schedule import StagePlacement
from legato.specs.strategy import layer_ranges as split_layers  # the cost model's split


class StageModule(nn.Module):
    """One virtual stage: ``forward(x, position_ids)`` maps token ids (first stage) or
    hidden states to hidden states, or to logits on the last stage."""

    def __init__(self, model: Transformer, stage: int, num_stages: int, layers: range) -> None:
        super().__init__()
        decoder = model.model
        self.spec = model.spec
        self.stage_index, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.hidden_size = model.spec.hidden_size
        self.layer_ids = layers
        self.embed_tokens = decoder.embed_tokens if self.is_first else None
        self.embed_positions = decoder.embed_positions if self.is_first else None
        self.rotary_emb = decoder.rotary_emb  # buffers only, shared by every stage
        self.layers = nn.ModuleList(decoder.layers[i] for i in layers)
        self.norm = decoder.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        # tied embeddings: the last stage computes the logits with the embedding matrix
        self.tied_embeddings = model.lm_head is None
        tied = self.is_last and self.tied_embeddings
        self.output_embedding = decoder.embed_tokens if tied else None

    @property
    def blocks(self) -> nn.ModuleList:
        """The stage's transformer blocks (``Transformer.blocks`` for a whole model), what
        the appliers of ``legato.parallel`` lay out block by block."""
        return self.layers

    def hidden_states(self, x: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """The stage's output before the LM head: on the last stage the final-normed
        hidden states, for a loss that applies the head itself (``loss_chunk``). FSDP2
        registers it as a forward method, so ``forward`` must not call it (nested root
        hooks would corrupt the first stage's gradients): both call ``_trunk``."""
        return self._trunk(x, position_ids)

    def _trunk(self, x: Tensor, position_ids: Tensor | None) -> Tensor:
        if position_ids is None:
            position_ids = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
            if self.embed_positions is not None:
                x = x + self.embed_positions(position_ids)
        rope = self.rotary_emb(position_ids) if self.rotary_emb is not None else None
        ctx = ForwardContext(rope, SdpaAttention())
        for layer in self.layers:
            x = layer(x, ctx)
        return self.norm(x) if self.is_last else x

    def output_weight(self) -> Tensor:
        """The last stage's LM head weight [V, h] (the embedding when tied)."""
        return (self.lm_head if self.lm_head is not None else self.output_embedding).weight

    def forward(self, x: Tensor, position_ids: Tensor | None = None) -> Tensor:
        x = self._trunk(x, position_ids)
        if not self.is_last:
            return x
        if self.lm_head is not None:
            return self.lm_head(x)
        return F.linear(x, self.output_weight())


def build_stages(
    model: Transformer,
    placement: StagePlacement,
    rank: int,
    layers_per_stage: Sequence[int] | None = None,
) -> dict[int, StageModule]:
    """The stages (virtual stage -> module) that pipeline rank ``rank`` holds.

    ``layers_per_stage`` (one count per virtual stage, summing to the model's layers)
    overrides the balanced split of :func:`split_layers`.
    """
    if not 0 <= rank < placement.ranks:
        raise ConfigError(f"rank: must be in [0, {placement.ranks}), got {rank}")
    num_layers, num_stages = model.spec.num_layers, placement.num_stages
    if layers_per_stage is None:
        ranges = split_layers(num_layers, num_stages)
    else:
        counts = list(layers_per_stage)
        if len(counts) != num_stages or sum(counts) != num_layers or min(counts) < 0:
            raise ConfigError(
                f"layers_per_stage: need {num_stages} non-negative counts summing to "
                f"{num_layers} layers, got {counts}"
            )
        starts = [sum(counts[:i]) for i in range(num_stages)]
        ranges = tuple(range(s, s + c) for s, c in zip(starts, counts, strict=True))
    return {
        placement.stage(rank, c): StageModule(
            model, placement.stage(rank, c), num_stages, ranges[placement.stage(rank, c)]
        )
        for c in range(placement.chunks)
    }
