"""The decoder-only transformer built from a :class:`ModelSpec`: the one definition that
training, multi-LoRA fine-tuning and serving all run.

``Block.forward`` is the computation; what differs between the uses are the attention and
linear-layer backends of the :class:`ForwardContext` it is given (``forward_context``):
training passes a rectangular [B, S] batch and :class:`SdpaAttention`, fine-tuning
(``lora.packed_model``) and serving (``serve.paged_model``) pass flat token rows with
their own backends through :meth:`Decoder.forward`'s ``attention`` and ``linear``.

The module tree mirrors Hugging Face Llama (``model.embed_tokens``, ``model.layers.{i}.
self_attn.q_proj``, ..., ``model.norm``, ``lm_head``), so ``state_dict()`` keys are HF keys
for dense models; only the stacked MoE experts need renaming (``hf_checkpoint``).
``model.layers`` (also ``Transformer.blocks``) is the list FSDP2 wraps block by block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.errors import ConfigError, SpecError
from legato.models.attention import Attention, SdpaAttention
from legato.models.forward_context import (
    AttentionBackend,
    ForwardContext,
    LinearBackend,
    call_layer,
)
from legato.models.mla import MLAttention
from legato.models.mlp import MLP
from legato.models.moe import MoE
from legato.models.norms import build_norm
from legato.models.rope import RotaryEmbedding
from legato.models.weight_init import init_weights
from legato.moe.layer import moe_aux_loss
from legato.specs.model import ModelSpec


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; ``mlp`` is an MLP
    or, on MoE layers, a :class:`MoE`."""

    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        h = spec.hidden_size
        self.input_layernorm = build_norm(spec.norm, h, spec.norm_eps)
        attention = MLAttention if spec.mla is not None else Attention
        self.self_attn = attention(spec, layer)
        self.post_attention_layernorm = build_norm(spec.norm, h, spec.norm_eps)
        if spec.is_moe_layer(layer):
            self.mlp = MoE(spec)
        else:
            self.mlp = MLP(h, spec.ffn_hidden_size, spec.mlp, spec.bias)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x), ctx)


class Decoder(nn.Module):
    """HF's ``model``: embeddings, blocks and the final norm (no LM head)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.seq_len = spec.seq_len
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        if spec.position == "learned":
            self.embed_positions = nn.Embedding(spec.seq_len, spec.hidden_size)
            self.rotary_emb = None
        else:
            self.embed_positions = None
            rotary_dim = spec.mla.qk_rope_head_dim if spec.mla is not None else spec.head_dim
            self.rotary_emb = RotaryEmbedding(
                rotary_dim, spec.seq_len, spec.rope_theta, spec.rope_scaling
            )
        self.layers = nn.ModuleList(Block(spec, i) for i in range(spec.num_layers))
        self.norm = build_norm(spec.norm, spec.hidden_size, spec.norm_eps)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        attn_mask: Tensor | None = None,
        *,
        attention: AttentionBackend | None = None,
        linear: LinearBackend = call_layer,
    ) -> Tensor:
        """Final-normed hidden states [..., S, h] of ``input_ids`` [..., S].

        A training batch is [B, S] with the default :class:`SdpaAttention` of ``attn_mask``;
        flat token rows [T] come with their positions and the backend that knows which
        rows belong together (``attn_mask`` is then the backend's business)."""
        if position_ids is None:
            b, s = input_ids.shape
            if s > self.seq_len:
                raise ConfigError(
                    f"input has {s} tokens per sequence, model seq_len is {self.seq_len}"
                )
            position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
        x = self.embed_tokens(input_ids)
        rope = None
        if self.embed_positions is not None:
            x = x + self.embed_positions(position_ids)
        else:
            rope = self.rotary_emb(position_ids)
        ctx = ForwardContext(rope, attention or SdpaAttention(attn_mask), linear)
        for layer in self.layers:
            x = layer(x, ctx)
        return self.norm(x)


class Transformer(nn.Module):
    """Decoder plus LM head. With ``tied_embeddings`` there is no ``lm_head`` module: the
    logits use ``model.embed_tokens.weight`` and the state dict has no ``lm_head.weight``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.mla is not None and spec.position != "rope":
            raise SpecError(
                f"model {spec.name!r}: mla needs position = 'rope', got {spec.position!r}"
            )
        self.spec = spec
        self.model = Decoder(spec)
        self.lm_head = (
            None
            if spec.tied_embeddings
            else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        )

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def hidden_states(
        self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        """Final-normed hidden states [B, S, h], for callers that apply the head themselves."""
        return self.model(input_ids, position_ids, attn_mask)

    def output_weight(self) -> Tensor:
        """The LM head weight [V, h] (the embedding when tied)."""
        head = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        return head.weight

    def forward(
        self, input_ids: Tensor, position_ids: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        """Logits [B, S, V] for ``input_ids`` [B, S]; see ``attention.attend`` for masks."""
        hidden = self.hidden_states(input_ids, position_ids, attn_mask)
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return F.linear(hidden, self.output_weight())

    def init_weights(self, seed: int | None = None) -> None:
        """(Re)initialise all weights and buffers; the same seed gives the same model.
        ``seed=None`` draws one from torch's global generator (honours ``torch.manual_seed``);
        sharded models must pass the same explicit seed on every rank."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        init_weights(self, seed, self.spec.num_layers)

    def moe_layers(self) -> list[MoE]:
        return [block.mlp for block in self.blocks if isinstance(block.mlp, MoE)]

    def moe_aux_loss(self) -> Tensor | None:
        """Sum of the last forward's load-balance losses over MoE layers (None if dense)."""
        return moe_aux_loss(self)


def build_model(
    spec: ModelSpec,
    *,
    seed: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Transformer:
    """Build and initialise a model. ``device="meta"`` returns it uninitialised (shapes
    only); call ``to_empty(device=...)`` and ``init_weights(seed)`` later (FSDP2 flow)."""
    with torch.device("meta"):
        model = Transformer(spec)
    if dtype is not None:
        model = model.to(dtype)
    target = torch.device(device) if device is not None else torch.get_default_device()
    if target.type == "meta":
        return model
    model.to_empty(device=target)
    model.init_weights(seed)
    return model
